//! The fuzz bodies of the client formats, written once and run for each: every format has a
//! request target and a stream target (`fuzz_targets/<format>_request.rs`,
//! `<format>_stream.rs`, one line each), which call [`request`] and [`stream`] with its
//! [`ClientFormat`]. A new variant does not compile here until it implements [`Fuzzed`] and
//! is listed in the two `match`es; the workspace's conformance test fails until its target
//! files, their `[[bin]]` entries and their seed folders exist.
//!
//! - **Requests**: any bytes give either a valid upstream request that respects the rules (a
//!   JSON body for a configured model, `max_tokens` 1–8192, a prompt with a real turn,
//!   `stream` as asked, and what the format adds: [`Fuzzed::check_request`]), or an error that
//!   renders as JSON with a 4xx/5xx status in every client format.
//! - **Streams**: the translator is fed through the gateway's path (`SseDecoder` →
//!   `feed_stream` per read → `finish_stream`) in two modes chosen by the first byte: a
//!   generated upstream chunk sequence ([`upstream_stream`], realistic or wild; any first byte
//!   but `R`, the next one the format's option bits), or raw SSE bytes ([`raw_input`]), split
//!   at fuzzer-chosen offsets. On any input the output, usage, end and error do not depend on
//!   the splits, the stream is never left open, `error()` is set exactly when it failed, and
//!   the format's own invariants hold ([`Fuzzed::check_output`]), among them that the
//!   `usage.cost` of the final usage is the charge of the usage the stream bills
//!   ([`check_cost`]); generated, the upstream's model name never reaches the client, and a
//!   clean answer is the same as the non-streaming translation's ([`Fuzzed::compare`]).

mod chat;
mod messages;
mod responses;

use crate::{pieces, raw_input, splits, upstream_stream, Cursor, Generated};
use quipu_core::config::{Config, EMBEDDED_DEFAULT};
use quipu_core::error::ClientFormat;
use quipu_core::testing::{replay, Replay};
use quipu_core::translate::chat::Chat;
use quipu_core::translate::messages::Messages;
use quipu_core::translate::responses::Responses;
use quipu_core::translate::{Format, StreamEnd};
use quipu_core::usage::Usage;
use serde_json::Value;
use std::sync::OnceLock;

/// The model name the generated upstream reports (never shown to a client).
pub const UPSTREAM_MODEL: &str = "Qwen/Qwen3-Upstream";

/// What the fuzz bodies need of a format beyond [`Format`].
pub trait Fuzzed: Format {
    /// What [`Self::check_output`] found that [`Self::compare`] needs.
    type Seen;

    /// The response context for the option bits `flags` (the byte after the mode byte).
    fn context(flags: u8) -> Self::Context;

    /// What holds for a request the format accepted, beyond the shared rules.
    fn check_request(_request: &Self::Request) {}

    /// What holds for every output, whatever the upstream sent. `raw` is the upstream's SSE
    /// when the fuzzer wrote it (faults a format relays as they came are allowed).
    fn check_output(whole: &Replay, flags: u8, raw: Option<&[u8]>) -> Self::Seen;

    /// A generated stream: what a client gets equals the non-streaming translation of the
    /// same answer, where the generator says there is one ([`Generated::completion`]).
    fn compare(g: &Generated, whole: &Replay, seen: Self::Seen, flags: u8);
}

/// The request target of `format`.
pub fn request(format: ClientFormat, data: &[u8]) {
    match format {
        ClientFormat::Chat => request_of::<Chat>(data),
        ClientFormat::Messages => request_of::<Messages>(data),
        ClientFormat::Responses => request_of::<Responses>(data),
    }
}

/// The stream target of `format`.
pub fn stream(format: ClientFormat, data: &[u8]) {
    match format {
        ClientFormat::Chat => stream_of::<Chat>(data),
        ClientFormat::Messages => stream_of::<Messages>(data),
        ClientFormat::Responses => stream_of::<Responses>(data),
    }
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config::parse(EMBEDDED_DEFAULT, "fuzz").expect("the embedded config is valid"))
}

fn request_of<F: Fuzzed>(data: &[u8]) {
    let c = config();
    match F::to_upstream(data, c, "req_abc") {
        Ok(translated) => {
            let r = translated.as_ref();
            let v: Value = serde_json::from_slice(&r.body).expect("the upstream body is JSON");
            let model = v["model"].as_str().expect("model is a string");
            assert!(c.models.iter().any(|m| m.upstream_model == model));
            assert!(v["max_tokens"]
                .as_u64()
                .is_some_and(|n| (1..=8192).contains(&n)));
            assert!(r.max_tokens <= 8192);
            let msgs: Value = serde_json::from_slice(&r.body[r.prompt_range.clone()])
                .expect("prompt range is JSON");
            // At least one real turn: never `[]`, never system messages alone.
            assert!(
                msgs.as_array().is_some_and(|a| a
                    .iter()
                    .any(|m| m["role"] == "user" || m["role"] == "assistant")),
                "a prompt without a user or assistant message: {msgs}"
            );
            assert_eq!(v["stream"].as_bool(), Some(r.stream));
            F::check_request(&translated);
        }
        Err(e) => {
            for f in ClientFormat::all() {
                let _: Value =
                    serde_json::from_slice(&e.body(f, "req_fuzz")).expect("errors render as JSON");
                assert!((400..600).contains(&e.status(f)));
            }
        }
    }
}

fn run<F: Fuzzed>(flags: u8, parts: &[&[u8]]) -> Replay {
    replay(&mut F::stream(F::context(flags)), parts)
}

/// Runs `sse` whole and cut at `points`; checks what holds for every format.
fn run_and_split<F: Fuzzed>(flags: u8, sse: &[u8], points: &[usize]) -> Replay {
    let whole = run::<F>(flags, &[sse]);
    let split = run::<F>(flags, &pieces(sse, points));
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    assert_ne!(whole.end, StreamEnd::Open, "the stream was left open");
    assert_eq!(
        whole.error.is_some(),
        whole.end == StreamEnd::Failed,
        "error() disagrees with end()"
    );
    whole
}

fn stream_of<F: Fuzzed>(data: &[u8]) {
    if let Some(raw) = raw_input(data) {
        let whole = run_and_split::<F>(raw.flags, raw.sse, &raw.points);
        F::check_output(&whole, raw.flags, Some(raw.sse));
        return;
    }
    let mut c = Cursor::new(data);
    let flags = c.byte();
    let g = upstream_stream(&mut c);
    let points = splits(&mut c, g.sse.len());
    let whole = run_and_split::<F>(flags, &g.sse, &points);
    assert!(
        !String::from_utf8_lossy(&whole.out).contains("Qwen3-Upstream"),
        "the upstream model name leaked"
    );
    let seen = F::check_output(&whole, flags, None);
    F::compare(&g, &whole, seen, flags);
}

/// A generated answer that is clean and in message order ([`Generated::in_order`]) has a
/// non-streaming equivalent: both translations complete (the non-streaming body and usage
/// are returned, to compare), or both fail with the same error.
fn in_order_answer<F: Fuzzed>(g: &Generated, whole: &Replay, flags: u8) -> Option<(Value, Usage)> {
    // Out of order, the stream cannot equal the message (blocks do not reopen): only the
    // invariants of every output hold.
    let body = g.completion.as_ref().filter(|_| g.in_order)?;
    match (
        whole.end,
        F::respond(body.to_string().as_bytes(), &F::context(flags)),
    ) {
        (StreamEnd::Complete, Ok((json, usage))) => {
            Some((serde_json::from_slice(&json).expect("JSON"), usage))
        }
        (StreamEnd::Failed, Err(e)) => {
            assert_eq!(
                whole.error.as_ref(),
                Some(&e),
                "stream and non-stream fail differently"
            );
            None
        }
        (end, plain) => panic!(
            "stream ended {end:?} ({:?}) but non-stream gave {:?}\n{}",
            whole.error,
            plain.map(|(b, _)| String::from_utf8_lossy(&b).into_owned()),
            String::from_utf8_lossy(&whole.out)
        ),
    }
}

/// The cost on every answer: `written`, a `usage.cost` read from the output, is the charge of
/// the usage the stream bills (what the settlement records), as a JSON number.
fn check_cost(written: &Value, whole: &Replay) {
    let charge = quipu_core::testing::charging().cost(whole.usage);
    let want: Value = serde_json::from_str(&charge.to_json_number()).expect("a JSON number");
    assert!(written.is_number(), "usage.cost is not a number: {written}");
    assert_eq!(
        written, &want,
        "usage.cost is not the charge of the usage billed ({:?})",
        whole.usage
    );
}

/// The base context of every format's answer.
fn base(client_model: &str) -> quipu_core::translate::ResponseContext {
    quipu_core::translate::ResponseContext {
        request_id: "req_f".into(),
        client_model: client_model.into(),
        slug: "aguila".into(),
        upstream_model: UPSTREAM_MODEL.into(),
        tool_name_map: Vec::new(),
        charging: quipu_core::testing::charging(),
}
}
