//! One error type for everything a client can be told, rendered in each client format.
//!
//! Every client-visible failure is an [`ApiError`]: a [`ErrorKind`] (which fixes the HTTP
//! status and the `type`/`code` fields of every format, see docs/design.md "Errors") plus a
//! message written for the client. Nothing here knows about sockets: the proxy picks the
//! renderer from the request's [`ClientFormat`] and writes the bytes.
//!
//! The Responses API's errors are the chat format's fields in its own order
//! (`{"error":{"type","code","message","param"}}`), with the same `type` and `code`.
//!
//! | kind | status | messages `error.type` | chat and responses `type` / `code` |
//! |---|---|---|---|
//! | `Authentication` | 401 | `authentication_error` | `authentication_error` / `invalid_api_key` |
//! | `InvalidRequest` | 400 | `invalid_request_error` | `invalid_request_error` / param |
//! | `ModelNotFound` | 404 | `not_found_error` | `invalid_request_error` / `model_not_found` |
//! | `ResponseNotFound` | 404 | `not_found_error` | `invalid_request_error` / `response_not_found` |
//! | `InsufficientBalance` | 402 | `billing_error` | `insufficient_quota` / `insufficient_quota` |
//! | `RateLimited` | 429 | `rate_limit_error` | `rate_limit_error` / `rate_limit_exceeded` |
//! | `QueueFull` | 429 | `rate_limit_error` | `rate_limit_error` / `queue_full` |
//! | `PermissionDenied` | 403 | `permission_error` | `permission_error` / `model_not_allowed` |
//! | `Forbidden` | 403 | `permission_error` | `permission_error` / `insufficient_permissions` |
//! | `KeyNotFound` | 404 | `not_found_error` | `not_found_error` / `key_not_found` |
//! | `BudgetExceeded` | 429 (a period's cap) / 402 (a `total` cap) | `rate_limit_error` / `billing_error` | `insufficient_quota` / `budget_exceeded` |
//! | `RequestTooLarge` | 413 | `request_too_large` | `invalid_request_error` / `request_too_large` |
//! | `HeadersTooLarge` | 431 | `invalid_request_error` | `invalid_request_error` / `request_header_fields_too_large` |
//! | `Overloaded` | 529 / 503 (messages / others) | `overloaded_error` | `server_error` / `upstream_unavailable` |
//! | `UpstreamTimeout` | 504 | `timeout_error` | `server_error` / `upstream_timeout` |
//!
//! Rate-limited and overloaded answers carry `retry-after`; an answer that no retry can change
//! (no tokenizer upstream: 501) carries `x-should-retry: false`, so the SDKs do not send it
//! three times.

use bytes::Bytes;
use std::fmt;

/// The wire format a client speaks; decides how errors and streams are rendered.
///
/// Code that treats formats differently `match`es on it exhaustively (never `==`), so a new
/// format makes the compiler list every place that must decide what it does; tables indexed by
/// format are sized by [`ClientFormat::COUNT`], and lists of formats (the conformance cases,
/// the fuzz targets) come from [`ClientFormat::all`]. Each
/// variant's translation is a folder of `translate/` behind `translate::Format`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, strum::EnumCount, strum::EnumIter, strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
pub enum ClientFormat {
    /// OpenAI chat completions (`POST /v1/chat/completions`).
    Chat,
    /// Anthropic messages (`POST /v1/messages`, `/v1/messages/count_tokens`).
    Messages,
    /// The OpenAI Responses API (`/v1/responses` and the stored responses under it).
    Responses,
}

impl ClientFormat {
    /// Stable label for logs, metrics and the ledger.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Number of formats, derived from the variants.
    pub const COUNT: usize = <ClientFormat as strum::EnumCount>::COUNT;

    /// Index into tables of [`ClientFormat::COUNT`] entries.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Every format, in declaration order (`strum::IntoEnumIterator::iter`): what a list of
    /// formats is built from.
    pub fn all() -> ClientFormatIter {
        <ClientFormat as strum::IntoEnumIterator>::iter()
    }
}

/// What went wrong, as far as the client is concerned. Decides status and error fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Missing, invalid or revoked key.
    Authentication,
    /// Malformed JSON, wrong field type, missing field, a value out of range. `param` names the
    /// offending field (`messages[2].role`) for the chat format's `param`.
    InvalidRequest { param: Option<String> },
    /// The upstream said the prompt does not fit the model's context window.
    ContextLengthExceeded,
    /// The model name is not a slug (nor an alias of one).
    ModelNotFound,
    /// No stored response has this id for the caller's tenant (another tenant's is the same
    /// answer: nothing leaks).
    ResponseNotFound,
    /// No such route.
    RouteNotFound,
    /// The route exists but not with this method.
    MethodNotAllowed,
    /// The tenant's balance minus open reservations does not cover the request's worst case.
    InsufficientBalance,
    /// A per-key or per-tenant limit was hit; `retry_after` is in whole seconds.
    RateLimited { retry_after: u64 },
    /// The tenant's own queue for a saturated model is full, or its request waited there
    /// longer than `queue_timeout` (see `schedule`).
    QueueFull { retry_after: u64 },
    /// The key may not use this model (its model list).
    PermissionDenied,
    /// The key may not do this: it lacks the `manage` scope, or asked for more than its own
    /// limits or the operator's allow (`/v1/keys` self-service).
    Forbidden,
    /// No key of the caller's tenant has this id (another tenant's is the same answer).
    KeyNotFound,
    /// A spend cap the request would pass: until the period ends (`retry_after`, 429), or for
    /// good (`None`: a `total` cap, 402).
    BudgetExceeded { retry_after: Option<u64> },
    /// The request body is over the configured limit.
    RequestTooLarge,
    /// The request head (request line and headers) is over the configured limit.
    HeadersTooLarge,
    /// No healthy replica, or the upstream said it is overloaded.
    Overloaded { retry_after: u64 },
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// The upstream failed (5xx, reset, malformed response).
    Upstream,
    /// The upstream has no tokenizer endpoint (count_tokens).
    TokenizerUnavailable,
    /// A bug or an unexpected state in the gateway.
    Internal,
}

impl ErrorKind {
    /// HTTP status for this kind in the given format (overloaded differs: 529 vs 503).
    pub fn status(&self, format: ClientFormat) -> u16 {
        match self {
            ErrorKind::Authentication => 401,
            ErrorKind::InvalidRequest { .. } => 400,
            ErrorKind::ContextLengthExceeded => 400,
            ErrorKind::ModelNotFound => 404,
            ErrorKind::ResponseNotFound => 404,
            ErrorKind::RouteNotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::InsufficientBalance => 402,
            ErrorKind::RateLimited { .. } | ErrorKind::QueueFull { .. } => 429,
            ErrorKind::PermissionDenied | ErrorKind::Forbidden => 403,
            ErrorKind::KeyNotFound => 404,
            ErrorKind::BudgetExceeded { retry_after } => match retry_after {
                Some(_) => 429,
                None => 402,
            },
            ErrorKind::RequestTooLarge => 413,
            ErrorKind::HeadersTooLarge => 431,
            ErrorKind::Overloaded { .. } => match format {
                ClientFormat::Messages => 529,
                ClientFormat::Chat | ClientFormat::Responses => 503,
            },
            ErrorKind::UpstreamTimeout => 504,
            ErrorKind::Upstream => 502,
            ErrorKind::TokenizerUnavailable => 501,
            ErrorKind::Internal => 500,
        }
    }

    /// `error.type` of the messages format.
    pub fn messages_type(&self) -> &'static str {
        match self {
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::InvalidRequest { .. } => "invalid_request_error",
            ErrorKind::ContextLengthExceeded => "invalid_request_error",
            ErrorKind::ModelNotFound => "not_found_error",
            ErrorKind::ResponseNotFound => "not_found_error",
            ErrorKind::RouteNotFound => "not_found_error",
            ErrorKind::MethodNotAllowed => "invalid_request_error",
            ErrorKind::InsufficientBalance => "billing_error",
            ErrorKind::RateLimited { .. } | ErrorKind::QueueFull { .. } => "rate_limit_error",
            ErrorKind::PermissionDenied | ErrorKind::Forbidden => "permission_error",
            ErrorKind::KeyNotFound => "not_found_error",
            ErrorKind::BudgetExceeded { retry_after } => match retry_after {
                Some(_) => "rate_limit_error",
                None => "billing_error",
            },
            ErrorKind::RequestTooLarge => "request_too_large",
            ErrorKind::HeadersTooLarge => "invalid_request_error",
            ErrorKind::Overloaded { .. } => "overloaded_error",
            ErrorKind::UpstreamTimeout => "timeout_error",
            ErrorKind::Upstream => "api_error",
            ErrorKind::TokenizerUnavailable => "api_error",
            ErrorKind::Internal => "api_error",
        }
    }

    /// `error.type` and `error.code` of the chat format (and of the Responses API).
    pub fn chat_type_code(&self) -> (&'static str, Option<&'static str>) {
        match self {
            ErrorKind::Authentication => ("authentication_error", Some("invalid_api_key")),
            ErrorKind::InvalidRequest { .. } => ("invalid_request_error", None),
            ErrorKind::ContextLengthExceeded => {
                ("invalid_request_error", Some("context_length_exceeded"))
            }
            ErrorKind::ModelNotFound => ("invalid_request_error", Some("model_not_found")),
            ErrorKind::ResponseNotFound => ("invalid_request_error", Some("response_not_found")),
            ErrorKind::RouteNotFound => ("invalid_request_error", Some("not_found")),
            ErrorKind::MethodNotAllowed => ("invalid_request_error", Some("method_not_allowed")),
            ErrorKind::InsufficientBalance => ("insufficient_quota", Some("insufficient_quota")),
            ErrorKind::RateLimited { .. } => ("rate_limit_error", Some("rate_limit_exceeded")),
            ErrorKind::QueueFull { .. } => ("rate_limit_error", Some("queue_full")),
            ErrorKind::PermissionDenied => ("permission_error", Some("model_not_allowed")),
            ErrorKind::Forbidden => ("permission_error", Some("insufficient_permissions")),
            ErrorKind::KeyNotFound => ("not_found_error", Some("key_not_found")),
            ErrorKind::BudgetExceeded { .. } => ("insufficient_quota", Some("budget_exceeded")),
            ErrorKind::RequestTooLarge => ("invalid_request_error", Some("request_too_large")),
            ErrorKind::HeadersTooLarge => (
                "invalid_request_error",
                Some("request_header_fields_too_large"),
            ),
            ErrorKind::Overloaded { .. } => ("server_error", Some("upstream_unavailable")),
            ErrorKind::UpstreamTimeout => ("server_error", Some("upstream_timeout")),
            ErrorKind::Upstream => ("server_error", Some("upstream_error")),
            ErrorKind::TokenizerUnavailable => ("server_error", Some("tokenizer_unavailable")),
            ErrorKind::Internal => ("server_error", Some("internal_error")),
        }
    }

    /// Seconds the client should wait before retrying, for the kinds that carry one.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ErrorKind::RateLimited { retry_after }
            | ErrorKind::QueueFull { retry_after }
            | ErrorKind::Overloaded { retry_after } => Some(*retry_after),
            ErrorKind::BudgetExceeded { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// A failure that fails the same way however often it is retried: sent with
    /// `x-should-retry: false`, which both official SDKs obey before their status rules (they
    /// would otherwise retry every 5xx twice). Other kinds leave the decision to those rules.
    pub fn forbids_retry(&self) -> bool {
        matches!(self, ErrorKind::TokenizerUnavailable)
    }

    /// Short stable label for metrics and the access log (bounded cardinality).
    pub fn label(&self) -> &'static str {
        match self {
            ErrorKind::Authentication => "authentication",
            ErrorKind::InvalidRequest { .. } => "invalid_request",
            ErrorKind::ContextLengthExceeded => "context_length",
            ErrorKind::ModelNotFound => "model_not_found",
            ErrorKind::ResponseNotFound => "response_not_found",
            ErrorKind::RouteNotFound => "route_not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::InsufficientBalance => "insufficient_balance",
            ErrorKind::RateLimited { .. } => "rate_limited",
            ErrorKind::QueueFull { .. } => "queue_full",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::KeyNotFound => "key_not_found",
            ErrorKind::BudgetExceeded { .. } => "budget_exceeded",
            ErrorKind::RequestTooLarge => "request_too_large",
            ErrorKind::HeadersTooLarge => "headers_too_large",
            ErrorKind::Overloaded { .. } => "overloaded",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
            ErrorKind::Upstream => "upstream_error",
            ErrorKind::TokenizerUnavailable => "tokenizer_unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// A client-visible error: a kind and a message written for the client (never internals).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    /// A 400 naming the offending field (`param`) in the chat format.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::new(
            ErrorKind::InvalidRequest {
                param: Some(param.into()),
            },
            message,
        )
    }

    /// A 400 that is not about one field (e.g. the body is not JSON).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::InvalidRequest { param: None }, message)
    }

    pub fn status(&self, format: ClientFormat) -> u16 {
        self.kind.status(format)
    }

    /// The JSON error body in the client's format. `request_id` is echoed in the messages
    /// format's `request_id` field, as the vendor does.
    pub fn body(&self, format: ClientFormat, request_id: &str) -> Bytes {
        let mut out = Vec::with_capacity(96 + self.message.len());
        self.write_json(format, request_id, &mut out);
        Bytes::from(out)
    }

    /// Writes the JSON error object (no SSE framing) for `format` into `out`.
    pub fn write_json(&self, format: ClientFormat, request_id: &str, out: &mut Vec<u8>) {
        match format {
            ClientFormat::Messages => {
                out.extend_from_slice(br#"{"type":"error","error":{"type":""#);
                out.extend_from_slice(self.kind.messages_type().as_bytes());
                out.extend_from_slice(br#"","message":"#);
                write_json_str(out, &self.message);
                out.extend_from_slice(br#"},"request_id":"#);
                write_json_str(out, request_id);
                out.push(b'}');
            }
            ClientFormat::Chat => {
                out.extend_from_slice(br#"{"error":{"message":"#);
                write_json_str(out, &self.message);
                out.extend_from_slice(br#","type":""#);
                out.extend_from_slice(self.kind.chat_type_code().0.as_bytes());
                out.extend_from_slice(br#"","param":"#);
                self.write_param(format, out);
                out.extend_from_slice(br#","code":"#);
                self.write_code(out);
                out.extend_from_slice(b"}}");
            }
            ClientFormat::Responses => {
                out.extend_from_slice(br#"{"error":{"type":""#);
                out.extend_from_slice(self.kind.chat_type_code().0.as_bytes());
                out.extend_from_slice(br#"","#);
                self.write_responses_fields(out);
                out.extend_from_slice(b"}}");
            }
        }
    }

    /// The Responses API's error members after `type`: `"code":…,"message":…,"param":…` (no
    /// braces). Shared by an error body (after its `type`) and a stream's `error` event (whose
    /// `type` is `"error"`).
    pub fn write_responses_fields(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#""code":"#);
        self.write_code(out);
        out.extend_from_slice(br#","message":"#);
        write_json_str(out, &self.message);
        out.extend_from_slice(br#","param":"#);
        self.write_param(ClientFormat::Responses, out);
    }

    /// `code` of the chat and Responses shapes: the kind's code, `invalid_value` for a field
    /// error (like the vendor), else `null`.
    pub fn write_code(&self, out: &mut Vec<u8>) {
        match (self.kind.chat_type_code().1, &self.kind) {
            (Some(c), _) => write_json_str(out, c),
            (None, ErrorKind::InvalidRequest { param: Some(_) }) => {
                out.extend_from_slice(br#""invalid_value""#)
            }
            (None, _) => out.extend_from_slice(b"null"),
        }
    }

    /// `param` of the chat and Responses shapes: the offending field, if any.
    fn write_param(&self, format: ClientFormat, out: &mut Vec<u8>) {
        match (&self.kind, format) {
            (ErrorKind::InvalidRequest { param: Some(p) }, _) => write_json_str(out, p),
            (ErrorKind::ContextLengthExceeded, ClientFormat::Responses) => {
                out.extend_from_slice(br#""input""#)
            }
            (ErrorKind::ContextLengthExceeded, _) => out.extend_from_slice(br#""messages""#),
            (ErrorKind::ModelNotFound, _) => out.extend_from_slice(br#""model""#),
            _ => out.extend_from_slice(b"null"),
        }
    }

    /// The error as an SSE frame for a stream that has already started: `event: error` for the
    /// messages format; `data: {"error":…}` followed by `data: [DONE]` for the chat format; an
    /// `error` event for the Responses API (its stream translator writes its own, numbered and
    /// followed by `response.failed`; this one has sequence number 0).
    pub fn write_sse(&self, format: ClientFormat, request_id: &str, out: &mut Vec<u8>) {
        match format {
            ClientFormat::Messages => {
                out.extend_from_slice(b"event: error\ndata: ");
                self.write_json(format, request_id, out);
                out.extend_from_slice(b"\n\n");
            }
            ClientFormat::Chat => {
                out.extend_from_slice(b"data: ");
                self.write_json(format, request_id, out);
                out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
            }
            ClientFormat::Responses => {
                out.extend_from_slice(b"event: error\ndata: {\"type\":\"error\",");
                self.write_responses_fields(out);
                out.extend_from_slice(b",\"sequence_number\":0}\n\n");
            }
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.message)
    }
}

impl std::error::Error for ApiError {}

/// Appends `s` as a JSON string literal (quotes included) to `out`: `serde_json`'s escaping
/// (`\"`, `\\`, `\n`-style short forms, `\u00xx` for other control characters), written
/// straight into the buffer.
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a `&str` into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// The escaped contents of `s` as a JSON string, without the quotes (to splice inside a
/// literal, e.g. an id after a fixed prefix).
pub fn json_inner(s: &str) -> std::borrow::Cow<'_, str> {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut v = Vec::with_capacity(s.len() + 8);
    write_json_str(&mut v, s);
    let inner = v.get(1..v.len().saturating_sub(1)).unwrap_or_default();
    std::borrow::Cow::Owned(String::from_utf8_lossy(inner).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_use_the_short_escapes_and_lowercase_hex() {
        let mut out = Vec::new();
        write_json_str(&mut out, "a\"b\\c\n\r\t\u{8}\u{c}\u{1}\u{1f}\u{7f}é");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\u{7f}é\""
        );
    }

    fn json(e: &ApiError, f: ClientFormat) -> serde_json::Value {
        serde_json::from_slice(&e.body(f, "req_1")).unwrap()
    }

    #[test]
    fn messages_shape() {
        let e = ApiError::new(ErrorKind::Authentication, "invalid x-api-key");
        let v = json(&e, ClientFormat::Messages);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "authentication_error");
        assert_eq!(v["error"]["message"], "invalid x-api-key");
        assert_eq!(v["request_id"], "req_1");
        assert_eq!(e.status(ClientFormat::Messages), 401);
    }

    #[test]
    fn chat_shape_with_param() {
        let e = ApiError::invalid("messages[1].role", "unknown role \"robot\"");
        let v = json(&e, ClientFormat::Chat);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "messages[1].role");
        assert_eq!(v["error"]["message"], "unknown role \"robot\"");
        assert_eq!(v["error"]["code"], "invalid_value");
        assert_eq!(e.status(ClientFormat::Chat), 400);
    }

    #[test]
    fn responses_shape_is_the_chat_fields_in_the_apis_order() {
        let e = ApiError::invalid("input[2].role", "unknown role \"robot\"");
        let body = e.body(ClientFormat::Responses, "req_1");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"error":{"type":"invalid_request_error","code":"invalid_value","message":"unknown role \"robot\"","param":"input[2].role"}}"#
        );
        let e = ApiError::new(ErrorKind::ModelNotFound, "no such model");
        let v = json(&e, ClientFormat::Responses);
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(e.status(ClientFormat::Responses), 404);
        let e = ApiError::new(ErrorKind::ResponseNotFound, "no response");
        let v = json(&e, ClientFormat::Responses);
        assert_eq!(v["error"]["code"], "response_not_found");
        assert_eq!(v["error"]["param"], serde_json::Value::Null);
        assert_eq!(e.status(ClientFormat::Responses), 404);
        let e = ApiError::new(ErrorKind::Overloaded { retry_after: 1 }, "busy");
        assert_eq!(e.status(ClientFormat::Responses), 503);
        let e = ApiError::new(ErrorKind::ContextLengthExceeded, "too long");
        assert_eq!(json(&e, ClientFormat::Responses)["error"]["param"], "input");
        assert_eq!(json(&e, ClientFormat::Chat)["error"]["param"], "messages");
    }

    #[test]
    fn every_kind_has_status_and_types() {
        let kinds = [
            ErrorKind::Authentication,
            ErrorKind::InvalidRequest { param: None },
            ErrorKind::ContextLengthExceeded,
            ErrorKind::ModelNotFound,
            ErrorKind::ResponseNotFound,
            ErrorKind::RouteNotFound,
            ErrorKind::MethodNotAllowed,
            ErrorKind::InsufficientBalance,
            ErrorKind::RateLimited { retry_after: 3 },
            ErrorKind::RequestTooLarge,
            ErrorKind::HeadersTooLarge,
            ErrorKind::Overloaded { retry_after: 1 },
            ErrorKind::UpstreamTimeout,
            ErrorKind::Upstream,
            ErrorKind::TokenizerUnavailable,
            ErrorKind::Internal,
        ];
        for k in kinds {
            let e = ApiError::new(k.clone(), "m");
            for f in [
                ClientFormat::Chat,
                ClientFormat::Messages,
                ClientFormat::Responses,
            ] {
                let v = json(&e, f);
                assert!(v.is_object(), "{k:?} {f:?}");
                assert!((400..600).contains(&e.status(f)));
            }
        }
    }

    #[test]
    fn only_failures_that_cannot_change_forbid_a_retry() {
        assert!(ErrorKind::TokenizerUnavailable.forbids_retry());
        // Overload, timeouts and upstream faults are worth the SDK's retries.
        for kind in [
            ErrorKind::Overloaded { retry_after: 1 },
            ErrorKind::UpstreamTimeout,
            ErrorKind::Upstream,
            ErrorKind::Internal,
        ] {
            assert!(!kind.forbids_retry(), "{kind:?}");
        }
    }

    #[test]
    fn design_table_statuses() {
        use ClientFormat::*;
        assert_eq!(ErrorKind::InsufficientBalance.status(Chat), 402);
        assert_eq!(
            ErrorKind::Overloaded { retry_after: 1 }.status(Messages),
            529
        );
        assert_eq!(ErrorKind::Overloaded { retry_after: 1 }.status(Chat), 503);
        assert_eq!(
            ErrorKind::RequestTooLarge.messages_type(),
            "request_too_large"
        );
        assert_eq!(
            ErrorKind::InsufficientBalance.chat_type_code(),
            ("insufficient_quota", Some("insufficient_quota"))
        );
        assert_eq!(ErrorKind::ModelNotFound.messages_type(), "not_found_error");
    }

    #[test]
    fn sse_error_frames() {
        let e = ApiError::new(ErrorKind::Upstream, "upstream failed");
        let mut out = Vec::new();
        e.write_sse(ClientFormat::Messages, "r", &mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("event: error\ndata: {\"type\":\"error\""));
        assert!(s.ends_with("\n\n"));
        let mut out = Vec::new();
        e.write_sse(ClientFormat::Chat, "r", &mut out);
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("data: {\"error\""));
        assert!(s.ends_with("data: [DONE]\n\n"));
        let mut out = Vec::new();
        e.write_sse(ClientFormat::Responses, "r", &mut out);
        let s = String::from_utf8(out).unwrap();
        let data = s
            .strip_prefix("event: error\ndata: ")
            .and_then(|d| d.strip_suffix("\n\n"))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["code"], "upstream_error");
        assert_eq!(v["message"], "upstream failed");
    }

    #[test]
    fn json_string_escaping_roundtrips() {
        for s in [
            "plain",
            "quo\"te",
            "back\\slash",
            "nl\n\r\t",
            "\u{1}\u{1f}",
            "ñandú 🦙",
            "",
        ] {
            let mut out = Vec::new();
            write_json_str(&mut out, s);
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s);
        }
        let mut out = Vec::new();
        write_json_str(&mut out, "\u{1}a\u{1f}\u{b}");
        assert_eq!(out, br#""\u0001a\u001f\u000b""#);
    }
}
