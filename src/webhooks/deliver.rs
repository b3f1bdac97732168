//! One delivery over HTTP/1.1: resolve, connect (TLS for `https://`, on pingora's connector,
//! which verifies the server against the system's roots), send the signed `POST`, read the
//! answer's status. One connection per delivery, closed after it (deliveries are rare); the
//! answer's body is not read.

use pingora::connectors::TransportConnector;
use pingora::upstreams::peer::HttpPeer;
use quipu_core::governance::webhooks::endpoint::EndpointUrl;
use quipu_core::h1;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest answer head read.
const MAX_HEAD: usize = 16 * 1024;

/// Sends `request` (the bytes of `endpoint::request`) to `url` within `timeout` (resolving,
/// connecting, sending and the answer's head); the answer's status, or why there is none.
pub async fn post(
    connector: &TransportConnector,
    url: &EndpointUrl,
    request: &[u8],
    timeout: Duration,
) -> Result<u16, String> {
    match tokio::time::timeout(timeout, exchange(connector, url, request, timeout)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

async fn exchange(
    connector: &TransportConnector,
    url: &EndpointUrl,
    request: &[u8],
    timeout: Duration,
) -> Result<u16, String> {
    let addr = tokio::net::lookup_host((url.host.as_str(), url.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", url.host))?;
    let sni = if url.tls {
        url.host.clone()
    } else {
        String::new()
    };
    let mut peer = HttpPeer::new(addr, url.tls, sni);
    peer.options.connection_timeout = Some(timeout);
    peer.options.total_connection_timeout = Some(timeout);
    let mut stream = connector
        .new_stream(&peer)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("sending failed: {e}"))?;
    stream
        .flush()
        .await
        .map_err(|e| format!("sending failed: {e}"))?;
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut pos = 0;
        while pos < buf.len() {
            match h1::parse_head(&buf[pos..]) {
                Ok(Some((head, len))) if head.is_informational() => pos += len,
                Ok(Some((head, _))) => return Ok(head.status),
                Ok(None) => break,
                Err(e) => return Err(format!("not an HTTP answer: {e}")),
            }
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("an answer head over {MAX_HEAD} bytes"));
        }
        let n = stream
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("reading the answer failed: {e}"))?;
        if n == 0 {
            return Err("the connection closed before an answer".into());
        }
    }
}
