//! `[[webhooks]]`: the operator's alert endpoints (each gets every tenant's events it
//! subscribes to), and `[webhook_delivery]`: how deliveries are tried (timeout, retry
//! schedule, how often the sender looks for due ones and the key-expiry scan runs).
//!
//! ```toml
//! [[webhooks]]
//! url = "https://ops.example.com/quipu"
//! secret = "env:QUIPU_WEBHOOK_SECRET"
//! events = ["balance.low", "topup.received"]   # or ["*"], the default
//!
//! [webhook_delivery]
//! timeout_ms = 10000
//! first_retry_ms = 30000
//! max_retry_delay_s = 21600
//! max_attempts = 20
//! tenant_private_urls = false   # tenants' endpoints at internal addresses are refused
//! ```

use super::raw::{RawWebhook, RawWebhookDelivery};
use super::secrets::secret;
use crate::governance::webhooks::backoff::Backoff;
use crate::governance::webhooks::endpoint::{EndpointUrl, EventFilter};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// An operator's endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    /// `op_` and 16 hex digits of the URL's SHA-256: stable across restarts, so deliveries
    /// pending in the store find their endpoint again.
    pub id: String,
    pub url: EndpointUrl,
    pub secret: String,
    pub events: EventFilter,
}

/// How deliveries are tried (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookDelivery {
    /// One attempt's deadline: connecting, sending and the answer's head.
    pub timeout: Duration,
    pub backoff: Backoff,
    /// How often the sender looks for events to deliver.
    pub poll: Duration,
    /// How often keys about to expire are looked for.
    pub key_scan: Duration,
    /// Whether tenants' endpoints may be at internal addresses (loopback, private networks,
    /// link-local and cloud metadata): off by default, so a tenant cannot make the gateway
    /// post to the operator's own network. The operator's endpoints may be anywhere.
    pub tenant_private_urls: bool,
}

/// The id of the operator's endpoint at `url`.
pub fn operator_endpoint_id(url: &str) -> String {
    let digest = Sha256::digest(url.as_bytes());
    let mut id = String::from("op_");
    for b in &digest[..8] {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

pub(super) fn validate_webhooks(
    raw: Vec<RawWebhook>,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> Vec<Webhook> {
    let mut out: Vec<Webhook> = Vec::with_capacity(raw.len());
    for (i, w) in raw.into_iter().enumerate() {
        let key = format!("webhooks[{i}]");
        let url = match EndpointUrl::parse(&w.url) {
            Ok(u) => Some(u),
            Err(e) => {
                errs.push(format!("{key}.url: {e}"));
                None
            }
        };
        let secret = secret(&w.secret, &format!("{key}.secret"), env, errs);
        if secret.trim().is_empty() {
            errs.push(format!(
                "{key}.secret is required (receivers check each delivery's signature with it)"
            ));
        }
        let events = EventFilter::parse(&w.events).unwrap_or_else(|e| {
            errs.push(format!("{key}.events: {e}"));
            EventFilter::All
        });
        let Some(url) = url else { continue };
        let id = operator_endpoint_id(&url.url);
        if out.iter().any(|o| o.id == id) {
            errs.push(format!("{key}.url: {} is configured twice", url.url));
            continue;
        }
        out.push(Webhook {
            id,
            url,
            secret,
            events,
        });
    }
    out
}

pub(super) fn validate_delivery(r: RawWebhookDelivery, errs: &mut Vec<String>) -> WebhookDelivery {
    let mut within = |key: &str, v: u64, lo: u64, hi: u64, unit: &str| {
        if !(lo..=hi).contains(&v) {
            errs.push(format!(
                "webhook_delivery.{key} must be between {lo} and {hi} ({unit}), got {v}"
            ));
        }
    };
    within("timeout_ms", r.timeout_ms, 100, 60_000, "milliseconds");
    within(
        "first_retry_ms",
        r.first_retry_ms,
        10,
        3_600_000,
        "milliseconds",
    );
    within(
        "max_retry_delay_s",
        r.max_retry_delay_s,
        1,
        7 * 86_400,
        "seconds",
    );
    within(
        "max_attempts",
        u64::from(r.max_attempts),
        1,
        100,
        "attempts",
    );
    within("poll_ms", r.poll_ms, 10, 60_000, "milliseconds");
    within("key_scan_s", r.key_scan_s, 1, 86_400, "seconds");
    WebhookDelivery {
        timeout: Duration::from_millis(r.timeout_ms),
        backoff: Backoff {
            first: Duration::from_millis(r.first_retry_ms),
            factor: 2,
            max_delay: Duration::from_secs(r.max_retry_delay_s),
            max_attempts: r.max_attempts,
        },
        poll: Duration::from_millis(r.poll_ms),
        key_scan: Duration::from_secs(r.key_scan_s),
        tenant_private_urls: r.tenant_private_urls,
    }
}
