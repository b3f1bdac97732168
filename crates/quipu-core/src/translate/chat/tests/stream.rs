//! Chat streams: relayed with the slug, usage shown only when asked (and carrying cached
//! tokens), reasoning under the configured field names, identical at every split, and
//! upstream errors, aborts and broken streams ending the stream loudly.

use super::*;

#[test]
fn relays_with_slug_and_without_unrequested_usage() {
    let (frames, done, t) = run(&[STREAM.as_bytes()], false, ReasoningField::Both);
    assert!(done);
    assert_eq!(frames.len(), 4, "usage-only chunk dropped");
    for f in &frames {
        assert_eq!(f["model"], "aguila");
        assert_eq!(f["usage"], Value::Null);
    }
    assert_eq!(frames[1]["choices"][0]["delta"]["reasoning"], "think");
    assert_eq!(
        frames[1]["choices"][0]["delta"]["reasoning_content"],
        "think"
    );
    assert_eq!(frames[2]["choices"][0]["delta"]["content"], "Hola ñandú 🦙");
    assert_eq!(t.end(), StreamEnd::Complete);
    assert_eq!(
        t.usage(),
        Usage {
            prompt_tokens: 12,
            cached_tokens: 8,
            completion_tokens: 3
        }
    );
    // The upstream's model name (in every upstream chunk) never reaches the client.
    assert!(STREAM.contains("Qwen/Qwen3-32B"));
    for f in &frames {
        assert!(!f.to_string().contains("Qwen"), "{f}");
    }
}

#[test]
fn usage_chunk_kept_when_asked() {
    let (frames, _, _) = run(&[STREAM.as_bytes()], true, ReasoningField::Reasoning);
    assert_eq!(frames.len(), 5);
    assert_eq!(frames[4]["choices"], json!([]));
    assert_eq!(
        frames[4]["usage"]["prompt_tokens_details"]["cached_tokens"],
        8
    );
    assert!(frames[1]["choices"][0]["delta"]
        .get("reasoning_content")
        .is_none());
}

#[test]
fn a_usage_chunk_without_choices_gets_an_empty_list() {
    let with = "\"choices\":[],";
    for (without, what) in [
        (STREAM.replace(with, "\"choices\":null,"), "null"),
        (STREAM.replace(with, ""), "missing"),
        (STREAM.replace(with, "\"choices\" : null ,"), "null, spaced"),
    ] {
        assert_ne!(without, STREAM, "{what}");
        let (frames, done, t) = run(&[without.as_bytes()], true, ReasoningField::Both);
        assert!(done, "{what}");
        assert_eq!(frames.len(), 5, "{what}");
        assert_eq!(frames[4]["choices"], json!([]), "{what}");
        assert_eq!(frames[4]["model"], "aguila", "{what}");
        assert_eq!(frames[4]["usage"]["completion_tokens"], 3, "{what}");
        assert_eq!(t.usage().cached_tokens, 8, "{what}");
    }
    // A chunk of nothing at all.
    let (frames, _, _) = run(
        &[b"data: {}\n\ndata: { }\n\n", STREAM.as_bytes()],
        true,
        ReasoningField::Both,
    );
    assert_eq!(frames[0], json!({"choices": []}));
    assert_eq!(frames[1], json!({"choices": []}));
}

#[test]
fn same_output_at_every_split() {
    let bytes = STREAM.as_bytes();
    let whole = run(&[bytes], false, ReasoningField::Both).0;
    for i in 0..=bytes.len() {
        let (frames, done, _) = run(&[&bytes[..i], &bytes[i..]], false, ReasoningField::Both);
        assert!(done, "split@{i}");
        assert_eq!(frames, whole, "split@{i}");
    }
}

#[test]
fn reasoning_content_renamed_when_configured() {
    let s = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"r\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let (frames, _, _) = run(&[s.as_bytes()], false, ReasoningField::Reasoning);
    assert_eq!(frames[0]["choices"][0]["delta"], json!({"reasoning": "r"}));
}

/// Each key of an object, in order (serde_json's `Value` would hide a duplicate).
fn keys(json: &str) -> Vec<String> {
    struct Keys(Vec<String>);
    impl<'de> serde::de::Visitor<'de> for &mut Keys {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some((k, _)) = map.next_entry::<String, serde::de::IgnoredAny>()? {
                self.0.push(k);
            }
            Ok(())
        }
    }
    let mut k = Keys(Vec::new());
    serde::Deserializer::deserialize_map(&mut serde_json::Deserializer::from_str(json), &mut k)
        .unwrap();
    k.0
}

/// The raw text of `choices[0].<member>`.
fn raw_member<'a>(json: &'a str, member: &str) -> &'a str {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        choices: Vec<std::collections::HashMap<String, &'a RawValue>>,
    }
    let t: Top = serde_json::from_str(json).unwrap();
    t.choices[0][member].get()
}

#[test]
fn reasoning_twins_are_filled_not_duplicated() {
    let delta_out = |delta: &str, field: ReasoningField| {
        let s = format!(
            "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
        );
        let mut t = ChatStream::new(ctx(), false, field);
        let text = String::from_utf8(replay(&mut t, &[s.as_bytes()]).out).unwrap();
        let frame = text
            .split("\n\n")
            .next()
            .unwrap()
            .strip_prefix("data: ")
            .unwrap();
        let v: Value = serde_json::from_str(frame).unwrap();
        (
            keys(raw_member(frame, "delta")),
            v["choices"][0]["delta"].clone(),
        )
    };
    use ReasoningField::*;
    for (delta, field, want_keys, want) in [
        // SGLang-style null twin, vLLM text: fill the twin (this used to add a second key).
        (
            r#"{"reasoning":"r","reasoning_content":null}"#,
            Both,
            vec!["reasoning", "reasoning_content"],
            json!({"reasoning": "r", "reasoning_content": "r"}),
        ),
        (
            r#"{"reasoning_content":null,"reasoning":"r"}"#,
            Both,
            vec!["reasoning_content", "reasoning"],
            json!({"reasoning": "r", "reasoning_content": "r"}),
        ),
        (
            r#"{"reasoning":"","reasoning_content":"r"}"#,
            Both,
            vec!["reasoning", "reasoning_content"],
            json!({"reasoning": "r", "reasoning_content": "r"}),
        ),
        (
            r#"{"reasoning":null,"reasoning_content":"r"}"#,
            Reasoning,
            vec!["reasoning"],
            json!({"reasoning": "r"}),
        ),
        (
            r#"{"reasoning_content":null,"reasoning":"r"}"#,
            ReasoningContent,
            vec!["reasoning_content"],
            json!({"reasoning_content": "r"}),
        ),
        // Absent twins are added or renamed, as before.
        (
            r#"{"reasoning":"r"}"#,
            Both,
            vec!["reasoning", "reasoning_content"],
            json!({"reasoning": "r", "reasoning_content": "r"}),
        ),
        (
            r#"{"reasoning_content":"r","content":null}"#,
            Reasoning,
            vec!["reasoning", "content"],
            json!({"reasoning": "r", "content": null}),
        ),
        (
            r#"{"reasoning":"r"}"#,
            ReasoningContent,
            vec!["reasoning_content"],
            json!({"reasoning_content": "r"}),
        ),
        (
            r#"{"reasoning":"r","reasoning_content":"s"}"#,
            Reasoning,
            vec!["reasoning"],
            json!({"reasoning": "r"}),
        ),
        // Nothing to expose: left alone.
        (
            r#"{"content":"c","reasoning_content":null}"#,
            Both,
            vec!["content", "reasoning_content"],
            json!({"content": "c", "reasoning_content": null}),
        ),
    ] {
        let (k, v) = delta_out(delta, field);
        assert_eq!(k, want_keys, "{delta} {field:?}");
        assert_eq!(v, want, "{delta} {field:?}");
    }
    // The same edits apply to a non-streaming message.
    let body = br#"{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a","reasoning":"r","reasoning_content":null},"finish_reason":"stop"}]}"#;
    let (out, _) = upstream_to_chat(body, &ctx(), ReasoningField::Both).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        keys(raw_member(&text, "message")),
        ["role", "content", "reasoning", "reasoning_content"],
        "{text}"
    );
    assert_eq!(text.matches("\"reasoning_content\"").count(), 1, "{text}");
}

#[test]
fn multi_line_data_is_relayed_on_one_line() {
    // Found by the chat_stream fuzz target once it spread chunks over several data lines.
    let s = "data: {\"model\": \"m\",\r\ndata:  \"choices\": [{\"index\": 0, \"delta\": {\"content\": \"a\\nb\"},\r\ndata: \"finish_reason\": \"stop\"}]}\r\n\r\ndata: [DONE]\r\n\r\n";
    let mut t = ChatStream::new(ctx(), false, ReasoningField::Both);
    let text = String::from_utf8(replay(&mut t, &[s.as_bytes()]).out).unwrap();
    let frames: Vec<&str> = text.split("\n\n").filter(|f| !f.is_empty()).collect();
    assert_eq!(frames.len(), 2, "{text:?}");
    let v: Value = serde_json::from_str(frames[0].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["choices"][0]["delta"]["content"], "a\nb");
    assert_eq!(v["model"], "aguila");
    assert_eq!(frames[1], "data: [DONE]");
}

#[test]
fn absurd_upstream_usage_saturates() {
    let s = format!(
        "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"a\"}}}}],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{}}}}}\n\ndata: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"b\"}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n",
        u64::MAX
    );
    let (_, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
    assert!(done);
    assert_eq!(t.usage().completion_tokens, u64::MAX);
}

#[test]
fn abort_is_relayed_and_the_usage_after_it_is_read() {
    // The chat client sees the upstream's finish_reason as is; the usage chunk that follows
    // is metered (the messages translator had to learn this, see c54 there).
    let s = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Half\"},\"finish_reason\":\"abort\"}]}\n\ndata: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":15,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
    let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
    assert!(done);
    assert_eq!(frames[0]["choices"][0]["finish_reason"], "abort");
    assert_eq!(t.usage().prompt_tokens, 15);
    assert_eq!(t.usage().completion_tokens, 3);
}

#[test]
fn midstream_upstream_error_is_rerendered() {
    let s = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n";
    let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
    assert!(done);
    assert_eq!(frames[1]["error"]["type"], "server_error");
    assert_eq!(frames[1]["error"]["code"], "upstream_error");
    assert_eq!(t.end(), StreamEnd::Failed);
    assert_eq!(t.usage().completion_tokens, 1);
}

#[test]
fn truncated_or_garbage_streams_fail_loudly() {
    let s = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
    let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
    assert!(done);
    assert!(frames[1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("ended"));
    assert_eq!(t.error().unwrap().kind, ErrorKind::Upstream);
    let s = "data: {not json\n\n";
    let (frames, done, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
    assert!(done);
    assert!(frames[0].get("error").is_some());
    assert_eq!(t.end(), StreamEnd::Failed);
}

#[test]
fn the_stream_usage_chunk_carries_cached_tokens() {
    let chunk = b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\ndata: [DONE]\n\n";
    let (frames, done, _) = run(&[chunk], true, ReasoningField::Both);
    assert!(done);
    assert_eq!(
        frames.last().unwrap()["usage"],
        json!({"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,
               "prompt_tokens_details":{"cached_tokens":0},"cost":0.000007})
    );
}

/// A chunk with `choices` (`content` a fragment, `finish` a finish reason or none).
fn content_chunk(content: &str, finish: Option<&str>) -> String {
    let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
    format!(
        "data: {{\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// A usage-only chunk.
fn usage_chunk(prompt: u64, completion: u64) -> String {
    format!(
        "data: {{\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}\n\n"
    )
}

#[test]
fn the_usage_chunk_after_the_finish_carries_the_cost_the_stream_bills() {
    let terms = crate::testing::charging();
    // Interim usage before the finish (no known server sends one): relayed without a cost.
    let s = [
        usage_chunk(3, 0),
        content_chunk("a", None),
        content_chunk("b", Some("stop")),
        usage_chunk(3, 2),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let (frames, done, t) = run(&[s.as_bytes()], true, ReasoningField::Both);
    assert!(done);
    assert_eq!(frames[0]["usage"].get("cost"), None);
    // Nor with the upstream's own (its money is not the tenant's).
    let interim = usage_chunk(3, 0).replace(
        "\"completion_tokens\":0",
        "\"completion_tokens\":0,\"cost\":2",
    );
    let (relayed, _, _) = run(&[interim.as_bytes()], true, ReasoningField::Both);
    assert_eq!(relayed[0]["usage"].get("cost"), None, "{relayed:?}");
    // Alone in its object, with the cached count to add: replaced by it, still valid JSON.
    let alone = "data: {\"choices\":[],\"usage\":{\"cost\":2}}\n\n";
    let (relayed, _, _) = run(&[alone.as_bytes()], true, ReasoningField::Both);
    assert_eq!(
        relayed[0]["usage"],
        json!({"prompt_tokens_details":{"cached_tokens":0}}),
        "{relayed:?}"
    );
    let shown = &frames[3]["usage"]["cost"];
    assert_eq!(shown, &json!(0.000011));
    assert_eq!(terms.cost(t.usage()), Pen::from_picos(11_000_000));
    // Output after the final report (a broken upstream) is relayed, but the bill stays the
    // one shown; a later report is shown with its cost and billed.
    let s = [
        content_chunk("a", Some("stop")),
        usage_chunk(3, 1),
        content_chunk("late", None),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let (frames, _, t) = run(&[s.as_bytes()], true, ReasoningField::Both);
    assert_eq!(frames[1]["usage"]["cost"], json!(0.000007));
    assert_eq!(t.usage().completion_tokens, 1);
    // So does a stream that then fails, or ends without `[DONE]`.
    for end in ["data: {not json\n\n", ""] {
        let s = [
            content_chunk("a", Some("stop")),
            usage_chunk(3, 1),
            content_chunk("late", None),
            end.to_owned(),
        ]
        .concat();
        let (frames, _, t) = run(&[s.as_bytes()], true, ReasoningField::Both);
        assert_eq!(frames[1]["usage"]["cost"], json!(0.000007));
        assert_eq!(t.usage().completion_tokens, 1, "{end:?}: {frames:?}");
    }
    let s = [
        content_chunk("a", Some("stop")),
        usage_chunk(3, 1),
        usage_chunk(3, 4),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let (frames, _, t) = run(&[s.as_bytes()], true, ReasoningField::Both);
    assert_eq!(frames[2]["usage"]["cost"], json!(0.000019));
    assert_eq!(t.usage().completion_tokens, 4);
    // Not asked for: no usage chunk, no cost, and the metering goes on as before.
    let s = [
        content_chunk("a", Some("stop")),
        usage_chunk(3, 1),
        content_chunk("late", None),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let (frames, _, t) = run(&[s.as_bytes()], false, ReasoningField::Both);
    assert!(!format!("{frames:?}").contains("cost"));
    assert_eq!(t.usage().completion_tokens, 2);
}
