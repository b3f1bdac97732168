//! Chat non-streaming responses: the model spliced to the slug, usage read and re-written with
//! cached tokens, and nothing of the upstream's (its model name, invalid UTF-8) reaching the
//! client.

use super::*;

#[test]
fn non_stream_splices_model_and_reports_usage() {
    let body = br#"{"id":"x","object":"chat.completion","created":1,"model":"Qwen/Qwen3-32B","choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning":"hmm"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":4}}}"#;
    let (out, usage) = upstream_to_chat(body, &ctx(), ReasoningField::Both).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["model"], "aguila");
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "hmm");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(
        usage,
        Usage {
            prompt_tokens: 5,
            cached_tokens: 4,
            completion_tokens: 1
        }
    );
    assert!(upstream_to_chat(b"<html>", &ctx(), ReasoningField::Both).is_err());
    let e = upstream_to_chat(
        br#"{"error":{"message":"bad","code":400}}"#,
        &ctx(),
        ReasoningField::Both,
    )
    .unwrap_err();
    assert_eq!(e.status(ClientFormat::Chat), 400);
}

fn non_stream_usage(usage: &str, extra: &str) -> Value {
    let body = format!(
        r#"{{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{usage}{extra}}}"#
    );
    let (out, _) = upstream_to_chat(body.as_bytes(), &ctx(), ReasoningField::Both).unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn every_usage_object_carries_cached_tokens() {
    // SGLang / llama.cpp: no details at all.
    let v = non_stream_usage(
        r#"{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}"#,
        "",
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens":5,"completion_tokens":1,"total_tokens":6,
               "prompt_tokens_details":{"cached_tokens":0},"cost":0.000009})
    );
    // vLLM without --enable-prompt-tokens-details: `null`.
    let v = non_stream_usage(
        r#"{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":null}"#,
        "",
    );
    assert_eq!(
        v["usage"]["prompt_tokens_details"],
        json!({"cached_tokens":0})
    );
    assert_eq!(v["usage"]["completion_tokens"], 1);
    // An object without the count; and llama.cpp's count in `timings`.
    let v = non_stream_usage(
        r#"{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,"prompt_tokens_details":{"audio_tokens":0}}"#,
        r#","timings":{"cache_n":7}"#,
    );
    assert_eq!(
        v["usage"]["prompt_tokens_details"],
        json!({"cached_tokens":7})
    );
    // An empty object gets its members without a stray comma; no input reported is billed
    // as the estimate (20 tokens at S/ 1.00 per million), and so is the cost.
    let v = non_stream_usage("{ }", "");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens_details":{"cached_tokens":0},"cost":0.00002})
    );
    // A complete object is relayed byte for byte, its cost added at its end.
    let usage = r#"{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":4,"x":1} }"#;
    let body = format!(
        r#"{{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[],"usage":{usage}}}"#
    );
    let (out, _) = upstream_to_chat(body.as_bytes(), &ctx(), ReasoningField::Both).unwrap();
    let relayed = format!("{},\"cost\":0.000006}}", &usage[..usage.len() - 1]);
    assert!(String::from_utf8(out).unwrap().contains(&relayed));
}

#[test]
fn the_cost_is_the_charge_of_the_usage_shown() {
    // The exact decimal, written as a JSON number: 12 in (8 cached) and 3 out at aguila's
    // prices are 4·1.00 + 8·0.25 + 3·4.00 = 18 micro-soles.
    let u = r#"{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":8}}"#;
    let body = format!(
        r#"{{"id":"x","model":"m","choices":[{{"index":0,"message":{{"content":"hi"}},"finish_reason":"stop"}}],"usage":{u}}}"#
    );
    let (out, usage) = upstream_to_chat(body.as_bytes(), &ctx(), ReasoningField::Both).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains(r#""cached_tokens":8},"cost":0.000018}"#),
        "{text}"
    );
    let charged = crate::testing::charging().settle(Some(usage)).charge;
    assert_eq!(charged.to_json_number(), "0.000018");
    // An upstream's own `cost` (its money, not the tenant's) is replaced, not duplicated.
    let v = non_stream_usage(
        r#"{"prompt_tokens":5,"cost":1.5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}"#,
        "",
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens":5,"cost":0.000009,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}})
    );
    // Counts it cannot read: no cost of Quipu's, and not the upstream's either.
    let v = non_stream_usage(r#"{"prompt_tokens":"many","cost":3}"#, "");
    assert_eq!(v["usage"], json!({"prompt_tokens":"many"}));
    // A completion without a usage object is answered without one: nothing to add a cost to.
    let v = non_stream_usage("null", "");
    assert_eq!(v["usage"], Value::Null);
    // A usage above what was reserved shows the capped charge, as the ledger records it.
    let v = non_stream_usage(r#"{"prompt_tokens":1000,"completion_tokens":5000}"#, "");
    assert_eq!(v["usage"]["cost"], json!(0.01));
}

#[test]
fn non_utf8_and_the_upstream_name_never_reach_the_client() {
    // Found by the stream fuzzer: serde_json does not check UTF-8 in members it skips,
    // and a parser's complaint quotes the upstream's bytes.
    let (frames, done, t) = run(
        &[b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"\x97\"},\"finish_reason\":\"stop\"}]}\n\n"],
        false,
        ReasoningField::Both,
    );
    assert_eq!(t.end(), StreamEnd::Failed, "{frames:?} {done}");
    assert!(upstream_to_chat(
        b"{\"x\":\"\x97\",\"choices\":[]}",
        &ctx(),
        ReasoningField::Both
    )
    .is_err());
    let (frames, _, t) = run(
        &[b"data: {\"choices\":\"Qwen/Qwen3-32B\"}\n\n"],
        false,
        ReasoningField::Both,
    );
    assert!(t.error().is_some());
    assert!(
        !format!("{frames:?}").contains("Qwen/Qwen3-32B"),
        "{frames:?}"
    );
    let e = upstream_to_chat(
        br#"{"choices":"Qwen/Qwen3-32B"}"#,
        &ctx(),
        ReasoningField::Both,
    )
    .unwrap_err();
    assert!(!e.message.contains("Qwen/Qwen3-32B"), "{}", e.message);
}
