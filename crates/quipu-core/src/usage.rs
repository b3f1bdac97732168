//! Token usage: one internal type, and where each protocol's fields come from.
//!
//! Quipu meters in the upstream's (OpenAI) semantics, where the prompt count **includes** the
//! cached tokens. Every other count is derived here and nowhere else:
//!
//! | internal | upstream (vLLM / SGLang / llama.cpp) | chat client | messages client |
//! |---|---|---|---|
//! | `prompt_tokens` | `usage.prompt_tokens` | `prompt_tokens` | `input_tokens + cache_read_input_tokens` |
//! | `cached_tokens` | `usage.prompt_tokens_details.cached_tokens`, else llama.cpp `timings.cache_n`, else 0 | `prompt_tokens_details.cached_tokens` | `cache_read_input_tokens` |
//! | `completion_tokens` | `usage.completion_tokens` | `completion_tokens` | `output_tokens` |
//! | — | — | — | `cache_creation_input_tokens` = 0 |
//!
//! The Responses API reports like the chat format: `input_tokens` = `prompt_tokens` (cached
//! included), `input_tokens_details.cached_tokens`, `output_tokens` = `completion_tokens`, and
//! `output_tokens_details.reasoning_tokens` from the upstream's
//! `usage.completion_tokens_details.reasoning_tokens` when it sends one (reported only, never
//! billed apart: reasoning tokens are output tokens).
//!
//! Billing: uncached input = `prompt_tokens − cached_tokens` (never negative: an upstream that
//! reports more cached than prompt tokens is clamped), charged at the input rate; cached at the
//! cache rate; completion at the output rate. Nothing is counted twice.

use serde::Deserialize;

/// Tokens of one request, in upstream semantics (prompt includes cached).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    /// Cached tokens, clamped to the prompt (an upstream bug must not create negative input).
    pub fn cached(&self) -> u64 {
        self.cached_tokens.min(self.prompt_tokens)
    }

    /// Input tokens that were not served from the prefix cache.
    pub fn uncached_input(&self) -> u64 {
        self.prompt_tokens - self.cached()
    }

    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// The upstream's `usage` object (OpenAI chat completions, as vLLM, SGLang and llama.cpp send
/// it). Unknown fields are ignored; absent counts are zero.
#[derive(Debug, Default, Deserialize)]
pub struct UpstreamUsage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct CompletionTokensDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
}

/// llama.cpp's `timings` object, the cached-token fallback of its older builds (its home is
/// [`crate::upstream_profile::llamacpp`]).
pub use crate::upstream_profile::llamacpp::Timings as UpstreamTimings;

impl UpstreamUsage {
    /// Whether the object itself carries `prompt_tokens_details.cached_tokens`.
    pub fn reports_cached_tokens(&self) -> bool {
        self.prompt_tokens_details
            .as_ref()
            .is_some_and(|d| d.cached_tokens.is_some())
    }

    /// The reasoning part of the completion, when the upstream reports it.
    pub fn reasoning_tokens(&self) -> Option<u64> {
        self.completion_tokens_details
            .as_ref()
            .and_then(|d| d.reasoning_tokens)
    }

    /// Converts to [`Usage`]; `timings` is the llama.cpp fallback for the cached count.
    pub fn to_usage(&self, timings: Option<&UpstreamTimings>) -> Usage {
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .or_else(|| timings.and_then(|t| t.cache_n))
            .unwrap_or(0);
        Usage {
            prompt_tokens: self.prompt_tokens.unwrap_or(0),
            cached_tokens: cached,
            completion_tokens: self.completion_tokens.unwrap_or(0),
        }
    }
}

/// The usage of a non-streamed completion body, read on its own: for billing a response whose
/// translation failed (malformed tool arguments, an aborted generation), where the tokens were
/// still spent. `None` if the body is not JSON or carries no usage.
pub fn usage_of_completion(body: &[u8]) -> Option<Usage> {
    #[derive(Deserialize)]
    struct Counts {
        #[serde(default)]
        usage: Option<UpstreamUsage>,
        #[serde(default)]
        timings: Option<UpstreamTimings>,
    }
    let c: Counts = serde_json::from_slice(body).ok()?;
    c.usage.map(|u| u.to_usage(c.timings.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_of_a_body_whose_content_is_unusable() {
        let body = br#"{"id":"x","choices":[{"index":0,"finish_reason":"abort","message":{"content":null}}],
            "usage":{"prompt_tokens":15,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(
            usage_of_completion(body),
            Some(Usage {
                prompt_tokens: 15,
                cached_tokens: 4,
                completion_tokens: 3
            })
        );
        assert_eq!(usage_of_completion(br#"{"choices":[]}"#), None);
        assert_eq!(usage_of_completion(b"not json"), None);
    }

    #[test]
    fn cached_is_part_of_prompt() {
        let u = Usage {
            prompt_tokens: 2100,
            cached_tokens: 2048,
            completion_tokens: 40,
        };
        assert_eq!(u.uncached_input(), 52);
        assert_eq!(u.cached(), 2048);
        assert_eq!(u.total(), 2140);
    }

    #[test]
    fn cached_above_prompt_is_clamped() {
        let u = Usage {
            prompt_tokens: 10,
            cached_tokens: 16,
            completion_tokens: 1,
        };
        assert_eq!(u.uncached_input(), 0);
        assert_eq!(u.cached(), 10);
    }

    #[test]
    fn upstream_shapes() {
        let vllm: UpstreamUsage = serde_json::from_str(
            r#"{"prompt_tokens":24,"completion_tokens":5,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":16}}"#,
        )
        .unwrap();
        assert_eq!(
            vllm.to_usage(None),
            Usage {
                prompt_tokens: 24,
                cached_tokens: 16,
                completion_tokens: 5
            }
        );
        let sglang_zero: UpstreamUsage =
            serde_json::from_str(r#"{"prompt_tokens":7,"completion_tokens":2}"#).unwrap();
        assert_eq!(sglang_zero.to_usage(None).cached_tokens, 0);
        let llama_old: UpstreamUsage =
            serde_json::from_str(r#"{"prompt_tokens":30,"completion_tokens":2}"#).unwrap();
        let t: UpstreamTimings = serde_json::from_str(r#"{"cache_n":12,"prompt_n":18}"#).unwrap();
        assert_eq!(llama_old.to_usage(Some(&t)).cached_tokens, 12);
        let nulls: UpstreamUsage = serde_json::from_str(
            r#"{"prompt_tokens":3,"completion_tokens":null,"prompt_tokens_details":null}"#,
        )
        .unwrap();
        assert_eq!(nulls.to_usage(None).completion_tokens, 0);
    }
}
