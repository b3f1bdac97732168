//! Claude Code: count-tokens through the upstream tokenizer, and a next turn
//! whose upstream prompt extends the previous one byte for byte (the prefix cache holds).

use super::*;

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
