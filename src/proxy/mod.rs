//! The request path: what happens to one request on a client connection.
//!
//! [`conn::Frontend`] runs each connection's keep-alive loop and hands every request to
//! [`Gateway`]'s [`conn::ServeRequest::serve`], which has three steps:
//!
//! - **read the head** with pingora's HTTP/1 server session;
//! - **[`Gateway::answer`]** answers the request: catalog routes from pre-rendered bytes, and
//!   the API routes through [`api`] (auth → body → translate → admit → upstream exchange →
//!   translate back), on pingora-core's connection pool and Quipu's own HTTP/1.1 client
//!   ([`crate::upstream::client`] explains why not through pingora-proxy's proxy loop);
//! - **[`Gateway::finish`]** runs once for every answered request, whatever happened — success,
//!   error, client disconnect — and is where the reservation is settled, the ledger row queued,
//!   metrics observed and the access-log line written.
//!
//! Quipu used pingora-proxy's `ProxyHttp` for this (`request_filter` and `logging`) until its
//! per-request cost showed in the benchmark: every request boxed and copied a ~9 KiB future
//! and a session with cache and module state that Quipu never used. Serving the request
//! straight from the connection loop keeps its state in the connection's future instead.
//!
//! [`RequestCtx`] carries what one step learns to the next; each field says who sets it.

pub mod api;
pub mod conn;
pub mod meters;
pub mod relay;
pub mod respond;
pub mod route;

use crate::ascii::fill_hex;
use crate::auth::{KeySnapshot, Principal};
use crate::billing::{Accounts, LedgerHandle, Reservation};
use crate::catalog::Catalog;
use crate::config::{Config, ModelId};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::metrics::m;
use crate::money::Pen;
use crate::ratelimit::RateLimiter;
use crate::store::{now_ms, LedgerRow};
use crate::upstream::ModelPool;
use crate::usage::Usage;
use conn::Lifecycle;
use meters::Meters;
use pingora::apps::{HttpPersistentSettings, ReusedHttpStream};
use pingora::connectors::TransportConnector;
use pingora::protocols::http::ServerSession;
use prometheus::IntGauge;
use route::Route;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything the request path needs, shared by all worker threads.
pub struct Gateway {
    pub config: Arc<Config>,
    pub catalog: Catalog,
    pub keys: Arc<KeySnapshot>,
    pub pools: Vec<ModelPool>,
    pub connector: TransportConnector,
    pub accounts: Arc<Accounts>,
    pub ledger: LedgerHandle,
    pub limits: RateLimiter,
    /// API requests between `answer` and `finish` (for `server.max_in_flight`).
    pub in_flight: Arc<AtomicUsize>,
    /// Connections and requests of every route, and whether the server is draining.
    pub life: Arc<Lifecycle>,
    pub meters: Meters,
}

/// Counts an API request as in flight while it lives: in `in_flight` and in its route's
/// `quipu_requests_in_flight` gauge. Held by the request's context, so a request whose task
/// panics or is cancelled (and never reaches `finish`) gives its slot back all the same.
pub struct InFlight {
    count: Arc<AtomicUsize>,
    gauge: IntGauge,
}

impl InFlight {
    fn new(count: &Arc<AtomicUsize>, gauge: &IntGauge) -> InFlight {
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

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    /// `serve`: `req_` + time-ordered hex.
    pub request_id: String,
    /// `serve`.
    pub started: Instant,
    /// `answer`.
    pub route: Route,
    /// `answer`: the shape errors and streams are written in.
    pub format: ClientFormat,
    /// `api`: the authenticated caller.
    pub principal: Option<Arc<Principal>>,
    /// `api`: the model the request resolved to.
    pub model: Option<ModelId>,
    pub stream: bool,
    /// `api`: held from admission until `finish` settles it.
    pub reservation: Option<Reservation>,
    /// `relay`: tokens to bill (the upstream's report, or what was counted of a cut stream).
    pub usage: Option<Usage>,
    /// Status written to the client (0 if nothing was written).
    pub status: u16,
    /// Error kind label, if the request failed.
    pub error: Option<&'static str>,
    /// `ok`, `client_disconnected`, `upstream_error`, … (the ledger row's status).
    pub outcome: &'static str,
    /// `relay`: arrival of the first generated chunk (streams only).
    pub ttft: Option<Duration>,
    /// `api`: the replica that answered (index into the model's replicas), and how many
    /// attempts it took.
    pub replica: Option<usize>,
    pub attempts: u32,
    /// Time spent waiting on the upstream (to report the gateway's own overhead).
    pub upstream_time: Duration,
    /// `api`: input tokens billed if the upstream reports none (see `api::prompt_bounds`).
    pub prompt_estimate: u64,
    /// `finish` (settlement): what the tenant was charged.
    pub charged: Pen,
    /// `api`, with the reservation: settles the request from `Drop` if `finish` never runs
    /// (a panicking task), so metered usage is still billed. `settle` disarms it.
    settlement_fallback: Option<SettlementFallback>,
    /// `answer` (API routes): this request's in-flight slot, released when `finish`
    /// ends or, if it never runs, when the context is dropped.
    in_flight: Option<InFlight>,
}

/// What settling a request needs beyond its context (see `RequestCtx::settlement_fallback`).
struct SettlementFallback {
    config: Arc<Config>,
    accounts: Arc<Accounts>,
    ledger: LedgerHandle,
}

impl std::fmt::Debug for SettlementFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SettlementFallback")
    }
}

impl RequestCtx {
    /// Called once the reservation is held.
    pub fn arm_settlement_fallback(&mut self, gw: &Gateway) {
        self.settlement_fallback = Some(SettlementFallback {
            config: gw.config.clone(),
            accounts: gw.accounts.clone(),
            ledger: gw.ledger.clone(),
        });
    }
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        // Settlement happens once: `settle` takes the reservation, so this only acts when
        // `finish` never ran for an admitted request.
        if self.reservation.is_none() {
            return;
        }
        if let Some(f) = self.settlement_fallback.take() {
            log::error!(
                "request {} ended without reaching its settlement (a panic?); settling it now",
                self.request_id
            );
            if self.outcome == "ok" {
                self.outcome = "internal_error";
            }
            settle_money(&f.config, &f.accounts, &f.ledger, self);
        }
    }
}

/// The money part of settling a request, shared by `finish` and the `Drop` fallback: takes
/// the reservation, bills the usage — capped at the reservation, with an estimate of the input
/// when the upstream reported none — and queues the ledger row. Returns what was billed (usage
/// and charge) for the caller's metrics, or `None` if nothing was reserved.
///
/// Usage is first clamped to sane bounds (no count above the model's context window), so a
/// broken upstream report cannot produce a row the store must refuse.
fn settle_money(
    config: &Config,
    accounts: &Accounts,
    ledger: &LedgerHandle,
    ctx: &mut RequestCtx,
) -> Option<(Arc<Principal>, ModelId, Usage, Pen)> {
    let reservation = ctx.reservation.take()?;
    let (Some(p), Some(model_id)) = (ctx.principal.clone(), ctx.model) else {
        accounts.settle(reservation, Pen::ZERO);
        return None;
    };
    let model = &config.models[model_id];
    let cap = model.context_window;
    let mut usage = ctx.usage.unwrap_or_default();
    usage.prompt_tokens = usage.prompt_tokens.min(cap);
    usage.cached_tokens = usage.cached_tokens.min(cap);
    usage.completion_tokens = usage.completion_tokens.min(cap);
    // The upstream answered but reported no input (a cut stream, usage only at the end): a
    // real prompt is never 0 tokens, so bill the estimate made at admission.
    let input_estimated = ctx.usage.is_some() && usage.prompt_tokens == 0;
    if input_estimated {
        usage.prompt_tokens = ctx.prompt_estimate;
        usage.cached_tokens = 0;
        m().input_estimated
            .with_label_values(&[model.slug.as_str()])
            .inc();
    }
    let full = model.prices.charge(
        usage.uncached_input(),
        usage.cached(),
        usage.completion_tokens,
    );
    let reserved = reservation.amount;
    let charge = accounts.settle(reservation, full);
    let unbilled = full - charge;
    if unbilled > Pen::ZERO {
        log::warn!(
            "request {} of tenant {} on {}: its tokens cost {} but only {} was reserved; billed the reservation, {} unbilled (in={} cached={} out={})",
            ctx.request_id,
            p.tenant_name,
            model.slug,
            full.to_decimal(),
            reserved.to_decimal(),
            unbilled.to_decimal(),
            usage.prompt_tokens,
            usage.cached(),
            usage.completion_tokens
        );
        m().unbilled_pen
            .with_label_values(&[model.slug.as_str()])
            .inc_by(unbilled.picos() as f64 / 1e12);
    }
    ledger.record(LedgerRow {
        request_id: ctx.request_id.clone(),
        at: now_ms(),
        tenant_id: p.tenant_id,
        key_id: p.key_id.clone(),
        model: model.slug.clone(),
        format: ctx.format.as_str().to_owned(),
        input_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached(),
        output_tokens: usage.completion_tokens,
        charge,
        status: ctx.outcome.to_owned(),
        http_status: ctx.status,
        unbilled,
        input_estimated,
    });
    ctx.usage = Some(usage);
    ctx.charged = charge;
    Some((p, model_id, usage, charge))
}

/// A time-ordered, unique request id: `req_` + 12 hex digits of milliseconds + 16 random.
pub fn new_request_id() -> String {
    let mut id = *b"req_0000000000000000000000000000";
    fill_hex(&mut id[4..16], u64::try_from(now_ms()).unwrap_or(0));
    fill_hex(&mut id[16..], rand::random::<u64>());
    // Built from ASCII hex digits only.
    String::from_utf8(id.to_vec()).unwrap_or_default()
}

impl Default for RequestCtx {
    fn default() -> Self {
        RequestCtx {
            request_id: new_request_id(),
            started: Instant::now(),
            route: Route::Unrouted,
            format: ClientFormat::Chat,
            principal: None,
            model: None,
            stream: false,
            reservation: None,
            usage: None,
            status: 0,
            error: None,
            outcome: "ok",
            ttft: None,
            replica: None,
            attempts: 0,
            upstream_time: Duration::ZERO,
            prompt_estimate: 0,
            charged: Pen::ZERO,
            settlement_fallback: None,
            in_flight: None,
        }
    }
}

impl conn::ServeRequest for Gateway {
    /// One request, in three steps: read its head, [`Gateway::answer`] it, then
    /// [`Gateway::finish`] it (settle, metrics, access log), whatever happened.
    async fn serve(
        &self,
        mut session: ServerSession,
        head_read: &AtomicBool,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            // The client closed the connection before sending a request.
            Ok(false) => return None,
            Err(e) => {
                // As pingora's proxy does: a head that does not parse gets a bare 400 (there is
                // no route yet, so no format to shape it in); a broken connection gets nothing.
                if matches!(e.etype(), pingora::ErrorType::InvalidHTTPHeader) {
                    let _ = session.respond_error(400).await;
                }
                session.shutdown().await;
                return None;
            }
        }
        head_read.store(true, Ordering::Relaxed);
        if session.req_header().method == http::Method::CONNECT {
            // A tunnel changes how the rest of the connection is framed; pingora's proxy
            // refuses it the same way.
            let _ = session.respond_error(405).await;
            session.shutdown().await;
            return None;
        }
        let mut ctx = RequestCtx::default();
        let answered = self.answer(&mut session, &mut ctx).await;
        if let Err(e) = &answered {
            self.failed(&mut session, &mut ctx, e).await;
        }
        self.finish(&mut ctx);
        if answered.is_err() {
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&session);
        let reusable = session.finish().await.ok().flatten()?;
        Some(ReusedHttpStream::from_reusable_stream(reusable, settings))
    }
}

impl Gateway {
    /// Answers a request whose head has arrived: catalog routes from pre-rendered bytes, the
    /// API routes through [`api`]. Errors a client should see are written here, in the
    /// request's format; an `Err` means the exchange itself broke (see [`Gateway::failed`]).
    async fn answer(
        &self,
        session: &mut ServerSession,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let header = session.req_header();
        ctx.route = route::route(&header.method, header.uri.path());
        ctx.format = match ctx.route {
            Route::Messages | Route::CountTokens => ClientFormat::Messages,
            _ => route::format_for_path(header.uri.path()),
        };
        if ctx.route.is_api() {
            ctx.in_flight = Some(InFlight::new(
                &self.in_flight,
                self.meters.in_flight(ctx.route),
            ));
        }
        api::handle(self, session, ctx).await
    }

    /// After [`Gateway::answer`] failed: the connection is not reused. If nothing was written
    /// yet and the client is still there, it gets an internal error in its request's format.
    /// A client that went away is expected: it is in the access log, not the error log.
    async fn failed(&self, session: &mut ServerSession, ctx: &mut RequestCtx, e: &pingora::Error) {
        session.set_keepalive(None);
        let client_gone = ctx.outcome == "client_disconnected"
            || matches!(
                e.etype(),
                pingora::ErrorType::WriteError
                    | pingora::ErrorType::ReadError
                    | pingora::ErrorType::ConnectionClosed
            );
        if client_gone {
            return;
        }
        log::error!("request {}: {e}", ctx.request_id);
        if ctx.outcome == "ok" {
            ctx.outcome = "internal_error";
        }
        if session.response_written().is_none() {
            let err = ApiError::new(ErrorKind::Internal, "the gateway failed to answer");
            let _ = respond::error(session, ctx, ctx.format, &err).await;
        }
    }

    /// Runs once for every answered request, whatever happened — success, error, client
    /// disconnect: settles the reservation, queues the ledger row, observes the metrics and
    /// writes the access-log line.
    fn finish(&self, ctx: &mut RequestCtx) {
        self.settle(ctx);
        self.observe(ctx);
        drop(ctx.in_flight.take());
    }

    /// Replaces the reservation by the real charge and queues the ledger row.
    fn settle(&self, ctx: &mut RequestCtx) {
        ctx.settlement_fallback = None;
        let Some((p, model_id, usage, charge)) =
            settle_money(&self.config, &self.accounts, &self.ledger, ctx)
        else {
            return;
        };
        let model = &self.config.models[model_id];
        self.limits.consumed(&p, usage.total());
        let tokens = [
            usage.uncached_input(),
            usage.cached(),
            usage.completion_tokens,
        ];
        for (kind, n) in tokens.into_iter().enumerate() {
            if let Some(h) = self.meters.token_usage(model_id, kind) {
                h.observe(n as f64);
            }
        }
        p.meters.with(model_id, &p.tenant_name, &model.slug, |t| {
            for (counter, n) in t.tokens.iter().zip(tokens) {
                counter.inc_by(n);
            }
            // Float soles for dashboards only; the ledger has the exact amount.
            t.spend_pen.inc_by(charge.picos() as f64 / 1e12);
        });
    }

    /// Metrics and the access-log line.
    fn observe(&self, ctx: &RequestCtx) {
        let elapsed = ctx.started.elapsed();
        let model = ctx
            .model
            .map(|i| self.config.models[i].slug.as_str())
            .unwrap_or("none");
        let error = ctx.error.unwrap_or("none");
        self.meters.request(ctx.route, ctx.model, ctx.status, error);
        if ctx.route.is_api() {
            self.meters.duration(
                ctx.model,
                ctx.format,
                ctx.stream,
                error,
                elapsed.as_secs_f64(),
            );
            self.meters
                .overhead(ctx.route)
                .observe(elapsed.saturating_sub(ctx.upstream_time).as_secs_f64());
            if let (Some(t), Some(model_id)) = (ctx.ttft, ctx.model) {
                if let Some(h) = self.meters.ttft(model_id, ctx.format) {
                    h.observe(t.as_secs_f64());
                }
                let out = ctx.usage.map_or(0, |u| u.completion_tokens);
                if ctx.stream && out > 1 {
                    let per = (elapsed.saturating_sub(t)).as_secs_f64() / (out - 1) as f64;
                    if let Some(h) = self.meters.tpot(model_id) {
                        h.observe(per);
                    }
                }
            }
        }
        if self.config.server.access_log
            && log::log_enabled!(target: "quipu::access", log::Level::Info)
        {
            let u = ctx.usage.unwrap_or_default();
            let replica = ctx
                .model
                .zip(ctx.replica)
                .map_or("-", |(m, r)| self.config.models[m].replicas[r].url.as_str());
            crate::logger::info_fields("quipu::access", |line| {
                line.str("request_id", &ctx.request_id)
                    .str("route", ctx.route.as_str())
                    .str("format", ctx.format.as_str())
                    .str(
                        "tenant",
                        ctx.principal
                            .as_ref()
                            .map_or("-", |p| p.tenant_name.as_str()),
                    )
                    .str(
                        "key",
                        ctx.principal.as_ref().map_or("-", |p| p.key_id.as_str()),
                    )
                    .str("model", model)
                    .num("status", ctx.status.into())
                    .str("outcome", ctx.outcome)
                    .str("error", error)
                    .num("in", u.prompt_tokens)
                    .num("cached", u.cached())
                    .num("out", u.completion_tokens)
                    .display("charge_pen", ctx.charged.decimal())
                    .millis("latency_ms", Some(elapsed))
                    .millis("ttft_ms", ctx.ttft)
                    .str("replica", replica)
                    .num("attempts", ctx.attempts.into());
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::ledger;
    use crate::config::EMBEDDED_DEFAULT;
    use crate::store::{sqlite::SqliteStore, ActiveKey, KeyLimits, Store};
    use std::panic::AssertUnwindSafe;

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

    #[tokio::test]
    async fn a_request_that_never_reaches_finish_is_billed_once_from_drop() {
        let config = Arc::new(Config::parse(EMBEDDED_DEFAULT, "test").unwrap());
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(":memory:").await.unwrap());
        let t = store.create_tenant("acme").await.unwrap().id;
        store.top_up(t, Pen::from_centimos(1000), "").await.unwrap();
        let accounts = Accounts::new(
            store.clone(),
            "r".into(),
            Pen::from_centimos(500),
            Duration::from_secs(15),
        );
        let (handle, writer) = ledger::channel(
            store.clone(),
            accounts.clone(),
            Duration::from_millis(5),
            100,
            config.store.max_unstored_rows,
            ledger::ShutdownPolicy::of(&config.store),
        );
        let keys = KeySnapshot::new(config.models.len());
        keys.install(
            1,
            vec![ActiveKey {
                secret_hash: crate::keys::hash_secret("sk-qp-test"),
                key_id: "key_1".into(),
                tenant_id: t,
                tenant_name: "acme".into(),
                limits: KeyLimits::default(),
            }],
        );
        let principal = keys.lookup("sk-qp-test").unwrap();
        let usage = Usage {
            prompt_tokens: 1000,
            cached_tokens: 0,
            completion_tokens: 500,
        };
        let charge = config.models[0].prices.charge(1000, 0, 500);
        let admitted = |reservation| {
            let mut ctx = RequestCtx::default();
            ctx.principal = Some(principal.clone());
            ctx.model = Some(0);
            ctx.usage = Some(usage);
            ctx.reservation = Some(reservation);
            ctx.settlement_fallback = Some(SettlementFallback {
                config: config.clone(),
                accounts: accounts.clone(),
                ledger: handle.clone(),
            });
            ctx
        };

        // The task panics: its context is dropped while unwinding, and settles.
        let ctx = admitted(accounts.reserve(t, Pen::from_centimos(100)).await.unwrap());
        let panicked = ctx.request_id.clone();
        let r = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let _ctx = ctx;
            panic!("a bug in a request task");
        }));
        assert!(r.is_err());
        assert_eq!(handle.queued(), 1);
        let v = accounts.view(t);
        assert_eq!((v.reserved, v.unflushed, v.open), (Pen::ZERO, charge, 0));

        // Settled normally, then dropped: billed once.
        let mut ctx = admitted(accounts.reserve(t, Pen::from_centimos(100)).await.unwrap());
        let settled = ctx.request_id.clone();
        settle_money(&config, &accounts, &handle, &mut ctx);
        drop(ctx);
        assert_eq!(handle.queued(), 2);

        let (_stop_tx, stop) = tokio::sync::watch::channel(true);
        writer.run(stop).await;
        let rows = store.ledger_rows(Some(t)).await.unwrap();
        let mut ids: Vec<&str> = rows.iter().map(|r| r.request_id.as_str()).collect();
        ids.sort_unstable();
        let mut want = vec![panicked.as_str(), settled.as_str()];
        want.sort_unstable();
        assert_eq!(ids, want);
        assert!(rows.iter().all(|r| r.charge == charge));
        let p = rows.iter().find(|r| r.request_id == panicked).unwrap();
        assert_eq!(p.status, "internal_error");
        assert_eq!(
            store.balance(t).await.unwrap().balance,
            Pen::from_centimos(1000) - charge - charge
        );
    }
}
