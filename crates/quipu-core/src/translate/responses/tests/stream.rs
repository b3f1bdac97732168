//! Streams: the event sequence and its numbering, items and their deltas, the terminal event,
//! failures, equality with the non-streaming answer, and the recorded upstream streams.

use super::*;

const FIXTURES: &[(&str, &str)] = &[
    (
        "content_empty_tool_calls",
        fixture!("content_empty_tool_calls"),
    ),
    ("content_filter", fixture!("content_filter")),
    ("content_with_finish", fixture!("content_with_finish")),
    ("crlf_text", fixture!("crlf_text")),
    ("empty_generation", fixture!("empty_generation")),
    ("finish_abort", fixture!("finish_abort")),
    ("finish_length", fixture!("finish_length")),
    (
        "interleaved_parallel_tools",
        fixture!("interleaved_parallel_tools"),
    ),
    ("interleaved_reasoning", fixture!("interleaved_reasoning")),
    ("llamacpp_timings", fixture!("llamacpp_timings")),
    ("long_tool_name", fixture!("long_tool_name")),
    ("malformed_chunk", fixture!("malformed_chunk")),
    (
        "malformed_tool_arguments",
        fixture!("malformed_tool_arguments"),
    ),
    (
        "midstream_context_overflow",
        fixture!("midstream_context_overflow"),
    ),
    ("midstream_error", fixture!("midstream_error")),
    ("name_after_id", fixture!("name_after_id")),
    ("named_tool_finish_stop", fixture!("named_tool_finish_stop")),
    ("no_usage_done", fixture!("no_usage_done")),
    ("no_usage_eof", fixture!("no_usage_eof")),
    ("parallel_tools", fixture!("parallel_tools")),
    ("reasoning_twin_fields", fixture!("reasoning_twin_fields")),
    ("resent_id_on_finish", fixture!("resent_id_on_finish")),
    ("same_index_new_id", fixture!("same_index_new_id")),
    (
        "sglang_reasoning_matched_stop",
        fixture!("sglang_reasoning_matched_stop"),
    ),
    ("stop_sequence_vllm", fixture!("stop_sequence_vllm")),
    ("stop_token_id", fixture!("stop_token_id")),
    ("text_basic", fixture!("text_basic")),
    (
        "tool_arguments_cut_by_length",
        fixture!("tool_arguments_cut_by_length"),
    ),
    ("truncated", fixture!("truncated")),
    ("usage_missing_choices", fixture!("usage_missing_choices")),
    ("whole_call_at_end", fixture!("whole_call_at_end")),
    ("worked_example", fixture!("worked_example")),
];

#[test]
fn every_recorded_stream_is_a_valid_event_sequence_that_accumulates_to_its_final_response() {
    for (name, input) in FIXTURES {
        let s = stream(input);
        assert_ne!(s.end, StreamEnd::Open, "{name}");
        let last = validate_event_sequence(&s.out)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", String::from_utf8_lossy(&s.out)));
        let status = last["status"].as_str().unwrap();
        assert_eq!(status == "failed", s.end == StreamEnd::Failed, "{name}");
        assert_eq!(s.error.is_some(), s.end == StreamEnd::Failed, "{name}");
        if s.end == StreamEnd::Complete {
            let acc = accumulate_response(&s.out).unwrap();
            assert_eq!(acc["output"], last["output"], "{name}: accumulated output");
            assert_eq!(acc["usage"], last["usage"], "{name}");
            assert_eq!(
                last["usage"]["input_tokens"], s.usage.prompt_tokens,
                "{name}"
            );
            assert_eq!(
                last["usage"]["output_tokens"], s.usage.completion_tokens,
                "{name}"
            );
        }
        assert!(
            !String::from_utf8_lossy(&s.out).contains(UPSTREAM_MODEL),
            "{name}: upstream name leaked"
        );
    }
}

#[test]
fn the_worked_example_streams_reasoning_text_and_a_call() {
    let s = stream(fixture!("worked_example"));
    assert_eq!(
        names(&s.out),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let ev = events(&s.out);
    for (n, (_, v)) in ev.iter().enumerate() {
        assert_eq!(v["sequence_number"], n);
    }
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[0].1["response"]["id"], "resp_0123abcd");
    assert_eq!(
        ev[14].1["item"],
        json!({"id": "fc_0123abcd_2", "type": "function_call", "status": "in_progress", "arguments": "",
               "call_id": "call_abc", "name": "get_weather"})
    );
    let last = &ev[19].1["response"];
    assert_eq!(last["status"], "completed");
    assert_eq!(last["output"][2]["arguments"], "{\"location\": \"Paris\"}");
    assert_eq!(
        last["usage"],
        json!({"input_tokens": 2100, "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 0},
               "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 17}, "total_tokens": 2140,
               "cost": 0.000724})
    );
    assert_eq!(
        s.usage,
        Usage {
            prompt_tokens: 2100,
            cached_tokens: 2048,
            completion_tokens: 40
        }
    );
}

#[test]
fn the_stream_ends_as_the_non_streaming_answer_does() {
    let chunks = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"reasoning": "Thinking "}), Value::Null),
        chunk(json!({"reasoning": "more."}), Value::Null),
        chunk(json!({"content": "Lima: "}), Value::Null),
        chunk(json!({"content": "18 °C"}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "ns__lookup", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(50, 9, 16),
    ];
    let s = stream(&sse(&chunks));
    let last = validate_event_sequence(&s.out).unwrap();
    let (plain, usage) = nonstream(&completion(
        json!({"role": "assistant", "reasoning": "Thinking more.", "content": "Lima: 18 °C", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ns__lookup", "arguments": "{\"q\": 1}"}}]}),
        "tool_calls",
        json!({"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 16}}),
    ))
    .unwrap();
    assert_eq!(last, plain);
    assert_eq!(s.usage, usage);
    assert_eq!(last["output"][2]["namespace"], "ns");
    assert_eq!(last["output"][2]["name"], "lookup");
}

#[test]
fn length_ends_in_response_incomplete() {
    let s = stream(fixture!("finish_length"));
    let last = validate_event_sequence(&s.out).unwrap();
    assert_eq!(names(&s.out).last().unwrap(), "response.incomplete");
    assert_eq!(last["status"], "incomplete");
    assert_eq!(last["incomplete_details"]["reason"], "max_output_tokens");
    let items = last["output"].as_array().unwrap();
    assert_eq!(items.last().unwrap()["status"], "incomplete");
    assert_eq!(s.end, StreamEnd::Complete);
    // A call cut by length is an incomplete item, not an error.
    let s = stream(fixture!("tool_arguments_cut_by_length"));
    let last = validate_event_sequence(&s.out).unwrap();
    assert_eq!(last["status"], "incomplete");
    assert_eq!(
        last["output"].as_array().unwrap().last().unwrap()["status"],
        "incomplete"
    );
}

#[test]
fn a_failure_mid_stream_is_an_error_event_then_response_failed() {
    let s = stream(fixture!("midstream_error"));
    let last = validate_event_sequence(&s.out).unwrap();
    let n = names(&s.out);
    assert_eq!(&n[n.len() - 2..], ["error", "response.failed"]);
    assert_eq!(last["status"], "failed");
    assert_eq!(last["error"]["code"], "server_error");
    assert_eq!(s.end, StreamEnd::Failed);
    let ev = events(&s.out);
    let error = &ev[ev.len() - 2].1;
    assert_eq!(error["message"], last["error"]["message"]);
    assert_eq!(error["message"], s.error.as_ref().unwrap().message.as_str());
    // A stream that ends before any finish reason.
    let s = stream(&sse(&[chunk(json!({"content": "half"}), Value::Null)])[..60]);
    assert_eq!(s.end, StreamEnd::Failed);
    validate_event_sequence(&s.out).unwrap();
    // on_failure (an upstream reset) after some output: finished items are kept.
    let mut t = ResponsesStream::new(ctx());
    let mut out = Vec::new();
    t.on_event(
        chunk(json!({"reasoning": "r"}), Value::Null)
            .to_string()
            .as_bytes(),
        &mut out,
    );
    t.on_event(
        chunk(json!({"content": "partial"}), Value::Null)
            .to_string()
            .as_bytes(),
        &mut out,
    );
    t.on_failure(&ApiError::new(ErrorKind::Upstream, "reset"), &mut out);
    let last = validate_event_sequence(&out).unwrap();
    assert_eq!(
        last["output"].as_array().unwrap().len(),
        1,
        "the open message is not finished"
    );
    assert_eq!(last["output"][0]["type"], "reasoning");
    // Its usage is what was metered (2 fragments, no input reported) and its cost what that
    // settles to: the input billed as the estimate, 20·1.00 + 2·4.00 micro-soles.
    assert_eq!(last["usage"]["output_tokens"], 2);
    assert_eq!(last["usage"]["cost"], json!(0.000028));
    let billed = crate::testing::charging().cost(t.usage());
    assert_eq!(billed.to_json_number(), "0.000028");
}

#[test]
fn the_cost_written_is_the_charge_of_the_usage_billed() {
    let terms = crate::testing::charging();
    for (name, input) in FIXTURES {
        let s = stream(input);
        let last = validate_event_sequence(&s.out).unwrap();
        let text = String::from_utf8_lossy(&s.out);
        // The last usage written is the final object's: its cost, as written, is the charge.
        let written = text.rsplit("\"cost\":").next().unwrap();
        let number: String = written
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        assert_eq!(number, terms.cost(s.usage).to_json_number(), "{name}");
        assert_eq!(
            last["usage"]["input_tokens"], s.usage.prompt_tokens,
            "{name}"
        );
        // In-progress objects carry no usage, so no cost.
        assert_eq!(text.matches("\"cost\":").count(), 1, "{name}");
    }
}

#[test]
fn no_keepalive_events_and_nothing_after_the_end() {
    let mut t = ResponsesStream::new(ctx());
    let mut out = Vec::new();
    t.on_idle(&mut out);
    assert!(out.is_empty(), "the Responses API has no ping event");
    for c in fixture!("text_basic")
        .split("\n\n")
        .filter(|c| !c.is_empty())
    {
        if let Some(d) = c.strip_prefix("data: ") {
            t.on_event(d.as_bytes(), &mut out);
        }
    }
    assert_eq!(t.end(), StreamEnd::Complete);
    let len = out.len();
    t.on_event(
        chunk(json!({"content": "late"}), Value::Null)
            .to_string()
            .as_bytes(),
        &mut out,
    );
    t.on_failure(&ApiError::new(ErrorKind::Upstream, "x"), &mut out);
    assert_eq!(out.len(), len);
}

#[test]
fn the_final_object_is_kept_only_for_a_stored_response() {
    let input = fixture!("text_basic");
    let mut stored = ctx();
    stored.keep_object = true;
    let mut t = ResponsesStream::new(stored);
    let r = replay(&mut t, &[input.as_bytes()]);
    let object: Value = serde_json::from_slice(&t.take_object().unwrap()).unwrap();
    assert_eq!(object, validate_event_sequence(&r.out).unwrap());
    assert!(t.take_object().is_none(), "taken once");
    let mut unstored = ctx();
    unstored.keep_object = false;
    let mut t = ResponsesStream::new(unstored);
    replay(&mut t, &[input.as_bytes()]);
    assert!(t.take_object().is_none());
}

#[test]
fn a_call_without_arguments_streams_an_empty_object() {
    let s = stream(&sse(&[
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(5, 3, 0),
    ]));
    let last = validate_event_sequence(&s.out).unwrap();
    assert_eq!(last["output"][0]["arguments"], "{}");
}
