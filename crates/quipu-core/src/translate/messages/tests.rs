//! The conformance checklist of reference §6, one named test per applicable item (`cNN_…`),
//! then the request rules of DESIGN.md and robustness properties. Stream cases replay the
//! recorded fixtures of `tests/fixtures/messages/` (the split-at-every-offset harness is
//! `tests/messages_conformance.rs`).
//!
//! Not applicable to pure translation code (the proxy's job): 15 (auth headers), 17 (413 on
//! body size), 55 (client disconnect), 56 (retry headers), 58 (`/v1/models`), 60 (Claude
//! Code's `/context`). Item 14's header and query parts (`anthropic-beta`, `?beta=true`) are
//! the proxy's too; its body-level counterpart — newer fields accepted, never a 400 — is c14.

use super::prompt::shorten_tool_name;
use super::*;
use crate::config::{Config, ImageUrlPolicy};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::sse::SseDecoder;
use crate::testing::{replay, Replay};
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::translate::{
    feed_stream, finish_stream, malformed_stream, ResponseContext, StreamEnd, StreamTranslator,
    UpstreamRequest, MAX_OUTPUT_TOKENS,
};
use crate::usage::Usage;
use serde_json::{json, Value};
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------------
// Helpers

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config::parse(crate::config::EMBEDDED_DEFAULT, "embedded").unwrap())
}

fn config_rejecting_urls() -> Config {
    let mut c = Config::parse(crate::config::EMBEDDED_DEFAULT, "embedded").unwrap();
    c.security.image_urls = ImageUrlPolicy::Reject;
    c
}

fn base(messages: Value) -> Value {
    json!({"model": "aguila", "max_tokens": 1024, "messages": messages})
}

fn translate(v: &Value) -> UpstreamRequest {
    messages_to_upstream(v.to_string().as_bytes(), config())
        .unwrap_or_else(|e| panic!("{e}\nrequest: {v}"))
}

fn upstream(v: &Value) -> Value {
    let r = translate(v);
    serde_json::from_slice(&r.body).unwrap()
}

fn msgs(v: &Value) -> Vec<Value> {
    upstream(v)["messages"].as_array().unwrap().clone()
}

fn reject(v: &Value) -> ApiError {
    match messages_to_upstream(v.to_string().as_bytes(), config()) {
        Ok(r) => panic!(
            "expected an error, got {}",
            String::from_utf8_lossy(&r.body)
        ),
        Err(e) => e,
    }
}

fn param(e: &ApiError) -> &str {
    match &e.kind {
        ErrorKind::InvalidRequest { param: Some(p) } => p,
        other => panic!("not a field error: {other:?} {}", e.message),
    }
}

const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

fn image(media: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": PNG}})
}

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_1".into(),
        client_model: "claude-sonnet-4-5".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-VL-32B-Instruct".into(),
        tool_name_map: Vec::new(),
    }
}

fn nonstream(body: &Value) -> Result<(Value, Usage), ApiError> {
    upstream_to_message(body.to_string().as_bytes(), &ctx())
        .map(|(b, u)| (serde_json::from_slice(&b).unwrap(), u))
}

fn completion(message: Value, finish: &str, usage: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "Qwen/Qwen3-VL-32B-Instruct",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": usage})
}

/// The upstream bytes, cut into these reads, through a fresh messages stream translator.
fn stream_chunks(chunks: &[&[u8]]) -> Replay {
    replay(&mut MessagesStream::new(ctx()), chunks)
}

fn stream(input: &str) -> Replay {
    stream_chunks(&[input.as_bytes()])
}

/// `data: …\n\n` for each chunk, then `data: [DONE]`.
fn sse(chunks: &[Value]) -> String {
    let mut s = String::new();
    for c in chunks {
        s.push_str(&format!("data: {c}\n\n"));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ev, data) = f.split_once('\n').unwrap();
            (
                ev.strip_prefix("event: ").unwrap().to_owned(),
                serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
            )
        })
        .collect()
}

fn names(bytes: &[u8]) -> Vec<String> {
    events(bytes).into_iter().map(|(n, _)| n).collect()
}

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/messages/",
            $name,
            ".sse"
        ))
    };
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn usage_chunk(prompt: u64, completion: u64, cached: u64) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}})
}

// ---------------------------------------------------------------------------------------------
// §6.1 Request parsing

#[test]
fn c01_system_string_blocks_absent_empty() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let mut v = base(user.clone());
    v["system"] = json!("Be brief.");
    assert_eq!(
        msgs(&v)[0],
        json!({"role": "system", "content": "Be brief."})
    );
    v["system"] = json!([
        {"type": "text", "text": "One."},
        {"type": "text", "text": "Two.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"type": "text", "text": ""}
    ]);
    assert_eq!(
        msgs(&v)[0],
        json!({"role": "system", "content": "One.\n\nTwo."})
    );
    v["system"] = json!([{"type": "text", "text": "Plain"}]);
    assert_eq!(msgs(&v)[0], json!({"role": "system", "content": "Plain"}));
    let absent = translate(&base(user.clone())).body;
    for empty in [json!(""), json!([]), json!(null)] {
        let mut v = base(user.clone());
        v["system"] = empty;
        assert_eq!(translate(&v).body, absent);
    }
    assert_eq!(msgs(&base(user))[0]["role"], "user");
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["system"] = json!([{"type": "image", "source": {}}]);
    assert_eq!(param(&reject(&v)), "system[0].type");
    v["system"] = json!(5);
    assert_eq!(param(&reject(&v)), "system");
}

fn claude_code_request(header: &str, first_prompt: &str) -> Value {
    json!({
        "model": "claude-opus-5-5",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nAttribution…"},
                {"type": "text", "text": first_prompt}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nYou have been invoked…", "cache_control": {"type": "ephemeral"}}],
             "output_config": {"effort": "medium"}}
        ],
        "system": [
            {"type": "text", "text": header},
            {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "\nYou are an agent working with the user…", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [
            {"name": "Bash", "description": "Executes a bash command.", "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "properties": {"command": {"description": "The command to execute", "type": "string"}},
                "required": ["command"], "additionalProperties": false}},
            {"name": "DeferredToolPlaceholder", "description": "Reserved placeholder.",
             "input_schema": {"type": "object", "properties": {}}, "defer_loading": true}
        ],
        "metadata": {"user_id": "{\"device_id\":\"ab12\",\"account_uuid\":\"\",\"session_id\":\"bbda0e11\"}"},
        "max_tokens": 128000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "safeguards": [{"type": "dangerous_tool_use", "classifier_context": {"permission_mode": "auto"}}],
        "stream": true
    })
}

#[test]
fn c02_billing_header_stripped_and_bodies_identical() {
    let a = translate(&claude_code_request(
        "x-anthropic-billing-header: cc_version=2.1.330.440; cc_entrypoint=sdk-cli; cch=1a2b;",
        "say hi",
    ));
    let b = translate(&claude_code_request(
        "x-anthropic-billing-header: cc_version=2.1.330.ed0; cc_entrypoint=cli; cc_is_subagent=true; cch=ffff;",
        "say hi",
    ));
    assert_eq!(a.body, b.body, "only the billing header differs");
    let text = String::from_utf8(a.body.clone()).unwrap();
    assert!(!text.contains("x-anthropic-billing-header"));
    let v: Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(
        v["messages"][0]["content"],
        "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n\n\nYou are an agent working with the user…"
    );
    // No header at all gives the same prompt as a stripped one.
    let mut no_header = claude_code_request("x", "say hi");
    no_header["system"].as_array_mut().unwrap().remove(0);
    assert_eq!(translate(&no_header).body, a.body);
}

#[test]
fn c03_string_content_equals_single_text_block() {
    let s = translate(&base(json!([{"role": "user", "content": "Hello"}])));
    let b = translate(&base(
        json!([{"role": "user", "content": [{"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}}]}]),
    ));
    assert_eq!(s.body, b.body);
    let a1 = translate(&base(
        json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "Sure"}]),
    ));
    let a2 = translate(&base(
        json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": "Sure"}]}]),
    ));
    assert_eq!(a1.body, a2.body);
}

#[test]
fn c04_consecutive_same_role_and_prefill() {
    let m = msgs(&base(json!([
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": [{"type": "text", "text": "{\"answer\": "}]}
    ])));
    let roles: Vec<&str> = m.iter().map(|x| x["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "user",
            "assistant",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert_eq!(m[1]["content"], "two");
    assert_eq!(
        m[5],
        json!({"role": "assistant", "content": "{\"answer\": "})
    );
    // An empty final assistant message is a (no-op) prefill; empty earlier ones are not valid.
    let m = msgs(&base(
        json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": []}]),
    ));
    assert_eq!(m[1], json!({"role": "assistant", "content": ""}));
    let e = reject(&base(json!([
        {"role": "assistant", "content": []},
        {"role": "user", "content": "x"}
    ])));
    assert_eq!(param(&e), "messages[0].content");
}

#[test]
fn prefill_asks_the_upstream_to_continue_the_final_message() {
    let continues = |v: &Value| {
        let u = upstream(v);
        match (&u["continue_final_message"], &u["add_generation_prompt"]) {
            (Value::Bool(true), Value::Bool(false)) => true,
            (Value::Null, Value::Null) => false,
            other => panic!("half a switch: {other:?}"),
        }
    };
    let q = json!({"role": "user", "content": "q"});
    // A prefill: string or text blocks (with thinking or a tool call besides).
    for last in [
        json!({"role": "assistant", "content": "{\"answer\": "}),
        json!({"role": "assistant", "content": [{"type": "text", "text": "Sure: "}]}),
        json!({"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "So"}]}),
    ] {
        assert!(continues(&base(json!([q, last]))), "{last}");
    }
    // Not a prefill: nothing to continue, or not the last message.
    for messages in [
        json!([q]),
        json!([q, {"role": "assistant", "content": ""}]),
        json!([q, {"role": "assistant", "content": []}]),
        json!([q, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]),
        json!([q, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}]),
        json!([q, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]),
        json!([q, {"role": "assistant", "content": "a"}, {"role": "system", "content": "s"}]),
    ] {
        assert!(!continues(&base(messages.clone())), "{messages}");
    }
    // The key order of the upstream body stays fixed: after the thinking switch, before stream.
    let mut v = base(json!([q, {"role": "assistant", "content": "Sure"}]));
    v["model"] = json!("apu");
    v["thinking"] = json!({"type": "disabled"});
    v["stream"] = json!(true);
    let body = String::from_utf8(translate(&v).body).unwrap();
    assert!(
        body.contains("{\"enable_thinking\":false},\"continue_final_message\":true,\"add_generation_prompt\":false,\"stream\":true"),
        "{body}"
    );
    // count_tokens counts the same prompt the same way.
    let (_, up) = count_tokens_to_upstream(v.to_string().as_bytes(), config()).unwrap();
    let up: Value = serde_json::from_slice(&up).unwrap();
    assert_eq!(up["continue_final_message"], true);
    assert_eq!(up["add_generation_prompt"], false);
    // A model whose upstream rejects the fields (llama.cpp ignores them; others may not).
    let mut c = Config::parse(crate::config::EMBEDDED_DEFAULT, "embedded").unwrap();
    c.models.iter_mut().for_each(|m| m.prefill = false);
    let r = messages_to_upstream(v.to_string().as_bytes(), &c).unwrap();
    let u: Value = serde_json::from_slice(&r.body).unwrap();
    assert!(u.get("continue_final_message").is_none() && u.get("add_generation_prompt").is_none());
    let (_, up) = count_tokens_to_upstream(v.to_string().as_bytes(), &c).unwrap();
    let up: Value = serde_json::from_slice(&up).unwrap();
    assert_eq!(up["add_generation_prompt"], true);
    assert!(up.get("continue_final_message").is_none());
}

#[test]
fn c05_images_base64_url_and_in_tool_result() {
    for media in ["image/jpeg", "image/png", "image/gif", "image/webp"] {
        let m = msgs(&base(json!([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, image(media)]}])));
        assert_eq!(
            m[0]["content"],
            json!([{"type": "text", "text": "What is this?"},
                   {"type": "image_url", "image_url": {"url": format!("data:{media};base64,{PNG}")}}])
        );
    }
    let url = json!([{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]);
    assert_eq!(
        msgs(&base(url.clone()))[0]["content"],
        json!([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    );
    let e = messages_to_upstream(base(url).to_string().as_bytes(), &config_rejecting_urls())
        .unwrap_err();
    assert_eq!(param(&e), "messages[0].content[0].source.type");
    // Only public hosts: the upstream fetches the URL from inside its network (SSRF). The
    // cases are in translate::image_url; here, that both places in a request are guarded.
    let url_image = |url: &str| json!({"type": "image", "source": {"type": "url", "url": url}});
    for bad in [
        "ftp://example.com/a.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://0x7f.1/",
        "https://user@example.com/a.png",
        "http://localhost:8000/",
    ] {
        let e = reject(&base(
            json!([{"role": "user", "content": [url_image(bad)]}]),
        ));
        assert_eq!(param(&e), "messages[0].content[0].source.url", "{bad}");
        assert!(
            e.message.starts_with("messages[0].content[0].source.url: "),
            "{}",
            e.message
        );
        let e = reject(&base(json!([
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [url_image(bad)]}]}
        ])));
        assert_eq!(
            param(&e),
            "messages[2].content[0].content[0].source.url",
            "{bad}"
        );
    }
    let m = msgs(&base(
        json!([{"role": "user", "content": [url_image("http://example.com/a.png")]}]),
    ));
    assert_eq!(
        m[0]["content"][0]["image_url"]["url"],
        "http://example.com/a.png"
    );
    // Inside a tool_result: text in the tool message, the image in a following user message.
    let m = msgs(&base(json!([
        {"role": "user", "content": "screenshot please"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "Here:"}, image("image/png")]},
            {"type": "text", "text": "Describe it."}]}
    ])));
    assert_eq!(
        m[2],
        json!({"role": "tool", "tool_call_id": "t1", "content": "Here:\n[image]"})
    );
    assert_eq!(
        m[3],
        json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}")}}]})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "Describe it."}));
    // Rejections: bad base64, bad media type, a model without vision.
    let bad = |source: Value| {
        reject(&base(
            json!([{"role": "user", "content": [{"type": "image", "source": source}]}]),
        ))
    };
    let e = bad(json!({"type": "base64", "media_type": "image/png", "data": "not base64!"}));
    assert_eq!(param(&e), "messages[0].content[0].source.data");
    let e = bad(json!({"type": "base64", "media_type": "image/bmp", "data": PNG}));
    assert_eq!(param(&e), "messages[0].content[0].source.media_type");
    let e = bad(json!({"type": "file", "file_id": "f"}));
    assert_eq!(param(&e), "messages[0].content[0].source.type");
    let mut v = base(json!([{"role": "user", "content": [image("image/png")]}]));
    v["model"] = json!("colibri");
    let e = reject(&v);
    assert_eq!(e.status(ClientFormat::Messages), 400);
    assert!(
        e.message.contains("does not accept images"),
        "{}",
        e.message
    );
    assert!(e.message.contains("`aguila`"), "{}", e.message);
    let mut v = base(json!([
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image("image/png")]}]}
    ]));
    v["model"] = json!("colibri");
    assert_eq!(param(&reject(&v)), "messages[2].content[0].content[0]");
}

fn with_tool_use(result: Value) -> Value {
    base(json!([
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [result]}
    ]))
}

#[test]
fn c06_tool_result_forms() {
    let tool = |result: Value| msgs(&with_tool_use(result))[2].clone();
    assert_eq!(
        tool(
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb", "is_error": false, "cache_control": {"type": "ephemeral"}})
        ),
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a\nb"})
    );
    assert_eq!(
        tool(
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]})
        )["content"],
        "one\ntwo"
    );
    assert_eq!(
        tool(json!({"type": "tool_result", "tool_use_id": "toolu_1"}))["content"],
        ""
    );
    assert_eq!(
        tool(
            json!({"content": "Exit code 2\nls: cannot access", "is_error": true, "tool_use_id": "toolu_1", "type": "tool_result"})
        )["content"],
        "[tool error] Exit code 2\nls: cannot access"
    );
    assert_eq!(
        tool(json!({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true}))["content"],
        "[tool error] "
    );
    // Claude Code's ToolSearch answers with tool_reference blocks.
    assert_eq!(
        tool(
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]})
        )["content"],
        "[tool_reference] WebFetch"
    );
    // A tool_result answering no tool_use of the previous assistant turn.
    let e = reject(&with_tool_use(
        json!({"type": "tool_result", "tool_use_id": "toolu_404", "content": "x"}),
    ));
    assert_eq!(param(&e), "messages[2].content[0].tool_use_id");
    assert!(e
        .message
        .contains("unexpected `tool_use_id` found in `tool_result` blocks: toolu_404"));
    let e = reject(&base(json!([
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}
    ])));
    assert_eq!(param(&e), "messages[0].content[0].tool_use_id");
    let e = reject(&with_tool_use(
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes"}),
    ));
    assert_eq!(param(&e), "messages[2].content[0].is_error");
    let e = reject(&with_tool_use(
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_use", "id": "x", "name": "y", "input": {}}]}),
    ));
    assert_eq!(param(&e), "messages[2].content[0].content[0].type");
}

#[test]
fn c07_tool_results_go_before_user_text() {
    let conv = |last: Value| {
        base(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "a", "name": "f", "input": {}},
                {"type": "tool_use", "id": "b", "name": "f", "input": {}}]},
            {"role": "user", "content": last}
        ]))
    };
    let m = msgs(&conv(json!([
        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
        {"type": "tool_result", "tool_use_id": "b", "content": "B"},
        {"type": "text", "text": "continue"}
    ])));
    assert_eq!(m.len(), 5);
    assert_eq!(
        m[2],
        json!({"role": "tool", "tool_call_id": "a", "content": "A"})
    );
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "b", "content": "B"})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "continue"}));
    // Text first: tools still come first (chat templates need tool messages right after
    // tool_calls), then the text.
    let m2 = msgs(&conv(json!([
        {"type": "text", "text": "continue"},
        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
        {"type": "tool_result", "tool_use_id": "b", "content": "B"}
    ])));
    assert_eq!(m2, m);
}

#[test]
fn c08_parallel_tool_use_is_one_assistant_message() {
    let m = msgs(&base(json!([
        {"role": "user", "content": "weather and time"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Lima", "units": {"temp": "C"}}},
            {"type": "tool_use", "id": "t2", "name": "get_time", "input": { "tz" : "America/Lima" }, "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "20C"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "10:00"}]}
    ])));
    assert_eq!(
        m[1],
        json!({"role": "assistant", "content": "Checking both.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Lima\",\"units\":{\"temp\":\"C\"}}"}},
            {"id": "t2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":\"America/Lima\"}"}}]})
    );
    assert_eq!(m.len(), 4);
    // Tool calls alone: content null.
    let m = msgs(&base(json!([
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    ])));
    assert_eq!(m[1]["content"], Value::Null);
    assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{}");
    for (input, p) in [(json!("str"), "input"), (Value::Null, "input")] {
        let e = reject(&base(json!([
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": input}]}
        ])));
        assert_eq!(param(&e), format!("messages[1].content[0].{p}"));
    }
}

#[test]
fn c09_assistant_thinking_history() {
    let m = msgs(&base(json!([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Let me think.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
            {"type": "thinking", "thinking": " More.", "signature": ""},
            {"type": "text", "text": "Answer."}]},
        {"role": "user", "content": "next"}
    ])));
    assert_eq!(
        m[1],
        json!({"role": "assistant", "content": "Answer.", "reasoning": "Let me think. More."})
    );
    let m = msgs(&base(json!([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
        {"role": "user", "content": "next"}
    ])));
    assert_eq!(m[1], json!({"role": "assistant", "content": ""}));
    let e = reject(&base(
        json!([{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]),
    ));
    assert_eq!(param(&e), "messages[0].content[0].type");
}

fn with_tools(tool_choice: Value) -> Value {
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["tools"] = json!([
        {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"name": "get_time", "input_schema": {"type": "object"}}
    ]);
    v["tool_choice"] = tool_choice;
    v
}

#[test]
fn c10_tool_choice_mapping() {
    for (choice, want) in [
        (json!({"type": "auto"}), json!("auto")),
        (json!({"type": "any"}), json!("required")),
        (json!({"type": "none"}), json!("none")),
        (
            json!({"type": "tool", "name": "get_time"}),
            json!({"type": "function", "function": {"name": "get_time"}}),
        ),
    ] {
        let v = upstream(&with_tools(choice.clone()));
        assert_eq!(v["tool_choice"], want, "{choice}");
        assert!(v.get("parallel_tool_calls").is_none());
        let mut c = choice.clone();
        c["disable_parallel_tool_use"] = json!(true);
        let v = upstream(&with_tools(c));
        assert_eq!(v["tool_choice"], want);
        assert_eq!(v["parallel_tool_calls"], json!(false));
    }
    let e = reject(&with_tools(json!({"type": "tool", "name": "nope"})));
    assert_eq!(param(&e), "tool_choice.name");
    let e = reject(&with_tools(json!({"type": "sometimes"})));
    assert_eq!(param(&e), "tool_choice.type");
    let e = reject(&with_tools(json!("auto")));
    assert_eq!(param(&e), "tool_choice");
    // Without tools: auto/none are omitted, any/tool are errors.
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["tool_choice"] = json!({"type": "auto"});
    assert!(upstream(&v).get("tool_choice").is_none());
    v["tool_choice"] = json!({"type": "any"});
    assert_eq!(param(&reject(&v)), "tool_choice.type");
}

#[test]
fn c11_long_tool_names_are_shortened_stably_and_restored() {
    let long = "mcp__claude_ai_project_tracker__create_issue_with_labels_and_assignees";
    let short = shorten_tool_name(long);
    assert_eq!(short.len(), 64);
    assert_eq!(short, shorten_tool_name(long));
    assert!(short.starts_with(&long[..55]));
    // `_` and the first 4 bytes of the name's SHA-256 in hex: the same in every version, so a
    // conversation's history maps to the same names after an upgrade.
    let d = <sha2::Sha256 as sha2::Digest>::digest(long.as_bytes());
    let suffix = format!("_{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3]);
    assert_eq!(short[55..], suffix);
    assert_ne!(
        short,
        shorten_tool_name(
            "mcp__claude_ai_project_tracker__create_issue_with_labels_and_assignees_2"
        )
    );
    // Multi-byte characters are never cut in half.
    let accented = "ñ".repeat(40);
    let s = shorten_tool_name(&accented);
    assert!(s.len() <= 64 && s.is_char_boundary(s.len() - 9));

    let mut v = base(json!([
        {"role": "user", "content": "file it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": long, "input": {"title": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}
    ]));
    v["tools"] = json!([{"name": long, "input_schema": {"type": "object"}}, {"name": "short", "input_schema": {"type": "object"}}]);
    v["tool_choice"] = json!({"type": "tool", "name": long});
    let r = translate(&v);
    assert_eq!(r.tool_name_map, vec![(short.clone(), long.to_owned())]);
    let u: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(u["tools"][0]["function"]["name"], short);
    assert_eq!(u["tools"][1]["function"]["name"], "short");
    assert_eq!(u["tool_choice"]["function"]["name"], short);
    assert_eq!(u["messages"][1]["tool_calls"][0]["function"]["name"], short);
    // Restored in a response.
    let mut c = ctx();
    c.tool_name_map = r.tool_name_map.clone();
    let body = completion(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": short, "arguments": "{}"}}]}),
        "tool_calls",
        json!({"prompt_tokens": 5, "completion_tokens": 2}),
    );
    let (out, _) = upstream_to_message(body.to_string().as_bytes(), &c).unwrap();
    let m: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(m["content"][0]["name"], long);
}

#[test]
fn c12_tool_schemas_pass_through_without_tool_level_keys() {
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["tools"] = json!([
        {"type": "custom", "name": "noprops", "description": "d", "input_schema": {"type": "object"},
         "cache_control": {"type": "ephemeral"}, "defer_loading": true, "strict": true,
         "input_examples": [{"a": 1}], "eager_input_streaming": true, "allowed_callers": ["direct"]},
        {"name": "extra", "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema",
         "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}}
    ]);
    let u = upstream(&v);
    assert_eq!(
        u["tools"],
        json!([
            {"type": "function", "function": {"name": "noprops", "description": "d", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "extra", "parameters": {"$schema": "https://json-schema.org/draft/2020-12/schema",
             "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}}}
        ])
    );
    for (tools, p) in [
        (
            json!([{"type": "web_search_20250305", "name": "web_search"}]),
            "tools[0].type",
        ),
        (json!([{"name": "x"}]), "tools[0].input_schema"),
        (
            json!([{"name": "x", "input_schema": "object"}]),
            "tools[0].input_schema",
        ),
        (json!([{"input_schema": {}}]), "tools[0].name"),
        (json!([{"name": "", "input_schema": {}}]), "tools[0].name"),
        (
            json!([{"name": "x", "input_schema": {}}, {"name": "x", "input_schema": {}}]),
            "tools[1].name",
        ),
        (
            json!([{"name": "x", "description": 3, "input_schema": {}}]),
            "tools[0].description",
        ),
        (json!({"name": "x"}), "tools"),
        (json!([7]), "tools[0]"),
    ] {
        let mut v = base(json!([{"role": "user", "content": "hi"}]));
        v["tools"] = tools.clone();
        assert_eq!(param(&reject(&v)), p, "{tools}");
    }
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["tools"] = json!([]);
    assert!(upstream(&v).get("tools").is_none());
}

#[test]
fn c13_thinking_switch_and_sampling_fields() {
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["model"] = json!("colibri");
    v["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    assert_eq!(
        upstream(&v)["chat_template_kwargs"],
        json!({"enable_thinking": true})
    );
    v["thinking"] = json!({"type": "disabled"});
    assert_eq!(
        upstream(&v)["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    for adaptive in [
        json!({"type": "adaptive"}),
        json!({"type": "adaptive", "display": "omitted"}),
    ] {
        v["thinking"] = adaptive;
        assert!(upstream(&v).get("chat_template_kwargs").is_none());
    }
    // A model with no switch configured: nothing added.
    v["model"] = json!("aguila");
    v["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    assert!(upstream(&v).get("chat_template_kwargs").is_none());
    v["thinking"] = json!("on");
    assert_eq!(param(&reject(&v)), "thinking");
    v["thinking"] = json!({"budget_tokens": 1});
    assert_eq!(param(&reject(&v)), "thinking.type");

    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["top_k"] = json!(40);
    v["top_p"] = json!(0.9);
    v["stop_sequences"] = json!(["###", "\n\nHuman:"]);
    v["temperature"] = json!(0.2);
    let u = upstream(&v);
    assert_eq!(u["top_k"], 40);
    assert_eq!(u["top_p"], 0.9);
    assert_eq!(u["stop"], json!(["###", "\n\nHuman:"]));
    assert_eq!(u["temperature"], 0.2);
    v["stop_sequences"] = json!([]);
    assert!(upstream(&v).get("stop").is_none());
}

#[test]
fn c14_newer_fields_are_accepted_and_dropped() {
    let mut v = claude_code_request("x-anthropic-billing-header: cc_version=1;", "hi");
    for (k, val) in [
        ("effort", json!("high")),
        ("service_tier", json!("auto")),
        ("container", json!("cont_1")),
        ("inference_geo", json!("us")),
        ("cache_control", json!({"type": "ephemeral", "ttl": "1h"})),
        ("some_future_field", json!({"x": [1, 2]})),
    ] {
        v[k] = val;
    }
    v["messages"][0]["content"][1]["citations"] = json!([]);
    let u = upstream(&v);
    let keys: Vec<&str> = u.as_object().unwrap().keys().map(String::as_str).collect();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "max_tokens",
            "messages",
            "model",
            "stream",
            "stream_options",
            "temperature",
            "tools",
            "user"
        ]
    );
    assert_eq!(u["max_tokens"], 8192);
    assert_eq!(u["model"], "Qwen/Qwen3-235B-A22B");
    assert_eq!(
        u["user"],
        "{\"device_id\":\"ab12\",\"account_uuid\":\"\",\"session_id\":\"bbda0e11\"}"
    );
    assert_eq!(
        u["messages"][2],
        json!({"role": "system", "content": "# Environment\nYou have been invoked…"})
    );
    assert_eq!(
        u["stream_options"],
        json!({"include_usage": true, "continuous_usage_stats": true})
    );
    let text = serde_json::to_string(&u).unwrap();
    for leaked in [
        "cache_control",
        "defer_loading",
        "output_config",
        "context_management",
        "safeguards",
        "citations",
        "effort",
    ] {
        assert!(!text.contains(leaked), "{leaked} leaked upstream");
    }
}

#[test]
fn c16_missing_required_fields_are_400_in_the_messages_envelope() {
    for (v, p) in [
        (json!({"model": "aguila", "max_tokens": 5}), "messages"),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (json!({"model": "aguila", "messages": []}), "messages"),
        (json!({"model": "aguila", "messages": {}}), "messages"),
        (
            json!({"model": 7, "messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (
            json!({"model": "aguila", "messages": [{"content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user", "content": [{"type": "video"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user", "content": [{"text": "x"}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "messages[0].content[0].text",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}),
            "messages[0].content[0].text",
        ),
        (
            json!({"model": "aguila", "messages": [{"role": "user", "content": ["x"]}]}),
            "messages[0].content[0]",
        ),
        (json!({"model": "aguila", "messages": ["x"]}), "messages[0]"),
    ] {
        let e = reject(&v);
        assert_eq!(param(&e), p, "{v}");
        assert!(e.message.starts_with(p), "{}", e.message);
        let body: Value = serde_json::from_slice(&e.body(ClientFormat::Messages, "req_1")).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(e.status(ClientFormat::Messages), 400);
    }
    // max_tokens is optional (DESIGN.md): defaults to the maximum.
    let u = upstream(&json!({"model": "aguila", "messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(u["max_tokens"], MAX_OUTPUT_TOKENS);
    // Not JSON / not an object.
    for body in [
        &b""[..],
        b"   ",
        b"not json",
        b"[1,2]",
        b"\"str\"",
        b"{\"model\":",
        b"{\"model\":\"aguila\",\"model\":\"apu\",\"messages\":[]}",
    ] {
        let e = messages_to_upstream(body, config()).unwrap_err();
        assert_eq!(e.status(ClientFormat::Messages), 400, "{body:?}");
    }
}

#[test]
fn system_entries_alone_are_400_not_an_empty_upstream_prompt() {
    // Found by the messages_request fuzz target: an empty `system` entry writes nothing, so
    // these used to reach the upstream as `"messages":[]`.
    let billing = json!([{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}]);
    for messages in [
        json!([{"role": "system", "content": ""}]),
        json!([{"role": "system", "content": []}]),
        json!([{"role": "system", "content": billing}]),
        json!([{"role": "system", "content": "Be brief."}]),
        json!([{"role": "system", "content": "a"}, {"role": "system", "content": "b"}]),
    ] {
        let v = json!({"model": "colibri", "max_tokens": 1, "messages": messages});
        let e = reject(&v);
        assert_eq!(param(&e), "messages", "{v}");
        assert!(e.message.contains("user or assistant"), "{}", e.message);
        assert_eq!(e.status(ClientFormat::Messages), 400);
        let e = count_tokens_to_upstream(v.to_string().as_bytes(), config()).unwrap_err();
        assert_eq!(param(&e), "messages");
    }
    // With a top-level system prompt too, and the exact fuzz input.
    let mut v = base(json!([{"role": "system", "content": ""}]));
    v["system"] = json!("Sys");
    assert_eq!(param(&reject(&v)), "messages");
    let e = messages_to_upstream(
        br#"{"model":"colibri","max_tokens":1,"messages":[{"role":"system","content":""}]}"#,
        config(),
    )
    .unwrap_err();
    assert_eq!(param(&e), "messages");
    // One real turn is enough, wherever the system entries are.
    let m = msgs(&base(
        json!([{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]),
    ));
    assert_eq!(m, vec![json!({"role": "user", "content": "hi"})]);
}

// ---------------------------------------------------------------------------------------------
// Request rules (DESIGN.md) beyond the checklist

#[test]
fn tool_result_ids_answer_only_the_latest_assistant_turn() {
    let turn = |id: &str| json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "f", "input": {}}]});
    let result = |id: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "ok"}]});
    // Consecutive assistant messages are one turn; results may be split across user messages.
    translate(&base(json!([
        {"role": "user", "content": "go"},
        turn("a"),
        {"role": "system", "content": "reminder"},
        turn("b"),
        result("a"),
        {"role": "user", "content": "and"},
        result("b")
    ])));
    // An id from an earlier turn is stale.
    let e = reject(&base(json!([
        {"role": "user", "content": "go"},
        turn("a"),
        result("a"),
        turn("b"),
        result("a")
    ])));
    assert_eq!(param(&e), "messages[4].content[0].tool_use_id");
}

#[test]
fn documents_with_text_sources_become_text() {
    let m = msgs(&base(json!([{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Doc body"}, "title": "t", "citations": {"enabled": true}},
        {"type": "text", "text": "Summarise."}]}])));
    assert_eq!(
        m[0]["content"],
        json!([{"type": "text", "text": "Doc body"}, {"type": "text", "text": "Summarise."}])
    );
    let e = reject(&base(json!([{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}])));
    assert_eq!(param(&e), "messages[0].content[0].source.type");
}

#[test]
fn unknown_model_lists_valid_slugs_and_aliases_resolve() {
    let mut v = base(json!([{"role": "user", "content": "x"}]));
    v["model"] = json!("gpt-4");
    let e = reject(&v);
    assert_eq!(e.kind, ErrorKind::ModelNotFound);
    assert_eq!(
        e.message,
        format!(
            "model `gpt-4` does not exist; valid models are {}",
            config().slug_list()
        )
    );
    assert_eq!(e.status(ClientFormat::Messages), 404);
    v["model"] = json!("claude-haiku-4-5");
    let r = translate(&v);
    assert_eq!(r.client_model, "claude-haiku-4-5");
    assert_eq!(config().models[r.model].slug, "colibri");
    let u: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(u["model"], "Qwen/Qwen3-4B");
}

#[test]
fn max_tokens_temperature_top_p_top_k_rules() {
    let with = |k: &str, val: Value| {
        let mut v = base(json!([{"role": "user", "content": "x"}]));
        v[k] = val;
        v
    };
    for (val, want) in [
        (json!(1), 1),
        (json!(8192), 8192),
        (json!(32000), 8192),
        (json!(128000), 8192),
        (json!(u64::MAX), 8192),
    ] {
        let r = translate(&with("max_tokens", val));
        assert_eq!(r.max_tokens, want);
        let u: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(u["max_tokens"], want);
    }
    let huge = br#"{"model":"aguila","max_tokens":100000000000000000000000,"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(
        messages_to_upstream(huge, config()).unwrap().max_tokens,
        8192
    );
    for bad in [
        json!(0),
        json!(-1),
        json!(1.5),
        json!("10"),
        json!(true),
        json!(1e3),
    ] {
        assert_eq!(param(&reject(&with("max_tokens", bad))), "max_tokens");
    }
    assert_eq!(
        upstream(&base(json!([{"role": "user", "content": "x"}])))["temperature"],
        0.6
    );
    for ok in [json!(0), json!(0.0), json!(1), json!(0.75)] {
        translate(&with("temperature", ok));
    }
    for bad in [json!(-0.1), json!(1.01), json!(2), json!("0.5")] {
        assert_eq!(param(&reject(&with("temperature", bad))), "temperature");
    }
    let huge =
        br#"{"model":"aguila","temperature":1e400,"messages":[{"role":"user","content":"x"}]}"#;
    assert!(messages_to_upstream(huge, config()).is_err());
    for ok in [json!(1), json!(0.01)] {
        translate(&with("top_p", ok));
    }
    for bad in [json!(0), json!(1.5), json!("x")] {
        assert_eq!(param(&reject(&with("top_p", bad))), "top_p");
    }
    translate(&with("top_k", json!(0)));
    for bad in [json!(-1), json!(2.5), json!("4")] {
        assert_eq!(param(&reject(&with("top_k", bad))), "top_k");
    }
    for bad in [json!("###"), json!([1]), json!([""])] {
        assert!(param(&reject(&with("stop_sequences", bad))).starts_with("stop_sequences"));
    }
    assert_eq!(param(&reject(&with("stream", json!("yes")))), "stream");
    assert_eq!(param(&reject(&with("metadata", json!("u")))), "metadata");
    assert_eq!(
        param(&reject(&with("metadata", json!({"user_id": 5})))),
        "metadata.user_id"
    );
    assert!(upstream(&with("metadata", json!({"user_id": null})))
        .get("user")
        .is_none());
}

#[test]
fn upstream_request_fields_are_filled() {
    let mut v = claude_code_request("x-anthropic-billing-header: a;", "hi");
    let r = translate(&v);
    assert!(r.stream);
    assert!(!r.client_wants_usage);
    assert_eq!(r.max_tokens, 8192);
    assert_eq!(r.client_model, "claude-opus-5-5");
    assert_eq!(r.body[r.prompt_range.start], b'[');
    assert_eq!(r.body[r.prompt_range.end - 1], b']');
    let messages: Value = serde_json::from_slice(&r.body[r.prompt_range.clone()]).unwrap();
    let full: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(messages, full["messages"]);
    let tools_len = serde_json::to_string(&full["tools"]).unwrap().len();
    assert!(r.prompt_bytes >= r.prompt_range.len() + tools_len - 64);
    assert!(r.prompt_bytes <= r.body.len());
    v["stream"] = json!(false);
    let r = translate(&v);
    let u: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(u["stream"], false);
    assert!(u.get("stream_options").is_none());
    // A model with continuous usage turned off does not get the field at all.
    let mut c = Config::parse(crate::config::EMBEDDED_DEFAULT, "x").unwrap();
    for m in &mut c.models {
        m.continuous_usage = false;
    }
    v["stream"] = json!(true);
    let r = messages_to_upstream(v.to_string().as_bytes(), &c).unwrap();
    let u: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(u["stream_options"], json!({"include_usage": true}));
}

#[test]
fn text_is_forwarded_exactly_as_escaped() {
    let body = br#"{"model":"aguila","system":[{"type":"text","text":"a\u00e9\"\n"},{"type":"text","text":"\ud83e\udd99"}],"messages":[{"role":"user","content":[{"type":"text","text":"caf\u00e9 \\ \/"}]}]}"#;
    let r = messages_to_upstream(body, config()).unwrap();
    let text = String::from_utf8(r.body.clone()).unwrap();
    assert!(text.contains(r#""a\u00e9\"\n\n\n\ud83e\udd99""#), "{text}");
    let u: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(u["messages"][0]["content"], "aé\"\n\n\n🦙");
    assert_eq!(u["messages"][1]["content"], "café \\ /");
}

// ---------------------------------------------------------------------------------------------
// §6.2 Non-streaming response

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
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 4}})
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
        json!({"input_tokens": 52, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2048, "output_tokens": 40})
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

// ---------------------------------------------------------------------------------------------
// §6.3 Streaming framing

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

// ---------------------------------------------------------------------------------------------
// §6.4 Streaming content edge cases (fixtures)

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
        json!({"input_tokens": 52, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2048, "output_tokens": 40})
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

// ---------------------------------------------------------------------------------------------
// §6.5 Errors

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

// ---------------------------------------------------------------------------------------------
// §6.6 Claude Code

#[test]
fn c57_count_tokens_uses_the_upstream_tokenizer() {
    let body = json!({
        "model": "claude-opus-5-5",
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"}, {"type": "text", "text": "Sys"}],
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}, "defer_loading": true}],
        "thinking": {"type": "disabled"},
        "max_tokens": 5, "stream": true, "tool_choice": {"type": "any"}
    });
    let (model, up) = count_tokens_to_upstream(body.to_string().as_bytes(), config()).unwrap();
    assert_eq!(config().models[model].slug, "apu");
    let u: Value = serde_json::from_slice(&up).unwrap();
    assert_eq!(
        u,
        json!({"model": "Qwen/Qwen3-235B-A22B",
            "messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}],
            "chat_template_kwargs": {"enable_thinking": false},
            "add_generation_prompt": true})
    );
    // The same prompt as a create request.
    let create = translate(&body);
    let tokenize_messages =
        &up[up.windows(12).position(|w| w == b"\"messages\":[").unwrap() + 11..];
    assert!(tokenize_messages.starts_with(&create.body[create.prompt_range.clone()]));
    assert_eq!(
        tokenize_to_count_tokens(br#"{"count":2095,"max_model_len":131072,"tokens":[1,2,3]}"#)
            .unwrap(),
        br#"{"input_tokens":2095}"#
    );
    for bad in [
        &b"{}"[..],
        b"{\"count\":-1}",
        b"{\"error\":{\"message\":\"x\"}}",
        b"nope",
    ] {
        assert_eq!(
            tokenize_to_count_tokens(bad).unwrap_err().kind,
            ErrorKind::Upstream
        );
    }
    let e = count_tokens_to_upstream(br#"{"model":"nope","messages":[]}"#, config()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ModelNotFound);
    let e = count_tokens_to_upstream(br#"{"model":"aguila"}"#, config()).unwrap_err();
    assert_eq!(param(&e), "messages");
}

#[test]
fn c59_next_turn_extends_the_previous_prompt_byte_for_byte() {
    let turn1 = claude_code_request(
        "x-anthropic-billing-header: cc_version=2.1.330.ed0;",
        "list files",
    );
    let mut turn2 = claude_code_request(
        "x-anthropic-billing-header: cc_version=2.1.330.ed0; cch=9;",
        "list files",
    );
    let msgs2 = turn2["messages"].as_array_mut().unwrap();
    msgs2.push(json!({"role": "assistant", "content": [
        {"type": "text", "text": "I'll list the files."},
        {"type": "tool_use", "id": "toolu_2e0a", "name": "Bash", "input": {"command": "ls", "description": "List files"}}]}));
    msgs2.push(json!({"role": "user", "content": [
        {"tool_use_id": "toolu_2e0a", "type": "tool_result", "content": "a\nb", "is_error": false, "cache_control": {"type": "ephemeral"}}]}));
    let a = translate(&turn1);
    let b = translate(&turn2);
    let p1 = &a.body[a.prompt_range.start..a.prompt_range.end - 1];
    let p2 = &b.body[b.prompt_range.clone()];
    assert!(
        p2.starts_with(p1),
        "turn 2's prompt must start with turn 1's"
    );
}

// ---------------------------------------------------------------------------------------------
// Robustness

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
            let _ = tokenize_to_count_tokens(body.as_bytes());
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
