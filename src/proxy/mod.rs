//! The request path: what happens to one request on a client connection.
//!
//! [`crate::http::Frontend`] runs each connection's loop and hands every request to
//! [`Gateway`]'s [`ServeRequest::serve`], which has four steps:
//!
//! - **read the head** with pingora's server session, and route it ([`crate::route`]);
//! - **answer**: a handler returns a typed [`Reply`] — the catalog routes from pre-rendered
//!   bytes and the account page from files compiled in ([`local`]), the API routes through
//!   [`api`] (auth → body → translate → admit → upstream exchange in [`relay`] → translate
//!   back), the account routes (the tenant's own balance and usage, read-only) through
//!   [`account`], and a managing key's writes on `/v1/keys` through [`manage`];
//! - **[`Gateway::conclude`]** writes what the reply says (a JSON body, or an error in the
//!   request's format, after draining an unread body) and sets how the request ended — status,
//!   [`Outcome`], error — in one place;
//! - **[`Gateway::finish`]** runs once for every request, whatever happened: the reservation is
//!   settled ([`settle`]), the ledger row queued, metrics observed and the access-log line
//!   written ([`observe`]).
//!
//! Quipu used pingora-proxy's `ProxyHttp` for this (`request_filter` and `logging`) until its
//! per-request cost showed in the benchmark: every request boxed and copied a ~9 KiB future
//! and a session with cache and module state that Quipu never used. Serving the request
//! straight from the connection loop keeps its state in the connection's future instead.

pub mod account;
pub mod api;
mod body;
mod count;
pub mod ctx;
mod local;
mod manage;
mod observe;
mod queue;
pub mod relay;
pub mod respond;
pub mod responses;
pub mod settle;
mod stream;
pub mod webhooks;

pub use ctx::{Outcome, RequestCtx};

use crate::auth::KeySnapshot;
use crate::billing::{Accounts, LedgerHandle};
use crate::catalog::Catalog;
use crate::config::Config;
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::http::{Lifecycle, ServeRequest, Served};
use crate::metrics::Meters;
use crate::ratelimit::RateLimiter;
use crate::route;
use crate::upstream::ModelPool;
use bytes::Bytes;
use ctx::InFlight;
use pingora::apps::{HttpPersistentSettings, ReusedHttpStream};
use pingora::connectors::TransportConnector;
use pingora::protocols::http::ServerSession;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Everything the request path needs, shared by all worker threads.
pub struct Gateway {
    pub config: Arc<Config>,
    pub catalog: Catalog,
    pub keys: Arc<KeySnapshot>,
    pub pools: Arc<Vec<ModelPool>>,
    pub connector: TransportConnector,
    pub accounts: Arc<Accounts>,
    pub ledger: LedgerHandle,
    pub limits: Arc<RateLimiter>,
    /// API requests between `answer` and `finish` (for `server.max_in_flight`).
    pub in_flight: Arc<AtomicUsize>,
    /// Connections and requests of every route, and whether the server is draining.
    pub life: Arc<Lifecycle>,
    pub meters: Meters,
    /// What the account routes read from (the store, a few queries at a time).
    pub account_reads: account::AccountReads,
    /// The Responses API's stored responses (`store: true`).
    pub responses: Arc<responses::StoredResponses>,
}

/// What a handler produced; [`Gateway::conclude`] writes it and records how the request ended.
#[derive(Debug)]
pub enum Reply {
    /// A `200` JSON body.
    Json(Bytes),
    /// A `200` static file of the account page.
    Asset(&'static crate::web::Asset),
    /// The handler wrote the response itself (a stream).
    Streamed(Streamed),
    /// The request failed.
    Failed(Failure),
}

/// How a stream the handler wrote itself ended.
#[derive(Debug, Clone, Copy)]
pub struct Streamed {
    /// `200` once the stream's head was written, 0 if the client left before.
    pub status: u16,
    pub outcome: Outcome,
    /// The error the stream ended with (an error frame), if any.
    pub error: Option<&'static str>,
}

/// A failed request: why, and what (if anything) the client is told.
#[derive(Debug)]
pub struct Failure {
    pub outcome: Outcome,
    /// Written in the request's format; `None` when nobody is there to read it (the client
    /// went away).
    pub error: Option<ApiError>,
    /// The request body was not (all) read: it is drained, bounded, before the error is
    /// written, so the connection can be reused (see [`body::drain`]).
    pub body_unread: bool,
}

impl Failure {
    /// Refused by the gateway after reading the body.
    pub fn refused(error: ApiError) -> Failure {
        Failure::new(Outcome::Refused, error)
    }

    /// Refused before the body was read.
    pub fn refused_unread(error: ApiError) -> Failure {
        Failure {
            body_unread: true,
            ..Failure::refused(error)
        }
    }

    pub fn new(outcome: Outcome, error: ApiError) -> Failure {
        Failure {
            outcome,
            error: Some(error),
            body_unread: false,
        }
    }

    /// The client went away: nothing to write.
    pub fn client_gone() -> Failure {
        Failure {
            outcome: Outcome::ClientDisconnected,
            error: None,
            body_unread: false,
        }
    }
}

impl From<Failure> for Reply {
    fn from(f: Failure) -> Reply {
        Reply::Failed(f)
    }
}

impl ServeRequest for Gateway {
    /// One request: read its head, answer it, [`Gateway::conclude`] and [`Gateway::finish`]
    /// it, whatever happened.
    async fn serve(&self, mut session: ServerSession, head_read: &AtomicBool) -> Served {
        match session.read_request().await {
            Ok(true) => {}
            // The client closed the connection before sending a request.
            Ok(false) => return Served::default(),
            Err(e) if body::adopt_target_authority(&mut session, &e) => {}
            Err(e) => {
                // A request line too long to parse is a head over the limit: its 431, in the
                // default (chat) shape since there is no path to route. Any other head that
                // does not parse gets a bare 400, as pingora's proxy answers it; a broken
                // connection gets nothing.
                if body::target_too_long(&e) {
                    let error = ApiError::new(
                        ErrorKind::HeadersTooLarge,
                        "the request line is longer than the request head limit",
                    );
                    let id = ctx::new_request_id();
                    session.set_keepalive(None);
                    let _ =
                        respond::error_to_unparsed(&mut session, &id, ClientFormat::Chat, &error)
                            .await;
                } else if matches!(e.etype(), pingora::ErrorType::InvalidHTTPHeader) {
                    let _ = session.respond_error(400).await;
                }
                session.shutdown().await;
                return Served::default();
            }
        }
        head_read.store(true, Ordering::Relaxed);
        if session.req_header().method == http::Method::CONNECT {
            // A tunnel changes how the rest of the connection is framed; pingora's proxy
            // refuses it the same way.
            let _ = session.respond_error(405).await;
            session.shutdown().await;
            return Served::default();
        }
        let header = session.req_header();
        let path = header.uri.path();
        let route = route::route(&header.method, path);
        let mut ctx = RequestCtx::new(route, route.format(path));
        if route.is_api() {
            ctx.in_flight = Some(InFlight::new(&self.in_flight, self.meters.in_flight(route)));
        }
        self.prepare(&mut session);
        let reply = if let Some(e) = body::head_too_large(&session, &self.config.server) {
            Failure::refused_unread(e).into()
        } else if body::has_bare_lf(&session) {
            // The body's framing comes from a head read differently upstream of us: close.
            session.set_keepalive(None);
            Failure::refused(ApiError::invalid_body(
                "every line of the request head must end with CRLF, not a bare LF",
            ))
            .into()
        } else if route.is_api() {
            api::handle(self, &mut session, &mut ctx).await
        } else if matches!(route, route::Route::Webhooks | route::Route::Webhook) {
            webhooks::handle(self, &mut session, &mut ctx, route).await
        } else if let Some(account_route) = route.account() {
            account::handle(self, &mut session, &mut ctx, account_route).await
        } else {
            local::handle(self, &session, route)
        };
        let reusable = self.conclude(&mut session, &mut ctx, reply).await;
        self.finish(&mut ctx);
        responses::write_finished(self, &mut ctx);
        let cancelled = ctx.ending.outcome == Outcome::ClientDisconnected;
        if cancelled {
            // A response cut short must not look complete: on HTTP/2, `finish` would end the
            // stream with END_STREAM; resetting it (and, on HTTP/1.1, closing the connection
            // in the middle of the chunked body) tells the client it is not.
            session.shutdown().await;
            return Served {
                next: None,
                cancelled,
            };
        }
        if !reusable {
            return Served {
                next: None,
                cancelled,
            };
        }
        let settings = HttpPersistentSettings::for_session(&session);
        let next = session
            .finish()
            .await
            .ok()
            .flatten()
            .map(|reusable| ReusedHttpStream::from_reusable_stream(reusable, settings));
        Served { next, cancelled }
    }
}

impl Gateway {
    /// Per-request session settings: read and write timeouts, the bound on draining an unread
    /// body, and keep-alive (bounded; none while draining).
    fn prepare(&self, session: &mut ServerSession) {
        let server = &self.config.server;
        session.set_read_timeout(Some(server.client_read_timeout));
        session.set_write_timeout(Some(server.client_write_timeout));
        // Pingora drains an unread body before reusing a connection; bound that too.
        session.set_total_drain_timeout(Some(body::DRAIN_TIMEOUT));
        // HTTP/1.1 keeps idle connections forever by default; bound them. Keep-alive is only
        // ever shortened here, never turned back on: pingora turns it off for a client's
        // `Connection: close` and for a head whose framing is ambiguous (both `Content-Length`
        // and `Transfer-Encoding`: RFC 9112 §6.1 says close after answering it, or the bytes
        // behind it could be read as a smuggled second request). HTTP/1.0 closes unless the
        // client asked to keep it (pingora would answer it `keep-alive`). A draining server
        // closes each connection after its request.
        let closing = session.get_keepalive().is_none() && !session.is_http2();
        if closing || self.life.draining() || body::http10_close(session) {
            session.set_keepalive(None);
        } else {
            session.set_keepalive(Some(server.keepalive_timeout_s));
        }
    }

    /// Writes what `reply` says and records how the request ended ([`ctx::Ending`]); the one
    /// place that does either. Returns whether the connection may carry another request.
    async fn conclude(
        &self,
        session: &mut ServerSession,
        ctx: &mut RequestCtx,
        reply: Reply,
    ) -> bool {
        let written = match reply {
            Reply::Json(body) => {
                ctx.ending.status = 200;
                respond::json(session, &ctx.request_id, 200, body).await
            }
            Reply::Asset(asset) => {
                ctx.ending.status = 200;
                respond::asset(session, &ctx.request_id, asset).await
            }
            Reply::Streamed(s) => {
                ctx.ending.status = s.status;
                ctx.ending.outcome = s.outcome;
                ctx.ending.error = s.error;
                // The stream wrote its own end; one whose client left has turned keep-alive
                // off, which `session.finish` honours.
                return true;
            }
            Reply::Failed(f) => {
                ctx.ending.outcome = f.outcome;
                let Some(error) = f.error else {
                    session.set_keepalive(None);
                    return false;
                };
                ctx.ending.error = Some(error.kind.label());
                if ctx.head_sent {
                    // The stream's `200` went out while it waited in a queue: the error is an
                    // event of that stream.
                    ctx.ending.status = 200;
                    respond::stream_error(session, &ctx.request_id, ctx.format, &error).await
                } else {
                    ctx.ending.status = error.status(ctx.format);
                    if f.body_unread && !body::drain(session, &self.config.server).await {
                        session.set_keepalive(None);
                    }
                    respond::error(session, &ctx.request_id, ctx.format, &error).await
                }
            }
        };
        match written {
            Ok(()) => true,
            Err(e) => {
                self.write_failed(ctx, &e);
                session.set_keepalive(None);
                false
            }
        }
    }

    /// Writing the response failed. A client that went away is expected: it is in the access
    /// log, not the error log; anything else is the gateway's failure.
    fn write_failed(&self, ctx: &mut RequestCtx, e: &pingora::Error) {
        // An HTTP/2 client that reset its stream shows as an `H2Error`.
        let client_gone = matches!(
            e.etype(),
            pingora::ErrorType::WriteError
                | pingora::ErrorType::ReadError
                | pingora::ErrorType::ConnectionClosed
                | pingora::ErrorType::H2Error
        );
        if client_gone {
            return;
        }
        log::error!("request {}: {e}", ctx.request_id);
        if ctx.ending.outcome == Outcome::Ok {
            ctx.ending.outcome = Outcome::InternalError;
        }
    }

    /// Runs once for every request, whatever happened — success, error, client disconnect:
    /// settles the reservation, queues the ledger row, observes the metrics and writes the
    /// access-log line.
    fn finish(&self, ctx: &mut RequestCtx) {
        if let Some(settled) = settle::settle_request(ctx) {
            observe::billed(self, ctx, &settled);
        }
        observe::request(self, ctx);
        drop(ctx.in_flight.take());
    }
}

/// The error every handler answers an internal failure with.
pub fn internal_error() -> ApiError {
    ApiError::new(ErrorKind::Internal, "the gateway failed to answer")
}

#[cfg(test)]
mod tests;
