//! What one request carries from step to step, typed: who is calling, which model, what is
//! reserved, what the upstream did, and how the request ended.
//!
//! Each field says which step sets it. How a request ends ([`Ending`]: status, [`Outcome`],
//! error label) is set in one place, `Gateway::conclude`, from the handler's typed
//! [`super::Reply`]; the handlers never write it.

use super::settle::settle_request;
use crate::ascii::fill_hex;
use crate::auth::Caller;
use crate::billing::{Accounts, LedgerHandle, Reservation};
use crate::config::{Config, ModelId};
use crate::error::ClientFormat;
use crate::money::Pen;
use crate::route::Route;
use crate::store::now_ms;
use crate::usage::Usage;
use prometheus::IntGauge;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a request ended, as the ledger row's `status`, the access log's `outcome` and the
/// settlement see it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    /// Answered (a stream that ran to its end included).
    #[default]
    Ok,
    /// Refused by the gateway before the upstream had it (auth, validation, limits, balance).
    Refused,
    /// The client went away before its response was complete.
    ClientDisconnected,
    /// The upstream answered with an error, or broke mid-answer.
    UpstreamError,
    /// No replica could take the request (none healthy, all failed or overloaded).
    UpstreamUnavailable,
    /// The upstream did not answer, or stopped sending, in time.
    Timeout,
    /// The gateway itself failed (a bug, a panicking task).
    InternalError,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How a request ended: set once, by `Gateway::conclude`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ending {
    /// Status written to the client (0 if nothing was written).
    pub status: u16,
    pub outcome: Outcome,
    /// The error kind's label (`ErrorKind::label`), if the request failed.
    pub error: Option<&'static str>,
}

/// What the upstream exchange did (set by `relay`).
#[derive(Clone, Copy, Debug, Default)]
pub struct UpstreamTrace {
    /// The replica that answered (index into the model's replicas).
    pub replica: Option<usize>,
    /// Attempts it took (failovers included).
    pub attempts: u32,
    /// Time spent waiting on the upstream (to report the gateway's own overhead).
    pub time: Duration,
    /// Arrival of the first generated chunk (streams only).
    pub ttft: Option<Duration>,
    /// Time spent waiting in a saturated model's queue (see `queue`).
    pub queued: Duration,
}

/// The money side of an admitted request: what is reserved, and where it is billed — also
/// from `Drop`, should `finish` never run (a panicking task). Set by `api` at admission, taken by the settlement.
pub struct Admitted {
    pub reservation: Reservation,
    /// Input tokens billed if the upstream reports none (the quote's estimate).
    pub input_estimate: u64,
    /// The cap pools it reserved against too (their ids), which its ledger row names.
    pub caps: Vec<String>,
    /// Where the settlement bills it.
    pub books: Books,
}

/// What settling a request needs beyond its context: the prices, the accounts that hold the
/// reservation and the ledger the row goes to.
#[derive(Clone)]
pub struct Books {
    pub config: Arc<Config>,
    pub accounts: Arc<Accounts>,
    pub ledger: LedgerHandle,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("reservation", &self.reservation)
            .field("input_estimate", &self.input_estimate)
            .finish()
    }
}

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    /// `serve`: `req_` + time-ordered hex.
    pub request_id: String,
    /// `serve`.
    pub started: Instant,
    /// `serve`.
    pub route: Route,
    /// `serve`: the shape errors and streams are written in.
    pub format: ClientFormat,
    /// `api`: the authenticated caller.
    pub caller: Option<Arc<Caller>>,
    /// `api`: the model the request resolved to.
    pub model: Option<ModelId>,
    /// `api`.
    pub stream: bool,
    /// `api` (admission): held until the settlement takes it.
    pub admitted: Option<Admitted>,
    /// `relay`: tokens to bill (the upstream's report, or what was counted of a cut stream);
    /// `None` if the upstream never had the request. The settlement replaces it by what was
    /// billed.
    pub usage: Option<Usage>,
    /// `relay`.
    pub upstream: UpstreamTrace,
    /// `conclude`, once.
    pub ending: Ending,
    /// `finish` (settlement): what the tenant was charged.
    pub charged: Pen,
    /// `api` (Responses API requests): what the response translators and the store need.
    pub responses: Option<Box<super::responses::Turn>>,
    /// `serve` (API routes): this request's in-flight slot, released when `finish` ends or, if
    /// it never runs, when the context is dropped.
    pub(super) in_flight: Option<InFlight>,
    /// `queue`: a stream's `200` head went out while it waited for a slot; every failure from
    /// then on is an error event in the stream.
    pub head_sent: bool,
}

impl RequestCtx {
    pub fn new(route: Route, format: ClientFormat) -> RequestCtx {
        RequestCtx {
            request_id: new_request_id(),
            started: Instant::now(),
            route,
            format,
            caller: None,
            model: None,
            stream: false,
            admitted: None,
            usage: None,
            upstream: UpstreamTrace::default(),
            ending: Ending::default(),
            charged: Pen::ZERO,
            responses: None,
            in_flight: None,
            head_sent: false,
        }
    }
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        // Settlement happens once: it takes `admitted`, so this only acts when `finish` never
        // ran for an admitted request.
        if self.admitted.is_none() {
            return;
        }
        log::error!(
            "request {} ended without reaching its settlement (a panic?); settling it now",
            self.request_id
        );
        if self.ending.outcome == Outcome::Ok {
            self.ending.outcome = Outcome::InternalError;
        }
        settle_request(self);
    }
}

/// A time-ordered, unique request id: `req_` + 12 hex digits of milliseconds + 16 random.
pub fn new_request_id() -> String {
    let mut id = *b"req_0000000000000000000000000000";
    fill_hex(&mut id[4..16], u64::try_from(now_ms()).unwrap_or(0));
    fill_hex(&mut id[16..], rand::random::<u64>());
    // Built from ASCII hex digits only.
    String::from_utf8(id.to_vec()).unwrap_or_default()
}

/// Counts an API request as in flight while it lives: in `in_flight` and in its route's
/// `quipu_requests_in_flight` gauge. Held by the request's context, so a request whose task
/// panics or is cancelled (and never reaches `finish`) gives its slot back all the same.
pub(super) struct InFlight {
    count: Arc<AtomicUsize>,
    gauge: IntGauge,
}

impl InFlight {
    pub(super) fn new(count: &Arc<AtomicUsize>, gauge: &IntGauge) -> InFlight {
        count.fetch_add(1, Ordering::SeqCst);
        gauge.inc();
        InFlight {
            count: count.clone(),
            gauge: gauge.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_req_then_the_millisecond_and_random_bits_in_hex() {
        let before = now_ms();
        let id = new_request_id();
        let after = now_ms();
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.starts_with("req_"), "{id}");
        assert!(id[4..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let ms = i64::from_str_radix(&id[4..16], 16).unwrap();
        assert!((before..=after).contains(&ms), "{id}");
        assert_ne!(new_request_id()[16..], id[16..], "the random part changes");
    }

    #[test]
    fn outcome_labels_are_the_ledger_statuses() {
        assert_eq!(Outcome::Ok.as_str(), "ok");
        assert_eq!(Outcome::ClientDisconnected.as_str(), "client_disconnected");
        assert_eq!(
            Outcome::UpstreamUnavailable.as_str(),
            "upstream_unavailable"
        );
        assert_eq!(Outcome::InternalError.as_str(), "internal_error");
    }
}
