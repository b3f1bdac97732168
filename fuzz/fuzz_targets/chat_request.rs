//! Chat-format requests: any bytes give either a valid upstream request that respects the
//! rules, or an error that renders in both client shapes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::config::{Config, EMBEDDED_DEFAULT};
use quipu_core::error::ClientFormat;
use quipu_core::translate::chat::chat_to_upstream;
use serde_json::Value;
use std::sync::OnceLock;

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config::parse(EMBEDDED_DEFAULT, "fuzz").expect("the embedded config is valid"))
}

fuzz_target!(|data: &[u8]| {
    let c = config();
    match chat_to_upstream(data, c) {
        Ok(r) => {
            let v: Value = serde_json::from_slice(&r.body).expect("the upstream body is JSON");
            let model = v["model"].as_str().expect("model is a string");
            assert!(c.models.iter().any(|m| m.upstream_model == model));
            assert!(v["max_tokens"]
                .as_u64()
                .is_some_and(|n| (1..=8192).contains(&n)));
            assert!(r.max_tokens <= 8192);
            let msgs: Value = serde_json::from_slice(&r.body[r.prompt_range.clone()])
                .expect("prompt range is JSON");
            // At least one real turn: never `[]`, never system messages alone.
            assert!(
                msgs.as_array().is_some_and(|a| a
                    .iter()
                    .any(|m| m["role"] == "user" || m["role"] == "assistant")),
                "a prompt without a user or assistant message: {msgs}"
            );
            assert_eq!(v["stream"].as_bool(), Some(r.stream));
        }
        Err(e) => {
            for f in [ClientFormat::Chat, ClientFormat::Messages] {
                let _: Value =
                    serde_json::from_slice(&e.body(f, "req_fuzz")).expect("errors render as JSON");
                assert!((400..600).contains(&e.status(f)));
            }
        }
    }
});
