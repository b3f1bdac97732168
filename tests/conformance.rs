//! Fixture harness for the stream translators of every client format.
//!
//! Every recorded upstream stream in `tests/fixtures/streams/<case>.sse` (written by
//! `generate.py` there) is replayed through each client format's stream translator, as the
//! proxy feeds it (`quipu_core::testing::replay`), and the client bytes are compared with
//! `<case>.<format>.expected`. The formats:
//!
//! - `messages`: the messages format (`MessagesStream`), a long tool name restored;
//! - `chat`: the chat format as shipped (`ChatStream`, reasoning under both field names), the
//!   client not asking for usage;
//! - `chat-usage`: the same, the client asking for usage (`stream_options.include_usage`);
//! - `responses`: the Responses API (`ResponsesStream`), a namespaced function tool restored,
//!   the object kept for the store.
//!
//! Each case is replayed whole, split in two at every byte offset (inside multi-byte UTF-8
//! characters and CRLF pairs included), split in three at a spread of offset pairs, and fed
//! one byte at a time; every run is labelled (`chat/parallel_tools/split@17`) and must give
//! byte-identical output, usage, end state and error. Every output must also be a valid
//! stream of its format (see [`valid_messages`], [`valid_chat`] and [`valid_responses`]).
//!
//! The formats come from [`ClientFormat`]'s variants, so a new format is replayed here (and
//! fuzzed: [`every_format_has_its_fuzz_targets`]) or does not compile.
//!
//! `QUIPU_BLESS=1 cargo test --release --test conformance` rewrites the `.expected` files from
//! the current output (review the diff before committing).

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test harness: any failure is the test failing"
)]

use quipu::config::ReasoningField;
use quipu::error::ClientFormat;
use quipu::translate::chat::{Chat, ChatContext};
use quipu::translate::common::tool_names::shorten_tool_name;
use quipu::translate::messages::{validate_event_sequence, Messages};
use quipu::translate::responses::{Responses, ResponsesContext, ToolName};
use quipu::translate::{Format as _, ResponseContext, StreamEnd, StreamTranslator};
use quipu_core::testing::{replay, Replay};
use serde_json::Value;
use std::path::{Path, PathBuf};

const LONG_TOOL: &str = "mcp__claude_ai_project_tracker__create_issue_with_labels_and_assignees";
/// The model name the recorded upstreams report (never shown to a client).
const UPSTREAM_MODEL: &str = "Qwen/Qwen3-VL-32B-Instruct";

/// A client format as a fixture replays it: how to build its translator and what a valid
/// output of it is.
struct Format {
    name: &'static str,
    build: fn() -> Box<dyn StreamTranslator>,
    valid: fn(&Replay) -> Result<(), String>,
}

/// The replayed formats: every variant of [`ClientFormat`] (a new one does not compile until
/// it is listed here, and then fails until its `.expected` files exist), the chat format
/// twice (with and without the client asking for usage).
fn formats() -> Vec<Format> {
    ClientFormat::all()
        .flat_map(|format| match format {
            ClientFormat::Messages => vec![Format {
                name: "messages",
                build: || Box::new(Messages::stream(messages_ctx())),
                valid: valid_messages,
            }],
            ClientFormat::Chat => vec![
                Format {
                    name: "chat",
                    build: || Box::new(Chat::stream(chat_options(false))),
                    valid: |r| valid_chat(r, false),
                },
                Format {
                    name: "chat-usage",
                    build: || Box::new(Chat::stream(chat_options(true))),
                    valid: |r| valid_chat(r, true),
                },
            ],
            ClientFormat::Responses => vec![Format {
                name: "responses",
                build: || Box::new(Responses::stream(responses_ctx())),
                valid: valid_responses,
            }],
        })
        .collect()
}

/// The chat format as shipped: reasoning under both field names.
fn chat_options(client_wants_usage: bool) -> ChatContext {
    ChatContext {
        base: chat_ctx(),
        client_wants_usage,
        reasoning: ReasoningField::Both,
    }
}

fn responses_ctx() -> ResponsesContext {
    ResponsesContext {
        base: chat_ctx(),
        created_at: 1_764_000_000,
        echo: b",\"instructions\":null,\"max_output_tokens\":8192".to_vec(),
        tools: vec![ToolName {
            // As if declared in a namespace: the client sees `weather` / `current`.
            upstream: "get_weather".into(),
            name: "current".into(),
            namespace: Some("weather".into()),
        }],
        encrypted_reasoning: false,
        keep_object: true,
    }
}

/// A Responses API stream: a valid numbered event sequence (see
/// `quipu::translate::responses::validate_event_sequence`), the slug and never the upstream's
/// model name.
fn valid_responses(r: &Replay) -> Result<(), String> {
    if r.out
        .windows(UPSTREAM_MODEL.len())
        .any(|w| w == UPSTREAM_MODEL.as_bytes())
    {
        return Err("the upstream's model name reached the client".into());
    }
    quipu::translate::responses::validate_event_sequence(&r.out).map(|_| ())
}

fn messages_ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_fx".into(),
        client_model: "claude-sonnet-4-5".into(),
        slug: "aguila".into(),
        upstream_model: UPSTREAM_MODEL.into(),
        tool_name_map: vec![(shorten_tool_name(LONG_TOOL), LONG_TOOL.into())],
        charging: quipu_core::testing::charging(),
    }
}

fn chat_ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_fx".into(),
        client_model: "aguila".into(),
        slug: "aguila".into(),
        upstream_model: UPSTREAM_MODEL.into(),
        // Chat requests never shorten tool names (longer ones are a 400).
        tool_name_map: Vec::new(),
        charging: quipu_core::testing::charging(),
    }
}

fn run(format: &Format, reads: &[&[u8]]) -> Replay {
    replay((format.build)().as_mut(), reads)
}

/// A messages stream: a valid event sequence (`message_start` first, dense indexes, one open
/// block, `message_stop` or an `error` event last), and no chat-format `[DONE]`.
fn valid_messages(r: &Replay) -> Result<(), String> {
    validate_event_sequence(&r.out).map_err(|e| e.to_string())?;
    if r.out.windows(6).any(|w| w == b"[DONE]") {
        return Err("[DONE] leaked into a messages stream".into());
    }
    Ok(())
}

/// A chat stream: UTF-8, frames of one `data: ` line each, every one a JSON chunk or error but
/// the last, which is `[DONE]`; the slug as every frame's `model`, never the upstream's; usage
/// frames only for a client that asked; and a failed stream's last frame before `[DONE]` is
/// its error, which is the only error frame.
fn valid_chat(r: &Replay, wants_usage: bool) -> Result<(), String> {
    let text = std::str::from_utf8(&r.out).map_err(|e| format!("not UTF-8: {e}"))?;
    if text.contains(UPSTREAM_MODEL) {
        return Err("the upstream's model name reached the client".into());
    }
    let frames: Vec<&str> = text
        .strip_suffix("\n\n")
        .ok_or("the output does not end with a blank line")?
        .split("\n\n")
        .collect();
    let (last, events) = frames.split_last().ok_or("no frames")?;
    if *last != "data: [DONE]" {
        return Err(format!("the last frame is not data: [DONE] but {last:?}"));
    }
    let mut errors = Vec::new();
    for (n, frame) in events.iter().enumerate() {
        let data = frame
            .strip_prefix("data: ")
            .filter(|d| !d.contains('\n'))
            .ok_or_else(|| format!("frame {n} is not one data line: {frame:?}"))?;
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("frame {n} is not JSON ({e})"))?;
        if let Some(m) = v.get("model") {
            if m != "aguila" {
                return Err(format!("frame {n} has model {m}, not the slug"));
            }
        }
        if !wants_usage && v.get("usage").is_some_and(|u| !u.is_null()) {
            return Err(format!(
                "frame {n} shows usage to a client that did not ask"
            ));
        }
        match v.get("error") {
            Some(e) if e["message"].is_string() && e["type"].is_string() => errors.push(n),
            Some(e) => return Err(format!("frame {n} is a malformed error: {e}")),
            // `choices` may be absent: a usage-only chunk is relayed as the upstream shaped it,
            // and one upstream leaves the key out (`usage_missing_choices`; OpenAI sends `[]`).
            None if v.is_object() && v.get("choices").is_none_or(Value::is_array) => {}
            None => {
                return Err(format!(
                    "frame {n} is not a chunk (an object, `choices` an array): {data}"
                ))
            }
        }
    }
    let want: &[usize] = match r.end {
        StreamEnd::Failed => &[events.len().saturating_sub(1)],
        _ => &[],
    };
    if errors != want {
        return Err(format!(
            "error frames at {errors:?} for a stream that ended {:?}",
            r.end
        ));
    }
    Ok(())
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/streams")
}

fn cases() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(String, Vec<u8>)> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sse"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 20, "fixtures missing: {}", cases.len());
    cases
}

fn expected_path(case: &str, format: &Format) -> PathBuf {
    fixture_dir().join(format!("{case}.{}.expected", format.name))
}

fn assert_same(label: &str, got: &Replay, want: &Replay) {
    if got == want {
        return;
    }
    let at = got
        .out
        .iter()
        .zip(&want.out)
        .position(|(a, b)| a != b)
        .unwrap_or(got.out.len().min(want.out.len()));
    let around = |b: &[u8]| {
        String::from_utf8_lossy(&b[at.saturating_sub(60)..(at + 60).min(b.len())]).into_owned()
    };
    panic!(
        "{label}: differs from the whole-input run at byte {at}\n got: …{}…\nwant: …{}…\n\
         usage {:?} vs {:?}, end {:?} vs {:?}, error {:?} vs {:?}",
        around(&got.out),
        around(&want.out),
        got.usage,
        want.usage,
        got.end,
        want.end,
        got.error,
        want.error
    );
}

#[test]
fn every_fixture_matches_its_expected_output_in_every_format() {
    let bless = std::env::var_os("QUIPU_BLESS").is_some();
    let formats = formats();
    for (case, input) in cases() {
        for format in &formats {
            let label = format!("{}/{case}", format.name);
            let whole = run(format, &[&input]);
            if let Err(e) = (format.valid)(&whole) {
                panic!(
                    "{label}: invalid output: {e}\n{}",
                    String::from_utf8_lossy(&whole.out)
                );
            }
            assert_ne!(whole.end, StreamEnd::Open, "{label}: left open");
            let path = expected_path(&case, format);
            if bless {
                std::fs::write(&path, &whole.out).unwrap();
                continue;
            }
            let expected = std::fs::read(&path).unwrap_or_else(|_| {
                panic!("{label}: no {} (run with QUIPU_BLESS=1)", path.display())
            });
            assert!(
                whole.out == expected,
                "{label}: output differs from {}\n--- got ---\n{}",
                path.display(),
                String::from_utf8_lossy(&whole.out)
            );
        }
    }
}

#[test]
fn every_expected_file_has_its_fixture() {
    let cases: Vec<String> = cases().into_iter().map(|(c, _)| c).collect();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".expected") else {
            continue;
        };
        let known = formats().iter().any(|f| {
            stem.strip_suffix(f.name)
                .and_then(|c| c.strip_suffix('.'))
                .is_some_and(|c| cases.iter().any(|k| k == c))
        });
        assert!(
            known,
            "{name}: no such case and format; delete it or add its .sse"
        );
    }
}

#[test]
fn every_split_gives_identical_output() {
    let formats = formats();
    for (case, input) in cases() {
        for format in &formats {
            let label = format!("{}/{case}", format.name);
            let whole = run(format, &[&input]);
            let n = input.len();
            for i in 0..=n {
                let got = run(format, &[&input[..i], &input[i..]]);
                assert_same(&format!("{label}/split@{i}"), &got, &whole);
            }
            let step_i = (n / 29).max(1);
            let step_j = (n / 31).max(1);
            for i in (0..=n).step_by(step_i) {
                for j in (i..=n).step_by(step_j) {
                    let got = run(format, &[&input[..i], &input[i..j], &input[j..]]);
                    assert_same(&format!("{label}/split@{i},{j}"), &got, &whole);
                }
            }
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            assert_same(&format!("{label}/bytewise"), &run(format, &bytes), &whole);
        }
    }
}

/// The `cost` members written in `out`, as written (a quoted `"cost":` inside a string is
/// escaped, `\"cost\":`, so it is not one).
fn costs_written(out: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(out).unwrap();
    text.match_indices("\"cost\":")
        .filter(|(at, _)| !text[..*at].ends_with('\\'))
        .map(|(at, key)| {
            text[at + key.len()..]
                .chars()
                .take_while(|c| !matches!(c, ',' | '}'))
                .collect()
        })
        .collect()
}

/// A JSON number as `Pen::json_number` writes it: digits, at most 12 decimals, no trailing
/// zero, no sign, no exponent.
fn is_exact_decimal(n: &str) -> bool {
    let (whole, frac) = n.split_once('.').unwrap_or((n, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    !whole.is_empty()
        && digits(whole)
        && digits(frac)
        && (whole == "0" || !whole.starts_with('0'))
        && frac.len() <= 12
        && n.contains('.') != frac.is_empty()
        && !frac.ends_with('0')
}

/// The cost on every answer: wherever a format writes its final usage — `message_delta`, the
/// Responses API's terminal object (`response.failed` included), the chat usage chunk after the
/// finish when asked for — it carries `cost`, and the last one written is the charge of the
/// usage the stream bills, which is what the settlement records.
#[test]
fn every_cost_written_is_the_charge_of_the_usage_billed() {
    let terms = quipu_core::testing::charging();
    let mut shown = 0;
    for (case, input) in cases() {
        for format in &formats() {
            let label = format!("{}/{case}", format.name);
            let r = run(format, &[&input]);
            let costs = costs_written(&r.out);
            let want = match (format.name, r.end) {
                ("messages", StreamEnd::Complete) | ("responses", _) => 1,
                ("messages" | "chat", _) => 0,
                // One per usage chunk after the finish: the upstream's to send.
                _ => costs.len(),
            };
            assert_eq!(costs.len(), want, "{label}: {costs:?}");
            for c in &costs {
                assert!(is_exact_decimal(c), "{label}: {c} is not an exact decimal");
            }
            if let Some(last) = costs.last() {
                assert_eq!(*last, terms.cost(r.usage).to_json_number(), "{label}");
                shown += 1;
            }
        }
    }
    assert!(shown > 60, "only {shown} answers carried a cost");
}

/// Every format is fuzzed: for each variant of [`ClientFormat`], its request and stream
/// targets (`fuzz/fuzz_targets/<format>_request.rs`, `<format>_stream.rs`) exist, run that
/// variant's body (`quipu_fuzz::formats`, whose `match` on the variant does not compile
/// without it), are declared in `fuzz/Cargo.toml` and have a seed folder.
#[test]
fn every_format_has_its_fuzz_targets() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    for format in ClientFormat::all() {
        for kind in ["request", "stream"] {
            let target = format!("{}_{kind}", format.as_str());
            let path = fuzz.join("fuzz_targets").join(format!("{target}.rs"));
            let code = std::fs::read_to_string(&path)
                .unwrap_or_else(|_| panic!("{format:?}: no fuzz target {}", path.display()));
            let variant = format!("ClientFormat::{format:?}");
            let body = format!("quipu_fuzz::formats::{kind}({format:?}, data)");
            assert!(
                code.contains(&variant) && code.contains(&body),
                "{}: does not run {body} for {variant}",
                path.display()
            );
            let declared = format!("name = \"{target}\"\npath = \"fuzz_targets/{target}.rs\"");
            assert!(
                manifest.contains(&declared),
                "fuzz/Cargo.toml: no [[bin]] {target}"
            );
            assert!(
                fuzz.join("seeds").join(&target).is_dir(),
                "no fuzz/seeds/{target}"
            );
        }
    }
}
