//! A webhook endpoint as far as it is pure: its URL ([`EndpointUrl`], `http://` or
//! `https://`, checked once), the events it subscribes to ([`EventFilter`]), and the bytes of
//! one delivery ([`request`]): an HTTP/1.1 `POST` of the event's JSON with its signature and
//! its id in the headers:
//!
//! ```text
//! POST /hooks/quipu HTTP/1.1
//! host: example.com
//! content-type: application/json
//! content-length: 187
//! user-agent: quipu-webhooks/1
//! quipu-event-id: evt_5c1f…
//! quipu-event-type: topup.received
//! quipu-signature: t=1795782600,v1=6a0c…
//! connection: close
//! ```

use super::event::EVENT_TYPES;
use std::fmt;

/// Where deliveries go: the scheme, the host and port to connect to, and the request target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointUrl {
    /// `https://`.
    pub tls: bool,
    /// A name or an IP literal (without brackets).
    pub host: String,
    pub port: u16,
    /// The path and query, `/` at least.
    pub target: String,
    /// The URL as written.
    pub url: String,
}

impl EndpointUrl {
    /// Parses `http(s)://host[:port][/path][?query]`: no user info, no fragment, no spaces or
    /// control characters.
    pub fn parse(url: &str) -> Result<EndpointUrl, String> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!(
                "a webhook URL must start with http:// or https://, got {url:?}"
            ));
        };
        if url.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!(
                "a webhook URL may not contain spaces or control characters: {url:?}"
            ));
        }
        if url.contains('#') {
            return Err(format!("a webhook URL may not have a #fragment: {url:?}"));
        }
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, target) = rest.split_at(split);
        if authority.contains('@') {
            return Err(format!(
                "a webhook URL may not carry user info (user@): {url:?}"
            ));
        }
        let (host, port) = split_port(authority).ok_or_else(|| {
            format!("a webhook URL needs a host and, if any, a numeric port: {url:?}")
        })?;
        let target = match target {
            "" => "/".to_owned(),
            t if t.starts_with('?') => format!("/{t}"),
            t => t.to_owned(),
        };
        Ok(EndpointUrl {
            tls,
            host: host.to_owned(),
            port: port.unwrap_or(if tls { 443 } else { 80 }),
            target,
            url: url.to_owned(),
        })
    }

    /// `host:port` as the `Host` header names it (brackets around an IPv6 literal, no port
    /// when it is the scheme's).
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl fmt::Display for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

/// `host[:port]`, `[v6][:port]` → the host and the port, if given.
fn split_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p != 0)?),
    };
    Some((host, port))
}

/// The events an endpoint receives: all of them, or the named ones.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum EventFilter {
    #[default]
    All,
    Only(Vec<&'static str>),
}

impl EventFilter {
    /// From the names as written (`["topup.received", "balance.low"]`); `"*"` or no names at
    /// all is every event. An unknown name is an error that lists the known ones.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<EventFilter, String> {
        let mut only = Vec::new();
        for name in names {
            let name = name.as_ref().trim();
            if name == "*" {
                return Ok(EventFilter::All);
            }
            match EVENT_TYPES.iter().find(|t| **t == name) {
                Some(t) if !only.contains(t) => only.push(*t),
                Some(_) => {}
                None => {
                    return Err(format!(
                        "unknown webhook event {name:?}; the events are {} (or \"*\" for all)",
                        EVENT_TYPES.join(", ")
                    ))
                }
            }
        }
        Ok(if only.is_empty() {
            EventFilter::All
        } else {
            EventFilter::Only(only)
        })
    }

    /// As stored: `*`, or the names comma-separated.
    pub fn to_text(&self) -> String {
        match self {
            EventFilter::All => "*".to_owned(),
            EventFilter::Only(names) => names.join(","),
        }
    }

    /// What [`EventFilter::to_text`] wrote.
    pub fn from_text(text: &str) -> Result<EventFilter, String> {
        let names: Vec<&str> = text.split(',').filter(|n| !n.trim().is_empty()).collect();
        EventFilter::parse(&names)
    }

    /// The names, as an answer lists them (`["*"]` for all).
    pub fn names(&self) -> Vec<&'static str> {
        match self {
            EventFilter::All => vec!["*"],
            EventFilter::Only(names) => names.clone(),
        }
    }

    /// Whether an event of type `kind` goes to the endpoint.
    pub fn matches(&self, kind: &str) -> bool {
        match self {
            EventFilter::All => true,
            EventFilter::Only(names) => names.contains(&kind),
        }
    }
}

/// The headers of a delivery besides the framing.
pub const EVENT_ID_HEADER: &str = "Quipu-Event-Id";
pub const EVENT_TYPE_HEADER: &str = "Quipu-Event-Type";

/// One delivery's request bytes (see the module docs): `body` is the event's JSON,
/// `signature` the [`sign`](super::signature::sign) header value for it. The connection is
/// closed after the answer (deliveries are rare; no pool to keep).
pub fn request(
    url: &EndpointUrl,
    event_id: &str,
    kind: &str,
    signature: &str,
    body: &[u8],
) -> Vec<u8> {
    let mut w = Vec::with_capacity(320 + url.target.len() + body.len());
    w.extend_from_slice(b"POST ");
    w.extend_from_slice(url.target.as_bytes());
    w.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    w.extend_from_slice(url.authority().as_bytes());
    w.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
    w.extend_from_slice(body.len().to_string().as_bytes());
    w.extend_from_slice(b"\r\nuser-agent: quipu-webhooks/1\r\n");
    for (name, value) in [
        (EVENT_ID_HEADER, event_id),
        (EVENT_TYPE_HEADER, kind),
        (super::signature::HEADER, signature),
    ] {
        w.extend_from_slice(name.as_bytes());
        w.extend_from_slice(b": ");
        // Ids, type names and signatures are ASCII Quipu wrote; drop anything else rather
        // than let it break the head.
        w.extend(value.bytes().filter(|b| (0x20..0x7f).contains(b)));
        w.extend_from_slice(b"\r\n");
    }
    w.extend_from_slice(b"connection: close\r\n\r\n");
    w.extend_from_slice(body);
    w
}

/// Whether an endpoint's answer counts as delivered: any 2xx. Anything else (a redirect
/// included: deliveries do not follow them) is a failed attempt, retried.
pub fn delivered(status: u16) -> bool {
    (200..300).contains(&status)
}
