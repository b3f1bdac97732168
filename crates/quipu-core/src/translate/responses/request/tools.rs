//! `tools` and `tool_choice`.
//!
//! - `function` tools become upstream function tools (`name`, `description`, `parameters`,
//!   `strict`; nothing else leaks). Names are 1–64 letters, digits, `_`, `-` or `.`.
//! - A `namespace` (a group of functions, as the Codex CLI sends `multi_agent_v1`) is
//!   flattened: each of its functions becomes `namespace__name` upstream (shortened stably
//!   when over 64 bytes, as the messages format does), its description prefixed with the
//!   namespace's; calls come back as the function's own name with `namespace` set, as the API
//!   returns them.
//! - Every other tool type is a hosted tool the upstream cannot run (`web_search` — which
//!   Codex sends on every request —, `file_search`, `computer_use_preview`, `code_interpreter`,
//!   `image_generation`, `mcp`, `local_shell`, `custom`, …): dropped from what the upstream
//!   sees, and echoed in the response as sent.
//! - `tool_choice`: `none`, `auto` (omitted upstream when no function tool is left),
//!   `required`, `{type:"function",name[,namespace]}` (must name a declared function),
//!   `{type:"allowed_tools",mode,tools}` (the upstream sees only the allowed functions, and
//!   `mode`). A choice that forces a dropped tool (`{type:"web_search_preview"}`, `required`
//!   with only hosted tools, …) is a 400 naming it.

use super::super::{ToolName, NAMESPACE_SEPARATOR};
use super::invalid;
use crate::error::{write_json_str, ApiError};
use crate::protocol::responses::{ResponsesTool, ResponsesToolChoice};
use crate::translate::common::rawjson::{self, is_array, is_object, is_string};
use crate::translate::common::tool_names::{shorten_tool_name, MAX_TOOL_NAME};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The upstream name of a client function: `namespace__name` in a namespace, shortened when
/// over [`MAX_TOOL_NAME`] bytes. The same inputs always give the same name, so a
/// conversation's history and its tools agree across requests.
pub fn upstream_name<'n>(namespace: Option<&str>, name: &'n str) -> Cow<'n, str> {
    let full: Cow<'n, str> = match namespace {
        Some(ns) => Cow::Owned(format!("{ns}{NAMESPACE_SEPARATOR}{name}")),
        None => Cow::Borrowed(name),
    };
    if full.len() <= MAX_TOOL_NAME {
        full
    } else {
        Cow::Owned(shorten_tool_name(&full))
    }
}

fn is_function_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// A declared function tool.
struct Function<'a> {
    upstream: String,
    name: Cow<'a, str>,
    namespace: Option<Cow<'a, str>>,
    /// The namespace's description, written before the function's.
    namespace_description: Option<&'a RawValue>,
    description: Option<&'a RawValue>,
    parameters: Option<&'a RawValue>,
    strict: Option<&'a RawValue>,
}

/// The declared tools: functions (namespaces flattened), and the hosted tools dropped.
pub(super) struct Declared<'a> {
    functions: Vec<Function<'a>>,
    /// Types of the tools dropped (`web_search`, …), for messages.
    dropped: Vec<String>,
}

/// What `tool_choice` asks, resolved against the declared functions (indexes into them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Choice {
    Unset,
    None,
    Auto,
    Required,
    Function(usize),
    Allowed { required: bool, allowed: Vec<usize> },
}

impl Declared<'_> {
    /// The functions by upstream name, for the response translators.
    pub fn names(&self) -> Vec<ToolName> {
        self.functions
            .iter()
            .map(|f| ToolName {
                upstream: f.upstream.clone(),
                name: f.name.to_string(),
                namespace: f.namespace.as_ref().map(|n| n.to_string()),
            })
            .collect()
    }

    /// Whether the upstream sees any tool (so `tool_choice` and `parallel_tool_calls` apply).
    pub fn any_written(&self, choice: &Choice) -> bool {
        match choice {
            Choice::Allowed { allowed, .. } => !allowed.is_empty(),
            _ => !self.functions.is_empty(),
        }
    }

    /// The function `name` of `namespace`; without a namespace, a top-level function of that
    /// name, else the first namespaced one.
    fn find(&self, name: &str, namespace: Option<&str>) -> Option<usize> {
        let exact = self
            .functions
            .iter()
            .position(|f| f.name == name && f.namespace.as_deref() == namespace);
        match (exact, namespace) {
            (Some(at), _) => Some(at),
            (None, Some(_)) => None,
            (None, None) => self.functions.iter().position(|f| f.name == name),
        }
    }

    fn dropped_list(&self) -> String {
        if self.dropped.is_empty() {
            "none".into()
        } else {
            self.dropped.join(", ")
        }
    }
}

fn opt_str(
    raw: Option<&RawValue>,
    param: impl Fn() -> String,
) -> Result<Option<&RawValue>, ApiError> {
    match raw {
        Some(r) if !is_string(r) => Err(invalid(param(), "must be a string")),
        other => Ok(other),
    }
}

/// A function tool's fields, checked.
fn function<'a>(
    t: &ResponsesTool<'a>,
    namespace: Option<(&Cow<'a, str>, Option<&'a RawValue>)>,
    p: &dyn Fn(&str) -> String,
) -> Result<Function<'a>, ApiError> {
    let name_raw = t.name.ok_or_else(|| invalid(p("name"), "is required"))?;
    let name = rawjson::decode(name_raw).ok_or_else(|| invalid(p("name"), "must be a string"))?;
    if !is_function_name(&name) {
        return Err(invalid(
            p("name"),
            "function names must be 1-64 letters, digits, '_', '-' or '.'",
        ));
    }
    let description = opt_str(t.description, || p("description"))?;
    let parameters = match t.parameters {
        Some(s) if !is_object(s) => {
            return Err(invalid(p("parameters"), "must be a JSON Schema object"))
        }
        Some(s) if !rawjson::depth_ok(s.get()) => {
            return Err(invalid(p("parameters"), "is nested too deeply"))
        }
        other => other,
    };
    let strict = match t.strict {
        Some(s) if s.get() != "true" && s.get() != "false" => {
            return Err(invalid(p("strict"), "must be true or false"))
        }
        other => other,
    };
    let upstream = upstream_name(namespace.map(|(ns, _)| ns.as_ref()), &name).into_owned();
    Ok(Function {
        upstream,
        name,
        namespace: namespace.map(|(ns, _)| ns.clone()),
        namespace_description: namespace.and_then(|(_, d)| d),
        description,
        parameters,
        strict,
    })
}

fn tool_type<'a>(
    t: &ResponsesTool<'a>,
    p: &dyn Fn(&str) -> String,
) -> Result<Cow<'a, str>, ApiError> {
    let raw = t.kind.ok_or_else(|| invalid(p("type"), "is required"))?;
    rawjson::decode(raw).ok_or_else(|| invalid(p("type"), "must be a string"))
}

fn tool_list<'a>(raw: &'a RawValue, param: &str) -> Result<Vec<ResponsesTool<'a>>, ApiError> {
    if !is_array(raw) {
        return Err(invalid(param, "must be an array of tools"));
    }
    if let Ok(v) = serde_json::from_str::<Vec<ResponsesTool<'a>>>(raw.get()) {
        return Ok(v);
    }
    let items: Vec<&RawValue> = serde_json::from_str(raw.get())
        .map_err(|e| invalid(param, format!("must be an array of tools: {e}")))?;
    for (i, item) in items.iter().enumerate() {
        if let Err(e) = serde_json::from_str::<ResponsesTool<'_>>(item.get()) {
            return Err(invalid(format!("{param}[{i}]"), e.to_string()));
        }
    }
    Err(invalid(param, "must be an array of tools"))
}

/// Validates `tools`: functions kept (namespaces flattened), hosted tools dropped.
pub(super) fn declare(raw: Option<&RawValue>) -> Result<Declared<'_>, ApiError> {
    let mut d = Declared {
        functions: Vec::new(),
        dropped: Vec::new(),
    };
    let Some(raw) = raw else {
        return Ok(d);
    };
    for (i, t) in tool_list(raw, "tools")?.iter().enumerate() {
        let p = |f: &str| format!("tools[{i}].{f}");
        match tool_type(t, &p)?.as_ref() {
            "function" => d.functions.push(function(t, None, &p)?),
            "namespace" => {
                let ns_raw = t.name.ok_or_else(|| invalid(p("name"), "is required"))?;
                let ns = rawjson::decode(ns_raw)
                    .filter(|n| is_function_name(n))
                    .ok_or_else(|| {
                        invalid(
                            p("name"),
                            "namespace names must be 1-64 letters, digits, '_', '-' or '.'",
                        )
                    })?;
                let ns_description = opt_str(t.description, || p("description"))?;
                let inner = t.tools.ok_or_else(|| invalid(p("tools"), "is required"))?;
                for (j, f) in tool_list(inner, &p("tools"))?.iter().enumerate() {
                    let fp = |f: &str| format!("tools[{i}].tools[{j}].{f}");
                    match tool_type(f, &fp)?.as_ref() {
                        "function" => {
                            d.functions
                                .push(function(f, Some((&ns, ns_description)), &fp)?)
                        }
                        other => d.dropped.push(format!("{ns}.{other}")),
                    }
                }
            }
            other => d.dropped.push(other.to_owned()),
        }
    }
    for (k, f) in d.functions.iter().enumerate() {
        if d.functions[..k].iter().any(|g| g.upstream == f.upstream) {
            let shown = match &f.namespace {
                Some(ns) => format!("{ns}.{}", f.name),
                None => f.name.to_string(),
            };
            return Err(invalid(
                "tools",
                format!("tool names must be unique; `{shown}` is declared twice (or collides with a flattened namespace function)"),
            ));
        }
    }
    Ok(d)
}

/// Validates `tool_choice` against the declared tools.
pub(super) fn choice(raw: Option<&RawValue>, d: &Declared<'_>) -> Result<Choice, ApiError> {
    let Some(raw) = raw else {
        return Ok(Choice::Unset);
    };
    let needs_functions = |what: &str| {
        invalid(
            "tool_choice",
            format!(
                "{what} needs a function tool, and none was declared (hosted tools are dropped by this gateway: {})",
                d.dropped_list()
            ),
        )
    };
    if is_string(raw) {
        let mode = rawjson::decode(raw).unwrap_or_default();
        return match mode.as_ref() {
            "none" => Ok(Choice::None),
            "auto" => Ok(Choice::Auto),
            "required" if d.functions.is_empty() => Err(needs_functions("\"required\"")),
            "required" => Ok(Choice::Required),
            other => Err(invalid(
                "tool_choice",
                format!("must be none, auto, required or an object, got \"{other}\""),
            )),
        };
    }
    if !is_object(raw) {
        return Err(invalid(
            "tool_choice",
            "must be \"none\", \"auto\", \"required\" or an object like {\"type\": \"function\", \"name\": …}",
        ));
    }
    let c: ResponsesToolChoice<'_> =
        serde_json::from_str(raw.get()).map_err(|e| invalid("tool_choice", e.to_string()))?;
    let kind_raw = c
        .kind
        .ok_or_else(|| invalid("tool_choice.type", "is required"))?;
    let kind =
        rawjson::decode(kind_raw).ok_or_else(|| invalid("tool_choice.type", "must be a string"))?;
    match kind.as_ref() {
        "function" => {
            let name = c
                .name
                .and_then(rawjson::decode)
                .ok_or_else(|| invalid("tool_choice.name", "must be a function name"))?;
            let namespace = match c.namespace {
                Some(ns) => Some(
                    rawjson::decode(ns)
                        .ok_or_else(|| invalid("tool_choice.namespace", "must be a string"))?,
                ),
                None => None,
            };
            let at = d.find(&name, namespace.as_deref()).ok_or_else(|| {
                invalid(
                    "tool_choice.name",
                    format!("names `{name}`, which is not a function in `tools`"),
                )
            })?;
            Ok(Choice::Function(at))
        }
        "allowed_tools" => {
            let required = match c.mode.and_then(rawjson::decode).as_deref() {
                Some("auto") => false,
                Some("required") => true,
                _ => {
                    return Err(invalid(
                        "tool_choice.mode",
                        "must be \"auto\" or \"required\"",
                    ))
                }
            };
            let list = c
                .tools
                .ok_or_else(|| invalid("tool_choice.tools", "is required"))?;
            let mut allowed = Vec::new();
            for (i, t) in tool_list(list, "tool_choice.tools")?.iter().enumerate() {
                let p = |f: &str| format!("tool_choice.tools[{i}].{f}");
                if tool_type(t, &p)? != "function" {
                    continue; // a hosted tool: dropped anyway
                }
                let name = t
                    .name
                    .and_then(rawjson::decode)
                    .ok_or_else(|| invalid(p("name"), "must be a function name"))?;
                let at = d.find(&name, None).ok_or_else(|| {
                    invalid(
                        p("name"),
                        format!("names `{name}`, which is not a function in `tools`"),
                    )
                })?;
                if !allowed.contains(&at) {
                    allowed.push(at);
                }
            }
            if required && allowed.is_empty() {
                return Err(needs_functions("allowed_tools with mode \"required\""));
            }
            allowed.sort_unstable();
            Ok(Choice::Allowed { required, allowed })
        }
        other => Err(invalid(
            "tool_choice.type",
            format!(
                "forces `{other}`, a hosted tool this gateway cannot run (the upstream model server runs no tools); declare a function tool instead"
            ),
        )),
    }
}

/// `,"tools":[…]` with the functions the upstream sees, or nothing when there are none.
pub(super) fn write_tools(d: &Declared<'_>, choice: &Choice, out: &mut Vec<u8>) {
    if !d.any_written(choice) {
        return;
    }
    out.extend_from_slice(b",\"tools\":[");
    let mut first = true;
    for (k, f) in d.functions.iter().enumerate() {
        if let Choice::Allowed { allowed, .. } = choice {
            if !allowed.contains(&k) {
                continue;
            }
        }
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(b"{\"type\":\"function\",\"function\":{\"name\":");
        write_json_str(out, &f.upstream);
        match (f.namespace_description, f.description) {
            (Some(ns), Some(fd)) => {
                out.extend_from_slice(b",\"description\":\"");
                out.extend_from_slice(rawjson::inner(ns).as_bytes());
                out.extend_from_slice(b"\\n\\n");
                out.extend_from_slice(rawjson::inner(fd).as_bytes());
                out.push(b'"');
            }
            (Some(d), None) | (None, Some(d)) => {
                out.extend_from_slice(b",\"description\":");
                out.extend_from_slice(d.get().as_bytes());
            }
            (None, None) => {}
        }
        if let Some(p) = f.parameters {
            out.extend_from_slice(b",\"parameters\":");
            out.extend_from_slice(p.get().as_bytes());
        }
        if let Some(s) = f.strict {
            out.extend_from_slice(b",\"strict\":");
            out.extend_from_slice(s.get().as_bytes());
        }
        out.extend_from_slice(b"}}");
    }
    out.push(b']');
}

/// `,"tool_choice":…` as the upstream takes it; nothing when there is no tool or no choice.
pub(super) fn write_choice(choice: &Choice, d: &Declared<'_>, out: &mut Vec<u8>) {
    if !d.any_written(choice) {
        return;
    }
    match choice {
        Choice::Unset => {}
        Choice::None => out.extend_from_slice(b",\"tool_choice\":\"none\""),
        Choice::Auto
        | Choice::Allowed {
            required: false, ..
        } => out.extend_from_slice(b",\"tool_choice\":\"auto\""),
        Choice::Required | Choice::Allowed { required: true, .. } => {
            out.extend_from_slice(b",\"tool_choice\":\"required\"")
        }
        Choice::Function(at) => {
            if let Some(f) = d.functions.get(*at) {
                out.extend_from_slice(
                    b",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":",
                );
                write_json_str(out, &f.upstream);
                out.extend_from_slice(b"}}");
            }
        }
    }
}
