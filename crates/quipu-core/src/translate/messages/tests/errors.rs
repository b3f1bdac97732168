//! Errors: upstream statuses before the first byte, context overflow,
//! mid-stream error objects, resets, flat envelopes, `abort` finishes.

use super::*;

#[test]
fn c49_upstream_statuses_before_the_first_byte_map_to_messages_errors() {
    // The proxy answers these with `map_upstream_error(…, ClientFormat::Messages)`.
    for (status, http, ty) in [
        (400, 400, "invalid_request_error"),
        (401, 502, "api_error"),
        (404, 502, "api_error"),
        (413, 413, "request_too_large"),
        (429, 429, "rate_limit_error"),
        (500, 502, "api_error"),
        (503, 529, "overloaded_error"),
    ] {
        let e = map_upstream_error(
            &UpstreamFailure {
                status,
                body: br#"{"error":{"message":"m","type":"X","code":1}}"#,
                retry_after: None,
                upstream_model: "Qwen/Qwen3-VL-32B-Instruct",
                slug: "aguila",
            },
            ClientFormat::Messages,
        );
        assert_eq!(e.status(ClientFormat::Messages), http, "{status}");
        let body: Value = serde_json::from_slice(&e.body(ClientFormat::Messages, "r")).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], ty, "{status}");
    }
}

#[test]
fn c50_context_overflow_becomes_the_vendors_wording() {
    let s = stream(fixture!("midstream_context_overflow"));
    let ev = events(&s.out);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        ev[0].1["error"],
        json!({"type": "invalid_request_error", "message": "input length and `max_tokens` exceed context limit: 8000 + 1001 > 8192, decrease input length or `max_tokens` and try again"})
    );
    // In a 200 body (non-streaming), llama.cpp's shape.
    let e = upstream_to_message(
        br#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#,
        &ctx(),
    )
    .unwrap_err();
    assert_eq!(e.message, "prompt is too long: 5000 tokens > 4096 maximum");
}

#[test]
fn c51_midstream_error_object_is_an_error_event_and_ends_the_stream() {
    let s = stream(fixture!("midstream_error"));
    validate_event_sequence(&s.out).unwrap();
    let ev = events(&s.out);
    let (name, data) = ev.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["error"]["type"], "api_error");
    assert!(!names(&s.out).contains(&"message_stop".to_owned()));
    assert_eq!(s.end, StreamEnd::Failed);
    assert_eq!(s.error.unwrap().kind, ErrorKind::Upstream);
    assert_eq!(
        s.usage.completion_tokens, 1,
        "the relayed fragment is metered"
    );
}

#[test]
fn c52_upstream_reset_is_an_error_event_not_end_turn() {
    let mut t = MessagesStream::new(ctx());
    let mut d = SseDecoder::default();
    let mut out = Vec::new();
    let input = fixture!("worked_example");
    let cut = input
        .find("\"tool_calls\":[{\"index\":0,\"function\"")
        .unwrap();
    feed_stream(&mut d, &mut t, &input.as_bytes()[..cut], &mut out);
    t.on_failure(
        &ApiError::new(
            ErrorKind::Upstream,
            "the model server closed the connection",
        ),
        &mut out,
    );
    validate_event_sequence(&out).unwrap();
    let n = names(&out);
    assert_eq!(n.last().unwrap(), "error");
    assert!(!n.contains(&"message_delta".to_owned()));
    assert_eq!(t.end(), StreamEnd::Failed);
    assert_eq!(t.usage().completion_tokens, 8);
    // Truncated without a finish reason: an error at EOF.
    let s = stream(fixture!("truncated"));
    assert_eq!(names(&s.out).last().unwrap(), "error");
    assert_eq!(s.usage.completion_tokens, 2);
}

#[test]
fn c53_flat_error_envelopes() {
    let e = upstream_to_message(
        br#"{"object":"error","message":"The model `Qwen/Qwen3-VL-32B-Instruct` does not support tools","type":"BadRequestError","param":null,"code":400}"#,
        &ctx(),
    )
    .unwrap_err();
    assert_eq!(e.kind.messages_type(), "invalid_request_error");
    assert_eq!(e.message, "The model `aguila` does not support tools");
    let s = stream(&sse(&[
        chunk(json!({"content": "x"}), Value::Null),
        json!({"object": "error", "message": "boom", "type": "InternalServerError", "code": 500}),
    ]));
    let ev = events(&s.out);
    assert_eq!(ev.last().unwrap().0, "error");
    assert_eq!(ev.last().unwrap().1["error"]["type"], "api_error");
}

#[test]
fn c54_finish_abort_is_an_error_after_its_usage_is_read() {
    // The usage chunk follows the abort chunk (continuous usage off): it is read before the
    // error frame, so the request is billed for its input and output.
    let s = stream(fixture!("finish_abort"));
    let n = names(&s.out);
    assert_eq!(n.last().unwrap(), "error");
    assert!(!n.contains(&"content_block_stop".to_owned()));
    assert_eq!(s.end, StreamEnd::Failed);
    assert_eq!(
        s.usage,
        Usage {
            prompt_tokens: 15,
            cached_tokens: 0,
            completion_tokens: 3
        }
    );
    assert_eq!(
        s.error.unwrap().message,
        "the model server aborted the generation"
    );
    // Nothing but usage is read after the abort; the error waits for it, then ends the stream.
    let mut t = MessagesStream::new(ctx());
    let mut out = Vec::new();
    let data = |v: Value| v.to_string().into_bytes();
    t.on_event(
        &data(chunk(json!({"content": "Half"}), json!("abort"))),
        &mut out,
    );
    assert_eq!(t.end(), StreamEnd::Open);
    assert!(!String::from_utf8_lossy(&out).contains("error"));
    t.on_event(
        &data(chunk(json!({"content": "ignored"}), Value::Null)),
        &mut out,
    );
    assert!(!String::from_utf8_lossy(&out).contains("ignored"));
    t.on_event(&data(usage_chunk(15, 3, 4)), &mut out);
    assert_eq!(t.end(), StreamEnd::Failed);
    assert_eq!(t.usage().prompt_tokens, 15);
    assert_eq!(names(&out).last().unwrap(), "error");
    // Without a usage chunk: released by [DONE], by the end of the stream, or by a failure.
    for ending in ["done", "eof", "reset"] {
        let mut t = MessagesStream::new(ctx());
        let mut out = Vec::new();
        t.on_event(
            &data(chunk(json!({"content": "x"}), json!("error"))),
            &mut out,
        );
        match ending {
            "done" => t.on_event(b"[DONE]", &mut out),
            "eof" => t.on_end(&mut out),
            _ => t.on_failure(&malformed_stream("reset"), &mut out),
        }
        assert_eq!(t.end(), StreamEnd::Failed, "{ending}");
        assert_eq!(
            t.error().unwrap().message,
            "the model server failed during generation",
            "{ending}"
        );
        assert_eq!(names(&out).last().unwrap(), "error");
        validate_event_sequence(&out).unwrap();
    }
}
