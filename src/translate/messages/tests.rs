//! Conformance checklist tests (reference §6), one named test per item.
use super::*;
use crate::config::Config;

#[test]
fn smoke() {
    let config = Config::parse(crate::config::EMBEDDED_DEFAULT, "x").unwrap();
    let body = br##"{"model":"claude-sonnet-4-5","max_tokens":32000,"stream":true,
      "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.330.440; cc_entrypoint=sdk-cli;"},{"type":"text","text":"You are a Claude agent.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Main\nprompt"}],
      "messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>"},{"type":"text","text":"list files"}]},
        {"role":"system","content":"# Environment"},
        {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"abc"},{"type":"text","text":"I'll list."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{ "command" : "ls \"x\"" }}]},
        {"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"a\nb","is_error":false,"cache_control":{"type":"ephemeral"}}]}],
      "tools":[{"name":"Bash","description":"Run","input_schema":{"type":"object","properties":{"command":{"type":"string"}}},"defer_loading":true}],
      "metadata":{"user_id":"{\"device_id\":\"ab\"}"},"thinking":{"type":"adaptive"},"output_config":{"effort":"high"}}"##;
    let r = messages_to_upstream(body, &config).unwrap();
    eprintln!("{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    eprintln!("{}", serde_json::to_string_pretty(&v).unwrap());
}
