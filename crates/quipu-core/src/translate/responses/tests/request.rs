//! Requests: top-level fields and their defaults, input items, tools and `tool_choice`,
//! `text.format`, `reasoning`, the echo, and a conversation continued from a stored one.

use super::*;
use crate::translate::MAX_OUTPUT_TOKENS;

const PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

#[test]
fn a_string_input_is_one_user_message_and_the_defaults_apply() {
    let v = base(json!("¡Hola!"));
    let t = translate(&v);
    let u: Value = serde_json::from_slice(&t.upstream.body).unwrap();
    assert_eq!(u["model"], UPSTREAM_MODEL);
    assert_eq!(
        u["messages"],
        json!([{"role": "user", "content": "¡Hola!"}])
    );
    assert_eq!(u["max_tokens"], MAX_OUTPUT_TOKENS);
    assert_eq!(u["temperature"], 0.6);
    assert_eq!(u["stream"], false);
    assert!(u.get("stream_options").is_none());
    assert!(u.get("tools").is_none());
    assert!(t.store, "store defaults to true");
    assert!(!t.upstream.stream);
    // The prompt range is the messages array.
    let range: Value =
        serde_json::from_slice(&t.upstream.body[t.upstream.prompt_range.clone()]).unwrap();
    assert_eq!(range, u["messages"]);
    let mut v = v;
    v["stream"] = json!(true);
    let u = upstream(&v);
    assert_eq!(u["stream_options"]["include_usage"], true);
}

#[test]
fn instructions_and_leading_developer_messages_are_one_system_message() {
    let v = json!({"model": "aguila", "instructions": "Be brief.", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rule 1"}, {"type": "input_text", "text": "Rule 2"}]},
        {"role": "system", "content": "Rule 3"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"role": "developer", "content": "Later rule"},
        {"role": "user", "content": "c"}
    ]});
    assert_eq!(
        msgs(&v),
        vec![
            json!({"role": "system", "content": "Be brief.\n\nRule 1\nRule 2\n\nRule 3"}),
            json!({"role": "user", "content": "a\nb"}),
            json!({"role": "system", "content": "Later rule"}),
            json!({"role": "user", "content": "c"}),
        ]
    );
    // Instructions alone are not a conversation.
    let e = reject(
        &json!({"model": "aguila", "instructions": "x", "input": [{"role": "developer", "content": "y"}]}),
    );
    assert_eq!(param(&e), "input");
}

#[test]
fn images_are_image_url_parts_for_a_vision_model_only() {
    let v = base(json!([{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": PNG, "detail": "auto"},
        {"type": "input_text", "text": "thanks"}]}]));
    assert_eq!(
        msgs(&v)[0]["content"],
        json!([
            {"type": "text", "text": "what is it?"},
            {"type": "image_url", "image_url": {"url": PNG}},
            {"type": "text", "text": "thanks"}
        ])
    );
    let mut small = v.clone();
    small["model"] = json!("colibri");
    let e = reject(&small);
    assert_eq!(param(&e), "input[0].content[1]");
    assert!(
        e.message.contains("does not accept images"),
        "{}",
        e.message
    );
    let e = reject(&base(
        json!([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]),
    ));
    assert_eq!(param(&e), "input[0].content[0].file_id");
    let e = reject(&base(
        json!([{"role": "user", "content": [{"type": "input_file", "file_data": "x"}]}]),
    ));
    assert_eq!(param(&e), "input[0].content[0].type");
    // Internal hosts are refused as the chat format refuses them.
    let e = reject(&base(
        json!([{"role": "user", "content": [{"type": "input_image", "image_url": "http://169.254.169.254/x.png"}]}]),
    ));
    assert_eq!(param(&e), "input[0].content[0].image_url");
}

#[test]
fn a_function_call_round_trip_becomes_tool_calls_and_a_tool_message() {
    let v = base(json!([
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\":\"Lima\"}", "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "lookup", "namespace": "ns", "arguments": ""},
        {"type": "function_call_output", "call_id": "call_a", "output": "18 °C"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "found"}, {"type": "input_image", "image_url": PNG}]}
    ]));
    assert_eq!(
        msgs(&v),
        vec![
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": "Checking.", "reasoning": "Need the tool.", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Lima\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "ns__lookup", "arguments": "{}"}}
            ]}),
            json!({"role": "tool", "tool_call_id": "call_a", "content": "18 °C"}),
            json!({"role": "tool", "tool_call_id": "call_b", "content": "found\n[image]"}),
        ]
    );
    let e = reject(&base(json!([
        {"role": "user", "content": "x"},
        {"type": "function_call_output", "call_id": "call_zz", "output": "?"}
    ])));
    assert_eq!(param(&e), "input[1].call_id");
    assert!(e.message.contains("call_zz"), "{}", e.message);
    let e = reject(&base(
        json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]),
    ));
    assert_eq!(param(&e), "input[0].arguments");
}

#[test]
fn reasoning_is_restored_or_dropped_never_an_error() {
    let with = |item: Value| {
        msgs(&base(
            json!([{"role": "user", "content": "q"}, item, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]),
        ))
    };
    let m = with(json!({"type": "reasoning", "id": "rs_1", "summary": [],
        "encrypted_content": format!("{REASONING_PREFIX}think \"hard\"")}));
    assert_eq!(
        m[1],
        json!({"role": "assistant", "content": "a", "reasoning": "think \"hard\""})
    );
    // Another provider's encrypted content, or a summary only: dropped.
    let m = with(
        json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
        "encrypted_content": "gAAAAB…opaque"}),
    );
    assert_eq!(m[1], json!({"role": "assistant", "content": "a"}));
    // Content wins over encrypted content.
    let m = with(
        json!({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "c"}],
        "encrypted_content": format!("{REASONING_PREFIX}e")}),
    );
    assert_eq!(m[1]["reasoning"], "c");
}

#[test]
fn unsupported_items_and_roles_are_a_400_naming_them() {
    for (item, at, what) in [
        (
            json!({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
            "input[1].type",
            "web_search_call",
        ),
        (
            json!({"type": "item_reference", "id": "msg_1"}),
            "input[1].type",
            "item_reference",
        ),
        (
            json!({"role": "robot", "content": "x"}),
            "input[1].role",
            "robot",
        ),
        (json!({"content": "x"}), "input[1].type", "role"),
    ] {
        let e = reject(&base(json!([{"role": "user", "content": "q"}, item])));
        assert_eq!(param(&e), at);
        assert!(e.message.contains(what), "{}", e.message);
        assert_eq!(e.status(crate::error::ClientFormat::Responses), 400);
    }
    for (v, at) in [
        (json!({"input": "x"}), "model"),
        (json!({"model": "aguila"}), "input"),
        (json!({"model": "aguila", "input": 3}), "input"),
        (
            json!({"model": "aguila", "input": "x", "instructions": 1}),
            "instructions",
        ),
        (
            json!({"model": "aguila", "input": "x", "stream": "yes"}),
            "stream",
        ),
        (
            json!({"model": "aguila", "input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (
            json!({"model": "aguila", "input": "x", "prompt": {"id": "pmpt_1"}}),
            "prompt",
        ),
        (
            json!({"model": "aguila", "input": "x", "temperature": 3}),
            "temperature",
        ),
        (
            json!({"model": "aguila", "input": "x", "top_p": 0}),
            "top_p",
        ),
        (
            json!({"model": "aguila", "input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": "aguila", "input": "x", "truncation": "middle"}),
            "truncation",
        ),
        (
            json!({"model": "aguila", "input": "x", "include": ["everything"]}),
            "include[0]",
        ),
        (
            json!({"model": "aguila", "input": "x", "previous_response_id": 7}),
            "previous_response_id",
        ),
    ] {
        assert_eq!(param(&reject(&v)), at, "{v}");
    }
    let e = reject(&json!({"model": "gpt-9", "input": "x"}));
    assert_eq!(e.kind, ErrorKind::ModelNotFound);
    assert!(e.message.contains("`colibri`"), "{}", e.message);
    for body in [
        &b""[..],
        b"[]",
        b"{\"model\":",
        b"{\"model\":\"a\",\"model\":\"b\"}",
    ] {
        assert!(matches!(
            responses_to_upstream_body(body, config(), "abc")
                .unwrap_err()
                .kind,
            ErrorKind::InvalidRequest { .. }
        ));
    }
}

#[test]
fn max_output_tokens_temperature_and_options() {
    let u = upstream(
        &json!({"model": "aguila", "input": "x", "max_output_tokens": 100000,
        "temperature": 0.2, "top_p": 0.9, "user": "u-1", "parallel_tool_calls": false,
        "metadata": {"k": "v"}, "truncation": "auto", "store": false, "service_tier": "flex",
        "prompt_cache_key": "abc", "background": false, "include": ["reasoning.encrypted_content"]}),
    );
    assert_eq!(u["max_tokens"], 8192);
    assert_eq!(u["temperature"], 0.2);
    assert_eq!(u["top_p"], 0.9);
    assert_eq!(u["user"], "u-1");
    // Without tools, parallel_tool_calls means nothing upstream.
    assert!(u.get("parallel_tool_calls").is_none());
    for unknown in [
        "service_tier",
        "prompt_cache_key",
        "metadata",
        "truncation",
        "background",
        "store",
        "include",
    ] {
        assert!(u.get(unknown).is_none(), "{unknown} leaked upstream");
    }
    let t = translate(
        &json!({"model": "aguila", "input": "x", "store": false, "include": ["reasoning.encrypted_content"]}),
    );
    assert!(!t.store && t.conversation.is_none() && t.encrypted_reasoning);
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    assert_eq!(
        param(&reject(
            &json!({"model": "aguila", "input": "x", "metadata": many})
        )),
        "metadata"
    );
    assert_eq!(
        param(&reject(
            &json!({"model": "aguila", "input": "x", "metadata": {"k": 1}})
        )),
        "metadata.k"
    );
    let long = "x".repeat(513);
    assert_eq!(
        param(&reject(
            &json!({"model": "aguila", "input": "x", "metadata": {"k": long}})
        )),
        "metadata.k"
    );
}

#[test]
fn text_format_becomes_response_format() {
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let u = upstream(&json!({"model": "aguila", "input": "x", "text": {"format":
        {"type": "json_schema", "name": "count", "schema": schema, "strict": true, "description": "A count"}, "verbosity": "low"}}));
    assert_eq!(
        u["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "count", "description": "A count", "schema": schema, "strict": true}})
    );
    let u = upstream(
        &json!({"model": "aguila", "input": "x", "text": {"format": {"type": "json_object"}}}),
    );
    assert_eq!(u["response_format"], json!({"type": "json_object"}));
    let u =
        upstream(&json!({"model": "aguila", "input": "x", "text": {"format": {"type": "text"}}}));
    assert!(u.get("response_format").is_none());
    for (text, at) in [
        (json!({"format": {"type": "xml"}}), "text.format.type"),
        (
            json!({"format": {"type": "json_schema", "schema": {}}}),
            "text.format.name",
        ),
        (
            json!({"format": {"type": "json_schema", "name": "n", "schema": []}}),
            "text.format.schema",
        ),
        (json!({"verbosity": "loud"}), "text.verbosity"),
        (json!("json"), "text"),
    ] {
        assert_eq!(
            param(&reject(
                &json!({"model": "aguila", "input": "x", "text": text})
            )),
            at
        );
    }
}

#[test]
fn reasoning_effort_is_mapped_as_the_chat_formats_is() {
    // colibri has thinking_on / thinking_off switches in the embedded config.
    let u = upstream(
        &json!({"model": "colibri", "input": "x", "reasoning": {"effort": "high", "summary": "auto"}}),
    );
    assert_eq!(u["chat_template_kwargs"]["enable_thinking"], true);
    assert_eq!(u["reasoning_effort"], "high");
    let u = upstream(&json!({"model": "colibri", "input": "x", "reasoning": {"effort": "none"}}));
    assert_eq!(u["chat_template_kwargs"]["enable_thinking"], false);
    assert!(u.get("reasoning_effort").is_none());
    let u = upstream(&json!({"model": "colibri", "input": "x", "reasoning": {"effort": "max"}}));
    assert_eq!(u["chat_template_kwargs"]["enable_thinking"], true);
    assert!(u.get("reasoning_effort").is_none());
    // A summary alone (what Codex sends for an unknown model) switches nothing.
    let u = upstream(&json!({"model": "colibri", "input": "x", "reasoning": {"summary": "auto"}}));
    assert!(u.get("chat_template_kwargs").is_none());
    assert_eq!(
        param(&reject(
            &json!({"model": "colibri", "input": "x", "reasoning": {"effort": "extreme"}})
        )),
        "reasoning.effort"
    );
    assert_eq!(
        param(&reject(
            &json!({"model": "colibri", "input": "x", "reasoning": {"summary": "long"}})
        )),
        "reasoning.summary"
    );
}

#[test]
fn tools_namespaces_and_hosted_tools() {
    let v = json!({"model": "aguila", "input": "x", "parallel_tool_calls": true, "tools": [
        {"type": "function", "name": "exec_command", "description": "Run", "strict": false,
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "defer_loading": true},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Agents", "tools": [
            {"type": "function", "name": "close_agent", "description": "Close one", "parameters": {"type": "object"}},
            {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
        {"type": "web_search", "external_web_access": false},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "computer_use_preview", "display_width": 1, "display_height": 1, "environment": "linux"}
    ]});
    let t = translate(&v);
    let u: Value = serde_json::from_slice(&t.upstream.body).unwrap();
    assert_eq!(
        u["tools"],
        json!([
            {"type": "function", "function": {"name": "exec_command", "description": "Run",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": false}},
            {"type": "function", "function": {"name": "multi_agent_v1__close_agent", "description": "Agents\n\nClose one", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "multi_agent_v1__spawn_agent", "description": "Agents", "parameters": {"type": "object"}}}
        ])
    );
    assert_eq!(u["parallel_tool_calls"], true);
    assert_eq!(
        t.tools[1],
        ToolName {
            upstream: "multi_agent_v1__close_agent".into(),
            name: "close_agent".into(),
            namespace: Some("multi_agent_v1".into())
        }
    );
    // The echo keeps the tools as sent, hosted ones included.
    let echo: Value = serde_json::from_str(&format!(
        "{{\"x\":0{}}}",
        String::from_utf8(t.echo).unwrap()
    ))
    .unwrap();
    assert_eq!(echo["tools"], v["tools"]);
    // Only hosted tools: nothing upstream, and no tool_choice either.
    let u = upstream(
        &json!({"model": "aguila", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": "auto"}),
    );
    assert!(u.get("tools").is_none() && u.get("tool_choice").is_none());
    // A long flattened name is shortened stably, and restored by name.
    let long = "a".repeat(60);
    let t = translate(&json!({"model": "aguila", "input": "x", "tools": [
        {"type": "namespace", "name": "server", "tools": [{"type": "function", "name": long}]}]}));
    assert!(t.tools[0].upstream.len() <= 64);
    assert_eq!(t.tools[0].name, long);
    let e = reject(&json!({"model": "aguila", "input": "x", "tools": [
        {"type": "function", "name": "f"}, {"type": "function", "name": "f"}]}));
    assert_eq!(param(&e), "tools");
    let e = reject(
        &json!({"model": "aguila", "input": "x", "tools": [{"type": "function", "name": "bad name"}]}),
    );
    assert_eq!(param(&e), "tools[0].name");
    let e = reject(
        &json!({"model": "aguila", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": "{}"}]}),
    );
    assert_eq!(param(&e), "tools[0].parameters");
}

#[test]
fn tool_choice_forcing_a_hosted_tool_is_a_400_naming_it() {
    let tools = json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                       {"type": "namespace", "name": "ns", "description": "N", "tools": [{"type": "function", "name": "lookup"}]},
                       {"type": "web_search"}]);
    let with = |choice: Value| json!({"model": "aguila", "input": "x", "tools": tools, "tool_choice": choice});
    let e = reject(&with(json!({"type": "web_search_preview"})));
    assert_eq!(param(&e), "tool_choice.type");
    assert!(e.message.contains("web_search_preview"), "{}", e.message);
    assert_eq!(
        upstream(&with(json!("required")))["tool_choice"],
        "required"
    );
    assert_eq!(upstream(&with(json!("none")))["tool_choice"], "none");
    assert_eq!(
        upstream(&with(
            json!({"type": "function", "name": "lookup", "namespace": "ns"})
        ))["tool_choice"],
        json!({"type": "function", "function": {"name": "ns__lookup"}})
    );
    let e = reject(&with(json!({"type": "function", "name": "nope"})));
    assert_eq!(param(&e), "tool_choice.name");
    // allowed_tools: the upstream sees only the allowed functions.
    let u = upstream(&with(json!({"type": "allowed_tools", "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}, {"type": "web_search"}]})));
    assert_eq!(u["tools"].as_array().unwrap().len(), 1);
    assert_eq!(u["tool_choice"], "required");
    // `required` with only hosted tools names what was dropped.
    let e = reject(
        &json!({"model": "aguila", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"}),
    );
    assert_eq!(param(&e), "tool_choice");
    assert!(e.message.contains("web_search"), "{}", e.message);
}

#[test]
fn the_echo_is_one_line_of_the_requests_parameters() {
    let body = "{\n \"model\": \"aguila\",\n \"input\": \"x\",\n \"instructions\": \"Be\\nbrief\",\n \"tools\": [\n  {\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"type\": \"object\"}}\n ],\n \"metadata\": {\"a b\": \"c d\"},\n \"text\": {\"format\": {\"type\": \"json_object\"}}\n}";
    let t = responses_to_upstream_body(body.as_bytes(), config(), "abc").unwrap();
    let echo = String::from_utf8(t.echo.clone()).unwrap();
    assert!(!echo.contains('\n'), "{echo}");
    let v: Value = serde_json::from_str(&format!("{{\"x\":0{echo}}}")).unwrap();
    assert_eq!(v["instructions"], "Be\nbrief");
    assert_eq!(v["max_output_tokens"], 8192);
    assert_eq!(v["metadata"], json!({"a b": "c d"}));
    assert_eq!(
        v["text"],
        json!({"format": {"type": "json_object"}, "verbosity": "medium"})
    );
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(v["store"], true);
    assert_eq!(v["temperature"], 0.6);
    assert_eq!(v["previous_response_id"], Value::Null);
    assert_eq!(v["reasoning"], json!({"effort": null, "summary": null}));
    assert_eq!(v["truncation"], "disabled");
}

/// What the store holds of a response: its conversation (normalized) and its object.
fn stored_turn(v: &Value, output: Value) -> (String, String) {
    let t = translate(v);
    let items = t.conversation.unwrap().items;
    let response = json!({"id": "resp_abc", "object": "response", "output": output});
    (items, response.to_string())
}

fn continue_from(v: &Value, items: &str, response: &str) -> ResponsesTurn {
    let body = v.to_string();
    let parsed = parse_request(body.as_bytes()).unwrap();
    responses_to_upstream(parsed, Some(Prior { items, response }), config(), "abd").unwrap()
}

#[test]
fn a_stored_conversation_is_rebuilt_before_the_new_input_with_the_same_prefix() {
    let first = json!({"model": "aguila", "instructions": "Be brief.", "input": "Hi, I am Ana."});
    let first_body = translate(&first).upstream.body;
    let output = json!([{"id": "msg_abc_0", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello Ana.", "annotations": [], "logprobs": []}]}]);
    let (items, response) = stored_turn(&first, output);
    let second = json!({"model": "aguila", "instructions": "Be brief.", "input": "What is my name?", "previous_response_id": "resp_abc"});
    let t = continue_from(&second, &items, &response);
    let u: Value = serde_json::from_slice(&t.upstream.body).unwrap();
    assert_eq!(
        u["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi, I am Ana."},
            {"role": "assistant", "content": "Hello Ana."},
            {"role": "user", "content": "What is my name?"}
        ])
    );
    // The earlier turn's messages are a byte prefix of this one's (prefix-affinity routing).
    let earlier = &first_body[translate(&first).upstream.prompt_range];
    let now = &t.upstream.body[t.upstream.prompt_range.clone()];
    assert!(
        now.starts_with(&earlier[..earlier.len() - 1]),
        "{}\n{}",
        String::from_utf8_lossy(earlier),
        String::from_utf8_lossy(now)
    );
    // What is stored next: the earlier items, the output, the new input.
    let conv = t.conversation.unwrap();
    assert_eq!(conv.new_from, 2);
    assert!(
        conv.items.starts_with(&items[..items.len() - 1]),
        "the earlier items are copied byte for byte: {}",
        conv.items
    );
    let all: Value = serde_json::from_str(&conv.items).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 3);
    assert_eq!(all[0]["id"], "msg_abc_in0");
    assert_eq!(all[1]["id"], "msg_abc_0");
    assert_eq!(
        all[2],
        json!({"id": "msg_abd_in0", "type": "message", "role": "user", "status": "completed",
               "content": [{"type": "input_text", "text": "What is my name?"}]})
    );
    // Instructions are not carried over: a new one replaces the old.
    let third = json!({"model": "aguila", "instructions": "Be verbose.", "input": "again", "previous_response_id": "resp_abc"});
    let u: Value =
        serde_json::from_slice(&continue_from(&third, &items, &response).upstream.body).unwrap();
    assert_eq!(
        u["messages"][0],
        json!({"role": "system", "content": "Be verbose."})
    );
}

#[test]
fn a_stored_function_call_can_be_answered_in_the_next_request() {
    let first = json!({"model": "aguila", "input": "weather in Lima?", "tools": [{"type": "function", "name": "get_weather"}]});
    let output = json!([{"id": "fc_abc_0", "type": "function_call", "status": "completed",
        "arguments": "{\"city\":\"Lima\"}", "call_id": "call_9", "name": "get_weather"}]);
    let (items, response) = stored_turn(&first, output);
    let second = json!({"model": "aguila", "previous_response_id": "resp_abc",
        "input": [{"type": "function_call_output", "call_id": "call_9", "output": "18 °C"}]});
    let u: Value =
        serde_json::from_slice(&continue_from(&second, &items, &response).upstream.body).unwrap();
    assert_eq!(u["messages"][1]["tool_calls"][0]["id"], "call_9");
    assert_eq!(
        u["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_9", "content": "18 °C"})
    );
    // A corrupt stored row is the gateway's failure, not the client's.
    let second_body = second.to_string();
    let parsed = parse_request(second_body.as_bytes()).unwrap();
    let e = responses_to_upstream(
        parsed,
        Some(Prior {
            items: "{",
            response: &response,
        }),
        config(),
        "abd",
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Internal);
}
