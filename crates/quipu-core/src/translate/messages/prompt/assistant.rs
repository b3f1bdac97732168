//! Assistant messages: text joined into `content`, `thinking` into `reasoning`, `tool_use`
//! blocks into `tool_calls` (inputs compacted into the `arguments` string); a final one with
//! text is a prefill.

use super::{
    block_kind, invalid, req_name, req_str, sep, string_or_blocks, write_joined, Kind, Writer,
};
use crate::error::{write_json_str, ApiError};
use crate::translate::common::rawjson::{self, is_object, is_string};
use serde_json::value::RawValue;

impl<'a> Writer<'_, 'a> {
    pub(super) fn write_assistant(
        &mut self,
        content: &'a RawValue,
        i: usize,
        is_last: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let Some(blocks) = string_or_blocks(out, "assistant", content, i)? else {
            self.prefill = is_last && !rawjson::str_is_empty(content);
            return Ok(());
        };
        if blocks.is_empty() && !is_last {
            return Err(invalid(
                format!("messages[{i}].content"),
                "must contain at least one content block",
            ));
        }
        let mut kinds = Vec::with_capacity(blocks.len());
        let mut texts = Vec::new();
        let mut thoughts = Vec::new();
        let mut calls = 0usize;
        for (j, b) in blocks.iter().enumerate() {
            let bp = |f: &str| format!("messages[{i}].content[{j}].{f}");
            let k = block_kind(b, &|| format!("messages[{i}].content[{j}]"))?;
            match k {
                Kind::Text => texts.push(req_str(b.text, &|| bp("text"))?),
                Kind::Thinking => {
                    thoughts.push(req_str(b.thinking, &|| bp("thinking"))?);
                    if b.signature.is_some_and(|s| !is_string(s)) {
                        return Err(invalid(bp("signature"), "must be a string"));
                    }
                }
                Kind::RedactedThinking => {}
                Kind::ToolUse => {
                    let id = req_name(b.id, &|| bp("id"))?;
                    req_name(b.name, &|| bp("name"))?;
                    match b.input {
                        Some(inp) if is_object(inp) => {}
                        Some(_) => return Err(invalid(bp("input"), "must be an object")),
                        None => return Err(invalid(bp("input"), "is required")),
                    }
                    self.open_ids.push(id);
                    calls += 1;
                }
                other => {
                    return Err(invalid(
                        bp("type"),
                        format!(
                            "{} blocks cannot appear in assistant messages",
                            other.name()
                        ),
                    ))
                }
            }
            kinds.push(k);
        }
        sep(out);
        out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
        if !write_joined(out, b"\"", b"", texts.iter().copied()) {
            out.extend_from_slice(if calls > 0 { b"null" } else { b"\"\"" });
        } else {
            out.push(b'"');
            self.prefill = is_last;
        }
        if write_joined(out, b",\"reasoning\":\"", b"", thoughts.iter().copied()) {
            out.push(b'"');
        }
        if calls > 0 {
            out.extend_from_slice(b",\"tool_calls\":[");
            for (j, b) in blocks.iter().enumerate() {
                if kinds[j] != Kind::ToolUse {
                    continue;
                }
                let (Some(id), Some(name_raw), Some(input)) = (b.id, b.name, b.input) else {
                    continue;
                };
                sep(out);
                out.extend_from_slice(b"{\"id\":");
                out.extend_from_slice(id.get().as_bytes());
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                let name = rawjson::decode(name_raw).unwrap_or_default();
                let upstream = self.names.upstream(&name);
                write_json_str(out, &upstream);
                out.extend_from_slice(b",\"arguments\":\"");
                if !rawjson::write_compact_escaped(out, input.get()) {
                    return Err(invalid(
                        format!("messages[{i}].content[{j}].input"),
                        "is nested too deeply",
                    ));
                }
                out.extend_from_slice(b"\"}}");
            }
            out.push(b']');
        }
        out.push(b'}');
        Ok(())
    }
}
