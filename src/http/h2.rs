//! HTTP/2 to clients: over TLS when ALPN picks `h2`, and h2c with prior knowledge on a plain
//! listener. Pingora's HTTP/2 sessions and the `h2` crate do the protocol; this is the
//! connection's accept loop, Quipu's own for the limits pingora's (private) loop does not
//! have:
//!
//! - **a handshake deadline** (the request-head deadline: a client that opens a connection and
//!   never finishes the preface holds nothing for long);
//! - **a cap on live request tasks per connection** ([`H2Limits::max_streams`]). The `h2` crate
//!   stops counting a stream against `SETTINGS_MAX_CONCURRENT_STREAMS` as soon as the client
//!   resets it, even while its request is still being served, so "open, then cancel" (the
//!   rapid-reset attack, CVE-2023-44487) would otherwise start unbounded work. A stream over
//!   the cap is refused with `REFUSED_STREAM`, which clients retry;
//! - **a cancel budget**: a connection whose client cancelled more than
//!   [`CANCELS_PER_WINDOW`] requests within [`CANCEL_WINDOW`] is closed with `GOAWAY
//!   (ENHANCE_YOUR_CALM)`. Every accepted request can start GPU work upstream; a well-behaved
//!   client does not cancel hundreds a second;
//! - **a malformed-stream budget** ([`MAX_REJECTED`]) shared across the connection's life
//!   (pingora's public accept call resets it at every call);
//! - **an idle timeout** (`server.keepalive_timeout_s` without a live request) and **a graceful
//!   drain**: on shutdown the connection gets `GOAWAY`, its open requests finish.
//!
//! What `h2` enforces itself, with the settings from [`options`]: the header-list size
//! (`server.max_header_bytes`: an HPACK bomb is refused while decoding, a longer head gets
//! `431`), CONTINUATION floods (bounded since h2 0.4.4), resets of not-yet-accepted streams
//! (`max_pending_accept_reset_streams`), PING and SETTINGS floods, and flow control: a response
//! write waits for the client's window, so a slow stream holds back its own upstream exactly as
//! a slow HTTP/1.1 client does.

use super::{ServeRequest, Served};
use pingora::protocols::http::v2::server::{self as v2, H2Accept, H2Options};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Digest, Stream};
use pingora::server::ShutdownWatch;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep_until, Instant};

/// A connection that sent this many malformed or refused streams is closed.
pub const MAX_REJECTED: usize = 32;
/// Client cancellations tolerated per connection per [`CANCEL_WINDOW`].
pub const CANCELS_PER_WINDOW: usize = 200;
pub const CANCEL_WINDOW: Duration = Duration::from_secs(10);

/// Limits of one HTTP/2 connection.
#[derive(Debug, Clone, Copy)]
pub struct H2Limits {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`, and the cap on live request tasks.
    pub max_streams: u32,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`.
    pub max_header_bytes: u32,
    /// Without a live request for this long, the connection is closed.
    pub idle: Duration,
}

/// The `h2` settings Quipu serves with.
pub fn options(limits: &H2Limits) -> H2Options {
    let mut o = v2::default_h2_options();
    o.max_concurrent_streams(limits.max_streams)
        .max_header_list_size(limits.max_header_bytes)
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(Some(256))
        // Request bodies of coding agents are hundreds of KiB: a 64 KiB window would take a
        // round trip per 64 KiB. The connection window bounds what one client can make the
        // gateway buffer unread.
        .initial_window_size(1 << 20)
        .initial_connection_window_size(4 << 20)
        // Per-stream response bytes queued before a write waits for the client's window.
        .max_send_buffer_size(256 * 1024);
    o
}

/// Why an HTTP/2 connection was closed by the gateway, or a stream refused (a metric label).
/// Every close for misbehaviour is counted once, whichever layer made it: this loop's own
/// budgets, or the `h2` crate's (a `GOAWAY` it sent for the client's frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum Abuse {
    /// Over [`MAX_REJECTED`] malformed or refused streams.
    Rejected,
    /// Over [`CANCELS_PER_WINDOW`] cancellations in [`CANCEL_WINDOW`].
    Cancels,
    /// Streams refused for the live-task cap (counted, not a reason to close by itself).
    Refused,
    /// `h2` closed the connection with `GOAWAY(ENHANCE_YOUR_CALM)`: streams reset before they
    /// were accepted (the rapid-reset attack as published), or floods of locally reset streams,
    /// CONTINUATION or DATA frames.
    Flood,
    /// `h2` closed the connection with another error `GOAWAY`: the client broke the protocol
    /// (`PROTOCOL_ERROR`, an HPACK `COMPRESSION_ERROR`, `FRAME_SIZE_ERROR`, flow control).
    ProtocolError,
}

impl Abuse {
    /// Why `h2` closed a connection, when it closed it for the client's misbehaviour: a
    /// `GOAWAY` it sent itself with an error code. A client's own `GOAWAY`, a clean close and
    /// an I/O error are not misbehaviour.
    pub fn of_connection_error(e: &pingora::Error) -> Option<Abuse> {
        let h2 = e.root_cause().downcast_ref::<h2::Error>()?;
        if !(h2.is_go_away() && h2.is_library()) {
            return None;
        }
        match h2.reason()? {
            h2::Reason::NO_ERROR => None,
            h2::Reason::ENHANCE_YOUR_CALM => Some(Abuse::Flood),
            _ => Some(Abuse::ProtocolError),
        }
    }
}

fn count_abuse(kind: Abuse) {
    let label: &str = kind.into();
    crate::metrics::m()
        .h2_abuse
        .with_label_values(&[label])
        .inc();
}

/// Serves one HTTP/2 connection until the client closes it, it idles out, it is drained at
/// shutdown, or it misbehaves.
pub async fn serve_connection<A: ServeRequest>(
    app: &Arc<A>,
    stream: Stream,
    limits: H2Limits,
    handshake_by: Instant,
    shutdown: &ShutdownWatch,
    draining: &AtomicBool,
) {
    let digest = Arc::new(Digest {
        ssl_digest: stream.get_ssl_digest(),
        timing_digest: stream.get_timing_digest(),
        proxy_digest: stream.get_proxy_digest(),
        socket_digest: stream.get_socket_digest(),
    });
    let handshake = v2::handshake(stream, Some(options(&limits)));
    let mut conn = match tokio::time::timeout_at(handshake_by, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            log::debug!("HTTP/2 handshake failed: {e}");
            return;
        }
        Err(_) => {
            log::debug!("HTTP/2 handshake did not finish in time");
            return;
        }
    };
    let live = Arc::new(Live {
        count: AtomicUsize::new(0),
        last_end: parking_lot::Mutex::new(Instant::now()),
    });
    let cancels = Arc::new(CancelWindow::default());
    let mut watch = shutdown.clone();
    let mut rejected = 0usize;
    let mut goaway_sent = false;
    // Why this loop closed the connection for misbehaviour, once it has.
    let mut closed_for: Option<Abuse> = None;
    loop {
        if !goaway_sent && (*watch.borrow() || draining.load(Ordering::Relaxed)) {
            conn.graceful_shutdown();
            goaway_sent = true;
        }
        // Wakes at least once per idle period to look again (a request ending wakes nothing).
        let now = Instant::now();
        let idle_by = if live.count.load(Ordering::Relaxed) == 0 {
            super::deadline(*live.last_end.lock(), limits.idle)
        } else {
            super::deadline(now, limits.idle)
        };
        let accepted = tokio::select! {
            biased;
            a = v2::HttpSession::from_h2_conn(&mut conn, digest.clone()) => a,
            _ = watch.changed(), if !goaway_sent => continue,
            _ = sleep_until(idle_by), if !goaway_sent => {
                let idle_for = live.last_end.lock().elapsed();
                if live.count.load(Ordering::Relaxed) == 0 && idle_for >= limits.idle {
                    conn.graceful_shutdown();
                    goaway_sent = true;
                }
                continue;
            }
        };
        match accepted {
            Ok(Some(H2Accept::Session(session))) => {
                if cancels.exceeded() {
                    close_for(&mut conn, &mut closed_for, Abuse::Cancels);
                    continue;
                }
                let n = live.count.load(Ordering::Relaxed);
                if n >= limits.max_streams as usize {
                    count_abuse(Abuse::Refused);
                    let mut refused = session;
                    refused.shutdown_with_reason(h2::Reason::REFUSED_STREAM);
                    rejected += 1;
                } else {
                    live.count.fetch_add(1, Ordering::Relaxed);
                    spawn_stream(app.clone(), session, live.clone(), cancels.clone());
                }
            }
            Ok(Some(H2Accept::Rejected)) => rejected += 1,
            Ok(None) => return,
            Err(e) => {
                // The connection is counted once: a close of this loop's ends the same way.
                if let (None, Some(kind)) = (closed_for, Abuse::of_connection_error(&e)) {
                    count_abuse(kind);
                }
                log::debug!("HTTP/2 connection ended: {e}");
                return;
            }
        }
        if rejected > MAX_REJECTED {
            close_for(&mut conn, &mut closed_for, Abuse::Rejected);
        }
    }
}

/// Closes the connection with `GOAWAY(ENHANCE_YOUR_CALM)` for `kind`, counted once per
/// connection (streams already in flight may trip a budget again before the close lands).
fn close_for(
    conn: &mut h2::server::Connection<Stream, bytes::Bytes>,
    closed_for: &mut Option<Abuse>,
    kind: Abuse,
) {
    if closed_for.is_none() {
        count_abuse(kind);
        *closed_for = Some(kind);
    }
    conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
}

/// Serves one stream in its own task, so the connection's other streams go on meanwhile.
fn spawn_stream<A: ServeRequest>(
    app: Arc<A>,
    session: v2::HttpSession,
    live: Arc<Live>,
    cancels: Arc<CancelWindow>,
) {
    tokio::spawn(async move {
        let _live = LiveGuard(live);
        // The head arrived with the stream: no head deadline applies.
        let head = AtomicBool::new(true);
        let served: Served = app.serve(ServerSession::new_http2(session), &head).await;
        if served.cancelled {
            cancels.note();
        }
    });
}

/// A connection's live request tasks, and when the last one ended (for the idle timeout).
struct Live {
    count: AtomicUsize,
    last_end: parking_lot::Mutex<Instant>,
}

/// Gives a live-task slot back when the task ends, however it ends.
struct LiveGuard(Arc<Live>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        *self.0.last_end.lock() = Instant::now();
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Client cancellations of one connection in the current window.
#[derive(Default)]
struct CancelWindow {
    state: parking_lot::Mutex<(Option<Instant>, usize)>,
}

impl CancelWindow {
    fn note(&self) {
        let mut s = self.state.lock();
        let now = Instant::now();
        match s.0 {
            Some(start) if now.duration_since(start) < CANCEL_WINDOW => s.1 += 1,
            _ => *s = (Some(now), 1),
        }
    }

    fn exceeded(&self) -> bool {
        let s = self.state.lock();
        s.1 > CANCELS_PER_WINDOW && s.0.is_some_and(|start| start.elapsed() < CANCEL_WINDOW)
    }
}
