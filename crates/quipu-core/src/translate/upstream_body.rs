//! The parts of an upstream request body that every request translator writes alike: the
//! opening `{"model":…`, a model's reasoning switch, and the end (how the prompt ends,
//! `stream`, `stream_options`, the closing brace).
//!
//! Chat, messages and count-tokens requests each write their own fields in between; what the
//! upstream server needs to hear the same way from all three is written here, once, so the
//! three bodies cannot drift apart. What is asked of the upstream depends only on the
//! [`Model`] for now (`continuous_usage`, `prefill`); taking the model, not its switches, keeps
//! room for an upstream-server profile later.
//!
//! Body shapes (`…` is the caller's part):
//! - chat completions: `{"model":M,…,"stream":S[,"stream_options":{"include_usage":true
//!   [,"continuous_usage_stats":true]}]}`, the options only when streaming, the usage stats
//!   only for a model with `continuous_usage`;
//! - a prompt ending in an assistant turn to continue, on a model with `prefill`: `…,
//!   "continue_final_message":true,"add_generation_prompt":false` before `stream`;
//! - tokenize (`/tokenize`, chat form): `{"model":M,…,"add_generation_prompt":true}`, or the
//!   prefill pair above instead of it, so a count matches what a create call sends.

use crate::config::Model;
use crate::error::{write_json_str, ApiError, ErrorKind};
use serde_json::{Map, Value};

/// Which upstream endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/chat/completions`, streamed or not.
    ChatCompletions { stream: bool },
    /// `/tokenize` in its chat form: no generation, the generation prompt said explicitly.
    Tokenize,
}

/// Starts the body: `{"model":"<the upstream's name for the model>"`. The caller's fields
/// follow, the first one after a `,`.
pub fn open(out: &mut Vec<u8>, model: &Model) {
    out.extend_from_slice(b"{\"model\":");
    write_json_str(out, &model.upstream_model);
}

/// Merges a reasoning switch (a model's `thinking_on` or `thinking_off` keys) into the body,
/// each key as `,"key":value`. `None` writes nothing.
pub fn write_switch(
    out: &mut Vec<u8>,
    switch: Option<&Map<String, Value>>,
) -> Result<(), ApiError> {
    for (k, v) in switch.into_iter().flatten() {
        out.push(b',');
        write_json_str(out, k);
        out.push(b':');
        serde_json::to_writer(&mut *out, v)
            .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    }
    Ok(())
}

/// A client's reasoning request, as the chat format and the Responses API both take it:
/// `on` (reasoning asked on or off, `None` when the client said neither) merges the model's
/// `thinking_on` / `thinking_off` keys, and an effort of `low`, `medium` or `high` is passed on
/// as `reasoning_effort` (vLLM's and SGLang's field; other efforts only switch reasoning).
pub fn write_reasoning(
    out: &mut Vec<u8>,
    model: &Model,
    on: Option<bool>,
    effort: Option<&str>,
) -> Result<(), ApiError> {
    let switch = match on {
        Some(true) => model.thinking_on.as_ref(),
        Some(false) => model.thinking_off.as_ref(),
        None => None,
    };
    write_switch(out, switch)?;
    if let Some(e @ ("low" | "medium" | "high")) = effort {
        out.extend_from_slice(b",\"reasoning_effort\":");
        write_json_str(out, e);
    }
    Ok(())
}

/// Ends the body for `endpoint`. `continue_final`: the prompt ends with an assistant message
/// the model should continue (a messages-format prefill); honoured on models whose `prefill`
/// switch is on.
pub fn close(out: &mut Vec<u8>, model: &Model, endpoint: Endpoint, continue_final: bool) {
    if continue_final && model.prefill {
        out.extend_from_slice(b",\"continue_final_message\":true,\"add_generation_prompt\":false");
    } else if endpoint == Endpoint::Tokenize {
        out.extend_from_slice(b",\"add_generation_prompt\":true");
    }
    if let Endpoint::ChatCompletions { stream } = endpoint {
        out.extend_from_slice(b",\"stream\":");
        out.extend_from_slice(if stream { b"true" } else { b"false" });
        if stream {
            out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true");
            if model.continuous_usage {
                out.extend_from_slice(b",\"continuous_usage_stats\":true");
            }
            out.push(b'}');
        }
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, EMBEDDED_DEFAULT};

    fn body(model: &Model, endpoint: Endpoint, continue_final: bool) -> String {
        let mut out = Vec::new();
        open(&mut out, model);
        out.extend_from_slice(b",\"messages\":[]");
        close(&mut out, model, endpoint, continue_final);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_ending() {
        let c = Config::parse(EMBEDDED_DEFAULT, "t").unwrap();
        let mut m = c.models[0].clone();
        m.upstream_model = "Q/\"x\"".into();
        let (chat, tok) = (
            |stream| Endpoint::ChatCompletions { stream },
            Endpoint::Tokenize,
        );
        let head = r#"{"model":"Q/\"x\"","messages":[]"#;
        let prefill = r#","continue_final_message":true,"add_generation_prompt":false"#;
        let usage = r#","stream_options":{"include_usage":true,"continuous_usage_stats":true}"#;
        m.continuous_usage = true;
        m.prefill = true;
        assert_eq!(
            body(&m, chat(false), false),
            format!(r#"{head},"stream":false}}"#)
        );
        assert_eq!(
            body(&m, chat(true), false),
            format!(r#"{head},"stream":true{usage}}}"#)
        );
        assert_eq!(
            body(&m, chat(true), true),
            format!(r#"{head}{prefill},"stream":true{usage}}}"#)
        );
        assert_eq!(
            body(&m, tok, false),
            format!(r#"{head},"add_generation_prompt":true}}"#)
        );
        assert_eq!(body(&m, tok, true), format!("{head}{prefill}}}"));
        m.continuous_usage = false;
        m.prefill = false;
        assert_eq!(
            body(&m, chat(true), true),
            format!(r#"{head},"stream":true,"stream_options":{{"include_usage":true}}}}"#)
        );
        assert_eq!(
            body(&m, tok, true),
            format!(r#"{head},"add_generation_prompt":true}}"#)
        );
    }

    #[test]
    fn switches_are_merged_key_by_key() {
        // Keys in order already: serde_json maps may keep insertion order or sort.
        let mut out = Vec::new();
        write_switch(&mut out, None).unwrap();
        assert!(out.is_empty());
        let switch: Map<String, Value> =
            serde_json::from_str(r#"{"a":1,"chat_template_kwargs":{"enable_thinking":true}}"#)
                .unwrap();
        write_switch(&mut out, Some(&switch)).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#","a":1,"chat_template_kwargs":{"enable_thinking":true}"#
        );
    }
}
