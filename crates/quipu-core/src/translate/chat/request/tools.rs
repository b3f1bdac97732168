//! `tools` (function tools only, rewritten with just the fields the upstream uses) and
//! `tool_choice` (which must name a declared tool).

use super::fields::{bool_field, str_field};
use super::present;
use crate::error::{write_json_str, ApiError};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashSet;

#[derive(Deserialize)]
struct ToolIn<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    function: Option<FunctionDefIn<'a>>,
}

#[derive(Deserialize)]
struct FunctionDefIn<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    description: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
    #[serde(borrow, default)]
    strict: Option<&'a RawValue>,
}

fn is_function_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// Writes `,"tools":[…]` keeping only the function fields the upstream uses.
pub(super) fn write_tools<'a>(
    raw: &'a RawValue,
    names: &mut HashSet<Cow<'a, str>>,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let tools: Vec<ToolIn> = serde_json::from_str(raw.get()).map_err(|e| {
        ApiError::invalid(
            "tools",
            format!(
                "`tools` must be an array of {{\"type\":\"function\",\"function\":{{…}}}}: {e}"
            ),
        )
    })?;
    out.extend_from_slice(b",\"tools\":[");
    for (i, tool) in tools.into_iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("only function tools are supported, got \"{}\"", tool.kind),
            ));
        }
        let f = tool.function.ok_or_else(|| {
            ApiError::invalid(
                format!("tools[{i}].function"),
                "a function tool needs `function`",
            )
        })?;
        if !is_function_name(&f.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                "function names must be 1-64 letters, digits, '_', '-' or '.'",
            ));
        }
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"type\":\"function\",\"function\":{\"name\":");
        write_json_str(out, &f.name);
        if let Some(d) = present(f.description) {
            str_field(d, format!("tools[{i}].function.description"))?;
            out.extend_from_slice(b",\"description\":");
            out.extend_from_slice(d.get().as_bytes());
        }
        if let Some(p) = present(f.parameters) {
            if !p.get().starts_with('{') {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    "`parameters` must be a JSON Schema object",
                ));
            }
            out.extend_from_slice(b",\"parameters\":");
            out.extend_from_slice(p.get().as_bytes());
        }
        if let Some(s) = present(f.strict) {
            bool_field(s, &format!("tools[{i}].function.strict"))?;
            out.extend_from_slice(b",\"strict\":");
            out.extend_from_slice(s.get().as_bytes());
        }
        out.extend_from_slice(b"}}");
        names.insert(f.name);
    }
    out.push(b']');
    Ok(())
}

pub(super) fn validate_tool_choice(
    raw: &RawValue,
    tools: &HashSet<Cow<'_, str>>,
) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Choice<'a> {
        Mode(#[serde(borrow)] Cow<'a, str>),
        Named {
            #[serde(borrow, rename = "type")]
            kind: Cow<'a, str>,
            #[serde(borrow)]
            function: NamedFn<'a>,
        },
    }
    #[derive(Deserialize)]
    struct NamedFn<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
    }
    let bad = || {
        ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":…}}",
        )
    };
    match serde_json::from_str::<Choice>(raw.get()).map_err(|_| bad())? {
        Choice::Mode(m) => match m.as_ref() {
            "none" | "auto" => Ok(()),
            "required" if tools.is_empty() => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` \"required\" needs `tools`",
            )),
            "required" => Ok(()),
            _ => Err(bad()),
        },
        Choice::Named { kind, function } => {
            if kind != "function" {
                return Err(bad());
            }
            if !tools.contains(&function.name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!(
                        "`tool_choice` names `{}`, which is not in `tools`",
                        function.name
                    ),
                ));
            }
            Ok(())
        }
    }
}
