//! Chat requests, top level: defaults, clamping, which fields reach the upstream, and errors
//! that name the field.

use super::*;

#[test]
fn defaults_and_model_rewrite() {
    let (r, up) = translate(hello("colibri")).unwrap();
    assert_eq!(up["model"], "Qwen/Qwen3-4B");
    assert_eq!(up["max_tokens"], 8192);
    assert_eq!(up["temperature"], 0.6);
    assert_eq!(up["stream"], false);
    assert!(up.get("stream_options").is_none());
    assert_eq!(r.max_tokens, 8192);
    assert_eq!(r.client_model, "colibri");
    assert!(!r.stream);
    let messages = &r.body[r.prompt_range.clone()];
    assert_eq!(
        serde_json::from_slice::<Value>(messages).unwrap(),
        json!([{"role":"user","content":"hola"}])
    );
}

#[test]
fn streams_always_ask_for_usage() {
    let mut v = hello("aguila");
    v["stream"] = json!(true);
    let (r, up) = translate(v.clone()).unwrap();
    assert_eq!(
        up["stream_options"],
        json!({"include_usage": true, "continuous_usage_stats": true})
    );
    assert!(!r.client_wants_usage);
    v["stream_options"] = json!({"include_usage": true});
    let (r, _) = translate(v).unwrap();
    assert!(r.client_wants_usage);
}

#[test]
fn max_tokens_rules() {
    let mut v = hello("apu");
    v["max_tokens"] = json!(32000);
    assert_eq!(translate(v.clone()).unwrap().1["max_tokens"], 8192);
    v["max_tokens"] = json!(100);
    assert_eq!(translate(v.clone()).unwrap().1["max_tokens"], 100);
    v["max_completion_tokens"] = json!(50);
    assert_eq!(translate(v.clone()).unwrap().1["max_tokens"], 50);
    v["max_tokens"] = json!(-1);
    v["max_completion_tokens"] = Value::Null;
    assert_eq!(
        err(v.clone()).kind,
        ErrorKind::InvalidRequest {
            param: Some("max_tokens".into())
        }
    );
    v["max_tokens"] = json!(0);
    assert!(err(v.clone()).message.contains("at least 1"));
    v["max_tokens"] = json!(1.5);
    assert!(err(v.clone()).message.contains("integer"));
    v["max_tokens"] = json!("10");
    assert!(err(v.clone()).message.contains("integer"));
    v["max_tokens"] = json!(1e300);
    assert_eq!(translate(v).unwrap().1["max_tokens"], 8192);
}

#[test]
fn listed_fields_forwarded_unlisted_dropped() {
    let v = json!({
        "model": "aguila",
        "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "temperature": 0.2, "top_p": 0.9, "stop": ["END"], "seed": 7,
        "frequency_penalty": 0.5, "presence_penalty": -0.5,
        "logit_bias": {"50256": -100}, "logprobs": true, "top_logprobs": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}},
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}, "extra": 1}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false, "user": "u-1",
        "n": 3, "metadata": {"a": 1}, "store": true, "service_tier": "auto"
    });
    let (_, up) = translate(v).unwrap();
    assert_eq!(up["messages"][0]["role"], "system");
    for k in [
        "temperature",
        "top_p",
        "stop",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "user",
    ] {
        assert!(up.get(k).is_some(), "{k} missing");
    }
    for k in ["n", "metadata", "store", "service_tier"] {
        assert!(up.get(k).is_none(), "{k} leaked");
    }
    assert!(up["tools"][0].get("extra").is_none());
    assert_eq!(up["temperature"], 0.2);
}

#[test]
fn validation_errors_name_the_field() {
    let cases = [
        (json!({"messages": []}), "model"),
        (json!({"model": "colibri"}), "messages"),
        (json!({"model": 5, "messages": []}), "model"),
        (json!({"model": "colibri", "messages": []}), "messages"),
        (json!({"model": "colibri", "messages": "hi"}), "messages"),
        (
            json!({"model": "colibri", "messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "colibri", "messages": [{"content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "temperature": 3}),
            "temperature",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            "stream",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "stop": [1]}),
            "stop",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
            "top_logprobs",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"model": "colibri", "messages": [{"role": "tool", "content": "x", "tool_call_id": "c1"}]}),
            "messages[0].tool_call_id",
        ),
    ];
    for (body, param) in cases {
        let e = err(body.clone());
        assert_eq!(
            e.kind,
            ErrorKind::InvalidRequest {
                param: Some(param.into())
            },
            "{body} -> {e:?}"
        );
    }
}

#[test]
fn unknown_model_lists_slugs() {
    let e = err(hello("gpt-9"));
    assert_eq!(e.kind, ErrorKind::ModelNotFound);
    assert_eq!(
        e.message,
        "model `gpt-9` does not exist; valid models are `colibri`, `aguila`, `apu`"
    );
}

#[test]
fn reasoning_switch() {
    let mut v = hello("colibri");
    v["reasoning"] = json!({"effort": "none"});
    let (_, up) = translate(v.clone()).unwrap();
    assert_eq!(up["chat_template_kwargs"]["enable_thinking"], false);
    v["reasoning"] = json!({"effort": "high"});
    let (_, up) = translate(v.clone()).unwrap();
    assert_eq!(up["chat_template_kwargs"]["enable_thinking"], true);
    assert_eq!(up["reasoning_effort"], "high");
    v["reasoning"] = json!({"effort": "extreme"});
    assert!(translate(v).is_err());
}

#[test]
fn hostile_bodies_are_400() {
    let c = config();
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    for body in [
        &b""[..],
        b"{",
        b"[]",
        b"null",
        b"\xff\xfe",
        deep.as_bytes(),
        br#"{"model":"colibri","model":"apu","messages":[]}"#,
    ] {
        let e = chat_to_upstream(body, &c).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::InvalidRequest { .. }), "{e:?}");
    }
}
