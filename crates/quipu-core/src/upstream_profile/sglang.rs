//! SGLang (`python -m sglang.launch_server`).
//!
//! - **Usage**: like vLLM's; `prompt_tokens_details.cached_tokens` only with
//!   `--enable-cache-report`, and omitted when 0 up to 0.5.21 (absent = 0 cached); a top-level,
//!   non-standard `usage.reasoning_tokens` (and `completion_tokens_details.reasoning_tokens`
//!   from 0.5.23).
//! - **Streams**: usage with `stream_options.include_usage` (or the server's
//!   `--stream-response-default-include-usage`); `continuous_usage_stats` honoured since
//!   0.5.5–0.5.7 (ignored before). Every chunk carries `"usage": null` and deltas
//!   `"reasoning_content": null`.
//! - **Reasoning**: `reasoning_content` only.
//! - **Counting a prompt**: `POST /v1/tokenize` takes the chat form (`messages`, `tools`, …)
//!   since 0.5.12 and answers `{"tokens","count","max_model_len"}` (that `max_model_len` is the
//!   tokenizer's, not the served context). Older versions take text only (400) or lack the
//!   route (404): counting needs 0.5.12 or later.
//! - **Errors**: flat `{"object":"error","message","type","param","code"}` (validation errors are
//!   400, not 422); streamed errors nest it once, `data: {"error":{…}}`. Context overflows say
//!   `The input (N tokens) is longer than the model's context length (C tokens).` or vLLM's
//!   newer wording.
//! - **Detection**: `GET /v1/models` cards say `"owned_by": "sglang"`.

/// `owned_by` of its `/v1/models` cards.
/// Its own scheduler's requests running, a Prometheus gauge at `/metrics` (see `load`).
pub const RUNNING_GAUGE: &str = "sglang:num_running_reqs";
/// Its own scheduler's requests waiting, a Prometheus gauge at `/metrics` (see `load`).
pub const WAITING_GAUGE: &str = "sglang:num_queue_reqs";

pub const OWNED_BY: &str = "sglang";

/// It honours `stream_options.continuous_usage_stats` (versions that do not ignore it).
pub const CONTINUOUS_USAGE: bool = true;

/// Its tokenizer endpoint, relative to the OpenAI API root.
pub const TOKENIZE_PATH: &str = "/tokenize";

#[cfg(test)]
mod tests {
    use crate::error::{ClientFormat, ErrorKind};
    use crate::translate::upstream_error::context_numbers;
    use crate::usage::usage_of_completion;

    #[test]
    fn its_flat_errors_and_overflow_wording() {
        let body = r#"{"object":"error","message":"The input (40000 tokens) is longer than the model's context length (32768 tokens).","type":"BadRequestError","param":null,"code":400}"#;
        let e = super::super::mapped(400, body, ClientFormat::Chat);
        assert_eq!(e.kind, ErrorKind::ContextLengthExceeded);
        let n = context_numbers(
            "The input (40000 tokens) is longer than the model's context length (32768 tokens).",
        );
        assert_eq!((n.input, n.limit), (Some(40000), Some(32768)));
    }

    #[test]
    fn a_missing_cached_count_is_zero_and_reasoning_extras_are_ignored() {
        let u = usage_of_completion(
            br#"{"choices":[],"usage":{"prompt_tokens":516,"completion_tokens":9,"total_tokens":525,"reasoning_tokens":4,"prompt_tokens_details":null}}"#,
        )
        .unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (516, 0, 9)
        );
    }
}
