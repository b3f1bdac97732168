//! The chat format's tests, by topic: [`request_fields`] (the top level of a request),
//! [`request_messages`] (its `messages`). The helpers below are shared.

use super::request::chat_to_upstream;
use crate::config::{Config, ImageUrlPolicy, EMBEDDED_DEFAULT};
use crate::error::{ApiError, ErrorKind};
use crate::translate::UpstreamRequest;
use serde_json::{json, Value};

mod request_fields;
mod request_messages;

fn config() -> Config {
    Config::parse(EMBEDDED_DEFAULT, "test").unwrap()
}

/// Translates `v` with the shipped configuration; the upstream body parsed back.
fn translate(v: Value) -> Result<(UpstreamRequest, Value), ApiError> {
    let c = config();
    let body = serde_json::to_vec(&v).unwrap();
    let r = chat_to_upstream(&body, &c)?;
    let up: Value = serde_json::from_slice(&r.body).unwrap();
    Ok((r, up))
}

fn err(v: Value) -> ApiError {
    translate(v).unwrap_err()
}

fn hello(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hola"}]})
}
