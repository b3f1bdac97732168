//! Declared tools: checked (custom tools only, unique names, a schema object), written as
//! upstream function tools, and named for the upstream (names over 64 bytes shortened stably,
//! and restored in responses through [`ToolNames::shortened`]).

use super::{invalid, req_name, sep};
use crate::error::{write_json_str, ApiError};
use crate::protocol::anthropic::AnthropicTool;
use crate::translate::common::rawjson::{self, is_object, is_string};
use crate::translate::common::tool_names::{shorten_tool_name, MAX_TOOL_NAME};
use std::borrow::Cow;

/// Client tool names and the names the upstream sees (shortened when over 64 bytes).
#[derive(Debug, Default)]
pub struct ToolNames<'a> {
    /// Declared tools in order: (client name, upstream name).
    pub declared: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// Every shortened name: (upstream name, client name), for `UpstreamRequest::tool_name_map`.
    pub shortened: Vec<(String, String)>,
}

impl<'a> ToolNames<'a> {
    /// The upstream name of `client`, recording it in `shortened` if it had to be cut.
    pub fn upstream(&mut self, client: &Cow<'a, str>) -> Cow<'a, str> {
        if client.len() <= MAX_TOOL_NAME {
            return client.clone();
        }
        let short = shorten_tool_name(client);
        if !self.shortened.iter().any(|(s, _)| *s == short) {
            self.shortened.push((short.clone(), client.to_string()));
        }
        Cow::Owned(short)
    }

    /// The upstream name of a declared tool.
    pub fn declared_upstream(&self, client: &str) -> Option<&str> {
        self.declared
            .iter()
            .find(|(c, _)| c == client)
            .map(|(_, u)| u.as_ref())
    }
}

/// Validates the declared tools and records their names.
pub(super) fn check_tools<'a>(
    tools: &[AnthropicTool<'a>],
    names: &mut ToolNames<'a>,
) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let p = |f: &str| format!("tools[{i}].{f}");
        if let Some(kind) = t.kind {
            if !is_string(kind) {
                return Err(invalid(p("type"), "must be a string"));
            }
            if !rawjson::str_eq(kind, "custom") {
                let k = rawjson::decode(kind).unwrap_or_default();
                return Err(invalid(
                    p("type"),
                    format!(
                        "tool type \"{k}\" is a server tool, which this gateway does not run; declare custom tools with `name` and `input_schema`"
                    ),
                ));
            }
        }
        let name = req_name(t.name, &|| p("name"))?;
        if t.description.is_some_and(|d| !is_string(d)) {
            return Err(invalid(p("description"), "must be a string"));
        }
        match t.input_schema {
            None => return Err(invalid(p("input_schema"), "is required")),
            Some(s) if !is_object(s) => {
                return Err(invalid(p("input_schema"), "must be a JSON Schema object"))
            }
            Some(s) if !rawjson::depth_ok(s.get()) => {
                return Err(invalid(p("input_schema"), "is nested too deeply"))
            }
            Some(_) => {}
        }
        if names.declared.iter().any(|(c, _)| *c == name) {
            return Err(invalid(
                p("name"),
                format!("tool names must be unique; `{name}` is declared twice"),
            ));
        }
        let upstream = names.upstream(&name);
        names.declared.push((name, upstream));
    }
    Ok(())
}

/// `[{"type":"function","function":{"name","description","parameters"}}, …]`. Only these keys
/// are written: tool-level extras never leak into the function or its parameters.
pub(super) fn write_tools(tools: &[AnthropicTool<'_>], names: &ToolNames<'_>, out: &mut Vec<u8>) {
    out.push(b'[');
    for (t, (_, upstream)) in tools.iter().zip(&names.declared) {
        sep(out);
        out.extend_from_slice(b"{\"type\":\"function\",\"function\":{\"name\":");
        write_json_str(out, upstream);
        if let Some(d) = t.description {
            out.extend_from_slice(b",\"description\":");
            out.extend_from_slice(d.get().as_bytes());
        }
        if let Some(s) = t.input_schema {
            out.extend_from_slice(b",\"parameters\":");
            out.extend_from_slice(s.get().as_bytes());
        }
        out.extend_from_slice(b"}}");
    }
    out.push(b']');
}
