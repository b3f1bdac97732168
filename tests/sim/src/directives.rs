//! Behaviour directives: `[[sim: key=value flag …]]` in the text of the conversation's final
//! non-system message, when it is a user message (so a tool's result ends a tool loop).
//!
//! Values contain no spaces; `_` stands for a space in `reply=`.

use serde_json::Value;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Directives {
    /// Output tokens (default 20).
    pub tokens: Option<usize>,
    /// Exact reply text.
    pub reply: Option<String>,
    /// Reasoning tokens before the answer.
    pub reasoning: usize,
    /// Tool to call, how many parallel calls, their arguments, arguments in one lump.
    pub tool: Option<String>,
    pub tools: usize,
    pub tool_args: Option<String>,
    pub args_lump: bool,
    /// End with finish_reason stop and this matched stop string.
    pub stop: Option<String>,
    /// Answer the whole request with this HTTP error status.
    pub status: Option<u16>,
    /// A context-length 400.
    pub overflow: bool,
    pub fail_after: Option<usize>,
    pub reset_after: Option<usize>,
    pub garbage_after: Option<usize>,
    pub abort: bool,
    pub no_usage: bool,
    pub delay_ms: Option<u64>,
    pub prefill_ms: u64,
    pub ttfb_ms: u64,
    /// Non-stream: send the response header at once and the body this much later (a server
    /// that commits early, so a client's header and body waits are separate).
    pub body_ms: u64,
    pub split: bool,
    /// Pad every generated word to this many bytes (big chunks, to fill socket buffers).
    pub word_bytes: usize,
}

/// The text of the final message if it is a user message. System messages after it are
/// skipped (Claude Code places one after the first user turn).
fn final_user_text(messages: &[Value]) -> String {
    let Some(last) = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) != Some("system"))
    else {
        return String::new();
    };
    if last.get("role").and_then(Value::as_str) != Some("user") {
        return String::new();
    }
    match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

pub fn parse(messages: &[Value]) -> Directives {
    let text = final_user_text(messages);
    let mut d = Directives {
        tools: 1,
        ..Directives::default()
    };
    let mut rest = text.as_str();
    while let Some(start) = rest.find("[[sim:") {
        let after = &rest[start + 6..];
        let Some(end) = after.find("]]") else { break };
        for item in after[..end].split_whitespace() {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            let num = || v.parse::<usize>().ok();
            match k {
                "tokens" => d.tokens = num(),
                "reply" => d.reply = Some(v.replace('_', " ")),
                "reasoning" => d.reasoning = num().unwrap_or(0),
                "tool" => d.tool = Some(v.to_owned()),
                "tools" => d.tools = num().unwrap_or(1).max(1),
                "tool_args" => d.tool_args = Some(v.to_owned()),
                "args" => d.args_lump = v == "lump",
                "stop" => d.stop = Some(v.to_owned()),
                "status" => d.status = v.parse().ok(),
                "overflow" => d.overflow = true,
                "fail_after" => d.fail_after = num(),
                "reset_after" => d.reset_after = num(),
                "garbage_after" => d.garbage_after = num(),
                "abort" => d.abort = true,
                "no_usage" => d.no_usage = true,
                "delay_ms" => d.delay_ms = v.parse().ok(),
                "prefill_ms" => d.prefill_ms = v.parse().unwrap_or(0),
                "ttfb_ms" => d.ttfb_ms = v.parse().unwrap_or(0),
                "body_ms" => d.body_ms = v.parse().unwrap_or(0),
                "split" => d.split = true,
                "word_bytes" => d.word_bytes = num().unwrap_or(0),
                _ => {}
            }
        }
        rest = &after[end + 2..];
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_from_the_final_user_message_only() {
        let m = vec![
            json!({"role":"user","content":"hola [[sim: tokens=3 tool=get_weather reply=a_b split]]"}),
        ];
        let d = parse(&m);
        assert_eq!(d.tokens, Some(3));
        assert_eq!(d.tool.as_deref(), Some("get_weather"));
        assert_eq!(d.reply.as_deref(), Some("a b"));
        assert!(d.split);
        let m = vec![
            json!({"role":"user","content":"[[sim: tool=x]]"}),
            json!({"role":"tool","content":"result","tool_call_id":"c"}),
        ];
        assert_eq!(parse(&m).tool, None);
        let m =
            vec![json!({"role":"user","content":[{"type":"text","text":"[[sim: status=503]]"}]})];
        assert_eq!(parse(&m).status, Some(503));
    }
}
