//! Upstream responses → the chat format.
//!
//! The upstream already speaks this format, so the response is relayed almost verbatim: each
//! payload is parsed once into borrowed spans and spliced (see [`crate::translate::splice`]):
//!
//! - `model` becomes the slug (the upstream's model name never reaches a client);
//! - usage on ordinary chunks (vLLM `continuous_usage_stats`, which Quipu requests for exact
//!   metering of cut-off streams) is nulled, so clients that add up chunk usage do not
//!   over-count; the final usage-only chunk is dropped unless the client asked for it with
//!   `stream_options.include_usage`;
//! - reasoning text is exposed under the configured field name(s) (`reasoning`,
//!   `reasoning_content` or both), whichever the upstream used;
//! - an upstream `{"error":…}` object is re-rendered in the chat error shape (string `code`,
//!   OpenAI `type`) and followed by `data: [DONE]`.

use super::super::splice::{key_range, member_range, range_of, Splice};
use super::super::upstream_error::{map_upstream_error, UpstreamFailure};
use super::super::{malformed_stream, ResponseContext, StreamEnd, StreamTranslator};
use crate::config::ReasoningField;
use crate::error::{write_json_str, ApiError, ClientFormat};
use crate::sse::{write_data_frame, DONE_FRAME};
use crate::usage::{UpstreamTimings, UpstreamUsage, Usage};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A chunk or completion, as spans.
#[derive(Deserialize)]
struct Spans<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Option<Vec<ChoiceSpans<'a>>>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(default)]
    timings: Option<UpstreamTimings>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ChoiceSpans<'a> {
    #[serde(borrow, default)]
    message: Option<MessageSpans<'a>>,
    #[serde(borrow, default)]
    delta: Option<MessageSpans<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MessageSpans<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCallSpans<'a>>>,
}

#[derive(Deserialize)]
struct ToolCallSpans<'a> {
    #[serde(borrow, default)]
    function: Option<FunctionSpans<'a>>,
}

#[derive(Deserialize)]
struct FunctionSpans<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

fn non_empty(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| {
        let s = r.get();
        s != "null" && s != "\"\""
    })
}

fn parse_usage(raw: Option<&RawValue>, timings: Option<&UpstreamTimings>) -> Option<Usage> {
    let raw = raw.filter(|r| r.get() != "null")?;
    serde_json::from_str::<UpstreamUsage>(raw.get())
        .ok()
        .map(|u| u.to_usage(timings))
}

/// Adds splice edits that expose reasoning under the configured field names.
fn reasoning_edits(src: &[u8], m: &MessageSpans<'_>, field: ReasoningField, splice: &mut Splice) {
    let reasoning = non_empty(m.reasoning);
    let reasoning_content = non_empty(m.reasoning_content);
    let (have, want_other, other_key): (Option<&RawValue>, bool, &[u8]) =
        match (field, reasoning, reasoning_content) {
            (ReasoningField::Both, Some(r), None) => (Some(r), true, b"reasoning_content"),
            (ReasoningField::Both, None, Some(r)) => (Some(r), true, b"reasoning"),
            (ReasoningField::Reasoning, None, Some(r)) => (Some(r), false, b"reasoning"),
            (ReasoningField::ReasoningContent, Some(r), None) => {
                (Some(r), false, b"reasoning_content")
            }
            (ReasoningField::Reasoning, Some(_), Some(rc)) => {
                if let Some(mr) = range_of(src, rc).and_then(|v| member_range(src, v)) {
                    splice.replace(mr, b"");
                }
                (None, false, b"")
            }
            (ReasoningField::ReasoningContent, Some(r), Some(_)) => {
                if let Some(mr) = range_of(src, r).and_then(|v| member_range(src, v)) {
                    splice.replace(mr, b"");
                }
                (None, false, b"")
            }
            _ => (None, false, b""),
        };
    let Some(raw) = have else { return };
    let Some(value) = range_of(src, raw) else {
        return;
    };
    if want_other {
        let mut ins = Vec::with_capacity(raw.get().len() + 24);
        ins.extend_from_slice(b",\"");
        ins.extend_from_slice(other_key);
        ins.extend_from_slice(b"\":");
        ins.extend_from_slice(raw.get().as_bytes());
        splice.replace(value.end..value.end, &ins);
    } else if let Some(key) = key_range(src, value) {
        let mut k = Vec::with_capacity(other_key.len() + 2);
        k.push(b'"');
        k.extend_from_slice(other_key);
        k.push(b'"');
        splice.replace(key, &k);
    }
}

fn slug_json(slug: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(slug.len() + 2);
    write_json_str(&mut v, slug);
    v
}

/// Translates a non-streaming upstream response; returns the client body and the usage to
/// bill. A body that is not a completion is an upstream failure.
pub fn upstream_to_chat(
    upstream_body: &[u8],
    ctx: &ResponseContext,
    reasoning: ReasoningField,
) -> Result<(Vec<u8>, Usage), ApiError> {
    let spans: Spans = serde_json::from_slice(upstream_body)
        .map_err(|e| malformed_stream(&format!("invalid completion JSON: {e}")))?;
    if let Some(err) = spans.error {
        return Err(upstream_error_object(err.get().as_bytes(), ctx));
    }
    let choices = spans
        .choices
        .as_ref()
        .ok_or_else(|| malformed_stream("a completion without choices"))?;
    let usage = parse_usage(spans.usage, spans.timings.as_ref()).unwrap_or_default();
    let mut splice = Splice::default();
    if let Some(r) = spans.model.and_then(|m| range_of(upstream_body, m)) {
        splice.replace(r, &slug_json(&ctx.slug));
    }
    for c in choices {
        if let Some(m) = &c.message {
            reasoning_edits(upstream_body, m, reasoning, &mut splice);
        }
    }
    let mut out = Vec::with_capacity(upstream_body.len() + 32);
    splice.apply(upstream_body, &mut out);
    Ok((out, usage))
}

/// An upstream `{"error":…}` object (mid-stream or in a 200 body) as a client error.
fn upstream_error_object(error_obj: &[u8], ctx: &ResponseContext) -> ApiError {
    #[derive(Deserialize, Default)]
    struct Code {
        #[serde(default)]
        code: Option<serde_json::Value>,
    }
    let code: Code = serde_json::from_slice(error_obj).unwrap_or_default();
    let status = code
        .code
        .and_then(|c| c.as_u64())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(500) as u16;
    // Re-wrap so the mapper sees the nested envelope it expects.
    let mut wrapped = Vec::with_capacity(error_obj.len() + 10);
    wrapped.extend_from_slice(b"{\"error\":");
    wrapped.extend_from_slice(error_obj);
    wrapped.push(b'}');
    map_upstream_error(
        &UpstreamFailure {
            status,
            body: &wrapped,
            retry_after: None,
            upstream_model: &ctx.upstream_model,
            slug: &ctx.slug,
        },
        ClientFormat::Chat,
    )
}

/// The chat-format stream translator (see the module docs).
pub struct ChatStream {
    ctx: ResponseContext,
    client_wants_usage: bool,
    reasoning: ReasoningField,
    slug_json: Vec<u8>,
    splice: Splice,
    scratch: Vec<u8>,
    usage: Option<Usage>,
    /// Non-empty content / reasoning / argument fragments relayed since the last chunk that
    /// carried usage: the fallback count of tokens the upstream has not reported.
    fragments_since_usage: u64,
    saw_finish: bool,
    end: StreamEnd,
    error: Option<ApiError>,
}

impl ChatStream {
    pub fn new(ctx: ResponseContext, client_wants_usage: bool, reasoning: ReasoningField) -> Self {
        let slug_json = slug_json(&ctx.slug);
        ChatStream {
            ctx,
            client_wants_usage,
            reasoning,
            slug_json,
            splice: Splice::default(),
            scratch: Vec::new(),
            usage: None,
            fragments_since_usage: 0,
            saw_finish: false,
            end: StreamEnd::Open,
            error: None,
        }
    }

    fn fail(&mut self, error: ApiError, out: &mut Vec<u8>) {
        error.write_sse(ClientFormat::Chat, &self.ctx.request_id, out);
        self.error = Some(error);
        self.end = StreamEnd::Failed;
    }

    fn translate(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), ApiError> {
        let spans: Spans = serde_json::from_slice(data)
            .map_err(|e| malformed_stream(&format!("invalid chunk JSON: {e}")))?;
        if let Some(err) = spans.error {
            return Err(upstream_error_object(err.get().as_bytes(), &self.ctx));
        }
        let chunk_usage = parse_usage(spans.usage, spans.timings.as_ref());
        let choices = spans.choices.as_deref().unwrap_or_default();
        if choices.is_empty() {
            // The usage-only chunk (or an empty keep-alive chunk).
            if let Some(u) = chunk_usage {
                self.usage = Some(u);
                self.fragments_since_usage = 0;
            }
            if !self.client_wants_usage {
                return Ok(());
            }
        }
        self.splice.clear();
        if let Some(r) = spans.model.and_then(|m| range_of(data, m)) {
            self.splice.replace(r, &self.slug_json);
        }
        if !choices.is_empty() {
            if let Some(r) = spans
                .usage
                .filter(|u| u.get() != "null")
                .and_then(|u| range_of(data, u))
            {
                self.splice.replace(r, b"null");
            }
        }
        let mut fragments = 0;
        for c in choices {
            if let Some(d) = &c.delta {
                fragments += u64::from(non_empty(d.content).is_some())
                    + u64::from(
                        non_empty(d.reasoning)
                            .or(non_empty(d.reasoning_content))
                            .is_some(),
                    );
                for tc in d.tool_calls.iter().flatten() {
                    let args = tc.function.as_ref().and_then(|f| non_empty(f.arguments));
                    fragments += u64::from(args.is_some());
                }
                reasoning_edits(data, d, self.reasoning, &mut self.splice);
            }
            if c.finish_reason.is_some() {
                self.saw_finish = true;
            }
        }
        match chunk_usage {
            Some(u) => {
                self.usage = Some(u);
                self.fragments_since_usage = 0;
            }
            None => self.fragments_since_usage += fragments,
        }
        self.scratch.clear();
        self.splice.apply(data, &mut self.scratch);
        write_data_frame(out, &self.scratch);
        Ok(())
    }
}

impl StreamTranslator for ChatStream {
    fn on_event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.end != StreamEnd::Open {
            return;
        }
        if data == b"[DONE]" {
            out.extend_from_slice(DONE_FRAME);
            self.end = StreamEnd::Complete;
            return;
        }
        if let Err(e) = self.translate(data, out) {
            self.fail(e, out);
        }
    }

    fn on_end(&mut self, out: &mut Vec<u8>) {
        if self.end != StreamEnd::Open {
            return;
        }
        if self.saw_finish {
            // Some servers close without `[DONE]` after the final chunk: complete it.
            out.extend_from_slice(DONE_FRAME);
            self.end = StreamEnd::Complete;
        } else {
            self.fail(
                malformed_stream("the stream ended before the model finished"),
                out,
            );
        }
    }

    fn on_failure(&mut self, error: &ApiError, out: &mut Vec<u8>) {
        if self.end == StreamEnd::Open {
            self.fail(error.clone(), out);
        }
    }

    fn on_idle(&mut self, _out: &mut Vec<u8>) {}

    fn usage(&self) -> Usage {
        let reported = self.usage.unwrap_or_default();
        Usage {
            completion_tokens: reported.completion_tokens + self.fragments_since_usage,
            ..reported
        }
    }

    fn end(&self) -> StreamEnd {
        self.end
    }

    fn error(&self) -> Option<&ApiError> {
        self.error.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::sse::SseDecoder;
    use crate::translate::{feed_stream, finish_stream};
    use serde_json::{json, Value};

    fn ctx() -> ResponseContext {
        ResponseContext {
            request_id: "req_1".into(),
            client_model: "aguila".into(),
            slug: "aguila".into(),
            upstream_model: "Qwen/Qwen3-32B".into(),
            tool_name_map: Vec::new(),
        }
    }

    const STREAM: &str = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":0,\"total_tokens\":12}}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"think\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"total_tokens\":13}}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hola ñandú 🦙\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14}}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn run(
        chunks: &[&[u8]],
        wants_usage: bool,
        field: ReasoningField,
    ) -> (Vec<Value>, bool, ChatStream) {
        let mut t = ChatStream::new(ctx(), wants_usage, field);
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            feed_stream(&mut d, &mut t, c, &mut out);
        }
        finish_stream(&mut d, &mut t, &mut out);
        let text = String::from_utf8(out).unwrap();
        let mut frames = Vec::new();
        let mut done = false;
        for f in text.split("\n\n").filter(|f| !f.is_empty()) {
            let data = f.strip_prefix("data: ").unwrap();
            if data == "[DONE]" {
                done = true;
            } else {
                frames.push(serde_json::from_str(data).unwrap());
            }
        }
        (frames, done, t)
    }

    #[test]
    fn relays_with_slug_and_without_unrequested_usage() {
        let (frames, done, t) = run(&[STREAM.as_bytes()], false, ReasoningField::Both);
        assert!(done);
        assert_eq!(frames.len(), 4, "usage-only chunk dropped");
        for f in &frames {
            assert_eq!(f["model"], "aguila");
            assert_eq!(f["usage"], Value::Null);
        }
        assert_eq!(frames[1]["choices"][0]["delta"]["reasoning"], "think");
        assert_eq!(
            frames[1]["choices"][0]["delta"]["reasoning_content"],
            "think"
        );
        assert_eq!(frames[2]["choices"][0]["delta"]["content"], "Hola ñandú 🦙");
        assert_eq!(t.end(), StreamEnd::Complete);
        assert_eq!(
            t.usage(),
            Usage {
                prompt_tokens: 12,
                cached_tokens: 8,
                completion_tokens: 3
            }
        );
        // The upstream's model name (in every upstream chunk) never reaches the client.
        assert!(STREAM.contains("Qwen/Qwen3-32B"));
        for f in &frames {
            assert!(!f.to_string().contains("Qwen"), "{f}");
        }
    }

    #[test]
    fn usage_chunk_kept_when_asked() {
        let (frames, _, _) = run(&[STREAM.as_bytes()], true, ReasoningField::Reasoning);
        assert_eq!(frames.len(), 5);
        assert_eq!(frames[4]["choices"], json!([]));
        assert_eq!(
            frames[4]["usage"]["prompt_tokens_details"]["cached_tokens"],
            8
        );
        assert!(frames[1]["choices"][0]["delta"]
            .get("reasoning_content")
            .is_none());
    }

    #[test]
    fn same_output_at_every_split() {
        let bytes = STREAM.as_bytes();
        let whole = run(&[bytes], false, ReasoningField::Both).0;
        for i in 0..=bytes.len() {
            let (frames, done, _) = run(&[&bytes[..i], &bytes[i..]], false, ReasoningField::Both);
            assert!(done, "split@{i}");
            assert_eq!(frames, whole, "split@{i}");
        }
    }

    #[test]
    fn reasoning_content_renamed_when_configured() {
        let s = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"r\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let (frames, _, _) = run(&[s.as_bytes()], false, ReasoningField::Reasoning);
        assert_eq!(frames[0]["choices"][0]["delta"], json!({"reasoning": "r"}));
    }

    #[test]
    fn midstream_upstream_error_is_rerendered() {
        let s = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n";
        let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
        assert!(done);
        assert_eq!(frames[1]["error"]["type"], "server_error");
        assert_eq!(frames[1]["error"]["code"], "upstream_error");
        assert_eq!(t.end(), StreamEnd::Failed);
        assert_eq!(t.usage().completion_tokens, 1);
    }

    #[test]
    fn truncated_or_garbage_streams_fail_loudly() {
        let s =
            "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
        let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
        assert!(done);
        assert!(frames[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ended"));
        assert_eq!(t.error().unwrap().kind, ErrorKind::Upstream);
        let s = "data: {not json\n\n";
        let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
        assert!(done);
        assert!(frames[0].get("error").is_some());
        assert_eq!(t.end(), StreamEnd::Failed);
    }

    #[test]
    fn non_stream_splices_model_and_reports_usage() {
        let body = br#"{"id":"x","object":"chat.completion","created":1,"model":"Qwen/Qwen3-32B","choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning":"hmm"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        let (out, usage) = upstream_to_chat(body, &ctx(), ReasoningField::Both).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "aguila");
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], "hmm");
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 5,
                cached_tokens: 4,
                completion_tokens: 1
            }
        );
        assert!(upstream_to_chat(b"<html>", &ctx(), ReasoningField::Both).is_err());
        let e = upstream_to_chat(
            br#"{"error":{"message":"bad","code":400}}"#,
            &ctx(),
            ReasoningField::Both,
        )
        .unwrap_err();
        assert_eq!(e.status(ClientFormat::Chat), 400);
    }
}
