//! One delivery over HTTP/1.1: resolve, connect (TLS for `https://`, on pingora's connector,
//! which verifies the server against the system's roots), send the signed `POST`, read the
//! answer's status. One connection per delivery, closed after it (deliveries are rare); the
//! answer's body is not read.
//!
//! With `public_only` (a tenant's endpoint, unless `webhook_delivery.tenant_private_urls`), the
//! address the name resolves to must be a public one: the check is on the address connected
//! to, so a name that resolves differently later (DNS rebinding) cannot get around it.

use pingora::connectors::TransportConnector;
use pingora::upstreams::peer::HttpPeer;
use quipu_core::governance::webhooks::endpoint::EndpointUrl;
use quipu_core::h1;
use quipu_core::translate::image_url::ip_is_public;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The longest answer head read.
const MAX_HEAD: usize = 16 * 1024;

/// Why a delivery got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAnswer {
    /// Worth trying again (a timeout, a refused connection, a broken answer).
    Failed(String),
    /// Never to be sent: the endpoint is at an address it may not be at.
    Forbidden(String),
}

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoAnswer::Failed(m) | NoAnswer::Forbidden(m) => f.write_str(m),
        }
    }
}

/// Sends `request` (the bytes of `endpoint::request`) to `url` within `timeout` (resolving,
/// connecting, sending and the answer's head); the answer's status, or why there is none.
pub async fn post(
    connector: &TransportConnector,
    url: &EndpointUrl,
    request: &[u8],
    timeout: Duration,
    public_only: bool,
) -> Result<u16, NoAnswer> {
    let addr = tokio::time::timeout(timeout, resolve(url))
        .await
        .unwrap_or_else(|_| Err(format!("cannot resolve {} within the timeout", url.host)))
        .map_err(NoAnswer::Failed)?;
    if public_only && !ip_is_public(addr.ip()) {
        return Err(NoAnswer::Forbidden(format!(
            "{} is at {}, an internal address, where tenants' endpoints may not be \
             (webhook_delivery.tenant_private_urls)",
            url.host,
            addr.ip()
        )));
    }
    match tokio::time::timeout(timeout, exchange(connector, url, addr, request, timeout)).await {
        Ok(result) => result.map_err(NoAnswer::Failed),
        Err(_) => Err(NoAnswer::Failed(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

async fn resolve(url: &EndpointUrl) -> Result<SocketAddr, String> {
    tokio::net::lookup_host((url.host.as_str(), url.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", url.host))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", url.host))
}

async fn exchange(
    connector: &TransportConnector,
    url: &EndpointUrl,
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<u16, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A one-connection server that reads the request head and answers `answer` (or closes
    /// without a word when it is empty); the request it read.
    async fn serve_once(answer: &'static [u8]) -> (EndpointUrl, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            if !answer.is_empty() {
                s.write_all(answer).await.unwrap();
            }
            got
        });
        let url = EndpointUrl::parse(&format!("http://127.0.0.1:{port}/in")).unwrap();
        (url, task)
    }

    #[tokio::test]
    async fn the_status_after_informational_heads_is_the_answer() {
        let (url, task) =
            serve_once(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n").await;
        let connector = TransportConnector::new(None);
        let request = b"POST /in HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
        let status = post(&connector, &url, request, Duration::from_secs(5), false).await;
        assert_eq!(status, Ok(204));
        assert!(task.await.unwrap().starts_with(b"POST /in HTTP/1.1"));
    }

    #[tokio::test]
    async fn no_answer_a_refused_connection_and_silence_are_errors() {
        let connector = TransportConnector::new(None);
        let request = b"POST /in HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
        let (url, _task) = serve_once(b"").await;
        let e = post(&connector, &url, request, Duration::from_secs(5), false)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed before an answer"), "{e}");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = EndpointUrl::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        let e = post(&connector, &url, request, Duration::from_secs(5), false)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, NoAnswer::Failed(m) if m.contains("cannot connect")),
            "{e}"
        );
        // The same address for a tenant's endpoint: refused before any connection.
        let e = post(&connector, &url, request, Duration::from_secs(5), true)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, NoAnswer::Forbidden(m) if m.contains("internal address")),
            "{e}"
        );

        // Accepts, reads, never answers: the timeout ends it.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _held = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let url = EndpointUrl::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        let e = post(&connector, &url, request, Duration::from_millis(200), false)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("no answer within 200 ms"), "{e}");
    }
}
