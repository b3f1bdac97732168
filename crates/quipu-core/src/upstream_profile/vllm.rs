//! vLLM's OpenAI-compatible server (`vllm serve`): the protocol Quipu speaks natively.
//!
//! - **Usage**: `usage.prompt_tokens` (cached included), `completion_tokens`;
//!   `prompt_tokens_details.cached_tokens` only with `--enable-prompt-tokens-details`;
//!   `completion_tokens_details.reasoning_tokens` with a reasoning parser.
//! - **Streams**: usage only with `stream_options.include_usage` (or
//!   `--enable-force-include-usage`); `continuous_usage_stats: true` adds usage to every chunk
//!   (only together with `include_usage`), and `prompt_tokens_details` rides on the final usage
//!   chunk only.
//! - **Reasoning**: `message.reasoning` / `delta.reasoning` (≥ late 2025; `reasoning_content`
//!   before, removed in 2026-01).
//! - **Counting a prompt**: `POST /tokenize` (server root, not under `/v1`) takes the chat form
//!   (`model`, `messages`, `tools`, `add_generation_prompt`, `continue_final_message`,
//!   `chat_template_kwargs`) and answers `{"count","max_model_len","tokens"}`.
//! - **Errors**: `{"error":{"message","type","param","code":<int>}}` since 0.10.1 (flat
//!   `{"object":"error",…}` before); a context overflow is a 400 `BadRequestError` whose message
//!   quotes the numbers (see `translate::upstream_error::context_numbers`).
//! - **Detection**: `GET /v1/models` cards say `"owned_by": "vllm"`.

/// `owned_by` of its `/v1/models` cards.
/// Its own scheduler's requests running, a Prometheus gauge at `/metrics` (see `load`).
pub const RUNNING_GAUGE: &str = "vllm:num_requests_running";
/// Its own scheduler's requests waiting, a Prometheus gauge at `/metrics` (see `load`).
pub const WAITING_GAUGE: &str = "vllm:num_requests_waiting";

pub const OWNED_BY: &str = "vllm";

/// It honours `stream_options.continuous_usage_stats`.
pub const CONTINUOUS_USAGE: bool = true;

/// Its tokenizer endpoint, relative to the server root.
pub const TOKENIZE_PATH: &str = "/tokenize";

#[cfg(test)]
mod tests {
    use crate::error::{ClientFormat, ErrorKind};
    use crate::usage::usage_of_completion;

    fn map(status: u16, body: &str) -> crate::error::ApiError {
        super::super::mapped(status, body, ClientFormat::Messages)
    }

    #[test]
    fn its_errors_map_to_client_errors() {
        let e = map(
            400,
            r#"{"error":{"message":"This model's maximum context length is 32768 tokens. However, you requested 40000 tokens (39000 in the messages, 1000 in the completion).","type":"BadRequestError","param":null,"code":400}}"#,
        );
        assert_eq!(e.kind, ErrorKind::ContextLengthExceeded);
        assert!(e.message.contains("39000"), "{}", e.message);
        let e = map(
            404,
            r#"{"error":{"message":"The model `Qwen/Qwen3-4B` does not exist.","type":"NotFoundError","param":null,"code":404}}"#,
        );
        assert!(
            !e.message.contains("Qwen"),
            "the upstream name is scrubbed: {}",
            e.message
        );
    }

    #[test]
    fn its_usage_with_cached_and_reasoning_details() {
        let u = usage_of_completion(
            br#"{"choices":[],"usage":{"prompt_tokens":24,"completion_tokens":7,"total_tokens":31,
                "prompt_tokens_details":{"cached_tokens":16},"completion_tokens_details":{"reasoning_tokens":3}}}"#,
        )
        .unwrap();
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (24, 16, 7)
        );
    }
}
