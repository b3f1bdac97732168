//! Non-streaming responses: content blocks in order, stop reasons, tool
//! arguments (and that streamed arguments agree with them), usage, ids, malformed bodies.

use super::*;

#[test]
fn c18_text_only() {
    let (m, u) = nonstream(&completion(
        json!({"role": "assistant", "content": "Hola, ñandú 🦙", "refusal": null}),
        "stop",
        json!({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}),
    ))
    .unwrap();
    assert_eq!(
        m,
        json!({"id": "msg_req_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Hola, ñandú 🦙"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 4, "cost": 0.000026}})
    );
    assert_eq!(
        u,
        Usage {
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 4
        }
    );
}

#[test]
fn c19_reasoning_text_and_two_tool_calls_in_order() {
    for field in ["reasoning", "reasoning_content"] {
        let mut msg = json!({"role": "assistant", "content": "I'll check.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]});
        msg[field] = json!("Two tools.");
        let (m, _) = nonstream(&completion(
            msg,
            "tool_calls",
            json!({"prompt_tokens": 10, "completion_tokens": 4}),
        ))
        .unwrap();
        assert_eq!(
            m["content"],
            json!([
                {"type": "thinking", "thinking": "Two tools.", "signature": ""},
                {"type": "text", "text": "I'll check."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Lima"}},
                {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}}
            ])
        );
        assert_eq!(m["stop_reason"], "tool_use");
    }
}

#[test]
fn c20_finish_stop_with_tool_calls_is_tool_use() {
    let (m, _) = nonstream(&completion(
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}),
        "stop",
        json!({"prompt_tokens": 1, "completion_tokens": 1}),
    ))
    .unwrap();
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(
        m["content"].as_array().unwrap().len(),
        1,
        "empty text skipped"
    );
}

#[test]
fn c21_length_content_filter_abort_unknown() {
    let msg = json!({"role": "assistant", "content": "x"});
    let u = json!({"prompt_tokens": 1, "completion_tokens": 1});
    let stop = |finish: &str| {
        nonstream(&completion(msg.clone(), finish, u.clone()))
            .map(|(m, _)| m["stop_reason"].clone())
    };
    assert_eq!(stop("length").unwrap(), "max_tokens");
    assert_eq!(stop("content_filter").unwrap(), "refusal");
    assert_eq!(stop("function_call").unwrap(), "tool_use");
    assert_eq!(stop("repetition").unwrap(), "end_turn");
    for bad in ["abort", "error", "weird"] {
        let e = stop(bad).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Upstream, "{bad}");
        assert_eq!(e.kind.messages_type(), "api_error");
    }
    let mut no_finish = completion(msg, "stop", u);
    no_finish["choices"][0]["finish_reason"] = Value::Null;
    assert!(nonstream(&no_finish).is_err());
}

#[test]
fn c22_stop_sequence_vllm_sglang_and_token_id() {
    let msg = json!({"role": "assistant", "content": "a b"});
    let u = json!({"prompt_tokens": 1, "completion_tokens": 1});
    let mut vllm = completion(msg.clone(), "stop", u.clone());
    vllm["choices"][0]["stop_reason"] = json!("###");
    let (m, _) = nonstream(&vllm).unwrap();
    assert_eq!(
        (&m["stop_reason"], &m["stop_sequence"]),
        (&json!("stop_sequence"), &json!("###"))
    );
    let mut sglang = completion(msg.clone(), "stop", u.clone());
    sglang["choices"][0]["matched_stop"] = json!("###");
    let (m, _) = nonstream(&sglang).unwrap();
    assert_eq!(m["stop_sequence"], "###");
    for token in [json!(151645), Value::Null] {
        let mut t = completion(msg.clone(), "stop", u.clone());
        t["choices"][0]["stop_reason"] = token.clone();
        t["choices"][0]["matched_stop"] = token;
        let (m, _) = nonstream(&t).unwrap();
        assert_eq!(
            (&m["stop_reason"], &m["stop_sequence"]),
            (&json!("end_turn"), &Value::Null)
        );
    }
}

#[test]
fn c23_empty_arguments_are_empty_input_malformed_ones_an_error() {
    let call = |args: Value, finish: &str| {
        nonstream(&completion(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]}),
            finish,
            json!({"prompt_tokens": 1, "completion_tokens": 1}),
        ))
    };
    // No arguments: a tool without parameters.
    for args in [json!(""), json!("  "), Value::Null] {
        let (m, _) = call(args.clone(), "tool_calls").unwrap();
        assert_eq!(m["content"][0]["input"], json!({}), "{args}");
    }
    // Arguments that are not one JSON object: the upstream is broken, and saying `{}` would
    // run the tool with an input the model never wrote. The stream says the same (c23b).
    for args in [
        "[1,2]",
        "null",
        "\"x\"",
        "{\"a\" 1}",
        "{\"a\":1}}",
        "{} {}",
        "{\"a\":1,}",
    ] {
        let e = call(json!(args), "tool_calls").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Upstream, "{args}");
        assert_eq!(e.status(ClientFormat::Messages), 502);
        assert_eq!(
            e.message,
            "the model server returned malformed tool arguments"
        );
    }
    // Incomplete: cut off by max_tokens (a 400 that says so), or by anything else.
    let e = call(json!("{\"a\": "), "length").unwrap_err();
    assert_eq!(e.kind.messages_type(), "invalid_request_error");
    assert!(
        e.message.starts_with("max_tokens was reached"),
        "{}",
        e.message
    );
    let e = call(json!("{\"a\": "), "tool_calls").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Upstream);
    // A call without an id gets a minted one; whitespace around the object is dropped.
    let (m, _) = nonstream(&completion(
        json!({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": " {\"x\":1} "}}]}),
        "tool_calls",
        json!({"prompt_tokens": 1, "completion_tokens": 1}),
    ))
    .unwrap();
    assert_eq!(m["content"][0]["id"], "toolu_req_1_0");
    assert_eq!(m["content"][0]["input"], json!({"x": 1}));
}

/// The same answer streamed (in `fragments`) and not: both succeed with the same message, or
/// both fail with the same error.
fn assert_tool_answer_agrees(fragments: &[&str], finish: &str) -> Result<Value, ApiError> {
    let mut chunks = vec![
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
            Value::Null,
        ),
    ];
    for f in fragments {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": f}}]}),
            Value::Null,
        ));
    }
    chunks.push(chunk(json!({}), json!(finish)));
    chunks.push(usage_chunk(9, 4, 0));
    let s = stream(&sse(&chunks));
    validate_event_sequence(&s.out).unwrap();
    let plain = nonstream(&completion(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": fragments.concat()}}]}),
        finish,
        json!({"prompt_tokens": 9, "completion_tokens": 4}),
    ));
    match (&plain, &s.error) {
        (Ok((m, _)), None) => assert_eq!(&accumulate_message(&s.out).unwrap(), m),
        (Err(a), Some(b)) => assert_eq!(a, b, "{fragments:?}"),
        (p, e) => panic!("{fragments:?}: non-stream {p:?}, stream {e:?}"),
    }
    plain.map(|(m, _)| m)
}

#[test]
fn c23b_streamed_tool_arguments_agree_with_the_non_streaming_answer() {
    let m = assert_tool_answer_agrees(
        &["{\"q\": \"ñ", "andú\\\"", "\", \"n\": -1.5e", "3}"],
        "tool_calls",
    )
    .unwrap();
    assert_eq!(
        m["content"][0]["input"],
        json!({"q": "ñandú\"", "n": -1.5e3})
    );
    // Whitespace only, and whitespace around the object.
    let m = assert_tool_answer_agrees(&["  ", "\n"], "tool_calls").unwrap();
    assert_eq!(m["content"][0]["input"], json!({}));
    assert_tool_answer_agrees(&[" ", "{\"a\"", ":1}", " \n"], "tool_calls").unwrap();
    // Malformed: in the first fragment, in a later one, after a complete object.
    for bad in [
        &["[1]"][..],
        &["{\"a\":1", " \"b\":2}"],
        &["{\"a\":1}", "}"],
        &["{\"a\":tru", "th}"],
    ] {
        let e = assert_tool_answer_agrees(bad, "tool_calls").unwrap_err();
        assert_eq!(
            e.message,
            "the model server returned malformed tool arguments"
        );
    }
    // The bad fragment itself is never forwarded: what the client got still parses as far as
    // it goes.
    let s = stream(fixture!("malformed_tool_arguments"));
    let text = String::from_utf8(s.out).unwrap();
    assert!(!text.contains("country"), "{text}");
    // Cut off by max_tokens: an error that comes with the finish, so the usage chunk after it
    // is read first and the tokens are billed.
    let e =
        assert_tool_answer_agrees(&["{\"path\": \"a\", \"content\": \"lor"], "length").unwrap_err();
    assert_eq!(e.kind.messages_type(), "invalid_request_error");
    let s = stream(fixture!("tool_arguments_cut_by_length"));
    assert_eq!((s.usage.prompt_tokens, s.usage.completion_tokens), (80, 64));
    // The finish is `length` but the call is complete: an ordinary max_tokens stop.
    let m = assert_tool_answer_agrees(&["{\"a\":1}"], "length").unwrap();
    assert_eq!(m["stop_reason"], "max_tokens");
}

#[test]
fn interleaved_parallel_tool_arguments_are_held_back_not_dropped() {
    // Fixture interleaved_parallel_tools: fragments for index 0 and 1 alternate.
    let s = stream(fixture!("interleaved_parallel_tools"));
    validate_event_sequence(&s.out).unwrap();
    let m = accumulate_message(&s.out).unwrap();
    assert_eq!(
        m["content"],
        json!([
            {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Lima"}},
            {"type": "tool_use", "id": "call_b", "name": "get_time", "input": {"tz": "America/Lima"}}
        ])
    );
    let (plain, _) = nonstream(&completion(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"America/Lima\"}"}}]}),
        "tool_calls",
        json!({"prompt_tokens": 120, "completion_tokens": 24}),
    ))
    .unwrap();
    assert_eq!(m["content"], plain["content"]);
    // Three calls, the held ones flushed in order once the open one completes.
    let tc = |i: u32, args: &str| {
        chunk(
            json!({"tool_calls": [{"index": i, "function": {"arguments": args}}]}),
            Value::Null,
        )
    };
    let head = |i: u32| {
        chunk(
            json!({"tool_calls": [{"index": i, "id": format!("c{i}"), "type": "function", "function": {"name": format!("f{i}"), "arguments": ""}}]}),
            Value::Null,
        )
    };
    let s = stream(&sse(&[
        head(0),
        head(1),
        head(2),
        tc(2, "{\"z\":"),
        tc(1, "{\"y\":"),
        tc(0, "{\"x\":"),
        tc(1, "2}"),
        tc(2, "3}"),
        tc(0, "1}"),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(5, 9, 0),
    ]));
    let m = accumulate_message(&s.out).unwrap();
    let inputs: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["input"])
        .collect();
    assert_eq!(
        inputs,
        [&json!({"x": 1}), &json!({"y": 2}), &json!({"z": 3})]
    );
}

#[test]
fn tool_arguments_that_cannot_be_delivered_fail_loudly() {
    // A call closed early by text, then more of its arguments: they cannot be sent.
    let s = stream(&sse(&[
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": "{\"a\":"}}]}),
            Value::Null,
        ),
        chunk(json!({"content": "meanwhile"}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(5, 9, 0),
    ]));
    validate_event_sequence(&s.out).unwrap();
    assert_eq!(s.end, StreamEnd::Failed);
    assert!(s
        .error
        .unwrap()
        .message
        .contains("after the call's block had to be closed"));
    // Whitespace after a complete, closed call is harmless.
    let s = stream(&sse(&[
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": " "}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(5, 9, 0),
    ]));
    assert_eq!(s.end, StreamEnd::Complete);
    // Held-back arguments are bounded.
    let big = "x".repeat(64 * 1024);
    let mut chunks = vec![
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": "{\"a\":\""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "c1", "type": "function", "function": {"name": "g", "arguments": "{\"b\":\""}}]}),
            Value::Null,
        ),
    ];
    for _ in 0..(stream::MAX_HELD_ARGUMENTS / big.len() + 1) {
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": big}}]}),
            Value::Null,
        ));
    }
    let s = stream(&sse(&chunks));
    assert_eq!(s.end, StreamEnd::Failed);
    assert!(s.error.unwrap().message.contains("hold back"));
}

#[test]
fn c24_usage_mapping() {
    let msg = json!({"role": "assistant", "content": "x"});
    let (m, u) = nonstream(&completion(
        msg.clone(),
        "stop",
        json!({"prompt_tokens": 2100, "completion_tokens": 40, "total_tokens": 2140, "prompt_tokens_details": {"cached_tokens": 2048}}),
    ))
    .unwrap();
    assert_eq!(
        m["usage"],
        json!({"input_tokens": 52, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2048, "output_tokens": 40, "cost": 0.000724})
    );
    assert_eq!(
        u,
        Usage {
            prompt_tokens: 2100,
            cached_tokens: 2048,
            completion_tokens: 40
        }
    );
    let (m, _) = nonstream(&completion(
        msg.clone(),
        "stop",
        json!({"prompt_tokens": 30, "completion_tokens": 2, "prompt_tokens_details": null}),
    ))
    .unwrap();
    assert_eq!(m["usage"]["cache_read_input_tokens"], 0);
    assert_eq!(m["usage"]["input_tokens"], 30);
    let (m, _) = nonstream(&completion(
        msg.clone(),
        "stop",
        json!({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}}),
    ))
    .unwrap();
    assert_eq!(m["usage"]["input_tokens"], 0);
    assert_eq!(m["usage"]["cache_read_input_tokens"], 10);
    // llama.cpp: cached tokens only in timings.
    let mut l = completion(
        msg.clone(),
        "stop",
        json!({"prompt_tokens": 32, "completion_tokens": 6}),
    );
    l["timings"] = json!({"cache_n": 24, "prompt_n": 8});
    assert_eq!(nonstream(&l).unwrap().0["usage"]["input_tokens"], 8);
    // No usage at all: output estimated from the text (4 bytes a token), never zero.
    let mut none = completion(
        json!({"role": "assistant", "content": "twelve bytes"}),
        "stop",
        json!(null),
    );
    none.as_object_mut().unwrap().remove("usage");
    let (m, u) = nonstream(&none).unwrap();
    assert_eq!(u.completion_tokens, 3);
    assert_eq!(m["usage"]["output_tokens"], 3);
}

#[test]
fn c25_model_is_the_client_name_and_id_is_minted() {
    let (m, _) = nonstream(&completion(
        json!({"content": "x"}),
        "stop",
        json!({"prompt_tokens": 1, "completion_tokens": 1}),
    ))
    .unwrap();
    assert_eq!(m["model"], "claude-sonnet-4-5");
    assert_eq!(m["id"], "msg_req_1");
    assert!(!m.to_string().contains("Qwen"));
}

#[test]
fn non_stream_malformed_bodies_are_upstream_errors() {
    for body in [
        &b""[..],
        b"<html>",
        b"{}",
        b"{\"choices\":[]}",
        b"{\"choices\":null}",
        b"[1]",
    ] {
        let e = upstream_to_message(body, &ctx()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Upstream, "{body:?}");
    }
}
