//! Chat requests, `messages`: turns, content parts, images, tool-call history.

use super::*;

#[test]
fn a_prompt_needs_a_user_or_assistant_turn_and_parts() {
    for messages in [
        json!([{"role": "system", "content": "be brief"}]),
        json!([{"role": "developer", "content": ""}, {"role": "system", "content": [{"type": "text", "text": "x"}]}]),
    ] {
        let e = err(json!({"model": "colibri", "messages": messages}));
        assert_eq!(
            e.kind,
            ErrorKind::InvalidRequest {
                param: Some("messages".into())
            },
            "{messages}"
        );
        assert!(e.message.contains("user or assistant"), "{}", e.message);
    }
    // An empty parts array is no content (the vendor rejects it too).
    let e = err(json!({"model": "colibri", "messages": [{"role": "user", "content": []}]}));
    assert_eq!(
        e.kind,
        ErrorKind::InvalidRequest {
            param: Some("messages[0].content".into())
        }
    );
    let (_, up) = translate(json!({"model": "colibri", "messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": ""}]}))
    .unwrap();
    assert_eq!(up["messages"][1], json!({"role": "user", "content": ""}));
}

#[test]
fn images() {
    let img = |url: &str| {
        json!({"model": "colibri", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]}]})
    };
    let e = err(img("data:image/png;base64,iVBORw0KGgo="));
    assert!(e.message.contains("does not accept images"), "{e:?}");
    let mut v = img("data:image/png;base64,iVBORw0KGgo=");
    v["model"] = json!("aguila");
    assert!(translate(v.clone()).is_ok());
    v["messages"][0]["content"][1]["image_url"]["url"] = json!("data:image/png;base64,not base64!");
    assert!(err(v.clone()).message.contains("base64"));
    // Image URLs: public hosts only (the shared check in translate::image_url).
    for bad in [
        "http://169.254.169.254/latest",
        "http://2130706433/",
        "http://[::ffff:127.0.0.1]/",
        "https://metadata.google.internal/",
        "https://a@example.com/",
        "file:///etc/passwd",
    ] {
        v["messages"][0]["content"][1]["image_url"]["url"] = json!(bad);
        let e = err(v.clone());
        assert_eq!(
            e.kind,
            ErrorKind::InvalidRequest {
                param: Some("messages[0].content[1].image_url.url".into())
            },
            "{bad}"
        );
    }
    v["messages"][0]["content"][1]["image_url"]["url"] = json!("https://example.com/cat.png");
    assert!(translate(v.clone()).is_ok());
    // forward_any passes internal hosts (the upstream restricts fetching); reject, none.
    let mut c = config();
    c.security.image_urls = ImageUrlPolicy::ForwardAny;
    v["messages"][0]["content"][1]["image_url"]["url"] = json!("http://10.0.0.5/a.png");
    assert!(chat_to_upstream(&serde_json::to_vec(&v).unwrap(), &c).is_ok());
    c.security.image_urls = ImageUrlPolicy::Reject;
    v["messages"][0]["content"][1]["image_url"]["url"] = json!("https://example.com/cat.png");
    let e = chat_to_upstream(&serde_json::to_vec(&v).unwrap(), &c).unwrap_err();
    assert!(e.message.contains("inline"), "{}", e.message);
}

#[test]
fn tool_round_trip_history() {
    let v = json!({"model": "aguila", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Lima\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
        {"role": "user", "content": "thanks"}
    ]});
    let (_, up) = translate(v).unwrap();
    assert_eq!(up["messages"][1]["tool_calls"][0]["id"], "call_1");
    assert_eq!(up["messages"][1]["content"], Value::Null);
    assert_eq!(up["messages"][2]["tool_call_id"], "call_1");
}
