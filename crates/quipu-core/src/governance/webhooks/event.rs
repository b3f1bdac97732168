//! The events Quipu tells webhook endpoints about, and the JSON each delivery carries:
//!
//! ```json
//! {"id":"evt_5c1f…","created":1795782600,"tenant":"acme","type":"cap.reached_80",
//!  "data":{"owner":"key","key_id":"key_7f3a","period":"day","period_key":"day:2026-11-27",
//!          "cap":"5.00","spent":"4.00"}}
//! ```
//!
//! `created` and `expires_at` are Unix seconds; amounts are exact decimal strings in soles
//! (`"4.00"`, `"0.0000026"`), as everywhere Quipu writes money for programs.
//!
//! **An event is once per cause.** Its id is derived from the tenant and the event's cause
//! ([`Event::cause`]): the crossing of a threshold by one change of the balance, a cap's level
//! in one period (at one amount), a key's notice for one expiry, one top-up. Two replicas that
//! see the same cause write the same id, so the outbox keeps one (a unique id), and a receiver
//! that sees an id twice (deliveries are at least once) knows it is a retry.

use super::super::caps::CapOwner;
use super::super::periods::CapPeriod;
use crate::money::{Pen, SCALE_DIGITS};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// An amount written as its exact decimal string (`"12.50"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Soles(pub Pen);

impl Serialize for Soles {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0.decimal())
    }
}

impl<'de> Deserialize<'de> for Soles {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Soles, D::Error> {
        let text = String::deserialize(d)?;
        let (neg, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let p = Pen::parse(digits, SCALE_DIGITS).map_err(serde::de::Error::custom)?;
        Ok(Soles(if neg { -p } else { p }))
    }
}

/// What happened, with its data. Serialized as `"type"` and `"data"` of the delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum Event {
    /// The balance went below a configured threshold.
    #[serde(rename = "balance.low")]
    BalanceLow(BalanceLow),
    /// A cap's current period reached 80 % of its amount.
    #[serde(rename = "cap.reached_80")]
    CapReached80(CapReached),
    /// A cap's current period reached its amount.
    #[serde(rename = "cap.reached_100")]
    CapReached100(CapReached),
    /// A key expires in 7 days or less.
    #[serde(rename = "key.expiring_7d")]
    KeyExpiring7d(KeyExpiring),
    /// A key expires in a day or less.
    #[serde(rename = "key.expiring_1d")]
    KeyExpiring1d(KeyExpiring),
    /// Money was added to the balance.
    #[serde(rename = "topup.received")]
    TopupReceived(TopupReceived),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceLow {
    pub threshold: Soles,
    /// The balance after the change.
    pub balance: Soles,
    /// The change that crossed the threshold (a charge batch, a request): what makes this
    /// crossing a different one from the next, after a top-up re-armed it.
    pub change_id: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapReached {
    pub owner: CapOwner,
    /// The key, for a key's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    pub period: CapPeriod,
    /// `day:2026-11-27`, `month:2026-11`, `total`.
    pub period_key: String,
    pub cap: Soles,
    /// Spent in the period after the change.
    pub spent: Soles,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyExpiring {
    pub key_id: String,
    /// Unix seconds.
    pub expires_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopupReceived {
    pub topup_id: String,
    pub amount: Soles,
    /// The balance after the top-up.
    pub balance: Soles,
}

impl Event {
    /// `balance.low`, `cap.reached_80`, …: the name endpoints subscribe to.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::BalanceLow(_) => "balance.low",
            Event::CapReached80(_) => "cap.reached_80",
            Event::CapReached100(_) => "cap.reached_100",
            Event::KeyExpiring7d(_) => "key.expiring_7d",
            Event::KeyExpiring1d(_) => "key.expiring_1d",
            Event::TopupReceived(_) => "topup.received",
        }
    }

    /// What makes this event once-only (see the module docs):
    /// `cap.reached_80/key/key_7f3a/day:2026-11-27/5.00`. A cap raised within its period
    /// is a new cause, as is a new expiry.
    pub fn cause(&self) -> String {
        let kind = self.kind();
        match self {
            Event::BalanceLow(b) => {
                format!("{kind}/{}/{}", b.threshold.0.decimal(), b.change_id)
            }
            Event::CapReached80(c) | Event::CapReached100(c) => format!(
                "{kind}/{}/{}/{}/{}",
                c.owner.as_str(),
                c.key_id.as_deref().unwrap_or("-"),
                c.period_key,
                c.cap.0.decimal()
            ),
            Event::KeyExpiring7d(k) | Event::KeyExpiring1d(k) => {
                format!("{kind}/{}/{}", k.key_id, k.expires_at)
            }
            Event::TopupReceived(t) => format!("{kind}/{}", t.topup_id),
        }
    }
}

/// Event types as endpoints name them in their subscriptions.
pub const EVENT_TYPES: [&str; 6] = [
    "balance.low",
    "cap.reached_80",
    "cap.reached_100",
    "key.expiring_7d",
    "key.expiring_1d",
    "topup.received",
];

/// One delivery's body: the event with its id, time and tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// `evt_` and 32 hex digits, derived from the tenant and the cause.
    pub id: String,
    /// Unix seconds.
    pub created: i64,
    /// The tenant's name.
    pub tenant: String,
    #[serde(flatten)]
    pub event: Event,
}

impl WebhookEvent {
    /// The event of `tenant` at `now_ms`, with its id.
    pub fn new(tenant: &str, now_ms: i64, event: Event) -> WebhookEvent {
        WebhookEvent {
            id: event_id(tenant, &event.cause()),
            created: now_ms.div_euclid(1000),
            tenant: tenant.to_owned(),
            event,
        }
    }

    /// The JSON body (what is signed and sent).
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// `evt_` and the first 16 bytes of SHA-256 over the tenant and the cause, in hex.
pub fn event_id(tenant: &str, cause: &str) -> String {
    let mut h = Sha256::new();
    h.update(tenant.as_bytes());
    h.update([0u8]);
    h.update(cause.as_bytes());
    let digest = h.finalize();
    let mut id = String::with_capacity(4 + 32);
    id.push_str("evt_");
    for b in &digest[..16] {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    id
}

pub(super) const HEX: &[u8; 16] = b"0123456789abcdef";
