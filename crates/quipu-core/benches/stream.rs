//! Micro-benchmarks of the pure streaming path: the SSE decoder and the three stream
//! translators (upstream chat-completion chunks → chat chunks, → messages events, → Responses
//! API events), fed vLLM-shaped streams.
//!
//! Run with `cargo bench -p quipu-core --bench stream`. Before the timings it prints, once, how
//! many heap allocations each case makes per upstream chunk (counted by the global allocator
//! below) after checking that every case's output is a complete, correct stream — a translator
//! that failed on the first chunk would otherwise look very fast.
//!
//! Each translator case is timed per upstream chunk (`Throughput::Elements`): the whole stream
//! from the first payload to `[DONE]` is fed, and the time divided by the number of SSE events.
//! The translator and the 8 KiB output buffer are built outside the timing (as the proxy does,
//! once per request); `out` is cleared after every event, as the proxy clears it after every
//! write to the client. Each shape runs at 100 and 2,000 generated tokens: equal per-chunk cost
//! shows that no chunk re-reads what came before it.

// The counting allocator must `unsafe impl GlobalAlloc`; the crate's `[lints]` make
// `unsafe_code` `deny` (not `forbid`) so that this file, and only files that say so, can opt
// out. The library itself forbids it in src/lib.rs.
#![allow(unsafe_code)]
// A bench binary: it prints its report, and a broken fixture should stop it loudly.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use criterion::{criterion_group, BatchSize, BenchmarkId, Criterion, Throughput};
use quipu_core::billing::{Charging, Prices};
use quipu_core::config::ReasoningField;
use quipu_core::money::{Pen, Rate};
use quipu_core::sse::{SseDecoder, SseError};
use quipu_core::translate::chat::ChatStream;
use quipu_core::translate::messages::{
    accumulate_message, validate_event_sequence, MessagesStream,
};
use quipu_core::translate::responses::{
    accumulate_response, validate_event_sequence as validate_responses, ResponsesContext,
    ResponsesStream,
};
use quipu_core::translate::{ResponseContext, StreamEnd, StreamTranslator};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

// ---------------------------------------------------------------------------------------------
// Allocation counting

/// `System`, counting allocations while [`COUNTING`] is on. Off during the timed benchmarks,
/// where the only cost left is one relaxed load per allocation.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static REALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

#[inline]
fn count(counter: &AtomicUsize, bytes: usize) {
    if COUNTING.load(Relaxed) {
        counter.fetch_add(1, Relaxed);
        BYTES.fetch_add(bytes, Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters are atomics and never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(&ALLOCS, layout.size());
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(&ALLOCS, layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(&REALLOCS, new_size.saturating_sub(layout.size()));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[derive(Clone, Copy, Default)]
struct Allocs {
    allocs: usize,
    reallocs: usize,
    bytes: usize,
}

/// Heap traffic of `f` (single-threaded: nothing else runs while the report is made).
fn allocs_of<R>(f: impl FnOnce() -> R) -> (R, Allocs) {
    ALLOCS.store(0, Relaxed);
    REALLOCS.store(0, Relaxed);
    BYTES.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    let r = black_box(f());
    COUNTING.store(false, Relaxed);
    let a = Allocs {
        allocs: ALLOCS.load(Relaxed),
        reallocs: REALLOCS.load(Relaxed),
        bytes: BYTES.load(Relaxed),
    };
    (r, a)
}

// ---------------------------------------------------------------------------------------------
// vLLM-shaped streams

/// What the generated tokens are.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Content tokens only.
    Text,
    /// 70 % `reasoning` tokens, then content (vLLM's reasoning parser, current field name).
    Reasoning,
    /// One tool call: a chunk with id and name, then argument fragments.
    Tool,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Text => "text",
            Shape::Reasoning => "reasoning",
            Shape::Tool => "tool",
        }
    }
}

/// Tokens of prose, cycled. Two of the sixteen need JSON escapes (a newline, quotes), as in
/// real markdown output; two are multi-byte UTF-8.
const WORDS: [&str; 16] = [
    " The",
    " quick",
    " ñandú",
    " runs",
    " across",
    " the",
    " Andes",
    ",",
    " and",
    "\n\n",
    " the",
    " llama",
    " 🦙",
    " says",
    " \"hola\"",
    ".",
];

/// Argument fragments of a tool call: JSON text, so many carry quotes (escaped in the chunk).
/// After an opening fragment, items are cycled; the last fragment closes whatever is open, so
/// the whole is valid JSON: `{"stops": [{"city": "Cusco"}, {"city": "Lima", "days": [1, 2]}, …]}`.
const ARG_ITEM: [&str; 13] = [
    ", ", "{\"", "city", "\":", " \"", "Lima", "\",", " \"", "days", "\":", " [", "1, 2", "]}",
];

/// The arguments fragment carried by token `i` (1 ≤ i < tokens) of a tool stream.
fn arg_fragment(i: usize, tokens: usize) -> String {
    if i == 1 {
        return "{\"stops\": [{\"city\": \"Cusco\"}".to_owned();
    }
    let k = (i - 2) % ARG_ITEM.len();
    if i + 1 < tokens {
        return ARG_ITEM[k].to_owned();
    }
    let rest = if k == 0 {
        String::new()
    } else {
        ARG_ITEM[k..].concat()
    };
    rest + "]}"
}

const PROMPT_TOKENS: usize = 1187;
const UPSTREAM_MODEL: &str = "Qwen/Qwen3-32B";

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// One `chat.completion.chunk` as vLLM sends it with `continuous_usage_stats` (which Quipu
/// requests): usage on every chunk.
fn chunk(delta: &str, finish: Option<&str>, completion_tokens: usize) -> String {
    let finish = finish.map_or("null".to_owned(), json_str);
    format!(
        "{{\"id\":\"chatcmpl-5f0c3e9b2a7d4e1f8a6b0c2d4e6f8a1b\",\"object\":\"chat.completion.chunk\",\
         \"created\":1767225600,\"model\":\"{UPSTREAM_MODEL}\",\"choices\":[{{\"index\":0,\
         \"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish},\"stop_reason\":null}}],\
         \"usage\":{{\"prompt_tokens\":{PROMPT_TOKENS},\"total_tokens\":{},\"completion_tokens\":{completion_tokens}}}}}",
        PROMPT_TOKENS + completion_tokens
    )
}

/// A whole upstream stream of `tokens` generated tokens, as SSE `data` payloads: the role
/// chunk, one chunk per token, the finish chunk, the usage-only chunk and `[DONE]`.
fn payloads(shape: Shape, tokens: usize) -> Vec<String> {
    let mut p = Vec::with_capacity(tokens + 4);
    p.push(chunk(r#"{"role":"assistant","content":""}"#, None, 0));
    let thinking = tokens * 7 / 10;
    for i in 0..tokens {
        let word = json_str(WORDS[i % WORDS.len()]);
        let delta = match shape {
            Shape::Text => format!("{{\"content\":{word}}}"),
            Shape::Reasoning if i < thinking => format!("{{\"reasoning\":{word}}}"),
            Shape::Reasoning => format!("{{\"content\":{word}}}"),
            Shape::Tool if i == 0 => r#"{"tool_calls":[{"id":"chatcmpl-tool-9b1d2c3e4f5a6b7c","type":"function","index":0,"function":{"name":"get_weather","arguments":""}}]}"#.to_owned(),
            Shape::Tool => format!(
                "{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":{}}}}}]}}",
                json_str(&arg_fragment(i, tokens))
            ),
        };
        p.push(chunk(&delta, None, i + 1));
    }
    let finish = match shape {
        Shape::Tool => "tool_calls",
        _ => "stop",
    };
    p.push(chunk("{}", Some(finish), tokens));
    p.push(format!(
        "{{\"id\":\"chatcmpl-5f0c3e9b2a7d4e1f8a6b0c2d4e6f8a1b\",\"object\":\"chat.completion.chunk\",\
         \"created\":1767225600,\"model\":\"{UPSTREAM_MODEL}\",\"choices\":[],\"usage\":{{\
         \"prompt_tokens\":{PROMPT_TOKENS},\"total_tokens\":{},\"completion_tokens\":{tokens},\
         \"prompt_tokens_details\":{{\"cached_tokens\":1024}}}}}}",
        PROMPT_TOKENS + tokens
    ));
    p.push("[DONE]".to_owned());
    p
}

/// The payloads as the bytes on the wire.
fn sse_bytes(payloads: &[String]) -> Vec<u8> {
    let mut b = Vec::new();
    for p in payloads {
        b.extend_from_slice(b"data: ");
        b.extend_from_slice(p.as_bytes());
        b.extend_from_slice(b"\n\n");
    }
    b
}

/// How the wire bytes arrive in reads.
#[derive(Clone, Copy, Debug)]
enum Split {
    /// All at once.
    Whole,
    /// Fixed-size reads.
    Every(usize),
    /// Two reads per event, the boundary in the middle of its `data:` line: every event goes
    /// through the partial-line path.
    MidLine,
}

impl Split {
    fn name(self) -> String {
        match self {
            Split::Whole => "whole".into(),
            Split::Every(n) => format!("{n}B-reads"),
            Split::MidLine => "mid-line".into(),
        }
    }

    fn pieces(self, bytes: &[u8]) -> Vec<&[u8]> {
        match self {
            Split::Whole => vec![bytes],
            Split::Every(n) => bytes.chunks(n).collect(),
            Split::MidLine => {
                let mut out = Vec::new();
                let mut rest = bytes;
                while !rest.is_empty() {
                    let end = rest.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
                    let (event, tail) = rest.split_at(end);
                    let (a, b) = event.split_at(event.len() / 2);
                    out.push(a);
                    out.push(b);
                    rest = tail;
                }
                out
            }
        }
    }
}

#[inline(never)]
fn decode(pieces: &[&[u8]]) -> usize {
    let mut d = SseDecoder::default();
    let mut events = 0;
    let mut on_event = |e: quipu_core::sse::SseEvent<'_>| {
        black_box(e.data);
        events += 1;
        Ok::<(), SseError>(())
    };
    for p in pieces {
        d.feed(p, &mut on_event).unwrap();
    }
    d.finish(&mut on_event).unwrap();
    events
}

// ---------------------------------------------------------------------------------------------
// Translators

#[derive(Clone, Copy, Debug)]
enum Translator {
    Chat,
    Messages,
    Responses,
}

impl Translator {
    fn name(self) -> &'static str {
        match self {
            Translator::Chat => "chat",
            Translator::Messages => "messages",
            Translator::Responses => "responses",
        }
    }

    /// A fresh translator, as the proxy builds one per request (boxed, like there), with the
    /// shipped default configuration: reasoning exposed under both field names, no usage chunk
    /// asked for.
    fn build(self) -> Box<dyn StreamTranslator> {
        let ctx = ResponseContext {
            request_id: "01JQ8Z6X4N2M7K5V3B9C1D0F2G".into(),
            client_model: match self {
                Translator::Chat | Translator::Responses => "aguila".into(),
                Translator::Messages => "claude-sonnet-4-5".into(),
            },
            slug: "aguila".into(),
            upstream_model: UPSTREAM_MODEL.into(),
            tool_name_map: Vec::new(),
            charging: Charging {
                prices: Prices {
                    input: Rate::parse("1.00").unwrap_or_default(),
                    cached: Rate::parse("0.25").unwrap_or_default(),
                    output: Rate::parse("4.00").unwrap_or_default(),
                },
                reserved: Pen::from_centimos(100),
                input_estimate: 20,
            },
        };
        match self {
            Translator::Chat => Box::new(ChatStream::new(ctx, false, ReasoningField::Both)),
            Translator::Messages => Box::new(MessagesStream::new(ctx)),
            // As a stored response (the API's default): the object is kept for the store.
            Translator::Responses => Box::new(ResponsesStream::new(ResponsesContext {
                base: ctx,
                created_at: 1_764_000_000,
                echo: b",\"instructions\":null,\"max_output_tokens\":8192".to_vec(),
                tools: Vec::new(),
                encrypted_reasoning: false,
                keep_object: true,
            })),
        }
    }
}

/// The proxy's output buffer (see `relay.rs`).
fn out_buffer() -> Vec<u8> {
    Vec::with_capacity(8 * 1024)
}

/// Feeds one stream; `out` is cleared after every event, as the proxy clears it per write.
// Not inlined, nor is `decode`: on a shared, noisy machine, instruction counts per case come
// from the report under `valgrind --tool=callgrind` with `--toggle-collect` and `--dump-after`
// on these two functions (see docs/benchmarks-micro.md).
#[inline(never)]
fn run(t: &mut dyn StreamTranslator, payloads: &[&[u8]], out: &mut Vec<u8>) {
    for p in payloads {
        t.on_event(p, out);
        black_box(&*out);
        out.clear();
    }
}

/// Runs a stream keeping all output, and checks it is the complete stream that was sent.
fn check(tr: Translator, shape: Shape, tokens: usize, payloads: &[&[u8]]) {
    let mut t = tr.build();
    let mut out = Vec::new();
    for p in payloads {
        t.on_event(p, &mut out);
    }
    assert_eq!(t.end(), StreamEnd::Complete, "{tr:?} {shape:?}");
    assert_eq!(t.usage().completion_tokens, tokens as u64);
    let words: String = (0..tokens).map(|i| WORDS[i % WORDS.len()]).collect();
    let thinking = tokens * 7 / 10;
    let split_at: usize = (0..thinking).map(|i| WORDS[i % WORDS.len()].len()).sum();
    let args: String = (1..tokens).map(|i| arg_fragment(i, tokens)).collect();
    serde_json::from_str::<serde_json::Value>(&args).unwrap();
    match tr {
        Translator::Messages => {
            validate_event_sequence(&out).unwrap();
            let m = accumulate_message(&out).unwrap();
            let content = &m["content"];
            match shape {
                Shape::Text => assert_eq!(content[0]["text"], words.as_str()),
                Shape::Reasoning => {
                    assert_eq!(content[0]["thinking"], &words[..split_at]);
                    assert_eq!(content[1]["text"], &words[split_at..]);
                }
                Shape::Tool => {
                    assert_eq!(content[0]["name"], "get_weather");
                    // The accumulator parses the arguments; compare the raw concatenation.
                    let s = String::from_utf8(out.clone()).unwrap();
                    let sent: String = s
                        .split("\n\n")
                        .filter_map(|f| f.split_once("\ndata: "))
                        .filter(|(ev, _)| *ev == "event: content_block_delta")
                        .map(|(_, d)| {
                            let v: serde_json::Value = serde_json::from_str(d).unwrap();
                            v["delta"]["partial_json"].as_str().unwrap().to_owned()
                        })
                        .collect();
                    assert_eq!(sent, args);
                }
            }
        }
        Translator::Responses => {
            validate_responses(&out).unwrap();
            let r = accumulate_response(&out).unwrap();
            let output = &r["output"];
            match shape {
                Shape::Text => assert_eq!(output[0]["content"][0]["text"], words.as_str()),
                Shape::Reasoning => {
                    assert_eq!(output[0]["content"][0]["text"], &words[..split_at]);
                    assert_eq!(output[1]["content"][0]["text"], &words[split_at..]);
                }
                Shape::Tool => {
                    assert_eq!(output[0]["name"], "get_weather");
                    assert_eq!(output[0]["arguments"], args.as_str());
                }
            }
        }
        Translator::Chat => {
            let s = String::from_utf8(out).unwrap();
            let (mut content, mut reasoning, mut arguments) =
                (String::new(), String::new(), String::new());
            let mut done = false;
            for f in s.split("\n\n").filter(|f| !f.is_empty()) {
                let d = f.strip_prefix("data: ").unwrap();
                if d == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(d).unwrap();
                assert_eq!(v["model"], "aguila");
                let delta = &v["choices"][0]["delta"];
                if let Some(r) = delta["reasoning"].as_str() {
                    assert_eq!(delta["reasoning_content"], r);
                    reasoning.push_str(r);
                }
                content.push_str(delta["content"].as_str().unwrap_or(""));
                let a = &delta["tool_calls"][0]["function"]["arguments"];
                arguments.push_str(a.as_str().unwrap_or(""));
            }
            assert!(done);
            match shape {
                Shape::Text => assert_eq!(content, words),
                Shape::Reasoning => {
                    assert_eq!(reasoning, &words[..split_at]);
                    assert_eq!(content, &words[split_at..]);
                }
                Shape::Tool => assert_eq!(arguments, args),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The allocation report

const SHAPES: [Shape; 3] = [Shape::Text, Shape::Reasoning, Shape::Tool];
const TRANSLATORS: [Translator; 3] = [
    Translator::Chat,
    Translator::Messages,
    Translator::Responses,
];
const LENGTHS: [usize; 2] = [100, 2000];
const SPLITS: [Split; 4] = [
    Split::Whole,
    Split::Every(1024),
    Split::Every(7),
    Split::MidLine,
];

fn alloc_report() {
    println!("allocations per upstream chunk (SSE event), after correctness checks:");
    println!(
        "{:<36} {:>7} {:>12} {:>14} {:>13} {:>14}",
        "case", "events", "allocs/event", "reallocs/event", "bytes/event", "setup allocs"
    );
    let row = |name: &str, events: usize, a: Allocs, setup: usize| {
        println!(
            "{:<36} {:>7} {:>12.2} {:>14.2} {:>13.1} {:>14}",
            name,
            events,
            a.allocs as f64 / events as f64,
            a.reallocs as f64 / events as f64,
            a.bytes as f64 / events as f64,
            setup
        );
    };
    for tokens in LENGTHS {
        let p = payloads(Shape::Text, tokens);
        let bytes = sse_bytes(&p);
        for split in SPLITS {
            let pieces = split.pieces(&bytes);
            let (events, a) = allocs_of(|| decode(&pieces));
            assert_eq!(events, p.len());
            row(&format!("sse/{}/{tokens}", split.name()), events, a, 0);
        }
    }
    for tr in TRANSLATORS {
        for shape in SHAPES {
            for tokens in LENGTHS {
                let p = payloads(shape, tokens);
                let refs: Vec<&[u8]> = p.iter().map(|s| s.as_bytes()).collect();
                check(tr, shape, tokens, &refs);
                let ((mut t, mut out), setup) = allocs_of(|| (tr.build(), out_buffer()));
                let ((), a) = allocs_of(|| run(t.as_mut(), &refs, &mut out));
                row(
                    &format!("{}/{}/{tokens}", tr.name(), shape.name()),
                    refs.len(),
                    a,
                    setup.allocs,
                );
            }
        }
    }
    println!();
}

// ---------------------------------------------------------------------------------------------
// Timings

fn bench_sse(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse");
    for tokens in LENGTHS {
        let p = payloads(Shape::Text, tokens);
        let bytes = sse_bytes(&p);
        for split in SPLITS {
            // The long stream only whole and in tiny reads: enough for the scaling check.
            if tokens != 100 && matches!(split, Split::Every(1024) | Split::MidLine) {
                continue;
            }
            let pieces = split.pieces(&bytes);
            g.throughput(Throughput::Elements(p.len() as u64));
            g.bench_with_input(
                BenchmarkId::new(split.name(), tokens),
                &pieces,
                |b, pieces| b.iter(|| decode(pieces)),
            );
        }
    }
    g.finish();
}

fn bench_translators(c: &mut Criterion) {
    for tr in TRANSLATORS {
        let mut g = c.benchmark_group(tr.name());
        for shape in SHAPES {
            for tokens in LENGTHS {
                let p = payloads(shape, tokens);
                let refs: Vec<&[u8]> = p.iter().map(|s| s.as_bytes()).collect();
                g.throughput(Throughput::Elements(refs.len() as u64));
                g.bench_with_input(BenchmarkId::new(shape.name(), tokens), &refs, |b, refs| {
                    b.iter_batched(
                        || (tr.build(), out_buffer()),
                        |(mut t, mut out)| {
                            run(t.as_mut(), refs, &mut out);
                            (t, out)
                        },
                        BatchSize::SmallInput,
                    )
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench_sse, bench_translators);

fn main() {
    alloc_report();
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
