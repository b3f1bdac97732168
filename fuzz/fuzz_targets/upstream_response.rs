//! The upstream response reader (`quipu_core::h1`): whatever bytes an upstream sends, split
//! wherever reads split them, nothing panics; the head, the body and whether and how it fails do
//! not depend on the split; a body never yields more than its `Content-Length`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::h1::{parse_head, Body, Framing, Step};
use quipu_fuzz::{pieces, split_input};

/// What reading a response out of `parts` gave: the final head's status and framing, the body
/// bytes, and the error, if any (`eof` when the bytes ended before a head did).
type Outcome = (Option<(u16, Framing)>, Vec<u8>, Result<(), String>);

/// Reads a response the way the upstream client does: parse heads (skipping 1xx ones) out of
/// a buffer that grows with each piece, then decode the body from the unconsumed bytes.
fn read(parts: &[&[u8]]) -> Outcome {
    let mut parts = parts.iter();
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = 0;
    let head = loop {
        match parse_head(&buf[pos..]) {
            Err(e) => return (None, Vec::new(), Err(e)),
            Ok(Some((head, len))) => {
                assert!(len <= buf.len() - pos, "a head longer than its input");
                pos += len;
                if !head.is_informational() {
                    break head;
                }
            }
            Ok(None) => match parts.next() {
                Some(p) => buf.extend_from_slice(p),
                None => return (None, Vec::new(), Err("eof".into())),
            },
        }
    };
    let mut body = Body::new(head.framing);
    let mut out = Vec::new();
    let result = loop {
        let input = &buf[pos..];
        let (used, step) = match body.step(input) {
            Ok(s) => s,
            Err(e) => break Err(e),
        };
        assert!(used <= input.len(), "consumed more than its input");
        match step {
            Step::Data(r) => {
                assert!(
                    r.end <= used && r.start < r.end,
                    "data outside what was consumed"
                );
                out.extend_from_slice(&input[r]);
            }
            Step::End => {
                assert!(body.is_done());
                break Ok(());
            }
            Step::More => match parts.next() {
                Some(p) => buf.extend_from_slice(p),
                None => match body.at_eof() {
                    Ok(()) => break Ok(()),
                    Err(e) => break Err(e),
                },
            },
        }
        pos += used;
    };
    if let Framing::Length(n) = head.framing {
        assert!(out.len() as u64 <= n, "more body than Content-Length");
        if result.is_ok() {
            assert_eq!(
                out.len() as u64,
                n,
                "a complete body shorter than Content-Length"
            );
        }
    }
    (Some((head.status, head.framing)), out, result)
}

fuzz_target!(|data: &[u8]| {
    let (wire, points) = split_input(data);
    let whole = read(&[wire]);
    let split = read(&pieces(wire, &points));
    assert_eq!(whole, split, "split at {points:?} changed the outcome");
});
