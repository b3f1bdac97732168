//! Requests, user content blocks: images (base64, URL, inside tool results),
//! `tool_result` forms and their place before user text, text documents.

use super::*;

#[test]
fn c05_images_base64_url_and_in_tool_result() {
    for media in ["image/jpeg", "image/png", "image/gif", "image/webp"] {
        let m = msgs(&base(json!([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, image(media)]}])));
        assert_eq!(
            m[0]["content"],
            json!([{"type": "text", "text": "What is this?"},
                   {"type": "image_url", "image_url": {"url": format!("data:{media};base64,{PNG}")}}])
        );
    }
    let url = json!([{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]);
    assert_eq!(
        msgs(&base(url.clone()))[0]["content"],
        json!([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    );
    let e = messages_to_upstream(base(url).to_string().as_bytes(), &config_rejecting_urls())
        .unwrap_err();
    assert_eq!(param(&e), "messages[0].content[0].source.type");
    // Only public hosts: the upstream fetches the URL from inside its network (SSRF). The
    // cases are in translate::image_url; here, that both places in a request are guarded.
    let url_image = |url: &str| json!({"type": "image", "source": {"type": "url", "url": url}});
    for bad in [
        "ftp://example.com/a.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://0x7f.1/",
        "https://user@example.com/a.png",
        "http://localhost:8000/",
    ] {
        let e = reject(&base(
            json!([{"role": "user", "content": [url_image(bad)]}]),
        ));
        assert_eq!(param(&e), "messages[0].content[0].source.url", "{bad}");
        assert!(
            e.message.starts_with("messages[0].content[0].source.url: "),
            "{}",
            e.message
        );
        let e = reject(&base(json!([
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [url_image(bad)]}]}
        ])));
        assert_eq!(
            param(&e),
            "messages[2].content[0].content[0].source.url",
            "{bad}"
        );
    }
    let m = msgs(&base(
        json!([{"role": "user", "content": [url_image("http://example.com/a.png")]}]),
    ));
    assert_eq!(
        m[0]["content"][0]["image_url"]["url"],
        "http://example.com/a.png"
    );
    // Inside a tool_result: text in the tool message, the image in a following user message.
    let m = msgs(&base(json!([
        {"role": "user", "content": "screenshot please"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "Here:"}, image("image/png")]},
            {"type": "text", "text": "Describe it."}]}
    ])));
    assert_eq!(
        m[2],
        json!({"role": "tool", "tool_call_id": "t1", "content": "Here:\n[image]"})
    );
    assert_eq!(
        m[3],
        json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG}")}}]})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "Describe it."}));
    // Rejections: bad base64, bad media type, a model without vision.
    let bad = |source: Value| {
        reject(&base(
            json!([{"role": "user", "content": [{"type": "image", "source": source}]}]),
        ))
    };
    let e = bad(json!({"type": "base64", "media_type": "image/png", "data": "not base64!"}));
    assert_eq!(param(&e), "messages[0].content[0].source.data");
    let e = bad(json!({"type": "base64", "media_type": "image/bmp", "data": PNG}));
    assert_eq!(param(&e), "messages[0].content[0].source.media_type");
    let e = bad(json!({"type": "file", "file_id": "f"}));
    assert_eq!(param(&e), "messages[0].content[0].source.type");
    let mut v = base(json!([{"role": "user", "content": [image("image/png")]}]));
    v["model"] = json!("colibri");
    let e = reject(&v);
    assert_eq!(e.status(ClientFormat::Messages), 400);
    assert!(
        e.message.contains("does not accept images"),
        "{}",
        e.message
    );
    assert!(e.message.contains("`aguila`"), "{}", e.message);
    let mut v = base(json!([
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image("image/png")]}]}
    ]));
    v["model"] = json!("colibri");
    assert_eq!(param(&reject(&v)), "messages[2].content[0].content[0]");
}

#[test]
fn c06_tool_result_forms() {
    let tool = |result: Value| msgs(&with_tool_use(result))[2].clone();
    assert_eq!(
        tool(
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb", "is_error": false, "cache_control": {"type": "ephemeral"}})
        ),
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a\nb"})
    );
    assert_eq!(
        tool(
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]})
        )["content"],
        "one\ntwo"
    );
    assert_eq!(
        tool(json!({"type": "tool_result", "tool_use_id": "toolu_1"}))["content"],
        ""
    );
    assert_eq!(
        tool(
            json!({"content": "Exit code 2\nls: cannot access", "is_error": true, "tool_use_id": "toolu_1", "type": "tool_result"})
        )["content"],
        "[tool error] Exit code 2\nls: cannot access"
    );
    assert_eq!(
        tool(json!({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true}))["content"],
        "[tool error] "
    );
    // Claude Code's ToolSearch answers with tool_reference blocks.
    assert_eq!(
        tool(
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]})
        )["content"],
        "[tool_reference] WebFetch"
    );
    // A tool_result answering no tool_use of the previous assistant turn.
    let e = reject(&with_tool_use(
        json!({"type": "tool_result", "tool_use_id": "toolu_404", "content": "x"}),
    ));
    assert_eq!(param(&e), "messages[2].content[0].tool_use_id");
    assert!(e
        .message
        .contains("unexpected `tool_use_id` found in `tool_result` blocks: toolu_404"));
    let e = reject(&base(json!([
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}
    ])));
    assert_eq!(param(&e), "messages[0].content[0].tool_use_id");
    let e = reject(&with_tool_use(
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes"}),
    ));
    assert_eq!(param(&e), "messages[2].content[0].is_error");
    let e = reject(&with_tool_use(
        json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_use", "id": "x", "name": "y", "input": {}}]}),
    ));
    assert_eq!(param(&e), "messages[2].content[0].content[0].type");
}

#[test]
fn c07_tool_results_go_before_user_text() {
    let conv = |last: Value| {
        base(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "a", "name": "f", "input": {}},
                {"type": "tool_use", "id": "b", "name": "f", "input": {}}]},
            {"role": "user", "content": last}
        ]))
    };
    let m = msgs(&conv(json!([
        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
        {"type": "tool_result", "tool_use_id": "b", "content": "B"},
        {"type": "text", "text": "continue"}
    ])));
    assert_eq!(m.len(), 5);
    assert_eq!(
        m[2],
        json!({"role": "tool", "tool_call_id": "a", "content": "A"})
    );
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "b", "content": "B"})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "continue"}));
    // Text first: tools still come first (chat templates need tool messages right after
    // tool_calls), then the text.
    let m2 = msgs(&conv(json!([
        {"type": "text", "text": "continue"},
        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
        {"type": "tool_result", "tool_use_id": "b", "content": "B"}
    ])));
    assert_eq!(m2, m);
}

#[test]
fn documents_with_text_sources_become_text() {
    let m = msgs(&base(json!([{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Doc body"}, "title": "t", "citations": {"enabled": true}},
        {"type": "text", "text": "Summarise."}]}])));
    assert_eq!(
        m[0]["content"],
        json!([{"type": "text", "text": "Doc body"}, {"type": "text", "text": "Summarise."}])
    );
    let e = reject(&base(json!([{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}])));
    assert_eq!(param(&e), "messages[0].content[0].source.type");
}
