//! Fixture harness for the messages-format stream translator.
//!
//! Replays every recorded upstream chunk sequence in `tests/fixtures/messages/<case>.sse`
//! through `feed_stream` / `finish_stream` (`quipu_core::testing::replay`) and compares the
//! client bytes with `<case>.expected`. Each case is replayed whole, split in two at every byte offset (inside
//! multi-byte UTF-8 characters and CRLF pairs included), split in three at a spread of
//! offset pairs, and fed one byte at a time; every run is labelled (`tool_use/split@17`) and
//! must give byte-identical output, usage and end state. Every output must also pass
//! `validate_event_sequence`.
//!
//! `QUIPU_BLESS=1 cargo test --release --test messages_conformance` rewrites the `.expected`
//! files from the current output (review the diff before committing).

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test harness: any failure is the test failing"
)]

use quipu::translate::messages::prompt::shorten_tool_name;
use quipu::translate::messages::{validate_event_sequence, MessagesStream};
use quipu::translate::ResponseContext;
use quipu_core::testing::{replay, Replay};
use std::path::{Path, PathBuf};

const LONG_TOOL: &str = "mcp__claude_ai_project_tracker__create_issue_with_labels_and_assignees";

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_fx".into(),
        client_model: "claude-sonnet-4-5".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-VL-32B-Instruct".into(),
        tool_name_map: vec![(shorten_tool_name(LONG_TOOL), LONG_TOOL.into())],
    }
}

fn run(chunks: &[&[u8]]) -> Replay {
    replay(&mut MessagesStream::new(ctx()), chunks)
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/messages")
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
    let ctx = |b: &[u8]| {
        String::from_utf8_lossy(&b[at.saturating_sub(60)..(at + 60).min(b.len())]).into_owned()
    };
    panic!(
        "{label}: output differs from the whole-input run at byte {at}\n got: …{}…\nwant: …{}…\nusage {:?} vs {:?}, end {:?} vs {:?}",
        ctx(&got.out),
        ctx(&want.out),
        got.usage,
        want.usage,
        got.end,
        want.end
    );
}

#[test]
fn every_fixture_matches_its_expected_frames() {
    let bless = std::env::var_os("QUIPU_BLESS").is_some();
    for (name, input) in cases() {
        let whole = run(&[&input]);
        if let Err(e) = validate_event_sequence(&whole.out) {
            panic!(
                "{name}: invalid event sequence: {e}\n{}",
                String::from_utf8_lossy(&whole.out)
            );
        }
        assert!(
            !whole.out.windows(6).any(|w| w == b"[DONE]"),
            "{name}: [DONE] leaked"
        );
        let path = fixture_dir().join(format!("{name}.expected"));
        if bless {
            std::fs::write(&path, &whole.out).unwrap();
            continue;
        }
        let expected = std::fs::read(&path)
            .unwrap_or_else(|_| panic!("{name}: no {name}.expected (run with QUIPU_BLESS=1)"));
        assert!(
            whole.out == expected,
            "{name}: output differs from {name}.expected\n--- got ---\n{}",
            String::from_utf8_lossy(&whole.out)
        );
    }
}

#[test]
fn every_split_gives_identical_output() {
    for (name, input) in cases() {
        let whole = run(&[&input]);
        let n = input.len();
        for i in 0..=n {
            let got = run(&[&input[..i], &input[i..]]);
            assert_same(&format!("{name}/split@{i}"), &got, &whole);
        }
        let step_i = (n / 29).max(1);
        let step_j = (n / 31).max(1);
        for i in (0..=n).step_by(step_i) {
            for j in (i..=n).step_by(step_j) {
                let got = run(&[&input[..i], &input[i..j], &input[j..]]);
                assert_same(&format!("{name}/split@{i},{j}"), &got, &whole);
            }
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_same(&format!("{name}/bytewise"), &run(&bytes), &whole);
    }
}
