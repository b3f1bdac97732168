//! Requests, top level and prompt shape (and docs/design.md's request rules):
//! `system`, Claude Code's billing header, string vs block content, consecutive roles and
//! prefills, fields accepted and dropped, required fields, `max_tokens` and sampling rules,
//! model names, and text forwarded exactly as escaped.

use super::*;

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
    // max_tokens is optional (docs/design.md): defaults to the maximum.
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
