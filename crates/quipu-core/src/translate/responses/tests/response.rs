//! Non-streaming answers: the response object, its items, status and usage, and the errors a
//! completion can amount to.

use super::*;

fn usage(prompt: u64, completion: u64, cached: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

#[test]
fn a_text_answer_is_one_message_item_with_the_apis_usage() {
    let (r, u) = nonstream(&completion(
        json!({"role": "assistant", "content": "¡Hola!"}),
        "stop",
        usage(2100, 40, 2048),
    ))
    .unwrap();
    assert_eq!(r["id"], "resp_0123abcd");
    assert_eq!(r["object"], "response");
    assert_eq!(r["created_at"], 1_764_000_000);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "aguila");
    assert_eq!(r["error"], Value::Null);
    assert_eq!(r["incomplete_details"], Value::Null);
    assert_eq!(
        r["output"],
        json!([{"id": "msg_0123abcd_0", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "¡Hola!", "annotations": [], "logprobs": []}]}])
    );
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 2100, "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 0},
               "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2140,
               "cost": 0.000724})
    );
    assert_eq!(
        u,
        Usage {
            prompt_tokens: 2100,
            cached_tokens: 2048,
            completion_tokens: 40
        }
    );
    // The echo is there, and the upstream's name is not.
    assert_eq!(r["max_output_tokens"], 8192);
    assert_eq!(r["parallel_tool_calls"], true);
    assert!(!r.to_string().contains(UPSTREAM_MODEL));
}

#[test]
fn reasoning_text_and_calls_are_items_in_order() {
    let (r, _) = nonstream(&completion(
        json!({"role": "assistant", "reasoning": "Weather first.", "content": "Checking.", "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": " {\"city\": \"Lima\"}"}},
            {"id": "", "type": "function", "function": {"name": "ns__lookup", "arguments": ""}}]}),
        "tool_calls",
        json!({"prompt_tokens": 10, "completion_tokens": 30, "completion_tokens_details": {"reasoning_tokens": 4}}),
    ))
    .unwrap();
    let out = r["output"].as_array().unwrap();
    assert_eq!(
        out[0],
        json!({"id": "rs_0123abcd_0", "type": "reasoning", "summary": [],
               "content": [{"type": "reasoning_text", "text": "Weather first."}], "status": "completed"})
    );
    assert_eq!(out[1]["type"], "message");
    assert_eq!(
        out[2],
        json!({"id": "fc_0123abcd_2", "type": "function_call", "status": "completed",
               "arguments": "{\"city\": \"Lima\"}", "call_id": "call_abc", "name": "get_weather"})
    );
    assert_eq!(
        out[3],
        json!({"id": "fc_0123abcd_3", "type": "function_call", "status": "completed",
               "arguments": "{}", "call_id": "call_0123abcd_3", "name": "lookup", "namespace": "ns"})
    );
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
    assert_eq!(r["status"], "completed");
}

#[test]
fn reasoning_tokens_are_estimated_from_bytes_when_not_reported() {
    // 20 bytes of reasoning, 20 of text: half the 30 output tokens.
    let (r, _) = nonstream(&completion(
        json!({"role": "assistant", "reasoning_content": "abcdefghijklmnopqrst", "content": "ABCDEFGHIJKLMNOPQRST"}),
        "stop",
        usage(5, 30, 0),
    ))
    .unwrap();
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 15);
}

#[test]
fn encrypted_content_carries_reasoning_when_included() {
    let t = translate(
        &json!({"model": "aguila", "input": "x", "include": ["reasoning.encrypted_content"]}),
    );
    let (r, _) = nonstream_with(
        &completion(
            json!({"role": "assistant", "reasoning": "why \"so\"", "content": "ok"}),
            "stop",
            usage(1, 2, 0),
        ),
        &ctx_of(&t),
    )
    .unwrap();
    assert_eq!(
        r["output"][0]["encrypted_content"],
        format!("{REASONING_PREFIX}why \"so\"")
    );
}

#[test]
fn length_is_an_incomplete_response_with_its_last_item_incomplete() {
    let (r, _) = nonstream(&completion(
        json!({"role": "assistant", "reasoning": "r", "content": "cut sho"}),
        "length",
        usage(5, 16, 0),
    ))
    .unwrap();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(r["output"][0]["status"], "completed");
    assert_eq!(r["output"][1]["status"], "incomplete");
    // Cut inside a call's arguments: the call is there, incomplete, no error.
    let (r, _) = nonstream(&completion(
        json!({"role": "assistant", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Li"}}]}),
        "length",
        usage(5, 16, 0),
    ))
    .unwrap();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["output"][0]["status"], "incomplete");
    assert_eq!(r["output"][0]["arguments"], "{\"city\": \"Li");
    let (r, _) = nonstream(&completion(
        json!({"role": "assistant", "content": "no"}),
        "content_filter",
        usage(5, 1, 0),
    ))
    .unwrap();
    assert_eq!(r["incomplete_details"]["reason"], "content_filter");
}

#[test]
fn failed_generations_are_errors_in_the_responses_shape() {
    for (message, finish, what) in [
        (
            json!({"role": "assistant", "content": "x"}),
            "abort",
            "aborted",
        ),
        (
            json!({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{]"}}]}),
            "tool_calls",
            "malformed",
        ),
        (
            json!({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{\"a\""}}]}),
            "stop",
            "malformed",
        ),
    ] {
        let e = nonstream(&completion(message, finish, usage(1, 1, 0))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Upstream);
        assert!(e.message.contains(what), "{}", e.message);
    }
    let e = nonstream(&json!({"error": {"message": format!("This model's maximum context length is 32768 tokens. However, you requested 40000 tokens (39000 in the messages, 1000 in the completion). {UPSTREAM_MODEL}"), "type": "BadRequestError", "code": 400}})).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ContextLengthExceeded);
    assert!(
        e.message.contains("Your input exceeds the context window"),
        "{}",
        e.message
    );
    assert!(!e.message.contains(UPSTREAM_MODEL));
    let body = e.body(crate::error::ClientFormat::Responses, "req_1");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "input");
    assert!(nonstream(&json!({"choices": []})).is_err());
}

#[test]
fn no_usage_reported_is_estimated_at_four_bytes_a_token() {
    let (_, u) = nonstream(&json!({"choices": [{"index": 0, "message": {"content": "12345678"}, "finish_reason": "stop"}]})).unwrap();
    assert_eq!(u.completion_tokens, 2);
}
