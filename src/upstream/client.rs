//! One HTTP/1.1 exchange with an upstream replica, on pingora-core's pooled connector.
//!
//! Quipu drives the upstream exchange itself instead of handing it to pingora-proxy's proxy
//! loop, because the routing key (the model) is inside a request body that can be far larger
//! than pingora's 64 KiB retry buffer, and because an LLM gateway needs what that loop cannot
//! give: the full body for failover to another replica, a real HTTP status for errors that come
//! before the first streamed byte, `ping` frames while a long prefill keeps the upstream silent,
//! and separate time-to-first-byte and idle timeouts. Connections still come from, and return
//! to, pingora's connection pool.
//!
//! Memory per open stream matters here (10,000 of them must fit): the response keeps its
//! connection boxed, and [`send`] and [`UpstreamResponse::finish`] return boxed futures. Their
//! state (pingora's connector, 4–5 KiB each) would otherwise be laid out inside every caller's
//! future, and so inside each request's, for the whole life of a stream.

use crate::config::{Replica, Timeouts};
use bytes::Bytes;
use http::HeaderValue;
use pingora::connectors::http::v1::Connector;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v1::client::HttpSession;
use pingora::upstreams::peer::HttpPeer;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;

/// A heap-allocated future (see the module docs for why some are).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long an idle upstream connection stays in the pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Why an attempt failed before a response header arrived.
#[derive(Debug)]
pub enum SendError {
    /// Could not connect (refused, unreachable, connect timeout): safe to retry elsewhere.
    Connect(String),
    /// The connection broke while sending or before any response byte: safe to retry
    /// elsewhere (no byte reached the client, and the upstream cannot have answered).
    Broken(String),
    /// No response header by the call's deadline.
    Timeout,
}

impl SendError {
    pub fn kind(&self) -> &'static str {
        match self {
            SendError::Connect(_) => "connect",
            SendError::Broken(_) => "reset",
            SendError::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "connect failed: {e}"),
            SendError::Broken(e) => write!(f, "connection broke: {e}"),
            SendError::Timeout => write!(f, "no response in time"),
        }
    }
}

/// An upstream response whose header has arrived; the body is read through [`Self::read`].
pub struct UpstreamResponse {
    conn: Box<Connection>,
    pub status: u16,
    pub retry_after: Option<u64>,
}

/// The connection of a response, and the peer it goes back to the pool under.
struct Connection {
    session: HttpSession,
    peer: HttpPeer,
}

fn peer_for(replica: &Replica, timeouts: &Timeouts) -> HttpPeer {
    let mut peer = HttpPeer::new(replica.addr, false, String::new());
    peer.options.connection_timeout = Some(timeouts.connect);
    peer.options.total_connection_timeout = Some(timeouts.connect);
    // Timeouts of reads are applied per phase by the caller (first byte vs idle).
    peer.options.read_timeout = None;
    peer.options.write_timeout = Some(timeouts.connect.max(Duration::from_secs(10)));
    peer.options.idle_timeout = Some(POOL_IDLE);
    peer
}

/// One request to send to one replica.
pub struct Call<'a> {
    pub replica: &'a Replica,
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

/// Sends the call and waits for the response header.
///
/// A pooled connection that turns out to be dead is retried once on a fresh connection before
/// the error is reported.
pub fn send<'a>(
    connector: &'a Connector,
    call: &'a Call<'_>,
) -> BoxFuture<'a, Result<UpstreamResponse, SendError>> {
    Box::pin(send_unboxed(connector, call))
}

async fn send_unboxed(
    connector: &Connector,
    call: &Call<'_>,
) -> Result<UpstreamResponse, SendError> {
    let Call {
        replica,
        timeouts,
        path,
        body,
        request_id,
        api_key,
        header_deadline,
    } = *call;
    let peer = peer_for(replica, timeouts);
    let mut fresh_only = false;
    loop {
        let (mut session, reused) = if fresh_only {
            (
                connector
                    .get_http_session(&peer)
                    .await
                    .map(|(s, _)| s)
                    .map_err(|e| SendError::Connect(e.to_string()))?,
                false,
            )
        } else {
            connector
                .get_http_session(&peer)
                .await
                .map_err(|e| SendError::Connect(e.to_string()))?
        };
        let header = request_header(replica, path, body.len(), request_id, api_key)
            .map_err(|e| SendError::Connect(e.to_string()))?;
        let sent = async {
            session.write_request_header(Box::new(header)).await?;
            session.write_body(body).await?;
            session.finish_body().await?;
            Ok::<(), Box<pingora::Error>>(())
        }
        .await;
        let result = match sent {
            Err(e) => Err(SendError::Broken(e.to_string())),
            Ok(()) => match tokio::time::timeout_at(header_deadline, session.read_response()).await
            {
                Err(_) => Err(SendError::Timeout),
                Ok(Err(e)) => Err(SendError::Broken(e.to_string())),
                Ok(Ok(_)) => Ok(()),
            },
        };
        match result {
            Ok(()) => {
                let (status, retry_after) = match session.resp_header() {
                    Some(h) => (h.status.as_u16(), retry_after(h)),
                    None => return Err(SendError::Broken("no response header".into())),
                };
                return Ok(UpstreamResponse {
                    conn: Box::new(Connection { session, peer }),
                    status,
                    retry_after,
                });
            }
            // A stale keep-alive connection: try once more on a new one.
            Err(SendError::Broken(_)) if reused && !fresh_only => {
                fresh_only = true;
                continue;
            }
            Err(e) => return Err(e),
        }
    }
}

fn request_header(
    replica: &Replica,
    path: &str,
    len: usize,
    request_id: &str,
    api_key: Option<&str>,
) -> pingora::Result<RequestHeader> {
    // No case map: upstreams read header names case-insensitively.
    let mut h = RequestHeader::build_no_case(http::Method::POST, path.as_bytes(), Some(5))?;
    h.insert_header("host", replica.authority.as_str())?;
    h.insert_header("content-type", HeaderValue::from_static("application/json"))?;
    h.insert_header("content-length", HeaderValue::from(len))?;
    h.insert_header("x-request-id", request_id)?;
    if let Some(key) = api_key {
        h.insert_header("authorization", format!("Bearer {key}"))?;
    }
    Ok(h)
}

fn retry_after(h: &ResponseHeader) -> Option<u64> {
    h.headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v.ceil() as u64)
}

/// A read from the upstream body.
pub enum Read<'a> {
    Data(&'a [u8]),
    End,
}

impl UpstreamResponse {
    /// The next piece of the body. Not a timeout: callers race it against their own clocks.
    pub async fn read(&mut self) -> Result<Read<'_>, String> {
        match self.conn.session.read_body_ref().await {
            Ok(Some(b)) => Ok(Read::Data(b)),
            Ok(None) => Ok(Read::End),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Reads the whole body, up to `limit` bytes, within `timeout`.
    pub async fn read_all(&mut self, limit: usize, timeout: Duration) -> Result<Bytes, String> {
        let by = crate::proxy::conn::deadline(Instant::now(), timeout);
        self.read_all_by(limit, by).await
    }

    /// Reads the whole body, up to `limit` bytes, by `deadline`.
    pub async fn read_all_by(&mut self, limit: usize, deadline: Instant) -> Result<Bytes, String> {
        let mut buf = Vec::new();
        let read = async {
            loop {
                match self.conn.session.read_body_ref().await {
                    Ok(Some(b)) => {
                        if buf.len() + b.len() > limit {
                            return Err(format!("response body over {limit} bytes"));
                        }
                        buf.extend_from_slice(b);
                    }
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        };
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(())) => Ok(Bytes::from(buf)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("timed out reading the response body".into()),
        }
    }

    /// Returns the connection to the pool if the body was read to its end; otherwise closes it
    /// (which makes vLLM abort a generation still running).
    pub fn finish(self, connector: &Connector) -> BoxFuture<'_, ()> {
        let Connection { mut session, peer } = *self.conn;
        Box::pin(async move {
            if session.is_body_done() {
                session.respect_keepalive();
                connector
                    .release_http_session(session, &peer, Some(POOL_IDLE))
                    .await;
            } else {
                session.shutdown().await;
            }
        })
    }
}
