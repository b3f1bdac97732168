//! What a key or a tenant may do, as pure policy: model lists, spend caps and the calendar
//! periods they are counted in, expiry, what a manage key may give out, and the webhooks
//! that tell a tenant about it. No store, no clock (every call takes `now` in UTC
//! milliseconds), no I/O; the binary keeps the keys, the spending and the outbox.
//!
//! - [`models`]: a key's model list (slugs, aliases, globs), checked against the catalog and
//!   compiled into the set of models it allows.
//! - [`periods`]: a cap's period (`day`, `week`, `month` in the tenant's IANA zone, or
//!   `total`) around an instant, its end for `retry-after`, and its storage key.
//! - [`caps`]: spend caps and the rule of admission: a request's worst case must fit what is
//!   left of every cap that applies.
//! - [`key_policy`]: a key's and a tenant's limits and the admission checks in order (usable,
//!   model, caps), each refusal typed with its HTTP answer.
//! - [`self_service`]: what a manage key may give the keys it creates or limits.
//! - [`webhooks`]: the events, their JSON and ids, the signature, the retry schedule, and
//!   which events a change fires.
//!
//! A request's admission, as the binary drives it:
//!
//! ```
//! use quipu_core::governance::caps::{Cap, CapLoad};
//! use quipu_core::governance::key_policy::{active_caps, admit, KeyPolicy, Request, TenantPolicy};
//! use quipu_core::money::Pen;
//! let key = KeyPolicy { cap: Some(Cap::parse("5.00", "day").unwrap()), ..KeyPolicy::default() };
//! let tenant = TenantPolicy::default(); // America/Lima, no monthly cap
//! let now = 1_795_782_600_000; // 2026-11-27T12:30:00Z
//! // 1. The caps in force and their periods: read what each period holds under its key.
//! let caps = active_caps(&key, &tenant, now).unwrap();
//! assert_eq!(caps[0].span.key().to_string(), "day:2026-11-27");
//! let loads: Vec<CapLoad> = caps
//!     .into_iter()
//!     .map(|active| CapLoad { active, spent: Pen::from_centimos(500), reserved: Pen::ZERO })
//!     .collect();
//! // 2. Admit or refuse, inside the reservation.
//! let request = Request { requested: "colibri", slug: "colibri", worst: Pen::from_centimos(1) };
//! let refusal = admit(&key, &tenant, &request, now, &loads).unwrap_err();
//! assert_eq!(refusal.kind().status(), 429);
//! assert_eq!(
//!     refusal.to_string(),
//!     "this key's daily cap of S/ 5.00 is spent; it resets at 2026-11-28 00:00 America/Lima"
//! );
//! ```

pub mod caps;
pub mod key_policy;
pub mod models;
pub mod periods;
pub mod self_service;
pub mod webhooks;
