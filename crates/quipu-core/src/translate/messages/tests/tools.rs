//! Requests, tools: parallel `tool_use` history, `tool_choice`, long tool
//! names shortened and restored, schemas passed through, which turn a `tool_result` answers.

use super::*;

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
