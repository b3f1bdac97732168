//! Streams: event framing and order, indexes, tool-use deltas,
//! usage in `message_start` and `message_delta`, pings, equality with the non-streaming
//! answer, and the recorded upstream edge cases of `tests/fixtures/`.

use super::*;

#[test]
fn c26_frames_have_event_lines_with_matching_type_and_utf8_reassembles() {
    let input = fixture!("text_basic");
    let whole = stream(input);
    validate_event_sequence(&whole.out).unwrap();
    for (name, data) in events(&whole.out) {
        assert_eq!(data["type"], name);
    }
    assert!(whole.out.ends_with(b"\n\n"));
    // Split inside the 4-byte llama emoji and inside ñ.
    let bytes = input.as_bytes();
    let llama = input.find('🦙').unwrap();
    let enye = input.find('ñ').unwrap();
    for at in [llama + 1, llama + 2, llama + 3, enye + 1] {
        let split = stream_chunks(&[&bytes[..at], &bytes[at..]]);
        assert_eq!(split.out, whole.out, "split@{at}");
    }
    let text: String = events(&whole.out)
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "Hola, ñandú 🦙 — ¿qué tal?");
}

#[test]
fn c27_message_start_first_message_stop_last_no_done() {
    for input in [
        fixture!("worked_example"),
        fixture!("no_usage_done"),
        fixture!("no_usage_eof"),
    ] {
        let s = stream(input);
        let n = names(&s.out);
        assert_eq!(n.first().map(String::as_str), Some("message_start"));
        assert_eq!(n.last().map(String::as_str), Some("message_stop"));
        assert_eq!(n.iter().filter(|x| *x == "message_stop").count(), 1);
        assert!(!String::from_utf8_lossy(&s.out).contains("[DONE]"));
        assert_eq!(s.end, StreamEnd::Complete);
    }
    // Nothing is written after the end, whatever arrives.
    let mut t = MessagesStream::new(ctx());
    let mut out = Vec::new();
    for c in fixture!("text_basic")
        .split("\n\n")
        .filter(|c| !c.is_empty())
    {
        if let Some(d) = c.strip_prefix("data: ") {
            t.on_event(d.as_bytes(), &mut out);
        }
    }
    let len = out.len();
    t.on_event(
        br#"{"choices":[{"index":0,"delta":{"content":"late"}}]}"#,
        &mut out,
    );
    t.on_idle(&mut out);
    t.on_end(&mut out);
    t.on_failure(&ApiError::new(ErrorKind::Upstream, "x"), &mut out);
    assert_eq!(out.len(), len);
}

#[test]
fn c28_dense_indexes_and_one_open_block() {
    let s = stream(fixture!("interleaved_reasoning"));
    validate_event_sequence(&s.out).unwrap();
    let ev = events(&s.out);
    let starts: Vec<u64> = ev
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| d["index"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [0, 1, 2, 3]);
    let mut open = None;
    for (n, d) in &ev {
        match n.as_str() {
            "content_block_start" => {
                assert!(open.is_none());
                open = d["index"].as_u64();
            }
            "content_block_stop" => {
                assert_eq!(open, d["index"].as_u64());
                open = None;
            }
            _ => {}
        }
    }
    assert!(open.is_none());
}

#[test]
fn c29_tool_use_starts_empty_and_partial_json_parses_to_the_final_input() {
    let s = stream(fixture!("worked_example"));
    let ev = events(&s.out);
    let start = ev
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let json: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&json).unwrap(),
        json!({"location": "Paris"})
    );
    let m = accumulate_message(&s.out).unwrap();
    assert_eq!(m["content"][2]["input"], json!({"location": "Paris"}));
}

#[test]
fn c30_output_tokens_present_without_any_usage_chunk() {
    for (input, want) in [
        (fixture!("no_usage_done"), 4),
        (fixture!("no_usage_eof"), 1),
    ] {
        let s = stream(input);
        let (_, delta) = events(&s.out)
            .into_iter()
            .find(|(n, _)| n == "message_delta")
            .unwrap();
        assert_eq!(delta["usage"]["output_tokens"], want);
        assert_eq!(s.usage.completion_tokens, want);
    }
}

#[test]
fn c31_message_start_usage_has_all_four_keys() {
    let s = stream(fixture!("text_basic"));
    let (_, start) = &events(&s.out)[0];
    assert_eq!(
        start["message"]["usage"],
        json!({"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0})
    );
    assert_eq!(start["message"]["id"], "msg_req_1");
    assert_eq!(start["message"]["model"], "claude-sonnet-4-5");
}

#[test]
fn c31_message_start_carries_the_first_chunks_usage() {
    // vLLM with continuous usage stats: the prompt's count is on the first chunk already.
    let mut first = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    first["usage"] = json!({"prompt_tokens": 12, "completion_tokens": 0, "total_tokens": 12,
                            "prompt_tokens_details": {"cached_tokens": 8}});
    let s = stream(&sse(&[
        first,
        chunk(json!({"content": "hola"}), json!("stop")),
        usage_chunk(12, 1, 8),
    ]));
    validate_event_sequence(&s.out).unwrap();
    let ev = events(&s.out);
    assert_eq!(
        ev[0].1["message"]["usage"],
        json!({"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 8, "output_tokens": 0})
    );
    let (_, delta) = ev.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta["usage"]["output_tokens"], 1);
}

#[test]
fn c32_pings_before_and_during_the_stream() {
    let mut t = MessagesStream::new(ctx());
    let mut out = Vec::new();
    // A long prefill: message_start goes out with the first ping.
    t.on_idle(&mut out);
    t.on_idle(&mut out);
    assert_eq!(names(&out), ["message_start", "ping", "ping"]);
    let mut d = SseDecoder::default();
    let input = fixture!("worked_example").as_bytes();
    let half = input.len() / 2;
    feed_stream(&mut d, &mut t, &input[..half], &mut out);
    t.on_idle(&mut out);
    feed_stream(&mut d, &mut t, &input[half..], &mut out);
    finish_stream(&mut d, &mut t, &mut out);
    validate_event_sequence(&out).unwrap();
    let n = names(&out);
    assert_eq!(n.iter().filter(|x| *x == "message_start").count(), 1);
    assert_eq!(n.iter().filter(|x| *x == "ping").count(), 3);
    assert!(String::from_utf8(out)
        .unwrap()
        .contains("\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n"));
}

/// The stream of `chunks`, accumulated like the SDK, must equal `upstream_to_message` of the
/// equivalent completion.
fn assert_stream_equals_nonstream(chunks: &[Value], completion_body: &Value) {
    let s = stream(&sse(chunks));
    validate_event_sequence(&s.out).unwrap();
    let streamed = accumulate_message(&s.out).unwrap();
    let (direct, usage) = nonstream(completion_body).unwrap();
    assert_eq!(streamed, direct);
    assert_eq!(s.usage, usage);
}

#[test]
fn c33_final_stream_message_equals_the_non_streaming_translation() {
    let u = json!({"prompt_tokens": 2100, "completion_tokens": 40, "total_tokens": 2140, "prompt_tokens_details": {"cached_tokens": 2048}});
    assert_stream_equals_nonstream(
        &[
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"reasoning": "The user wants "}), Value::Null),
            chunk(json!({"reasoning": "weather."}), Value::Null),
            chunk(json!({"content": "Checking"}), Value::Null),
            chunk(json!({"content": " now 🦙."}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\": \"Pa"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "ris\"}"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_def", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
            usage_chunk(2100, 40, 2048),
        ],
        &completion(
            json!({"role": "assistant", "reasoning": "The user wants weather.", "content": "Checking now 🦙.", "tool_calls": [
                {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}},
                {"id": "call_def", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}),
            "tool_calls",
            u,
        ),
    );
    // Stop sequence, SGLang fields.
    let mut fin = chunk(json!({"reasoning_content": null}), json!("stop"));
    fin["choices"][0]["matched_stop"] = json!("END");
    let mut done = completion(
        json!({"role": "assistant", "content": "a b c"}),
        "stop",
        json!({"prompt_tokens": 7, "completion_tokens": 3}),
    );
    done["choices"][0]["matched_stop"] = json!("END");
    assert_stream_equals_nonstream(
        &[
            chunk(
                json!({"role": "assistant", "content": null, "reasoning_content": null}),
                Value::Null,
            ),
            chunk(
                json!({"content": "a b", "reasoning_content": null}),
                Value::Null,
            ),
            chunk(
                json!({"content": " c", "reasoning_content": null}),
                Value::Null,
            ),
            fin,
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        ],
        &done,
    );
    // Empty generation.
    assert_stream_equals_nonstream(
        &[
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({}), json!("length")),
            usage_chunk(5, 0, 0),
        ],
        &completion(
            json!({"role": "assistant", "content": ""}),
            "length",
            json!({"prompt_tokens": 5, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}),
        ),
    );
}

fn blocks(input: &str) -> Value {
    let s = stream(input);
    validate_event_sequence(&s.out).unwrap();
    accumulate_message(&s.out).unwrap()
}

#[test]
fn c34_empty_first_content_opens_no_block() {
    let s = stream(fixture!("empty_generation"));
    assert_eq!(
        names(&s.out),
        ["message_start", "message_delta", "message_stop"]
    );
}

#[test]
fn c35_content_with_empty_tool_calls_is_text() {
    let m = blocks(fixture!("content_empty_tool_calls"));
    assert_eq!(
        m["content"],
        json!([{"type": "text", "text": "Visible text"}])
    );
}

#[test]
fn c36_content_on_the_finish_chunk_is_kept() {
    let m = blocks(fixture!("content_with_finish"));
    assert_eq!(
        m["content"],
        json!([{"type": "text", "text": "All at once."}])
    );
    assert_eq!(m["stop_reason"], "end_turn");
}

#[test]
fn c36_reasoning_content_and_tool_calls_in_one_finish_chunk() {
    let m = blocks(&sse(&[
        chunk(
            json!({"role": "assistant", "reasoning": "R", "content": "T", "tool_calls": [
                {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]}),
            json!("tool_calls"),
        ),
        usage_chunk(4, 3, 0),
    ]));
    assert_eq!(
        m["content"],
        json!([
            {"type": "thinking", "thinking": "R", "signature": ""},
            {"type": "text", "text": "T"},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}}
        ])
    );
    assert_eq!(m["stop_reason"], "tool_use");
}

#[test]
fn c37_finish_chunk_with_last_fragment_and_resent_id() {
    let m = blocks(fixture!("resent_id_on_finish"));
    assert_eq!(
        m["content"],
        json!([{"type": "tool_use", "id": "call_9", "name": "get_weather", "input": {"city": "Cusco"}}])
    );
}

#[test]
fn c38_whole_tool_call_in_one_chunk() {
    let m = blocks(fixture!("whole_call_at_end"));
    assert_eq!(
        m["content"][1]["input"],
        json!({"query": "llamas", "limit": 3})
    );
    // The whole call on the finish chunk itself.
    let m = blocks(&sse(&[
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"k\":true}"}}]}),
            json!("tool_calls"),
        ),
        usage_chunk(3, 3, 0),
    ]));
    assert_eq!(
        m["content"],
        json!([{"type": "tool_use", "id": "c1", "name": "f", "input": {"k": true}}])
    );
    assert_eq!(m["stop_reason"], "tool_use");
}

#[test]
fn c39_two_calls_by_index_and_by_new_id_on_index_zero() {
    for input in [fixture!("parallel_tools"), fixture!("same_index_new_id")] {
        let m = blocks(input);
        let content = m["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_ne!(content[0]["id"], content[1]["id"]);
    }
    let m = blocks(fixture!("same_index_new_id"));
    assert_eq!(m["content"][0]["input"], json!({"path": "a.txt"}));
    assert_eq!(m["content"][1]["input"], json!({"path": "b.txt"}));
}

#[test]
fn c40_name_after_id_waits_for_the_name() {
    let m = blocks(fixture!("name_after_id"));
    assert_eq!(
        m["content"],
        json!([{"type": "tool_use", "id": "call_n", "name": "add", "input": {"a": 1}}])
    );
    // A call whose name never comes is still sent (with an empty name) at the finish.
    let m = blocks(&sse(&[
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
    ]));
    assert_eq!(
        m["content"],
        json!([{"type": "tool_use", "id": "toolu_req_1_0", "name": "", "input": {}}])
    );
}

#[test]
fn c41_interleaved_reasoning_makes_separate_blocks() {
    let m = blocks(fixture!("interleaved_reasoning"));
    let kinds: Vec<&str> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "thinking", "text"]);
}

#[test]
fn c42_reasoning_and_reasoning_content_both_read() {
    let vllm = blocks(fixture!("worked_example"));
    assert_eq!(vllm["content"][0]["thinking"], "The user wants weather.");
    let sglang = blocks(fixture!("sglang_reasoning_matched_stop"));
    assert_eq!(sglang["content"][0]["thinking"], "Count to three.");
    assert_eq!(sglang["content"].as_array().unwrap().len(), 2);
    let llama = blocks(fixture!("llamacpp_timings"));
    assert_eq!(llama["content"][0]["thinking"], "Short.");
}

#[test]
fn c43_stop_reason_string_in_the_finish_chunk() {
    let m = blocks(fixture!("stop_sequence_vllm"));
    assert_eq!(m["stop_reason"], "stop_sequence");
    assert_eq!(m["stop_sequence"], "###");
    let m = blocks(fixture!("stop_token_id"));
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["stop_sequence"], Value::Null);
}

#[test]
fn c44_message_delta_without_usage_chunk() {
    let s = stream(fixture!("no_usage_done"));
    assert_eq!(
        &names(&s.out)[names(&s.out).len() - 2..],
        ["message_delta", "message_stop"]
    );
    let s = stream(fixture!("no_usage_eof"));
    assert_eq!(s.end, StreamEnd::Complete);
}

#[test]
fn c45_continuous_usage_last_wins_with_final_cache_split() {
    let s = stream(fixture!("worked_example"));
    let m = accumulate_message(&s.out).unwrap();
    assert_eq!(
        m["usage"],
        json!({"input_tokens": 52, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2048, "output_tokens": 40, "cost": 0.000724})
    );
    assert_eq!(
        s.usage,
        Usage {
            prompt_tokens: 2100,
            cached_tokens: 2048,
            completion_tokens: 40
        }
    );
    // Cut off mid-way: the last continuous report is what is metered.
    let input = fixture!("worked_example");
    let cut = input.find("ris\\\"}").unwrap();
    let s = stream(&input[..cut]);
    assert_eq!(s.end, StreamEnd::Failed);
    assert_eq!(
        s.usage,
        Usage {
            prompt_tokens: 2100,
            cached_tokens: 0,
            completion_tokens: 20
        }
    );
}

#[test]
fn c46_usage_chunk_with_choices_missing_or_null() {
    let m = blocks(fixture!("usage_missing_choices"));
    assert_eq!(m["usage"]["input_tokens"], 10);
    let m = blocks(&sse(&[
        chunk(json!({"content": "x"}), json!("stop")),
        json!({"id": "c", "choices": null, "usage": {"prompt_tokens": 11, "completion_tokens": 1}}),
    ]));
    assert_eq!(m["usage"]["input_tokens"], 11);
}

#[test]
fn c47_sglang_matched_stop_and_llamacpp_timings() {
    let m = blocks(fixture!("sglang_reasoning_matched_stop"));
    assert_eq!(m["stop_sequence"], "###");
    assert_eq!(m["usage"]["cache_read_input_tokens"], 512);
    assert_eq!(m["usage"]["input_tokens"], 4);
    let m = blocks(fixture!("llamacpp_timings"));
    assert_eq!(m["usage"]["cache_read_input_tokens"], 24);
    assert_eq!(m["usage"]["input_tokens"], 8);
    assert_eq!(m["stop_reason"], "end_turn");
}

#[test]
fn c48_empty_generation() {
    let m = blocks(fixture!("empty_generation"));
    assert_eq!(m["content"], json!([]));
    assert_eq!(m["stop_reason"], "end_turn");
}

#[test]
fn message_delta_carries_the_cost_the_stream_bills() {
    let terms = crate::testing::charging();
    for input in [
        fixture!("worked_example"),
        fixture!("no_usage_done"),
        fixture!("no_usage_eof"),
        fixture!("llamacpp_timings"),
        fixture!("usage_missing_choices"),
        fixture!("text_basic"),
    ] {
        let s = stream(input);
        assert_eq!(s.end, StreamEnd::Complete);
        let ev = events(&s.out);
        let start = &ev[0].1["message"]["usage"];
        assert_eq!(
            start.get("cost"),
            None,
            "message_start's usage is not final"
        );
        let (name, delta) = &ev[ev.len() - 2];
        assert_eq!(name, "message_delta");
        // The number as written, exactly: the charge of the usage the stream bills.
        let text = std::str::from_utf8(&s.out).unwrap();
        let written = text.rsplit("\"cost\":").next().unwrap();
        let written: String = written
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        assert_eq!(written, terms.cost(s.usage).to_json_number());
        assert_eq!(
            delta["usage"]["output_tokens"], s.usage.completion_tokens,
            "the usage shown is the usage billed"
        );
    }
    // Failed: an error event, no usage and so no cost; the usage metered is still billed.
    let s = stream(fixture!("midstream_error"));
    assert_eq!(s.end, StreamEnd::Failed);
    assert!(!String::from_utf8_lossy(&s.out).contains("\"cost\""));
}
