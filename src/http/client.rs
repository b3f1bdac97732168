//! One HTTP/1.1 exchange with an upstream replica, on pingora-core's connection pool.
//!
//! Quipu drives the upstream exchange itself instead of handing it to pingora-proxy's proxy
//! loop, because the routing key (the model) is inside a request body that can be far larger
//! than pingora's 64 KiB retry buffer, and because an LLM gateway needs what that loop cannot
//! give: the full body for failover to another replica, a real HTTP status for errors that come
//! before the first streamed byte, `ping` frames while a long prefill keeps the upstream silent,
//! and separate time-to-first-byte and idle timeouts. Connections still come from, and return
//! to, pingora's connection pool.
//!
//! The HTTP/1.1 layer is Quipu's own ([`crate::h1`] parses), on pingora's TCP connector and
//! connection pool. Memory per open stream matters here (10,000 of them must fit): a response
//! holds its connection and one read buffer, which starts at 4 KiB and grows only while reads
//! fill it; the body is handed out as slices of that buffer. Pingora's HTTP/1 client session
//! kept a 4 KiB head buffer, a 64 KiB body buffer and a header map per response. [`send`]
//! returns a boxed future, so its state is not laid out inside each request's future for the
//! whole life of a stream; inside it, pingora's connector future (~8 KiB with the TLS connector
//! in it, measured with `-Zprint-type-sizes`) is boxed again and built only when the pool has
//! no connection, so a pooled request moves ~1 KiB, not ~9 KiB. The bytes of the request and the response framing are [`crate::h1`]'s, pure and
//! tested there; this module only does the I/O.

use super::upstream_tls::UpstreamTlsMaterial;
use crate::config::Timeouts;
use crate::h1::{self, Body, Head, Step};
use bytes::Bytes;
use pingora::connectors::TransportConnector;
use pingora::protocols::Stream;
use pingora::upstreams::peer::{HttpPeer, Peer};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// A heap-allocated future (see the module docs for why some are).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long an idle upstream connection stays in the pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Why an upstream exchange failed: typed, so the relay decides on kinds, never on message
/// text. The strings are details for the log, never shown to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
    /// Could not connect (refused, unreachable, connect timeout): nothing was sent.
    Connect(String),
    /// The TLS handshake failed (a certificate that does not verify, no common protocol).
    Tls(String),
    /// The connection broke or closed early.
    Reset(String),
    /// No response head, or not the whole body, by the call's deadline.
    Timeout,
    /// The bytes are not HTTP/1.1 as it frames a response (a bad head, a bad chunk line).
    Framing(String),
    /// A response head or body over the limit (the number).
    TooLarge(usize),
}

impl UpstreamError {
    /// Label for `quipu_upstream_failures_total{kind}` and the pool's failure count.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Tls(_) => "tls",
            UpstreamError::Reset(_) => "reset",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Framing(_) => "framing",
            UpstreamError::TooLarge(_) => "too_large",
        }
    }
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "connect failed: {e}"),
            UpstreamError::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            UpstreamError::Reset(e) => write!(f, "connection broke: {e}"),
            UpstreamError::Timeout => write!(f, "timed out"),
            UpstreamError::Framing(e) => write!(f, "malformed response: {e}"),
            UpstreamError::TooLarge(n) => write!(f, "response over {n} bytes"),
        }
    }
}

/// An upstream response whose head has arrived; the body is read through [`Self::read`].
pub struct UpstreamResponse {
    conn: Connection,
    pub status: u16,
    pub retry_after: Option<u64>,
}

/// An upstream connection and what has been read from it.
struct Connection {
    stream: Stream,
    /// The peer's key in the connection pool (its `reuse_hash`).
    pool_key: u64,
    /// Bytes read from the upstream; `buf[pos..]` are not consumed yet.
    buf: Vec<u8>,
    pos: usize,
    body: Body,
    keep_alive: bool,
}

/// Where one exchange goes: a replica's current address, its `Host`, and its TLS, if any.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub addr: SocketAddr,
    /// `host:port` as configured, sent as `Host`.
    pub authority: &'a str,
    /// `https://`: the server name to send and verify, and the model's TLS settings.
    pub tls: Option<(&'a str, &'a UpstreamTlsMaterial)>,
}

/// The pingora peer of a target. With TLS, pingora's rustls connector verifies the server
/// against the CA (or the system's roots) unless `verify = false`, and presents the client
/// certificate if one is set; the handshake shares the connect timeout.
fn peer_for(target: &Target<'_>, timeouts: &Timeouts) -> HttpPeer {
    let mut peer = match target.tls {
        None => HttpPeer::new(target.addr, false, String::new()),
        Some((sni, tls)) => {
            let mut peer = HttpPeer::new(target.addr, true, sni.to_owned());
            peer.options.verify_cert = tls.verify;
            peer.options.verify_hostname = tls.verify;
            peer.options.ca = tls.ca.clone();
            peer.client_cert_key = tls.client.clone();
            peer.group_key = tls.group_key;
            peer
        }
    };
    peer.options.connection_timeout = Some(timeouts.connect);
    peer.options.total_connection_timeout = Some(timeouts.connect);
    peer
}

/// A connector error, typed: a TLS failure is told apart from a connect failure so that a
/// wrong CA reads as what it is in the log.
fn connect_error(e: Box<pingora::Error>) -> UpstreamError {
    match e.etype() {
        pingora::ErrorType::TLSHandshakeFailure
        | pingora::ErrorType::TLSHandshakeTimedout
        | pingora::ErrorType::InvalidCert
        | pingora::ErrorType::HandshakeError => UpstreamError::Tls(e.to_string()),
        _ => UpstreamError::Connect(e.to_string()),
    }
}

/// One request to send to one replica.
pub struct Call<'a> {
    /// `POST` with `body`, or `GET` (with an empty `body`).
    pub method: h1::Method,
    pub target: Target<'a>,
    pub timeouts: &'a Timeouts,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: &'a str,
    pub body: &'a [u8],
    /// Sent as `x-request-id`, so upstream logs correlate with Quipu's.
    pub request_id: &'a str,
    /// Sent as `Authorization: Bearer` (vLLM `--api-key`).
    pub api_key: Option<&'a str>,
    /// When the response header must have arrived (a deadline, not a duration, so that one
    /// timeout covers the header and the body that follows it).
    pub header_deadline: Instant,
}

/// Sends the call and waits for the response head.
///
/// A pooled connection that turns out to be dead is retried once on a fresh connection before
/// the error is reported.
///
/// An error before a response head is [`UpstreamError::Connect`] / [`UpstreamError::Tls`]
/// (nothing sent), [`UpstreamError::Reset`] (broke while sending or before any response byte:
/// safe to retry elsewhere, the upstream cannot have answered) or [`UpstreamError::Timeout`].
pub fn send<'a>(
    connector: &'a TransportConnector,
    call: &'a Call<'_>,
) -> BoxFuture<'a, Result<UpstreamResponse, UpstreamError>> {
    Box::pin(send_unboxed(connector, call))
}

async fn send_unboxed(
    connector: &TransportConnector,
    call: &Call<'_>,
) -> Result<UpstreamResponse, UpstreamError> {
    let Call {
        method,
        target,
        timeouts,
        path,
        body,
        request_id,
        api_key,
        header_deadline,
    } = *call;
    let peer = peer_for(&target, timeouts);
    let request = h1::Request {
        method,
        path,
        authority: target.authority,
        body,
        request_id,
        api_key,
    };
    let wire = h1::request(&request).map_err(UpstreamError::Connect)?;
    // A small body goes out with the head, in one write.
    let rest = if request.body_inline() { &[][..] } else { body };
    let write_timeout = timeouts.connect.max(Duration::from_secs(10));
    let mut fresh_only = false;
    loop {
        // A pooled connection first; only a new one pays for the connector's future (boxed:
        // with TLS it is ~8 KiB, and would otherwise be copied with every request's state).
        let pooled = match fresh_only {
            false => connector.reused_stream(&peer).await,
            true => None,
        };
        let (stream, reused) = match pooled {
            Some(s) => (s, true),
            None => {
                let s = Box::pin(connector.new_stream(&peer)).await;
                (s.map_err(connect_error)?, false)
            }
        };
        let mut conn = Connection::new(stream, peer.reuse_hash());
        let result = match tokio::time::timeout(write_timeout, conn.write(&wire, rest)).await {
            Err(_) => Err(UpstreamError::Reset("timed out sending the request".into())),
            Ok(Err(e)) => Err(UpstreamError::Reset(e.to_string())),
            Ok(Ok(())) => match tokio::time::timeout_at(header_deadline, conn.read_head()).await {
                Err(_) => Err(UpstreamError::Timeout),
                Ok(Err(e)) => Err(e),
                Ok(Ok(head)) => Ok(head),
            },
        };
        match result {
            Ok(head) => {
                return Ok(UpstreamResponse {
                    conn,
                    status: head.status,
                    retry_after: head.retry_after,
                })
            }
            // A stale keep-alive connection: try once more on a new one.
            Err(UpstreamError::Reset(_)) if reused && !fresh_only => {
                fresh_only = true;
                continue;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A read from the upstream body.
pub enum Read<'a> {
    Data(&'a [u8]),
    End,
}

/// The read buffer's first size: a response head and a few streamed chunks fit.
const INITIAL_BUF: usize = 4096;
/// The read buffer grows (doubling) while reads fill it, up to this.
const MAX_BUF: usize = 64 * 1024;
/// The longest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

impl Connection {
    fn new(stream: Stream, pool_key: u64) -> Connection {
        Connection {
            stream,
            pool_key,
            buf: Vec::with_capacity(INITIAL_BUF),
            pos: 0,
            body: Body::new(h1::Framing::Length(0)),
            keep_alive: false,
        }
    }

    async fn write(&mut self, wire: &[u8], rest: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(wire).await?;
        if !rest.is_empty() {
            self.stream.write_all(rest).await?;
        }
        self.stream.flush().await
    }

    /// Reads until a final (not 1xx) response head has arrived, and sets up its body.
    async fn read_head(&mut self) -> Result<Head, UpstreamError> {
        loop {
            let unread = &self.buf[self.pos..];
            // Nothing buffered yet (a fresh response): read before parsing.
            let parsed = if unread.is_empty() {
                None
            } else {
                h1::parse_head(unread).map_err(UpstreamError::Framing)?
            };
            if let Some((head, len)) = parsed {
                self.pos += len;
                if head.is_informational() {
                    continue;
                }
                if head.status == 101 {
                    return Err(UpstreamError::Framing(
                        "the upstream switched protocols".into(),
                    ));
                }
                self.body = Body::new(head.framing);
                self.keep_alive = head.keep_alive;
                return Ok(head);
            }
            if self.buf.len() - self.pos > MAX_HEAD {
                return Err(UpstreamError::TooLarge(MAX_HEAD));
            }
            if self.fill().await? == 0 {
                return Err(UpstreamError::Reset(
                    "the upstream closed the connection before a response head".into(),
                ));
            }
        }
    }

    /// Reads more bytes; 0 means the upstream closed the connection. Consumed bytes are
    /// dropped first, so the buffer only grows when reads keep filling it (a fast upstream) or
    /// one frame does not fit.
    async fn fill(&mut self) -> Result<usize, UpstreamError> {
        if self.pos == self.buf.len() {
            self.buf.clear();
        } else if self.pos > 0 {
            self.buf.drain(..self.pos);
        }
        self.pos = 0;
        if self.buf.len() == self.buf.capacity() {
            self.buf.reserve(self.buf.capacity().max(INITIAL_BUF));
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| UpstreamError::Reset(e.to_string()))?;
        if n == room && self.buf.capacity() < MAX_BUF {
            self.buf.reserve(self.buf.capacity());
        }
        Ok(n)
    }
}

impl UpstreamResponse {
    /// The next piece of the body, without a copy. Not a timeout: callers race it against
    /// their own clocks (it is cancel-safe).
    pub async fn read(&mut self) -> Result<Read<'_>, UpstreamError> {
        let c = &mut self.conn;
        loop {
            let at = c.pos;
            let (used, step) = c.body.step(&c.buf[at..]).map_err(UpstreamError::Framing)?;
            c.pos += used;
            match step {
                Step::Data(r) => return Ok(Read::Data(&c.buf[at + r.start..at + r.end])),
                Step::End => return Ok(Read::End),
                Step::More => {
                    if c.fill().await? == 0 {
                        c.body.at_eof().map_err(UpstreamError::Framing)?;
                        return Ok(Read::End);
                    }
                }
            }
        }
    }

    /// Reads the whole body, up to `limit` bytes, within `timeout`.
    pub async fn read_all(
        &mut self,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, UpstreamError> {
        let by = super::deadline(Instant::now(), timeout);
        self.read_all_by(limit, by).await
    }

    /// Reads the whole body, up to `limit` bytes, by `deadline`.
    pub async fn read_all_by(
        &mut self,
        limit: usize,
        deadline: Instant,
    ) -> Result<Bytes, UpstreamError> {
        let mut buf = Vec::new();
        let read = async {
            loop {
                match self.read().await? {
                    Read::Data(b) => {
                        if buf.len() + b.len() > limit {
                            return Err(UpstreamError::TooLarge(limit));
                        }
                        buf.extend_from_slice(b);
                    }
                    Read::End => return Ok(()),
                }
            }
        };
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(())) => Ok(Bytes::from(buf)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    /// Returns the connection to the pool if the body was read to its end and nothing came
    /// after it; otherwise closes it (which makes vLLM abort a generation still running).
    pub fn finish(self, connector: &TransportConnector) {
        let c = self.conn;
        if c.keep_alive && c.body.is_done() && c.pos == c.buf.len() {
            connector.release_stream(c.stream, c.pool_key, Some(POOL_IDLE));
        }
    }
}
