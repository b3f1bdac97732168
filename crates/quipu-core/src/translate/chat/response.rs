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
//! - the usage the client sees (the completion's, and the stream's usage-only chunk after the
//!   finish) gets `prompt_tokens_details.cached_tokens` when the upstream left it out, and
//!   `cost`: the charge of that usage in soles ([`crate::billing::Charging::cost`]), the
//!   ledger row's. A completion the upstream sent without a usage object has none, so no cost;
//!   a usage-only chunk before the finish (no known server sends one) is relayed without one.
//! - reasoning text is exposed under the configured field name(s) (`reasoning`,
//!   `reasoning_content` or both), whichever the upstream used;
//! - an upstream `{"error":…}` object is re-rendered in the chat error shape (string `code`,
//!   OpenAI `type`) and followed by `data: [DONE]`.

use super::super::splice::{key_range, member_range, range_of, Splice};
use super::super::stream_core::{Billed, Core, Stream, StreamFormat};
use super::super::upstream_error::{map_upstream_error, UpstreamFailure};
use super::super::{json_failure, malformed_stream, scrub_error, ResponseContext};
use crate::config::ReasoningField;
use crate::error::{write_json_str, ApiError, ClientFormat};
use crate::money::Pen;
use crate::sse::{write_data_frame, DONE_FRAME};
use crate::usage::{
    CompletionTokensDetails, PromptTokensDetails, UpstreamTimings, UpstreamUsage, Usage,
};
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
    /// `Some` whenever the member is present, `null` included (see [`present_raw`]).
    #[serde(borrow, default, deserialize_with = "present_raw")]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
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

/// A member's raw value whenever the member is present. A plain `Option<&RawValue>` reads a
/// `null` as absent, and a `null` twin must be replaced rather than duplicated.
fn present_raw<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A chunk's `choices`, `Some` whenever the member is present (`null` included).
#[derive(Deserialize)]
struct ChoicesMember<'a> {
    #[serde(borrow, default, deserialize_with = "present_raw")]
    choices: Option<&'a RawValue>,
}

/// Gives a chunk with `"choices": null`, or none, the `"choices": []` OpenAI's usage chunk
/// has: clients read `chunk.choices` on every chunk, and some servers (SGLang, llama.cpp
/// builds) leave it out of the usage-only one. Read again only for such a chunk, the last of
/// a stream.
fn empty_choices(data: &[u8], splice: &mut Splice) {
    let Ok(member) = serde_json::from_slice::<ChoicesMember<'_>>(data) else {
        return;
    };
    if let Some(r) = member.choices.and_then(|raw| range_of(data, raw)) {
        splice.replace(r, b"[]");
        return;
    }
    let Some(open) = data.iter().position(|&b| b == b'{') else {
        return;
    };
    let rest = data.get(open + 1..).unwrap_or_default();
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let with: &[u8] = if empty {
        b"\"choices\":[]"
    } else {
        b"\"choices\":[],"
    };
    splice.replace(open + 1..open + 1, with);
}

fn non_empty(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| {
        let s = r.get();
        s != "null" && s != "\"\""
    })
}

/// The usage to bill, and whether the upstream's own object reported `cached_tokens`.
fn parse_usage(raw: Option<&RawValue>, timings: Option<&UpstreamTimings>) -> Option<(Usage, bool)> {
    let raw = raw.filter(|r| r.get() != "null")?;
    serde_json::from_str::<UpstreamUsage>(raw.get())
        .ok()
        .map(|u| (u.to_usage(timings), u.reports_cached_tokens()))
}

/// The members of a usage object Quipu writes, as spans (`null` included).
#[derive(Deserialize)]
struct UsageSpans<'a> {
    #[serde(borrow, default, deserialize_with = "present_raw")]
    prompt_tokens_details: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    cost: Option<&'a RawValue>,
}

/// [`UsageSpans`] of a usage object; `None` if it is not an object of them.
fn usage_spans(usage: &RawValue) -> Option<UsageSpans<'_>> {
    serde_json::from_str(usage.get()).ok()
}

/// A usage object in one pass: [`UpstreamUsage`]'s members and [`UsageSpans`]' together,
/// `prompt_tokens_details` as a span (read into its count afterwards, a few bytes).
#[derive(Deserialize)]
struct UsageMembers<'a> {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    prompt_tokens_details: Option<&'a RawValue>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
    #[serde(borrow, default, deserialize_with = "present_raw")]
    cost: Option<&'a RawValue>,
}

/// A completion's usage object, read once for both its uses: [`parse_usage`]'s counts and
/// [`usage_spans`]' spans. The one pass is taken only when it reads exactly what the two
/// would (it reads their members with their types, so it succeeds only where both do); any
/// other object (`null`, a duplicated member, a malformed count) is read by the two, as
/// before.
fn read_usage<'a>(
    raw: &'a RawValue,
    timings: Option<&UpstreamTimings>,
) -> (Option<(Usage, bool)>, Option<UsageSpans<'a>>) {
    if raw.get() != "null" {
        if let Ok(m) = serde_json::from_str::<UsageMembers<'a>>(raw.get()) {
            let details = match m.prompt_tokens_details {
                None => Ok(None),
                Some(d) => serde_json::from_str::<Option<PromptTokensDetails>>(d.get()),
            };
            if let Ok(prompt_tokens_details) = details {
                let u = UpstreamUsage {
                    prompt_tokens: m.prompt_tokens,
                    completion_tokens: m.completion_tokens,
                    prompt_tokens_details,
                    completion_tokens_details: m.completion_tokens_details,
                };
                let spans = UsageSpans {
                    prompt_tokens_details: m.prompt_tokens_details,
                    cost: m.cost,
                };
                return (
                    Some((u.to_usage(timings), u.reports_cached_tokens())),
                    Some(spans),
                );
            }
        }
    }
    (parse_usage(Some(raw), timings), usage_spans(raw))
}

/// The edits of a usage object the client sees (docs/design.md, usage semantics):
///
/// - `prompt_tokens_details.cached_tokens`, which a chat answer from Quipu always has, when
///   the object lacks it (`details`: the count to write): vLLM without
///   `--enable-prompt-tokens-details` sends `null` there, SGLang and llama.cpp often leave it
///   out. The count written is the one billed (llama.cpp's `timings.cache_n` when that is
///   where the upstream put it);
/// - `cost`, when given: the answer's cost in soles, a JSON number, replacing a `cost` the
///   upstream may have written (its money is not the tenant's); when not, such a `cost` is
///   removed.
///
/// The rest of the object is relayed byte for byte; members are added at its end. `spans`
/// are the object's ([`usage_spans`]); none, no edit.
fn usage_edits(
    src: &[u8],
    usage: &RawValue,
    spans: Option<UsageSpans<'_>>,
    details: Option<u64>,
    cost: Option<Pen>,
    splice: &mut Splice,
) {
    let Some(range) = range_of(src, usage) else {
        return;
    };
    let Some(spans) = spans else {
        return;
    };
    // Members added at the end of the object, each with its leading comma.
    let mut added = Vec::with_capacity(64);
    if let Some(cached) = details {
        let mut details = Vec::with_capacity(40);
        details.extend_from_slice(b"{\"cached_tokens\":");
        details.extend_from_slice(itoa::Buffer::new().format(cached).as_bytes());
        details.push(b'}');
        match spans.prompt_tokens_details.and_then(|d| range_of(src, d)) {
            // `null`, or an object without the count: replaced whole.
            Some(value) => splice.replace_with(value, details),
            None => {
                added.extend_from_slice(b",\"prompt_tokens_details\":");
                added.extend_from_slice(&details);
            }
        }
    }
    let upstream_cost = spans.cost.and_then(|c| range_of(src, c));
    match (cost, upstream_cost) {
        (Some(cost), Some(value)) => {
            let mut number = Vec::with_capacity(24);
            cost.json_number().write_to(&mut number);
            splice.replace_with(value, number);
        }
        (Some(cost), None) => {
            added.extend_from_slice(b",\"cost\":");
            cost.json_number().write_to(&mut added);
        }
        // Removed: in its place the members to add, if any (an object it was alone in stays
        // valid JSON), else with its comma.
        (None, Some(value)) => match key_range(src, value.clone()) {
            Some(key) if !added.is_empty() => {
                splice.replace(key.start..value.end, &added[1..]);
                added.clear();
            }
            _ => {
                if let Some(member) = member_range(src, value) {
                    splice.replace(member, b"");
                }
            }
        },
        (None, None) => {}
    }
    if added.is_empty() {
        return;
    }
    let body = &src[range.clone()];
    let Some(close) = body.iter().rposition(|&b| b == b'}') else {
        return;
    };
    if body[1..close].iter().all(u8::is_ascii_whitespace) {
        // An empty object: the first member without its comma.
        added.remove(0);
    }
    let at = range.start + close;
    splice.replace_with(at..at, added);
}

/// Adds splice edits that expose reasoning under the configured field names.
///
/// The text is taken from `reasoning`, else `reasoning_content`. Each wanted field gets it:
/// a member already present with `null` or `""` (SGLang sends `"reasoning_content": null` on
/// every delta) has its value replaced — never a second member with the same key; an absent
/// one is added (or, when the text sits under the unwanted name only, that key is renamed).
/// An unwanted field holding text is removed; unwanted `null`s are left as they are.
fn reasoning_edits(src: &[u8], m: &MessageSpans<'_>, field: ReasoningField, splice: &mut Splice) {
    let r = non_empty(m.reasoning);
    let rc = non_empty(m.reasoning_content);
    let Some(text) = r.or(rc) else { return };
    let Some(text_range) = range_of(src, text) else {
        return;
    };
    let (want_r, want_rc) = match field {
        ReasoningField::Reasoning => (true, false),
        ReasoningField::ReasoningContent => (false, true),
        ReasoningField::Both => (true, true),
    };
    // (key, its member as sent, whether it holds text, whether the client wants it)
    let fields: [(&[u8], Option<&RawValue>, bool, bool); 2] = [
        (b"reasoning", m.reasoning, r.is_some(), want_r),
        (
            b"reasoning_content",
            m.reasoning_content,
            rc.is_some(),
            want_rc,
        ),
    ];
    let mut missing: Option<&[u8]> = None;
    for (key, raw, has_text, wanted) in fields {
        match (raw, has_text, wanted) {
            (Some(raw), false, true) => {
                if let Some(v) = range_of(src, raw) {
                    splice.replace(v, text.get().as_bytes());
                }
            }
            (None, _, true) => missing = Some(key),
            _ => {}
        }
    }
    for (_, raw, has_text, wanted) in fields {
        if wanted || !has_text {
            continue;
        }
        let Some(v) = raw.and_then(|raw| range_of(src, raw)) else {
            continue;
        };
        match missing.take() {
            // The text is only under the unwanted name: rename it.
            Some(to) => {
                if let Some(k) = key_range(src, v) {
                    let mut quoted = Vec::with_capacity(to.len() + 2);
                    quoted.push(b'"');
                    quoted.extend_from_slice(to);
                    quoted.push(b'"');
                    splice.replace(k, &quoted);
                }
            }
            None => {
                if let Some(member) = member_range(src, v) {
                    splice.replace(member, b"");
                }
            }
        }
    }
    if let Some(key) = missing {
        let mut ins = Vec::with_capacity(text.get().len() + key.len() + 4);
        ins.extend_from_slice(b",\"");
        ins.extend_from_slice(key);
        ins.extend_from_slice(b"\":");
        ins.extend_from_slice(text.get().as_bytes());
        splice.replace(text_range.end..text_range.end, &ins);
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
    completion_to_chat(upstream_body, ctx, reasoning).map_err(|e| scrub_error(e, ctx))
}

/// Parses upstream JSON that is relayed nearly verbatim. The bytes are checked to be UTF-8
/// once, whole, and parsed as a `&str`: serde's slice reader checks only the strings it reads,
/// so invalid UTF-8 in a member it skips would otherwise reach the client (and it would check
/// the ones it reads a second time).
fn parse_relayed<'a>(bytes: &'a [u8], what: &str) -> Result<Spans<'a>, ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| malformed_stream(&format!("{what} is not UTF-8")))?;
    serde_json::from_str(text).map_err(|e| malformed_stream(&json_failure(what, &e)))
}

fn completion_to_chat(
    upstream_body: &[u8],
    ctx: &ResponseContext,
    reasoning: ReasoningField,
) -> Result<(Vec<u8>, Usage), ApiError> {
    let spans = parse_relayed(upstream_body, "the completion")?;
    if let Some(err) = spans.error {
        return Err(upstream_error_object(err.get().as_bytes(), ctx));
    }
    let choices = spans
        .choices
        .as_ref()
        .ok_or_else(|| malformed_stream("a completion without choices"))?;
    let (parsed, usage_spans) = spans
        .usage
        .map_or((None, None), |raw| read_usage(raw, spans.timings.as_ref()));
    let usage = parsed.map(|(u, _)| u).unwrap_or_default();
    let mut splice = Splice::default();
    if let Some(r) = spans.model.and_then(|m| range_of(upstream_body, m)) {
        splice.replace_with(r, slug_json(&ctx.slug));
    }
    if let Some(raw) = spans.usage {
        // An object that is not a usage (its counts unreadable) gets neither, only loses an
        // upstream's `cost`.
        let (details, cost) = parsed.map_or((None, None), |(billed, cached)| {
            let details = (!cached).then(|| billed.cached());
            (details, Some(ctx.charging.cost(billed)))
        });
        usage_edits(upstream_body, raw, usage_spans, details, cost, &mut splice);
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

/// The chat-format stream translator (see the module docs): [`ChatWriter`] run by the stream
/// core.
pub type ChatStream = Stream<ChatWriter>;

impl ChatStream {
    pub fn new(ctx: ResponseContext, client_wants_usage: bool, reasoning: ReasoningField) -> Self {
        let slug_json = slug_json(&ctx.slug);
        Stream::with(ChatWriter {
            ctx,
            client_wants_usage,
            reasoning,
            slug_json,
            splice: Splice::default(),
            scratch: Vec::new(),
        })
    }
}

/// What the chat format writes of a stream: the upstream's chunks, spliced. The finish it
/// holds is only that one was seen (`[DONE]` is owed at the end); usage is metered from the
/// upstream's reports, else one token per non-empty content, reasoning or argument fragment
/// relayed.
pub struct ChatWriter {
    ctx: ResponseContext,
    client_wants_usage: bool,
    reasoning: ReasoningField,
    slug_json: Vec<u8>,
    splice: Splice,
    scratch: Vec<u8>,
}

impl StreamFormat for ChatWriter {
    type Held = ();
    const FORMAT: ClientFormat = ClientFormat::Chat;
    const PINGS: bool = false;

    fn context(&self) -> &ResponseContext {
        &self.ctx
    }

    /// The upstream's `[DONE]` is relayed ([`Self::chunk`]), not taken as the end.
    fn is_end(_data: &[u8]) -> bool {
        false
    }

    fn chunk(
        &mut self,
        core: &mut Core<()>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        if data == b"[DONE]" {
            // Relayed as the upstream's verdict, with or without a finish before it.
            out.extend_from_slice(DONE_FRAME);
            core.completed();
            return Ok(());
        }
        self.relay(core, data, out)
    }

    /// Some servers close without `[DONE]` after the final chunk: complete it.
    fn complete(&mut self, _held: (), _billed: Billed, out: &mut Vec<u8>) {
        out.extend_from_slice(DONE_FRAME);
    }
}

impl ChatWriter {
    /// One chunk, relayed spliced (see the module docs).
    fn relay(
        &mut self,
        core: &mut Core<()>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let spans = parse_relayed(data, "a chunk")?;
        if let Some(err) = spans.error {
            return Err(upstream_error_object(err.get().as_bytes(), &self.ctx));
        }
        let parsed = parse_usage(spans.usage, spans.timings.as_ref());
        let chunk_usage = parsed.map(|(u, _)| u);
        let choices = spans.choices.as_deref().unwrap_or_default();
        if choices.is_empty() {
            // The usage-only chunk (or an empty keep-alive chunk).
            if let Some(u) = chunk_usage {
                core.metered.report(u);
            }
            if !self.client_wants_usage {
                return Ok(());
            }
        }
        self.splice.clear();
        if let Some(r) = spans.model.and_then(|m| range_of(data, m)) {
            self.splice.replace(r, &self.slug_json);
        }
        if choices.is_empty() {
            if let Some(raw) = spans.usage {
                // The usage chunk after the finish: the final usage, with its cost, which from
                // here on is what the stream bills. (Unreadable counts: no cost, only an
                // upstream's `cost` removed.)
                let details =
                    parsed.and_then(|(billed, cached)| (!cached).then(|| billed.cached()));
                let cost = (parsed.is_some() && core.finished())
                    .then(|| core.metered.bill(&self.ctx.charging).cost);
                let spans = usage_spans(raw);
                usage_edits(data, raw, spans, details, cost, &mut self.splice);
            }
            if spans.choices.is_none() {
                empty_choices(data, &mut self.splice);
            }
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
                core.hold(());
            }
        }
        match chunk_usage {
            Some(u) => core.metered.report(u),
            None => core.metered.count(fragments),
        }
        self.scratch.clear();
        self.splice.apply(data, &mut self.scratch);
        // An upstream may spread a chunk over several `data:` lines (legal SSE; the decoder
        // joins them with `\n`). In JSON that parsed, a line break can only be whitespace
        // between tokens, but relayed as is it would end the client's `data:` line.
        if memchr::memchr2(b'\n', b'\r', &self.scratch).is_some() {
            for b in &mut self.scratch {
                if *b == b'\n' || *b == b'\r' {
                    *b = b' ';
                }
            }
        }
        write_data_frame(out, &self.scratch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass read of a completion's usage gives what the two separate reads give, on
    /// the objects it reads itself and on those it leaves to them.
    #[test]
    fn a_usage_read_once_reads_as_the_two_reads() {
        let objects = [
            r#"{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28,"prompt_tokens_details":{"cached_tokens":4}}"#,
            r#"{"prompt_tokens":12,"completion_tokens":16}"#,
            r#"{"prompt_tokens":12,"completion_tokens":16,"prompt_tokens_details":null,"cost":0.5}"#,
            r#"{"prompt_tokens":12,"prompt_tokens_details":{},"completion_tokens_details":{"reasoning_tokens":3}}"#,
            r#"{"prompt_tokens":12,"cost":1,"cost":2}"#,
            r#"{"prompt_tokens":12,"prompt_tokens_details":7,"cost":1}"#,
            r#"{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":"x"}}"#,
            r#"{"prompt_tokens":"12","cost":1}"#,
            r#"{"prompt_tokens":12,"completion_tokens_details":[]}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            r#"{}"#,
            "null",
            "[]",
            "3",
        ];
        let timings: UpstreamTimings = serde_json::from_str(r#"{"cache_n":5}"#).unwrap();
        for text in objects {
            let raw: &RawValue = serde_json::from_str(text).unwrap();
            for timings in [None, Some(&timings)] {
                let (parsed, spans) = read_usage(raw, timings);
                assert_eq!(parsed, parse_usage(Some(raw), timings), "{text}");
                let texts = |s: Option<UsageSpans<'_>>| {
                    s.map(|s| {
                        (
                            s.prompt_tokens_details.map(|r| r.get().to_owned()),
                            s.cost.map(|r| r.get().to_owned()),
                        )
                    })
                };
                assert_eq!(texts(spans), texts(usage_spans(raw)), "{text}");
            }
        }
    }
}
