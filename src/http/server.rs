//! Client connections: how many may be open, how long a request head may take, and draining.
//!
//! Pingora bounds a request head only per read (a client sending one byte every 50 s holds its
//! connection forever) and counts no connections. [`Frontend`] is the listener's `ServerApp`:
//! it takes the connection's slot, runs the TLS handshake when the listener has a certificate
//! ([`super::tls`]), hands HTTP/2 connections (ALPN `h2`, or the h2c preface on a plain
//! listener) to [`super::h2`], and runs the HTTP/1.1 keep-alive loop itself — the same steps
//! as pingora's `ServerApp` implementation for an `HttpServerApp` — handing each request to a
//! [`ServeRequest`] and adding:
//!
//! - **A connection cap** (`server.max_connections`): a connection over it is closed as soon as
//!   it is accepted, before anything is read; idle keep-alive connections count too. Closing
//!   costs nothing under a flood, and a client sees a closed connection it can retry.
//! - **A request-head deadline** (`server.header_timeout_ms`): the whole head must arrive within
//!   it, counted from the connection's opening for its first request. A later request on a
//!   keep-alive connection must have its whole head within `server.keepalive_timeout_s` +
//!   `server.header_timeout_ms` of the previous response (idle time and a slow head share that
//!   budget: the loop no longer reads a byte ahead to see when a head starts, which cost a
//!   system call per request). Otherwise the connection is closed.
//! - **Draining**: once a graceful shutdown starts (SIGTERM, or the end of a graceful upgrade), a
//!   request in progress is finished and its connection then closed; a connection that has not
//!   delivered a whole head is given [`LATE_HEAD_GRACE`] to do so (a head that was half sent
//!   when the signal came is served, with `Connection: close`) and is closed otherwise.
//!   [`Lifecycle`] counts open connections, so the drain waits for the last one before the
//!   ledger's final flush.
//!
//! The common case costs nothing extra: a keep-alive client's next head is usually already in
//! the socket, so the first poll of a request reads it and starts the request; only a
//! connection still waiting after that poll arms a timer and watches for shutdown.
//!
//! A request is served by a statically dispatched `async fn` ([`ServeRequest::serve`]), so its
//! state lives inside the connection's future, allocated once per connection. Pingora's
//! `HttpServerApp::process_new_http` is an `async_trait` method: every request would box (and
//! copy) a fresh future of several KiB.
//!
//! There is no shutdown hook like pingora's `http_cleanup` (which drops every connection parked
//! in a header read, including ones halfway through a head): the loop here closes idle
//! connections itself and lets started requests finish.

use super::deadline;
use super::h2::{self, H2Limits};
use pingora::apps::{HttpPersistentSettings, ReusedHttpStream, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{Stream, ALPN};
use pingora::server::ShutdownWatch;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::{sleep_until, Instant};

/// After a shutdown starts, how long a connection that has not delivered a whole request head
/// may still complete one (it is then served with `Connection: close`); idle ones close then.
pub const LATE_HEAD_GRACE: Duration = Duration::from_secs(2);

/// Serves one request of a connection, from reading its head to the end of its response.
pub trait ServeRequest: Send + Sync + 'static {
    /// Reads a request head from `session`, sets `head_read` once it has arrived whole (the
    /// head deadline then no longer applies), answers it, and says whether the connection can
    /// carry another request (HTTP/1.1) and whether the client cancelled it.
    fn serve(
        &self,
        session: ServerSession,
        head_read: &AtomicBool,
    ) -> impl Future<Output = Served> + Send;
}

/// What became of one served request, for the connection loop.
#[derive(Debug, Default)]
pub struct Served {
    /// HTTP/1.1: the connection, if it can carry another request.
    pub next: Option<ReusedHttpStream>,
    /// The client went away before its response was complete (HTTP/2 counts these, see
    /// [`super::h2`]).
    pub cancelled: bool,
}

/// Open connections and the draining flag, for the connection cap and the drain.
#[derive(Debug, Default)]
pub struct Lifecycle {
    connections: AtomicUsize,
    draining: AtomicBool,
    refused: AtomicU64,
    refusal_logged_s: AtomicU64,
}

/// Decrements its counter when dropped (also when a request task panics or is cancelled).
struct Held<'a>(&'a AtomicUsize);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lifecycle {
    /// Open client connections.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// The draining flag itself, for loops that poll it.
    pub fn draining_flag(&self) -> &AtomicBool {
        &self.draining
    }

    fn open_connection(&self, max: usize) -> Option<Held<'_>> {
        self.connections
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Held(&self.connections))
    }

    fn note_refusal(&self, max: usize, started: std::time::Instant) {
        crate::metrics::m().connections_refused.inc();
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        // At most one line a second: a flood must not become a flood of log lines.
        let now_s = started.elapsed().as_secs() + 1;
        let last = self.refusal_logged_s.load(Ordering::Relaxed);
        if now_s > last
            && self
                .refusal_logged_s
                .compare_exchange(last, now_s, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log::warn!(
                "{max} client connections are open (server.max_connections); closing new ones ({n} so far)"
            );
        }
    }
}

/// Limits of the connection loop, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub keepalive_s: u64,
    /// A TLS handshake must finish within this (and within the head deadline).
    pub tls_handshake_timeout: Duration,
    /// HTTP/2: over TLS when ALPN picks it; with prior knowledge on a plain listener when
    /// `h2c` is set.
    pub http2: bool,
    pub h2c: bool,
    /// Concurrent streams per HTTP/2 connection.
    pub h2_max_streams: u32,
    /// `server.max_header_bytes`, for HTTP/2's header-list limit.
    pub max_header_bytes: u32,
}

/// The protocol a connection speaks, once its first bytes (or its ALPN) said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// The HTTP/2 connection preface a prior-knowledge (h2c) client starts with.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The request server behind a connection cap, a head deadline and a drain-aware keep-alive loop.
pub struct Frontend<A> {
    app: Arc<A>,
    life: Arc<Lifecycle>,
    limits: ConnLimits,
    /// Set on a TLS listener: the handshake runs here (see [`super::tls`] for why).
    tls: Option<Acceptor>,
    epoch: std::time::Instant,
}

impl<A> Frontend<A> {
    /// A listener's server; `tls` makes it a TLS listener.
    pub fn new(
        app: Arc<A>,
        life: Arc<Lifecycle>,
        limits: ConnLimits,
        tls: Option<Acceptor>,
    ) -> Self {
        Frontend {
            app,
            life,
            limits,
            tls,
            epoch: std::time::Instant::now(),
        }
    }
}

/// Why a TLS handshake failed (a metric label).
fn count_handshake_failure(reason: &'static str) {
    crate::metrics::m()
        .tls_handshake_failures
        .with_label_values(&[reason])
        .inc();
}

impl<A: ServeRequest> Frontend<A> {
    /// The HTTP/1.1 keep-alive loop of one connection (pipelined requests included: each is
    /// answered in order, RFC 9112 §9.3.2).
    async fn http1(
        &self,
        mut stream: Stream,
        opened: Instant,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let limits = self.limits;
        let mut watch = shutdown.clone();
        let keepalive = Duration::from_secs(limits.keepalive_s);
        let mut settings: Option<HttpPersistentSettings> = None;
        let mut first = true;
        let head = AtomicBool::new(false);
        loop {
            // The whole head within `header_timeout`: from the connection's opening for its
            // first request; for a later one, after up to `keepalive` of idling (pingora closes
            // a connection idle that long before its next request's first byte).
            let head_by = if first {
                deadline(opened, limits.header_timeout)
            } else {
                deadline(Instant::now(), keepalive + limits.header_timeout)
            };
            let mut session = ServerSession::new_http1(stream);
            match settings.take() {
                Some(s) => s.apply_to_session(&mut session),
                None => {
                    session.set_keepalive(Some(limits.keepalive_s));
                    // Requests sent before their predecessor's answer are answered in order
                    // instead of lost with a closed connection (the settings carry it on).
                    session.set_pipelining_enabled(true);
                }
            }
            if *watch.borrow() || self.life.draining() {
                session.set_keepalive(None);
            }
            head.store(false, Ordering::Relaxed);
            let serve = self.app.serve(session, &head);
            tokio::pin!(serve);
            // Fast path: a keep-alive client's next head is usually in the socket already, and
            // one poll reads it and starts the request. Only a connection still waiting for
            // (the rest of) a head gets a timer and a shutdown watch: the common case costs no
            // timer registration (a driver wake-up per request) and no extra read.
            let polled = std::future::poll_fn(|cx| Poll::Ready(serve.as_mut().poll(cx))).await;
            let reusable = match polled {
                Poll::Ready(r) => r,
                Poll::Pending if head.load(Ordering::Relaxed) => serve.await,
                Poll::Pending => {
                    tokio::select! {
                        biased;
                        r = &mut serve => r,
                        _ = sleep_until(head_by) => {
                            if !head.load(Ordering::Relaxed) {
                                log::debug!(
                                    "closing a connection whose request head took over {:?}",
                                    limits.header_timeout
                                );
                                return None;
                            }
                            serve.await
                        }
                        _ = shutting_down(&mut watch) => {
                            self.life.start_draining();
                            // Idle, or a head on its way: a head that completes soon is served
                            // (with `Connection: close`); an idle connection is closed.
                            let grace = deadline(Instant::now(), LATE_HEAD_GRACE).min(head_by);
                            tokio::select! {
                                biased;
                                r = &mut serve => r,
                                _ = sleep_until(grace) => {
                                    if !head.load(Ordering::Relaxed) {
                                        return None;
                                    }
                                    serve.await
                                }
                            }
                        }
                    }
                }
            };
            let (next, next_settings) = reusable.next?.consume();
            stream = next;
            settings = next_settings;
            first = false;
        }
    }
}

/// The TLS handshake of a new connection, by `by`. Failures are counted and logged at `debug`
/// (a flood of garbage must not become a flood of log lines).
async fn handshake(acceptor: &Acceptor, stream: Stream, by: Instant) -> Option<Stream> {
    // The plain listener hands over pingora's L4 stream; TLS goes on top of it.
    let Ok(l4) = stream.into_any().downcast::<L4Stream>() else {
        log::error!("a TLS listener got a stream that is not TCP");
        return None;
    };
    match tokio::time::timeout_at(by, acceptor.tls_handshake(*l4)).await {
        Ok(Ok(tls)) => Some(Box::new(tls)),
        Ok(Err(e)) => {
            count_handshake_failure("error");
            log::debug!("TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            count_handshake_failure("timeout");
            log::debug!("TLS handshake did not finish in time");
            None
        }
    }
}

/// On a plain listener that takes h2c: reads until the first bytes tell an HTTP/2 connection
/// preface from an HTTP/1.1 request (the first byte usually does), then puts them back.
/// Bounded by the head deadline. Pingora's own peek waits for all 24 bytes of a preface, so a
/// complete HTTP/1.0 request shorter than that would wait out the deadline.
async fn sniff_h2c(stream: Stream, by: Instant) -> Option<(Stream, Protocol)> {
    let Ok(mut l4) = stream.into_any().downcast::<L4Stream>() else {
        log::error!("an h2c listener got a stream that is not TCP");
        return None;
    };
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let mut buf = [0u8; 24];
    let protocol = loop {
        if seen.len() >= H2_PREFACE.len() {
            break Protocol::Http2;
        }
        let want = H2_PREFACE.len() - seen.len();
        let n = match tokio::time::timeout_at(by, l4.read(&mut buf[..want])).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => n,
        };
        seen.extend_from_slice(&buf[..n]);
        if !H2_PREFACE.starts_with(&seen[..seen.len().min(H2_PREFACE.len())]) {
            break Protocol::Http1;
        }
    };
    l4.rewind(&seen);
    Some((l4, protocol))
}

/// Resolves once the server is shutting down.
async fn shutting_down(shutdown: &mut ShutdownWatch) {
    if shutdown.wait_for(|s| *s).await.is_err() {
        // The server is gone: nothing will ever be served again.
        std::future::pending::<()>().await;
    }
}

#[async_trait::async_trait]
impl<A: ServeRequest> ServerApp for Frontend<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let limits = self.limits;
        let Some(_connection) = self.life.open_connection(limits.max_connections) else {
            self.life.note_refusal(limits.max_connections, self.epoch);
            return None;
        };
        let opened = Instant::now();
        let head_by = deadline(opened, limits.header_timeout);
        let (stream, protocol) = match &self.tls {
            Some(acceptor) => {
                let by = deadline(opened, limits.tls_handshake_timeout).min(head_by);
                // Boxed, as the HTTP/2 loop below: their state would otherwise be laid out in
                // every connection's future, plain HTTP/1.1 ones included.
                let stream = Box::pin(handshake(acceptor, stream, by)).await?;
                let protocol = match stream.selected_alpn_proto() {
                    Some(ALPN::H2) if limits.http2 => Protocol::Http2,
                    _ => Protocol::Http1,
                };
                (stream, protocol)
            }
            None if limits.h2c => sniff_h2c(stream, head_by).await?,
            None => (stream, Protocol::Http1),
        };
        match protocol {
            Protocol::Http2 => {
                let h2_limits = H2Limits {
                    max_streams: limits.h2_max_streams,
                    max_header_bytes: limits.max_header_bytes,
                    idle: Duration::from_secs(limits.keepalive_s),
                };
                Box::pin(h2::serve_connection(
                    &self.app,
                    stream,
                    h2_limits,
                    head_by,
                    shutdown,
                    self.life.draining_flag(),
                ))
                .await;
                None
            }
            Protocol::Http1 => self.http1(stream, opened, shutdown).await,
        }
    }

    // No `cleanup`: see the module docs.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_counts_open_connections() {
        let life = Lifecycle::default();
        let a = life.open_connection(2);
        let b = life.open_connection(2);
        assert!(a.is_some() && b.is_some());
        assert!(life.open_connection(2).is_none());
        assert_eq!(life.connections(), 2);
        drop(a);
        assert!(life.open_connection(2).is_some());
        drop(b);
        assert_eq!(life.connections(), 0);
    }
}
