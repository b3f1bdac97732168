//! Wire types of the one upstream protocol: OpenAI chat completions as vLLM, SGLang and
//! llama.cpp serve it, with their extensions.
//!
//! Response-side types borrow from the bytes they are parsed from (`Cow<'a, str>` borrows
//! unless the JSON string had escapes), so parsing a stream chunk copies no text. Unknown
//! fields are ignored everywhere: upstreams add fields often.
//!
//! Extensions read here, by server:
//! - reasoning text: `reasoning` (vLLM ≥ late 2025) or `reasoning_content` (SGLang,
//!   llama.cpp, older vLLM); both are read.
//! - matched stop string: vLLM `stop_reason` (a string; an integer is a stop token id),
//!   SGLang `matched_stop`.
//! - cached tokens: `usage.prompt_tokens_details.cached_tokens`, llama.cpp `timings.cache_n`.

use crate::usage::{UpstreamTimings, UpstreamUsage, Usage};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// One `data:` payload of an upstream stream (`chat.completion.chunk`), or an error object.
#[derive(Debug, Deserialize)]
pub struct ChatChunk<'a> {
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    /// `chat.completion.chunk`; `error` on servers that send flat errors (old vLLM, SGLang).
    #[serde(borrow, default)]
    pub object: Option<Cow<'a, str>>,
    /// Kept raw: the chat passthrough splices the slug over it.
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(default)]
    pub created: Option<i64>,
    /// Missing or `null` on some servers' usage-only chunk.
    #[serde(borrow, default)]
    pub choices: Option<Vec<ChunkChoice<'a>>>,
    #[serde(default)]
    pub usage: Option<UpstreamUsage>,
    #[serde(default)]
    pub timings: Option<UpstreamTimings>,
    /// vLLM / SGLang mid-stream error: `{"error":{…}}`.
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

impl ChatChunk<'_> {
    /// Usage carried by this chunk, if any (with llama.cpp's `timings` fallback applied).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
            .as_ref()
            .map(|u| u.to_usage(self.timings.as_ref()))
    }
}

#[derive(Debug, Deserialize)]
pub struct ChunkChoice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default)]
    pub delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    pub finish_reason: Option<Cow<'a, str>>,
    /// vLLM: the matched stop string, a stop token id, or null.
    #[serde(borrow, default)]
    pub stop_reason: Option<StopReason<'a>>,
    /// SGLang: the matched stop string, a token id, or null.
    #[serde(borrow, default)]
    pub matched_stop: Option<StopReason<'a>>,
}

impl<'a> ChunkChoice<'a> {
    /// The stop string that ended generation, if the upstream says one did.
    pub fn matched_stop_string(&self) -> Option<&str> {
        matched_stop_string(self.stop_reason.as_ref(), self.matched_stop.as_ref())
    }
}

/// `stop_reason` / `matched_stop`: a string means a stop sequence matched.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopReason<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    TokenId(i64),
}

fn matched_stop_string<'s>(
    vllm: Option<&'s StopReason<'_>>,
    sglang: Option<&'s StopReason<'_>>,
) -> Option<&'s str> {
    [vllm, sglang].into_iter().flatten().find_map(|r| match r {
        StopReason::Text(s) => Some(s.as_ref()),
        StopReason::TokenId(_) => None,
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct Delta<'a> {
    #[serde(borrow, default)]
    pub role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<ToolCallDelta<'a>>>,
}

impl Delta<'_> {
    /// Reasoning text of this delta from whichever field the server uses; empty is `None`.
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning
            .as_deref()
            .filter(|s| !s.is_empty())
            .or_else(|| self.reasoning_content.as_deref().filter(|s| !s.is_empty()))
    }
}

#[derive(Debug, Deserialize)]
pub struct ToolCallDelta<'a> {
    #[serde(default)]
    pub index: Option<u32>,
    /// `""` on some servers' continuation deltas: treat as absent.
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub function: Option<FunctionDelta<'a>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FunctionDelta<'a> {
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub arguments: Option<Cow<'a, str>>,
}

/// A non-streaming upstream response (`chat.completion`).
#[derive(Debug, Deserialize)]
pub struct ChatCompletion<'a> {
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    /// `chat.completion`; `error` on servers that send flat errors (old vLLM, SGLang).
    #[serde(borrow, default)]
    pub object: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(default)]
    pub created: Option<i64>,
    #[serde(borrow, default)]
    pub choices: Vec<CompletionChoice<'a>>,
    #[serde(default)]
    pub usage: Option<UpstreamUsage>,
    #[serde(default)]
    pub timings: Option<UpstreamTimings>,
    /// An error object in a 200 body: `{"error":{…}}`.
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

impl ChatCompletion<'_> {
    pub fn usage(&self) -> Option<Usage> {
        self.usage
            .as_ref()
            .map(|u| u.to_usage(self.timings.as_ref()))
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionChoice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default)]
    pub message: CompletionMessage<'a>,
    #[serde(borrow, default)]
    pub finish_reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub stop_reason: Option<StopReason<'a>>,
    #[serde(borrow, default)]
    pub matched_stop: Option<StopReason<'a>>,
}

impl CompletionChoice<'_> {
    pub fn matched_stop_string(&self) -> Option<&str> {
        matched_stop_string(self.stop_reason.as_ref(), self.matched_stop.as_ref())
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct CompletionMessage<'a> {
    #[serde(borrow, default)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<CompletionToolCall<'a>>>,
}

impl CompletionMessage<'_> {
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning
            .as_deref()
            .filter(|s| !s.is_empty())
            .or_else(|| self.reasoning_content.as_deref().filter(|s| !s.is_empty()))
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionToolCall<'a> {
    #[serde(borrow, default)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub function: FunctionDelta<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_chunks() {
        let c: ChatChunk = serde_json::from_str(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}"#,
        )
        .unwrap();
        let tc = &c.choices.as_ref().unwrap()[0]
            .delta
            .as_ref()
            .unwrap()
            .tool_calls
            .as_ref()
            .unwrap()[0];
        assert_eq!(tc.id.as_deref(), Some("call_abc"));
        assert_eq!(c.model.unwrap().get(), "\"qwen3\"");
        let u: ChatChunk = serde_json::from_str(
            r#"{"id":"x","choices":[],"usage":{"prompt_tokens":2100,"completion_tokens":40,"total_tokens":2140,"prompt_tokens_details":{"cached_tokens":2048}}}"#,
        )
        .unwrap();
        assert_eq!(u.usage().unwrap().cached_tokens, 2048);
    }

    #[test]
    fn stop_reason_forms() {
        let c: ChatChunk = serde_json::from_str(
            r####"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"###"}]}"####,
        )
        .unwrap();
        assert_eq!(c.choices.unwrap()[0].matched_stop_string(), Some("###"));
        let c: ChatChunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":151645}]}"#,
        )
        .unwrap();
        assert_eq!(c.choices.unwrap()[0].matched_stop_string(), None);
        let c: ChatChunk = serde_json::from_str(
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":null},"finish_reason":"stop","matched_stop":"END"}]}"#,
        )
        .unwrap();
        assert_eq!(c.choices.unwrap()[0].matched_stop_string(), Some("END"));
    }

    #[test]
    fn reasoning_from_either_field() {
        let d: Delta = serde_json::from_str(r#"{"reasoning":"a"}"#).unwrap();
        assert_eq!(d.reasoning_text(), Some("a"));
        let d: Delta = serde_json::from_str(r#"{"reasoning_content":"b","reasoning":""}"#).unwrap();
        assert_eq!(d.reasoning_text(), Some("b"));
        let d: Delta = serde_json::from_str(r#"{"reasoning_content":null}"#).unwrap();
        assert_eq!(d.reasoning_text(), None);
    }

    #[test]
    fn usage_only_chunk_with_null_choices() {
        let c: ChatChunk = serde_json::from_str(
            r#"{"choices":null,"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        )
        .unwrap();
        assert!(c.choices.is_none());
        assert_eq!(c.usage().unwrap().completion_tokens, 2);
    }
}
