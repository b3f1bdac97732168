//! What the Codex CLI (0.169.0, the version `scripts/deps-codex.sh` pins) sends, as recorded
//! from its traffic: its two request shapes translate, and what it needs back is there.

use super::*;

fn codex_tools() -> Value {
    json!([
        {"type": "function", "name": "exec_command", "description": "Runs a command in a PTY.", "strict": false,
         "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string"}, "workdir": {"type": "string"}, "shell": {"type": "string"},
            "tty": {"type": "boolean"}, "login": {"type": "boolean"}, "yield_time_ms": {"type": "number"}},
            "required": ["cmd"], "additionalProperties": false}},
        {"type": "function", "name": "write_stdin", "description": "Writes to a session.", "strict": false,
         "parameters": {"type": "object", "properties": {"session_id": {"type": "number"}}}},
        {"type": "function", "name": "view_image", "description": "View an image.", "strict": false,
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
            {"type": "function", "name": "close_agent", "strict": false, "parameters": {"type": "object"}},
            {"type": "function", "name": "spawn_agent", "strict": false, "parameters": {"type": "object"}}]},
        {"type": "web_search", "external_web_access": false}
    ])
}

fn turn1() -> Value {
    json!({
        "model": "aguila", "stream": true,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex, a coding agent…"}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<skills_instructions>…</skills_instructions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/tmp/w</cwd>\n</environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]}
        ],
        "tools": codex_tools(),
        "tool_choice": "auto", "parallel_tool_calls": true,
        "reasoning": {"summary": "auto"},
        "store": false, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "client_metadata": {"session_id": "0199a1b2"}
    })
}

#[test]
fn turn_one_developer_messages_are_the_system_prompt_and_web_search_is_dropped() {
    let t = translate(&turn1());
    let u: Value = serde_json::from_slice(&t.upstream.body).unwrap();
    let m = u["messages"].as_array().unwrap();
    assert_eq!(m[0]["role"], "system");
    assert_eq!(
        m[0]["content"],
        "You are Codex, a coding agent…\n\n<skills_instructions>…</skills_instructions>"
    );
    assert_eq!(m[1]["role"], "user");
    assert_eq!(m[2], json!({"role": "user", "content": "list the files"}));
    let names: Vec<&str> = u["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "exec_command",
            "write_stdin",
            "view_image",
            "multi_agent_v1__close_agent",
            "multi_agent_v1__spawn_agent"
        ]
    );
    assert_eq!(u["tool_choice"], "auto");
    assert_eq!(u["stream"], true);
    assert!(t.upstream.stream);
    assert!(
        !t.store && t.conversation.is_none(),
        "Codex sends store:false"
    );
    assert!(t.encrypted_reasoning);
    for leaked in [
        "prompt_cache_key",
        "client_metadata",
        "include",
        "reasoning",
    ] {
        assert!(u.get(leaked).is_none(), "{leaked} leaked upstream");
    }
}

#[test]
fn turn_two_echoes_the_call_its_output_and_the_reasoning_back() {
    let mut v = turn1();
    let input = v["input"].as_array_mut().unwrap();
    input.push(json!({"type": "reasoning", "id": "rs_abc_0", "summary": [],
        "encrypted_content": format!("{REASONING_PREFIX}I should list the directory.")}));
    input.push(json!({"type": "function_call", "id": "fc_abc_1", "status": "completed", "name": "exec_command",
        "arguments": "{\"cmd\": \"ls\"}", "call_id": "call_1"}));
    input.push(json!({"type": "function_call_output", "id": "fco_1", "call_id": "call_1",
        "output": "Chunk ID: 49eb02\nWall time: 0.0000 seconds\nProcess exited with code 0\nOriginal token count: 4\nOutput:\nREADME.md\n"}));
    input.push(
        json!({"type": "function_call", "name": "close_agent", "namespace": "multi_agent_v1",
        "arguments": "{}", "call_id": "call_2"}),
    );
    input.push(json!({"type": "function_call_output", "call_id": "call_2", "output": "closed"}));
    let m = msgs(&v);
    assert_eq!(
        m[3],
        json!({"role": "assistant", "content": null, "reasoning": "I should list the directory.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\": \"ls\"}"}}]})
    );
    assert_eq!(m[4]["role"], "tool");
    assert_eq!(m[4]["tool_call_id"], "call_1");
    assert!(m[4]["content"].as_str().unwrap().contains("README.md"));
    assert_eq!(
        m[5]["tool_calls"][0]["function"]["name"],
        "multi_agent_v1__close_agent"
    );
    assert_eq!(
        m[6],
        json!({"role": "tool", "tool_call_id": "call_2", "content": "closed"})
    );
}

#[test]
fn a_namespaced_call_comes_back_with_its_name_and_namespace() {
    let t = translate(&turn1());
    let ctx = ctx_of(&t);
    let (r, _) = nonstream_with(
        &completion(
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_7", "type": "function", "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}},
                {"id": "call_8", "type": "function", "function": {"name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"}}]}),
            "tool_calls",
            json!({"prompt_tokens": 900, "completion_tokens": 12}),
        ),
        &ctx,
    )
    .unwrap();
    assert_eq!(r["output"][0]["name"], "spawn_agent");
    assert_eq!(r["output"][0]["namespace"], "multi_agent_v1");
    assert_eq!(r["output"][0]["call_id"], "call_7");
    assert_eq!(r["output"][1]["name"], "exec_command");
    assert!(r["output"][1].get("namespace").is_none());
    // What Codex reads to finish the turn.
    assert_eq!(r["status"], "completed");
    assert_eq!(r["usage"]["input_tokens"], 900);
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(r["usage"]["output_tokens"], 12);
    assert_eq!(r["store"], false);
    assert_eq!(r["tools"], codex_tools());
}
