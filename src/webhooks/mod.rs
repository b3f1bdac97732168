//! Alerts as webhooks: the one sender per store ([`sender`]) that delivers the outbox's
//! events to the operator's endpoints (`[[webhooks]]`) and the tenants' own (`/v1/webhooks`),
//! over HTTP ([`deliver`]).
//!
//! What is pure lives in `quipu_core::governance::webhooks` (events, ids, signatures, the
//! retry schedule, crossings, URLs); what is durable in `store::webhooks` (the outbox, written
//! in the transaction of each event's cause, and the delivery rows). This module only moves
//! rows to receivers, on the bookkeeping runtime: no request ever waits on it.
//!
//! **Exactly one sender.** Every replica runs the loop, but a round starts only with the
//! sender's lease in the store (`webhook_sender`, renewed when half of it is left, timed by
//! PostgreSQL's clock on PostgreSQL); the others try to take it each round. The lease lasts three attempt timeouts (at least
//! 5 s), longer than a round's sends, which run concurrently, each bounded by the timeout. A
//! sender that stalls past its lease may have a delivery sent again by the next one: deliveries
//! are at least once, and the event id (header and body) lets a receiver drop a repeat.
//!
//! **Each round**: (1) every `key_scan` the keys expiring within 7 days get their notice
//! (`key.expiring_7d`, or `key.expiring_1d` in their last day), inserted once per key and
//! expiry whatever replica scans; (2) new events are fanned out into one delivery row per
//! endpoint subscribed to them (operator endpoints get every tenant's, a tenant's endpoint
//! only its tenant's); (3) due deliveries are sent, signed at send time
//! (`Quipu-Signature: t=…,v1=…`), and each attempt recorded: a 2xx is delivered; anything else
//! (a timeout, a refused connection, a 500, a redirect) is retried after the backoff of
//! `[webhook_delivery]`, until its last attempt, after which it is dead. A delivery whose
//! endpoint was removed (from the config or by its tenant) dies at its next turn, and so does
//! one to a tenant's endpoint at an internal address (unless
//! `webhook_delivery.tenant_private_urls`): tenants cannot make the gateway post into the
//! operator's network.
//!
//! Metrics: `quipu_webhook_deliveries_total{outcome="delivered|failed|dead"}` (each attempt's
//! outcome: `failed` is retried later) and `quipu_webhook_backlog` (deliveries pending plus
//! events not fanned out yet, as the sender last counted).

pub mod deliver;
pub mod sender;

pub use sender::Sender;
