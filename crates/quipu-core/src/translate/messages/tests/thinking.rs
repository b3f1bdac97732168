//! Requests, reasoning: thinking history in assistant turns, and the
//! `thinking` switch with the sampling fields around it.

use super::*;

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
