//! Upstream error bodies → client errors (reference §4.7 and DESIGN.md "Errors").
//!
//! Upstreams disagree on the envelope: vLLM ≥ 0.10.1 nests `{"error":{"message","type","code":<int>}}`,
//! older vLLM and SGLang are flat `{"object":"error","message",…}`, llama.cpp nests with its
//! own `type`s (`exceed_context_size_error` carries `n_prompt_tokens` / `n_ctx`). This module
//! reads all of them and maps status + message to an [`ApiError`]. The upstream's model name
//! is scrubbed from messages: clients only ever see slugs.

use crate::error::{ApiError, ClientFormat, ErrorKind};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
struct Envelope {
    #[serde(default)]
    error: Option<ErrorFields>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorFields {
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    n_prompt_tokens: Option<u64>,
    #[serde(default)]
    n_ctx: Option<u64>,
}

/// What the client is told when the upstream answered `status` with `body` (or sent `body` as
/// a mid-stream `{"error":…}` object, with `status` 500 unless the object says otherwise).
pub struct UpstreamFailure<'a> {
    pub status: u16,
    pub body: &'a [u8],
    /// Seconds from the upstream's `retry-after`, if it sent one.
    pub retry_after: Option<u64>,
    pub upstream_model: &'a str,
    pub slug: &'a str,
}

/// Maps an upstream failure to the client's error in `format`.
pub fn map_upstream_error(f: &UpstreamFailure<'_>, format: ClientFormat) -> ApiError {
    let env: Envelope = serde_json::from_slice(f.body).unwrap_or_default();
    let (message, kind, n_prompt, n_ctx) = match env.error {
        Some(e) => (e.message, e.kind, e.n_prompt_tokens, e.n_ctx),
        None => (env.message, env.kind, None, None),
    };
    let message = message
        .map(|m| scrub(&m, f.upstream_model, f.slug))
        .unwrap_or_default();
    let is_overflow = kind.as_deref() == Some("exceed_context_size_error")
        || looks_like_context_overflow(&message);
    if (f.status == 400 || f.status == 413 || f.status == 422) && is_overflow {
        let (prompt, max) = match (n_prompt, n_ctx) {
            (Some(p), Some(m)) => (Some(p), Some(m)),
            _ => context_numbers(&message),
        };
        return context_overflow(prompt, max, format);
    }
    let fallback = |what: &str| {
        if message.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {message}")
        }
    };
    match f.status {
        400 | 422 => ApiError::new(
            ErrorKind::InvalidRequest { param: None },
            if message.is_empty() {
                "the upstream rejected the request".to_owned()
            } else {
                message.clone()
            },
        ),
        413 => ApiError::new(ErrorKind::RequestTooLarge, fallback("request too large")),
        429 => ApiError::new(
            ErrorKind::RateLimited {
                retry_after: f.retry_after.unwrap_or(1),
            },
            "the model is busy; retry shortly".to_owned(),
        ),
        503 => ApiError::new(
            ErrorKind::Overloaded {
                retry_after: f.retry_after.unwrap_or(1),
            },
            "the model is overloaded or starting; retry shortly".to_owned(),
        ),
        504 => ApiError::new(ErrorKind::UpstreamTimeout, "the model did not answer in time"),
        401 | 403 => ApiError::new(
            ErrorKind::Upstream,
            "the model server refused the gateway; the operator must check the upstream credentials",
        ),
        404 => ApiError::new(
            ErrorKind::Upstream,
            "the model server does not serve this model; the operator must check the configuration",
        ),
        _ => {
            // The upstream's own words may name internals (engine state, paths): log them for
            // the operator, tell the client only what happened.
            if !message.is_empty() {
                log::warn!("upstream answered {}: {message}", f.status);
            }
            ApiError::new(
                ErrorKind::Upstream,
                format!("the model server failed (status {}); retry shortly", f.status),
            )
        }
    }
}

/// The context-overflow error in the client's format: the exact text tools parse.
pub fn context_overflow(prompt: Option<u64>, max: Option<u64>, format: ClientFormat) -> ApiError {
    let message = match (format, prompt, max) {
        (ClientFormat::Messages, Some(p), Some(m)) => {
            format!("prompt is too long: {p} tokens > {m} maximum")
        }
        (ClientFormat::Messages, _, _) => {
            "prompt is too long: the prompt exceeds the model's context window".to_owned()
        }
        (ClientFormat::Chat, Some(p), Some(m)) => format!(
            "This model's maximum context length is {m} tokens. However, your messages resulted in {p} tokens. Please reduce the length of the messages."
        ),
        (ClientFormat::Chat, _, _) => {
            "The messages exceed this model's maximum context length. Please reduce the length of the messages.".to_owned()
        }
    };
    ApiError::new(ErrorKind::ContextLengthExceeded, message)
}

fn looks_like_context_overflow(m: &str) -> bool {
    let l = m.to_ascii_lowercase();
    l.contains("maximum context length")
        || l.contains("context length")
        || l.contains("maximum model length")
        || l.contains("exceeds the available context size")
        || l.contains("context window")
}

/// Pulls (prompt tokens, maximum) out of the message formats vLLM has used.
fn context_numbers(m: &str) -> (Option<u64>, Option<u64>) {
    let l = m.to_ascii_lowercase();
    let after = |needle: &str| -> Option<u64> {
        let i = l.find(needle)? + needle.len();
        let digits: String = l[i..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    };
    let max = after("maximum context length is")
        .or_else(|| after("maximum context length of"))
        .or_else(|| after("maximum model length of"))
        .or_else(|| after("context length of"));
    let prompt = after("(length")
        .or_else(|| after("however, you requested"))
        .or_else(|| after("requested a total of"))
        .or_else(|| after("your messages resulted in"))
        .or_else(|| after("you requested"));
    // "you requested 9001 tokens (8000 in the messages, 1001 in the completion)": the prompt
    // is the part in the messages.
    let in_messages = l.find(" in the messages").and_then(|end| {
        let start = l[..end].rfind('(')? + 1;
        l[start..end].trim().parse::<u64>().ok()
    });
    (in_messages.or(prompt), max)
}

/// Replaces the upstream's model name with the slug.
fn scrub(message: &str, upstream_model: &str, slug: &str) -> String {
    if upstream_model.is_empty() {
        message.to_owned()
    } else {
        message.replace(upstream_model, slug)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(status: u16, body: &str, format: ClientFormat) -> ApiError {
        map_upstream_error(
            &UpstreamFailure {
                status,
                body: body.as_bytes(),
                retry_after: None,
                upstream_model: "Qwen/Qwen3-4B",
                slug: "colibri",
            },
            format,
        )
    }

    #[test]
    fn vllm_context_overflow_both_formats() {
        let body = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 9001 tokens (8000 in the messages, 1001 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}}"#;
        let e = map(400, body, ClientFormat::Messages);
        assert_eq!(e.kind, ErrorKind::ContextLengthExceeded);
        assert_eq!(e.message, "prompt is too long: 8000 tokens > 8192 maximum");
        let e = map(400, body, ClientFormat::Chat);
        assert_eq!(e.kind.chat_type_code().1, Some("context_length_exceeded"));
        assert!(e.message.contains("8192"));
    }

    #[test]
    fn newer_vllm_and_llamacpp_overflow() {
        let body = r#"{"error":{"message":"Requested token count exceeds the model's maximum context length of 262144 tokens. You requested a total of 270000 tokens: 262000 tokens from the input messages and 8000 tokens for the completion.","type":"BadRequestError","code":400}}"#;
        let e = map(400, body, ClientFormat::Messages);
        assert_eq!(
            e.message,
            "prompt is too long: 270000 tokens > 262144 maximum"
        );
        let body = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        let e = map(400, body, ClientFormat::Messages);
        assert_eq!(e.message, "prompt is too long: 5000 tokens > 4096 maximum");
    }

    #[test]
    fn flat_envelope_and_model_scrubbing() {
        let body = r#"{"object":"error","message":"The model `Qwen/Qwen3-4B` does not support tools","type":"BadRequestError","code":400}"#;
        let e = map(400, body, ClientFormat::Chat);
        assert_eq!(e.message, "The model `colibri` does not support tools");
        assert!(!e.message.contains("Qwen"));
    }

    #[test]
    fn status_mapping() {
        assert_eq!(
            map(503, "", ClientFormat::Messages).status(ClientFormat::Messages),
            529
        );
        assert_eq!(
            map(503, "", ClientFormat::Chat).status(ClientFormat::Chat),
            503
        );
        assert_eq!(
            map(429, "{}", ClientFormat::Chat).status(ClientFormat::Chat),
            429
        );
        assert_eq!(
            map(500, "oops", ClientFormat::Chat).status(ClientFormat::Chat),
            502
        );
        assert_eq!(
            map(504, "", ClientFormat::Chat).status(ClientFormat::Chat),
            504
        );
        let e = map(
            404,
            r#"{"error":{"message":"The model `Qwen/Qwen3-4B` does not exist."}}"#,
            ClientFormat::Chat,
        );
        assert_eq!(e.kind, ErrorKind::Upstream);
        assert!(!e.message.contains("Qwen"));
    }
}
