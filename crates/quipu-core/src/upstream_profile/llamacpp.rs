//! llama.cpp's `llama-server`.
//!
//! - **Usage**: `prompt_tokens` is the whole prompt, cached included; newer builds report
//!   `prompt_tokens_details.cached_tokens`, and every build sends a `timings` object whose
//!   `cache_n` is the cached count — older builds report it nowhere else, so [`Timings`] is read
//!   as the fallback (see [`crate::usage`]).
//! - **Streams**: usage only with `stream_options.include_usage`, as a last `choices: []`
//!   chunk; `timings` rides on the last chunk even without it. `continuous_usage_stats` is
//!   accepted and ignored, so a cut stream is metered from the chunks Quipu relayed.
//! - **Reasoning**: `reasoning_content` (`--reasoning-format`).
//! - **Counting a prompt**: `POST {api}/chat/completions/input_tokens` takes the chat body and
//!   answers `{"input_tokens":N}` (recent builds); older builds render the prompt with
//!   `POST /apply-template` (`{"prompt"}`, without BOS) and count it with `POST /tokenize`
//!   (`{"content", "add_special": true, "parse_special": true}` → `{"tokens":[…]}`, no count).
//!   `/tokenize` answers a body without `content` — vLLM's chat form — with `{"tokens":[]}` and a
//!   200, a silent zero, so it is never sent that form.
//! - **Errors**: `{"error":{"code":<int>,"message","type"}}`; a context overflow is a 400 of
//!   type `exceed_context_size_error` carrying `n_prompt_tokens` and `n_ctx` (per slot). Invalid
//!   JSON and an image for a text-only model are 500 `server_error`.
//! - **Detection**: `GET /v1/models` cards say `"owned_by": "llamacpp"`; only llama.cpp has
//!   `GET /props`.

use serde::Deserialize;

/// `owned_by` of its `/v1/models` cards.
/// Its own scheduler's requests running, a Prometheus gauge at `/metrics` (see `load`).
pub const RUNNING_GAUGE: &str = "llamacpp:requests_processing";
/// Its own scheduler's requests waiting, a Prometheus gauge at `/metrics` (see `load`).
pub const WAITING_GAUGE: &str = "llamacpp:requests_deferred";

pub const OWNED_BY: &str = "llamacpp";

/// It ignores `continuous_usage_stats`: not sent.
pub const CONTINUOUS_USAGE: bool = false;

/// Counts a chat body's prompt, relative to the OpenAI API root.
pub const INPUT_TOKENS_PATH: &str = "/chat/completions/input_tokens";
/// Renders a chat body's prompt, relative to the server root.
pub const APPLY_TEMPLATE_PATH: &str = "/apply-template";
/// Tokenizes text, relative to the server root.
pub const TOKENIZE_PATH: &str = "/tokenize";

/// llama.cpp's `timings` object: only `cache_n` (the cached prompt tokens) matters.
#[derive(Debug, Default, Deserialize)]
pub struct Timings {
    #[serde(default)]
    pub cache_n: Option<u64>,
}

#[cfg(test)]
mod tests {
    use crate::error::{ClientFormat, ErrorKind};
    use crate::usage::usage_of_completion;

    #[test]
    fn its_context_error_carries_the_numbers() {
        let body = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        let e = super::super::mapped(400, body, ClientFormat::Messages);
        assert_eq!(e.kind, ErrorKind::ContextLengthExceeded);
        assert!(e.message.contains("5000 tokens > 4096"), "{}", e.message);
    }

    #[test]
    fn cached_tokens_from_timings_when_usage_lacks_them() {
        let u = usage_of_completion(
            br#"{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":5},"timings":{"cache_n":12,"prompt_n":18}}"#,
        )
        .unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens), (30, 12));
        // Newer builds: the usage's own field wins.
        let u = usage_of_completion(
            br#"{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":29}},"timings":{"cache_n":12}}"#,
        )
        .unwrap();
        assert_eq!(u.cached_tokens, 29);
    }
}
