//! Responses API create requests: any bytes give either a valid upstream request that respects
//! the rules (a JSON body for a configured model, `max_tokens` 1–8192, a prompt with a real
//! turn, `stream` as asked, the stored conversation when `store`, which normalizes to as many
//! items, each with an id, a type and a status), or an error that renders in every client
//! shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::config::{Config, EMBEDDED_DEFAULT};
use quipu_core::error::ClientFormat;
use quipu_core::translate::responses::request::parse_items;
use quipu_core::translate::responses::responses_to_upstream_body;
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::OnceLock;

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config::parse(EMBEDDED_DEFAULT, "fuzz").expect("the embedded config is valid"))
}

fuzz_target!(|data: &[u8]| {
    let c = config();
    match responses_to_upstream_body(data, c, "abc") {
        Ok(t) => {
            let r = &t.upstream;
            let v: Value = serde_json::from_slice(&r.body).expect("the upstream body is JSON");
            let model = v["model"].as_str().expect("model is a string");
            assert!(c.models.iter().any(|m| m.upstream_model == model));
            assert!(v["max_tokens"]
                .as_u64()
                .is_some_and(|n| (1..=8192).contains(&n)));
            assert!(r.max_tokens <= 8192);
            let msgs: Value = serde_json::from_slice(&r.body[r.prompt_range.clone()])
                .expect("prompt range is JSON");
            assert!(
                msgs.as_array().is_some_and(|a| a
                    .iter()
                    .any(|m| m["role"] == "user" || m["role"] == "assistant")),
                "a prompt without a user or assistant message: {msgs}"
            );
            assert_eq!(v["stream"].as_bool(), Some(r.stream));
            // The echo is JSON members; the conversation to store is a JSON array.
            let echo = format!("{{\"x\":0{}}}", String::from_utf8_lossy(&t.echo));
            let _: Value = serde_json::from_str(&echo).expect("the echo is JSON members");
            assert_eq!(t.conversation.is_some(), t.store);
            if let Some(conv) = &t.conversation {
                // What is stored: every item kept, each new object with an id, a type and a
                // status, and it reads back as a conversation.
                let items: Value =
                    serde_json::from_str(&conv.items).expect("the stored conversation is JSON");
                let items = items
                    .as_array()
                    .expect("the stored conversation is an array");
                assert!(items.len() > conv.new_from);
                for item in items.iter().skip(conv.new_from).filter(|i| i.is_object()) {
                    assert!(
                        item["id"].as_str().is_some_and(|id| !id.is_empty()),
                        "{item}"
                    );
                    assert!(
                        item["type"].is_string() && item["status"].is_string(),
                        "{item}"
                    );
                }
                let raw: &RawValue = serde_json::from_str(&conv.items).expect("raw JSON");
                parse_items(raw, "x").expect("the stored conversation reads back as items");
            }
        }
        Err(e) => {
            for f in [
                ClientFormat::Chat,
                ClientFormat::Messages,
                ClientFormat::Responses,
            ] {
                let _: Value =
                    serde_json::from_slice(&e.body(f, "req_fuzz")).expect("errors render as JSON");
                assert!((400..600).contains(&e.status(f)));
            }
        }
    }
});
