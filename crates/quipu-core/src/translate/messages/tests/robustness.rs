//! Robustness: deep nesting, mutated requests and streams (a seeded generator, no panics and
//! always a valid event sequence), the sequence validator itself, linear request cost, and
//! no upstream model name in errors that quote upstream bytes.

use super::*;

/// A tiny deterministic generator (xorshift) for the property tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn deep_nesting_is_a_400_never_a_crash() {
    let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
    let curly = |n: usize| "{\"a\":".repeat(n) + "1" + &"}".repeat(n);
    for n in [200, 10_000, 200_000] {
        for body in [
            deep(n),
            format!("{{\"model\":\"aguila\",\"messages\":{}}}", deep(n)),
            format!("{{\"model\":\"aguila\",\"x\":{}}}", deep(n)),
            format!(
                "{{\"model\":\"aguila\",\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}}],\"tools\":[{{\"name\":\"t\",\"input_schema\":{}}}]}}",
                curly(n)
            ),
            format!(
                "{{\"model\":\"aguila\",\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}},{{\"role\":\"assistant\",\"content\":[{{\"type\":\"tool_use\",\"id\":\"i\",\"name\":\"n\",\"input\":{}}}]}}]}}",
                curly(n)
            ),
            format!("{{\"model\":\"aguila\",\"messages\":[{{\"role\":\"user\",\"content\":[{{\"type\":\"text\",\"text\":\"x\",\"citations\":{}}}]}}]}}", deep(n)),
        ] {
            match messages_to_upstream(body.as_bytes(), config()) {
                Err(e) => assert_eq!(e.status(ClientFormat::Messages), 400),
                // Only where the deep value is dropped (an unknown field, citations).
                Ok(r) => assert!(r.body.len() < 1000, "deep value forwarded"),
            }
            let _ = count_tokens_to_upstream(body.as_bytes(), config());
            let _ = upstream_to_message(body.as_bytes(), &ctx());
        }
    }
}

#[test]
fn mutated_requests_never_panic() {
    let seeds = [
        claude_code_request("x-anthropic-billing-header: a;", "hi").to_string(),
        with_tool_use(json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "t"}, image("image/png")]})).to_string(),
        with_tools(json!({"type": "tool", "name": "get_time", "disable_parallel_tool_use": true})).to_string(),
    ];
    let alphabet = b"{}[]\",:\\ 0-1etrufalsnxy\xc3\xb1\xff\n";
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for seed in &seeds {
        let seed = seed.as_bytes();
        for _ in 0..3000 {
            let mut b = seed.to_vec();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(b.len());
                match rng.below(3) {
                    0 => b[at] = alphabet[rng.below(alphabet.len())],
                    1 => {
                        b.remove(at);
                    }
                    _ => b.truncate(at),
                }
                if b.is_empty() {
                    break;
                }
            }
            if let Ok(r) = messages_to_upstream(&b, config()) {
                // Whatever is accepted produces valid JSON with its prompt range in place.
                let v: Value = serde_json::from_slice(&r.body)
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r.body)));
                assert!(v["messages"].is_array());
                assert_eq!(r.body[r.prompt_range.start], b'[');
            }
            if let Ok((_, body)) = count_tokens_to_upstream(&b, config()) {
                serde_json::from_slice::<Value>(&body).unwrap();
            }
        }
    }
}

#[test]
fn mutated_streams_always_give_a_valid_event_sequence() {
    let inputs = [
        fixture!("worked_example"),
        fixture!("parallel_tools"),
        fixture!("sglang_reasoning_matched_stop"),
        fixture!("name_after_id"),
        fixture!("llamacpp_timings"),
    ];
    let alphabet = b"{}[]\",:\\ 0-1\n\rdata:[DONE]\xf0\x9f";
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for input in inputs {
        let input = input.as_bytes();
        for round in 0..1500 {
            let mut b = input.to_vec();
            for _ in 0..1 + rng.below(6) {
                if b.is_empty() {
                    break;
                }
                let at = rng.below(b.len());
                match rng.below(4) {
                    0 => b[at] = alphabet[rng.below(alphabet.len())],
                    1 => {
                        b.remove(at);
                    }
                    2 => {
                        // Swap two chunks' order.
                        let other = rng.below(b.len());
                        b.swap(at, other);
                    }
                    _ => b.truncate(at.max(1)),
                }
            }
            let split = rng.below(b.len() + 1);
            let s = stream_chunks(&[&b[..split], &b[split..]]);
            if let Err(e) = validate_event_sequence(&s.out) {
                panic!(
                    "round {round}: {e}\ninput: {}\noutput: {}",
                    String::from_utf8_lossy(&b),
                    String::from_utf8_lossy(&s.out)
                );
            }
            assert_ne!(s.end, StreamEnd::Open);
        }
    }
}

#[test]
fn validator_rejects_broken_sequences() {
    let good = stream(fixture!("worked_example")).out;
    validate_event_sequence(&good).unwrap();
    let text = String::from_utf8(good).unwrap();
    let frames: Vec<&str> = text.split_inclusive("\n\n").collect();
    let join = |f: &[&str]| f.concat().into_bytes();
    // Dropping any single structural frame breaks it.
    for i in 0..frames.len() {
        if frames[i].contains("content_block_delta") {
            continue;
        }
        let mut f = frames.clone();
        f.remove(i);
        assert!(
            validate_event_sequence(&join(&f)).is_err(),
            "dropped frame {i}"
        );
    }
    let mut f = frames.clone();
    f.push("event: ping\ndata: {\"type\":\"ping\"}\n\n");
    assert!(
        validate_event_sequence(&join(&f)).is_err(),
        "frame after stop"
    );
    let mut f = frames.clone();
    f.push("data: [DONE]\n\n");
    assert!(validate_event_sequence(&join(&f)).is_err(), "[DONE]");
    let mut f = frames.clone();
    f.swap(1, 2);
    assert!(validate_event_sequence(&join(&f)).is_err(), "swapped");
    let bad_type = text.replacen(
        "\"type\":\"content_block_stop\"",
        "\"type\":\"content_block_end\"",
        1,
    );
    assert!(validate_event_sequence(bad_type.as_bytes()).is_err());
    let bad_index = text.replacen(
        "\"index\":1,\"content_block\"",
        "\"index\":2,\"content_block\"",
        1,
    );
    assert!(validate_event_sequence(bad_index.as_bytes()).is_err());
    assert!(validate_event_sequence(b"").is_err());
    validate_event_sequence(
        b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"x\"}}\n\n",
    )
    .unwrap();
}

/// A Claude Code-sized request (~20 tools, a long system prompt, `turns` tool round trips).
fn claude_code_sized(turns: usize) -> String {
    let mut v = claude_code_request("x-anthropic-billing-header: a;", "hi");
    let schema = json!({"type": "object", "properties": {"command": {"type": "string", "description": "d".repeat(200)}}});
    let tools: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("Tool{i}"), "description": "x".repeat(1500), "input_schema": schema}))
        .collect();
    v["tools"] = json!(tools);
    v["system"][2]["text"] = json!("You are an agent.\n".repeat(400));
    let msgs = v["messages"].as_array_mut().unwrap();
    for i in 0..turns {
        let id = format!("toolu_{i}");
        msgs.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Running.\n"}, {"type": "tool_use", "id": id, "name": "Tool1", "input": {"command": "ls -la"}}]}));
        msgs.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "file\n".repeat(100), "is_error": false}]}));
    }
    v.to_string()
}

/// Speed is measured by the benchmarks (`benches/stream.rs`), not by a wall-clock assertion
/// that flakes on a loaded CI machine. What a test can pin is the shape of the work: the
/// upstream body grows linearly with the conversation, by what each turn adds, and is no
/// bigger than the client's body plus the escaping of tool inputs.
#[test]
fn request_translation_is_linear_in_the_conversation() {
    let sizes: Vec<(usize, usize)> = [20, 40, 80]
        .into_iter()
        .map(|turns| {
            let body = claude_code_sized(turns);
            let r = messages_to_upstream(body.as_bytes(), config()).unwrap();
            let up: Value = serde_json::from_slice(&r.body).unwrap();
            // system + 2 user blocks' message + system entry + one assistant and one tool
            // message per turn.
            assert_eq!(up["messages"].as_array().unwrap().len(), 3 + 2 * turns);
            assert!(
                r.body.len() < body.len(),
                "{} vs {}",
                r.body.len(),
                body.len()
            );
            (body.len(), r.body.len())
        })
        .collect();
    // Every turn adds the same bytes (to within the digits of the growing ids): 40 more turns
    // add twice what 20 more did.
    let twenty = sizes[1].1 - sizes[0].1;
    let forty = sizes[2].1 - sizes[1].1;
    assert!(forty.abs_diff(2 * twenty) <= twenty / 100, "{sizes:?}");
}

#[test]
fn errors_quoting_upstream_bytes_never_name_the_upstream_model() {
    // Found by the stream fuzzer: a parser's complaint and an unknown finish reason quote
    // what the upstream sent, the upstream's model name included.
    let up = "Qwen/Qwen3-VL-32B-Instruct";
    for body in [
        format!(r#"{{"choices":"{up}"}}"#),
        format!(r#"{{"choices":[{{"index":0,"delta":{{}},"finish_reason":"{up}"}}]}}"#),
    ] {
        let s = stream(&format!("data: {body}\n\n"));
        let text = String::from_utf8(s.out.clone()).unwrap();
        assert!(text.contains("event: error"), "{text}");
        assert!(!text.contains(up), "{text}");
        let e = nonstream(&serde_json::from_str::<Value>(&body).unwrap()).unwrap_err();
        assert!(!e.message.contains(up), "{}", e.message);
    }
}
