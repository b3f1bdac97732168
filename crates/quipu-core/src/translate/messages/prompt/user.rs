//! User messages: tool results first (one `tool` message each, images they return in a
//! `user` message after them), then the remaining text, image and document blocks in order.

use super::{
    block_kind, invalid, parse_object, parse_objects, req_str, sep, string_or_blocks, Kind, Writer,
};
use crate::config::ImageUrlPolicy;
use crate::error::{write_json_str, ApiError};
use crate::protocol::anthropic::{AnthropicBlock, AnthropicSource};
use crate::translate::base64::is_base64;
use crate::translate::common::images::check_vision;
use crate::translate::common::rawjson::{self, is_array, is_string};
use crate::translate::image_url::{check_image_url, ImageUrlRejection};
use serde_json::value::RawValue;

impl<'a> Writer<'_, 'a> {
    fn check_vision(&self, param: &dyn Fn() -> String) -> Result<(), ApiError> {
        check_vision(self.model, self.config, self.client_model, param)
    }

    /// An `image` block → an `image_url` part.
    fn write_image(
        &self,
        b: &AnthropicBlock<'_>,
        param: &dyn Fn() -> String,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        self.check_vision(param)?;
        let sp = || format!("{}.source", param());
        let raw = b.source.ok_or_else(|| invalid(sp(), "is required"))?;
        let src: AnthropicSource<'_> = parse_object(raw, &sp, "an image source object")?;
        let kind = req_str(src.kind, &|| format!("{}.type", sp()))?;
        if rawjson::str_eq(kind, "base64") {
            let mt = req_str(src.media_type, &|| format!("{}.media_type", sp()))?;
            let media = ["image/jpeg", "image/png", "image/gif", "image/webp"]
                .into_iter()
                .find(|m| rawjson::str_eq(mt, m))
                .ok_or_else(|| {
                    invalid(
                        format!("{}.media_type", sp()),
                        format!(
                            "unsupported image type {}; use image/jpeg, image/png, image/gif or image/webp",
                            mt.get()
                        ),
                    )
                })?;
            let data_raw = req_str(src.data, &|| format!("{}.data", sp()))?;
            let data = rawjson::decode(data_raw).unwrap_or_default();
            if !is_base64(data.as_bytes()) {
                return Err(invalid(
                    format!("{}.data", sp()),
                    "is not valid base64 image data",
                ));
            }
            out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:");
            out.extend_from_slice(media.as_bytes());
            out.extend_from_slice(b";base64,");
            out.extend_from_slice(data.as_bytes());
            out.extend_from_slice(b"\"}}");
            Ok(())
        } else if rawjson::str_eq(kind, "url") {
            let policy = self.config.security.image_urls;
            if policy == ImageUrlPolicy::Reject {
                return Err(invalid(
                    format!("{}.type", sp()),
                    ImageUrlRejection::NotAccepted.message(),
                ));
            }
            let url_raw = req_str(src.url, &|| format!("{}.url", sp()))?;
            let url = rawjson::decode(url_raw).unwrap_or_default();
            if let Err(e) = check_image_url(&url, policy) {
                return Err(invalid(format!("{}.url", sp()), e.message()));
            }
            out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":");
            write_json_str(out, &url);
            out.extend_from_slice(b"}}");
            Ok(())
        } else {
            Err(invalid(
                format!("{}.type", sp()),
                format!(
                    "unsupported image source type {}; use \"base64\" or \"url\"",
                    kind.get()
                ),
            ))
        }
    }

    /// A `document` block with a plain-text source → its text (other sources cannot reach a
    /// chat-completions upstream).
    fn document_text<'b>(
        &self,
        b: &AnthropicBlock<'b>,
        param: &dyn Fn() -> String,
    ) -> Result<&'b RawValue, ApiError> {
        let sp = || format!("{}.source", param());
        let raw = b.source.ok_or_else(|| invalid(sp(), "is required"))?;
        let src: AnthropicSource<'b> = parse_object(raw, &sp, "a document source object")?;
        let kind = req_str(src.kind, &|| format!("{}.type", sp()))?;
        if !rawjson::str_eq(kind, "text") {
            return Err(invalid(
                format!("{}.type", sp()),
                format!(
                    "document source {} is not supported; only plain-text documents (source type \"text\") are",
                    kind.get()
                ),
            ));
        }
        req_str(src.data, &|| format!("{}.data", sp()))
    }

    pub(super) fn write_user(
        &mut self,
        content: &'a RawValue,
        i: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let Some(blocks) = string_or_blocks(out, "user", content, i)? else {
            return Ok(());
        };
        if blocks.is_empty() {
            return Err(invalid(
                format!("messages[{i}].content"),
                "must contain at least one content block",
            ));
        }
        let mut kinds = Vec::with_capacity(blocks.len());
        for (j, b) in blocks.iter().enumerate() {
            let bp = || format!("messages[{i}].content[{j}]");
            let k = block_kind(b, &bp)?;
            match k {
                Kind::ToolUse | Kind::Thinking | Kind::RedactedThinking => {
                    return Err(invalid(
                        format!("{}.type", bp()),
                        format!("{} blocks belong in assistant messages", k.name()),
                    ))
                }
                Kind::ToolReference => {
                    return Err(invalid(
                        format!("{}.type", bp()),
                        "tool_reference blocks belong inside a tool_result",
                    ))
                }
                _ => kinds.push(k),
            }
        }

        // 1. One `tool` message per tool_result, in block order.
        let mut result_images: Vec<(usize, usize, AnthropicBlock<'a>)> = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            if kinds[j] == Kind::ToolResult {
                self.write_tool_result(b, i, j, &mut result_images, out)?;
            }
        }
        // 2. Images returned by tools, which the `tool` role cannot carry.
        if !result_images.is_empty() {
            sep(out);
            out.extend_from_slice(b"{\"role\":\"user\",\"content\":[");
            for (j, k, img) in &result_images {
                sep(out);
                self.write_image(
                    img,
                    &|| format!("messages[{i}].content[{j}].content[{k}]"),
                    out,
                )?;
            }
            out.extend_from_slice(b"]}");
        }
        // 3. The rest, in order.
        let rest = kinds.iter().filter(|k| **k != Kind::ToolResult).count();
        if rest == 0 {
            return Ok(());
        }
        sep(out);
        out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
        if rest == 1 {
            if let Some(j) = kinds.iter().position(|k| *k == Kind::Text) {
                let text = req_str(blocks[j].text, &|| {
                    format!("messages[{i}].content[{j}].text")
                })?;
                out.extend_from_slice(text.get().as_bytes());
                out.push(b'}');
                return Ok(());
            }
        }
        out.push(b'[');
        for (j, b) in blocks.iter().enumerate() {
            let bp = || format!("messages[{i}].content[{j}]");
            let text = match kinds[j] {
                Kind::ToolResult => continue,
                Kind::Image => {
                    sep(out);
                    self.write_image(b, &bp, out)?;
                    continue;
                }
                Kind::Document => self.document_text(b, &bp)?,
                _ => req_str(b.text, &|| format!("{}.text", bp()))?,
            };
            sep(out);
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
            out.extend_from_slice(text.get().as_bytes());
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
        Ok(())
    }

    /// `{"role":"tool","tool_call_id":…,"content":"…"}`: text parts joined with `"\n"`, each
    /// image as `[image]` (the image itself goes in the following user message), prefixed with
    /// `[tool error] ` when `is_error` is true.
    fn write_tool_result(
        &mut self,
        b: &AnthropicBlock<'a>,
        i: usize,
        j: usize,
        images: &mut Vec<(usize, usize, AnthropicBlock<'a>)>,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let bp = |f: &str| format!("messages[{i}].content[{j}].{f}");
        let id_raw = req_str(b.tool_use_id, &|| bp("tool_use_id"))?;
        let id = rawjson::decode(id_raw).unwrap_or_default();
        if !self.open_ids.contains(&id) {
            return Err(invalid(
                bp("tool_use_id"),
                format!(
                    "unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                ),
            ));
        }
        let is_error = match b.is_error {
            None => false,
            Some(r) => match r.get() {
                "true" => true,
                "false" => false,
                _ => return Err(invalid(bp("is_error"), "must be true or false")),
            },
        };
        sep(out);
        out.extend_from_slice(b"{\"role\":\"tool\",\"tool_call_id\":");
        out.extend_from_slice(id_raw.get().as_bytes());
        out.extend_from_slice(b",\"content\":\"");
        if is_error {
            out.extend_from_slice(b"[tool error] ");
        }
        match b.content {
            None => {}
            Some(c) if is_string(c) => out.extend_from_slice(rawjson::inner(c).as_bytes()),
            Some(c) if is_array(c) => {
                let cp = || bp("content");
                let parts: Vec<AnthropicBlock<'a>> = parse_objects(c, &cp, "content blocks")?;
                let mut first = true;
                for (k, part) in parts.into_iter().enumerate() {
                    let pp = || format!("{}[{k}]", cp());
                    let piece: &[u8] = match block_kind(&part, &pp)? {
                        Kind::Text => {
                            rawjson::inner(req_str(part.text, &|| format!("{}.text", pp()))?)
                                .as_bytes()
                        }
                        Kind::Document => rawjson::inner(self.document_text(&part, &pp)?).as_bytes(),
                        Kind::Image => {
                            self.check_vision(&pp)?;
                            images.push((j, k, part));
                            b"[image]"
                        }
                        Kind::ToolReference => {
                            let name = req_str(part.tool_name, &|| format!("{}.tool_name", pp()))?;
                            if !first {
                                out.extend_from_slice(b"\\n");
                            }
                            first = false;
                            out.extend_from_slice(b"[tool_reference] ");
                            out.extend_from_slice(rawjson::inner(name).as_bytes());
                            continue;
                        }
                        other => {
                            return Err(invalid(
                                format!("{}.type", pp()),
                                format!(
                                    "{} blocks cannot appear inside a tool_result; use text or image blocks",
                                    other.name()
                                ),
                            ))
                        }
                    };
                    if !first {
                        out.extend_from_slice(b"\\n");
                    }
                    first = false;
                    out.extend_from_slice(piece);
                }
            }
            Some(_) => {
                return Err(invalid(
                    bp("content"),
                    "must be a string or an array of content blocks",
                ))
            }
        }
        out.extend_from_slice(b"\"}");
        Ok(())
    }
}
