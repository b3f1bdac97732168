//! Upstream error bodies → client errors (the statuses and types are docs/design.md's "Errors" table).
//!
//! Upstreams disagree on the envelope: vLLM ≥ 0.10.1 nests `{"error":{"message","type","code":<int>}}`,
//! older vLLM and SGLang are flat `{"object":"error","message",…}`, llama.cpp nests with its
//! own `type`s (`exceed_context_size_error` carries `n_prompt_tokens` / `n_ctx`). This module
//! reads all of them and maps status + message to an [`ApiError`]. The upstream's model name
//! is scrubbed from messages: clients only ever see slugs.
//!
//! Context overflows are rewritten into the vendors' exact wording, because clients parse it
//! to recover: Claude Code compacts the conversation on `prompt is too long: N tokens > M
//! maximum` and lowers `max_tokens` on `input length and \`max_tokens\` exceed context
//! limit: P + C > M, …`. So the numbers must mean what the vendor means: N and P are the
//! **input** tokens (never the input + completion total the upstream may quote), C the
//! requested `max_tokens`, M the context window. The input alone leaving no room for output
//! (P ≥ M) is the first message; input + `max_tokens` over the window the second. Chat
//! clients get OpenAI's wording with code `context_length_exceeded`.

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
        let numbers = match (n_prompt, n_ctx) {
            (Some(p), Some(m)) => ContextNumbers {
                input: Some(p),
                completion: None,
                limit: Some(m),
            },
            _ => context_numbers(&message),
        };
        return context_overflow(numbers, format);
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

/// What an upstream context-overflow message says, each number if it says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextNumbers {
    /// Tokens of the prompt (the input alone).
    pub input: Option<u64>,
    /// The `max_tokens` the request asked for.
    pub completion: Option<u64>,
    /// The model's context window.
    pub limit: Option<u64>,
}

/// The context-overflow error in the client's format: the exact text tools parse (see the
/// module docs for what each number means).
pub fn context_overflow(n: ContextNumbers, format: ClientFormat) -> ApiError {
    let message = match (format, n.input, n.completion, n.limit) {
        // The input alone leaves no room for output. A prompt may have at most M − 1 tokens
        // (one is needed for output), so an input of exactly M is reported against M − 1:
        // the comparison printed is always true.
        (ClientFormat::Messages, Some(p), _, Some(m)) if p >= m => format!(
            "prompt is too long: {p} tokens > {} maximum",
            if p > m { m } else { m.saturating_sub(1) }
        ),
        (ClientFormat::Messages, Some(p), Some(c), Some(m)) => format!(
            "input length and `max_tokens` exceed context limit: {p} + {c} > {m}, decrease input length or `max_tokens` and try again"
        ),
        (ClientFormat::Messages, _, _, _) => {
            "prompt is too long: the prompt exceeds the model's context window".to_owned()
        }
        (ClientFormat::Chat, Some(p), _, Some(m)) if p >= m => format!(
            "This model's maximum context length is {m} tokens. However, your messages resulted in {p} tokens. Please reduce the length of the messages."
        ),
        (ClientFormat::Chat, Some(p), Some(c), Some(m)) => format!(
            "This model's maximum context length is {m} tokens. However, you requested {} tokens ({p} in the messages, {c} in the completion). Please reduce the length of the messages or completion.",
            p.saturating_add(c)
        ),
        (ClientFormat::Chat, _, _, _) => {
            "The messages exceed this model's maximum context length. Please reduce the length of the messages.".to_owned()
        }
        // The Responses API's own wording, with the numbers when the upstream gave them.
        (ClientFormat::Responses, Some(p), _, Some(m)) if p >= m => format!(
            "Your input exceeds the context window of this model: {p} input tokens, {m} maximum. Please adjust your input and try again."
        ),
        (ClientFormat::Responses, Some(p), Some(c), Some(m)) => format!(
            "Your input exceeds the context window of this model: {p} input tokens + {c} max_output_tokens > {m}. Please adjust your input or max_output_tokens and try again."
        ),
        (ClientFormat::Responses, _, _, _) => {
            "Your input exceeds the context window of this model. Please adjust your input and try again.".to_owned()
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

/// Pulls the numbers out of the overflow messages vLLM, SGLang and OpenAI-compatible servers
/// have used (their total, "you requested 9001 tokens", is never taken for the input):
///
/// - `maximum context length is M tokens. However, you requested T tokens (P in the messages,
///   C in the completion).` (vLLM < 0.10)
/// - `… However, you requested P tokens in the messages, …` / `your messages resulted in P
///   tokens` / `your request has P input tokens` (input alone)
/// - `'max_tokens' or 'max_completion_tokens' is too large: C. This model's maximum context
///   length is M tokens and your request has P input tokens (C > M - P).`
/// - `… you requested C output tokens and your prompt contains at least P input tokens …`
/// - `… maximum context length of M tokens. You requested a total of T tokens: P tokens from
///   the input messages and C tokens for the completion.` (vLLM ≥ 0.11, SGLang)
/// - `The decoder prompt (length P) is longer than the maximum model length of M.` (vLLM)
/// - `The input (P tokens) is longer than the model's context length (M tokens).` (SGLang)
pub fn context_numbers(m: &str) -> ContextNumbers {
    let l = m.to_ascii_lowercase();
    let digits_at = |s: &str| -> Option<u64> {
        let d: String = s
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        d.parse().ok()
    };
    let after = |needle: &str| -> Option<u64> {
        let i = l.find(needle)? + needle.len();
        digits_at(&l[i..])
    };
    let before = |needle: &str| -> Option<u64> {
        let end = l.find(needle)?;
        let head = l[..end].trim_end();
        let start = head
            .rfind(|c: char| !c.is_ascii_digit())
            .map_or(0, |i| i + 1);
        head[start..].parse().ok()
    };
    let limit = after("maximum context length is")
        .or_else(|| after("maximum context length of"))
        .or_else(|| after("maximum model length of"))
        .or_else(|| after("model's context length ("))
        .or_else(|| after("context length of"));
    let input = before(" in the messages")
        .or_else(|| before(" tokens in the messages"))
        .or_else(|| before(" tokens from the input"))
        .or_else(|| after("your request has"))
        .or_else(|| after("your prompt contains at least"))
        .or_else(|| after("your messages resulted in"))
        .or_else(|| after("(length"))
        .or_else(|| after("the input ("));
    let completion = before(" in the completion")
        .or_else(|| before(" tokens for the completion"))
        .or_else(|| before(" output tokens"))
        .or_else(|| after("is too large:"));
    ContextNumbers {
        input,
        completion,
        limit,
    }
}

/// Replaces the upstream's model name with the slug.
pub(crate) fn scrub(message: &str, upstream_model: &str, slug: &str) -> String {
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

    fn vllm(message: &str) -> String {
        serde_json::json!({"error": {"message": message, "type": "BadRequestError", "param": null, "code": 400}})
            .to_string()
    }

    #[test]
    fn vllm_context_overflow_both_formats() {
        // The input (8000) fits; input + max_tokens (1001) does not. The old translation said
        // "prompt is too long: 8000 tokens > 8192 maximum", which contradicts itself and sends
        // Claude Code to compact instead of lowering max_tokens.
        let body = vllm("This model's maximum context length is 8192 tokens. However, you requested 9001 tokens (8000 in the messages, 1001 in the completion). Please reduce the length of the messages or completion.");
        let e = map(400, &body, ClientFormat::Messages);
        assert_eq!(e.kind, ErrorKind::ContextLengthExceeded);
        assert_eq!(
            e.message,
            "input length and `max_tokens` exceed context limit: 8000 + 1001 > 8192, decrease input length or `max_tokens` and try again"
        );
        assert_eq!(e.kind.messages_type(), "invalid_request_error");
        let e = map(400, &body, ClientFormat::Chat);
        assert_eq!(e.kind.chat_type_code().1, Some("context_length_exceeded"));
        assert_eq!(e.status(ClientFormat::Chat), 400);
        assert_eq!(
            e.message,
            "This model's maximum context length is 8192 tokens. However, you requested 9001 tokens (8000 in the messages, 1001 in the completion). Please reduce the length of the messages or completion."
        );
    }

    #[test]
    fn newer_vllm_and_llamacpp_overflow() {
        // The total (270000) is not the input: 262000 fits the window, the completion does not.
        let body = vllm("Requested token count exceeds the model's maximum context length of 262144 tokens. You requested a total of 270000 tokens: 262000 tokens from the input messages and 8000 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.");
        let e = map(400, &body, ClientFormat::Messages);
        assert_eq!(
            e.message,
            "input length and `max_tokens` exceed context limit: 262000 + 8000 > 262144, decrease input length or `max_tokens` and try again"
        );
        // The same wording with an input over the window.
        let body = vllm("Requested token count exceeds the model's maximum context length of 262144 tokens. You requested a total of 300000 tokens: 292000 tokens from the input messages and 8000 tokens for the completion.");
        let e = map(400, &body, ClientFormat::Messages);
        assert_eq!(
            e.message,
            "prompt is too long: 292000 tokens > 262144 maximum"
        );
        let e = map(400, &body, ClientFormat::Chat);
        assert_eq!(e.message, "This model's maximum context length is 262144 tokens. However, your messages resulted in 292000 tokens. Please reduce the length of the messages.");
        let body = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        let e = map(400, body, ClientFormat::Messages);
        assert_eq!(e.message, "prompt is too long: 5000 tokens > 4096 maximum");
    }

    #[test]
    fn every_known_overflow_wording_gives_input_completion_and_limit() {
        let too_long = |p: u64, m: u64| format!("prompt is too long: {p} tokens > {m} maximum");
        let exceed = |p: u64, c: u64, m: u64| {
            format!("input length and `max_tokens` exceed context limit: {p} + {c} > {m}, decrease input length or `max_tokens` and try again")
        };
        for (upstream, want) in [
            ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the messages, Please reduce the length of the messages.", too_long(5000, 4096)),
            ("This model's maximum context length is 4096 tokens. However, your messages resulted in 4500 tokens. Please reduce the length of the messages.", too_long(4500, 4096)),
            ("This model's maximum context length is 4096 tokens. However, your request has 6000 input tokens. Please reduce the length of the input messages.", too_long(6000, 4096)),
            ("'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None", exceed(2778, 8000, 4096)),
            ("This model's maximum context length is 4096 tokens. However, you requested 5000 output tokens and your prompt contains at least 100 input tokens, for a total of at least 5100 tokens. Please reduce the length of the input prompt or the number of requested output tokens.", exceed(100, 5000, 4096)),
            ("The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens.", too_long(9000, 8192)),
            ("The input (70000 tokens) is longer than the model's context length (65536 tokens).", too_long(70000, 65536)),
            // Exactly the window: no room for one output token; the printed limit stays true.
            ("This model's maximum context length is 4096 tokens. However, your request has 4096 input tokens. Please reduce the length of the input messages.", too_long(4096, 4095)),
            // No numbers at all.
            ("Input exceeds the maximum context length.", "prompt is too long: the prompt exceeds the model's context window".to_owned()),
        ] {
            let e = map(400, &vllm(upstream), ClientFormat::Messages);
            assert_eq!(e.kind, ErrorKind::ContextLengthExceeded, "{upstream}");
            assert_eq!(e.message, want, "{upstream}");
            let chat = map(400, &vllm(upstream), ClientFormat::Chat);
            assert_eq!(chat.kind.chat_type_code().1, Some("context_length_exceeded"));
        }
        // SGLang's flat envelope.
        let flat = r#"{"object":"error","message":"The input (70000 tokens) is longer than the model's context length (65536 tokens).","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(
            map(400, flat, ClientFormat::Messages).message,
            too_long(70000, 65536)
        );
        // Huge numbers do not overflow the chat total.
        let n = context_numbers(&format!("maximum context length is 10 tokens. However, you requested 1 tokens ({} in the messages, {} in the completion).", u64::MAX - 1, 5));
        assert_eq!(n.input, Some(u64::MAX - 1));
        let e = context_overflow(
            ContextNumbers {
                input: Some(3),
                completion: Some(u64::MAX),
                limit: Some(10),
            },
            ClientFormat::Chat,
        );
        assert!(e.message.contains(&u64::MAX.to_string()), "{}", e.message);
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
