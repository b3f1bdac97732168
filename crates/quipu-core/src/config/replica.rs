//! One upstream server of a model: its URL parsed into the parts the upstream client needs.
//!
//! By syntax alone: a host name is kept as written and resolved later by the binary, once at
//! `serve` start (`quipu::upstream::resolve`), never here and never on the request path.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// One upstream server of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The URL as configured (for logs and metrics labels).
    pub url: String,
    /// `host:port` as written, sent as the `Host` header.
    pub authority: String,
    /// The host as written (an IP literal without brackets, or a name).
    pub host: String,
    pub port: u16,
    /// Where to connect. Set by parsing when the host is an IP literal; for a name, by the
    /// binary at start (`quipu::upstream::resolve`; until then the unroutable `0.0.0.0:0`, see
    /// [`Replica::is_resolved`]). The gateway never resolves names on the request path.
    pub addr: SocketAddr,
    /// Path of the OpenAI API root, `/v1` unless the URL says otherwise.
    pub api_base: String,
    /// `{api_base}/chat/completions`, built once rather than per request.
    chat_path: String,
}

impl Replica {
    pub fn chat_path(&self) -> &str {
        &self.chat_path
    }

    /// Whether [`Replica::addr`] is known: an IP literal, or a name already resolved.
    pub fn is_resolved(&self) -> bool {
        self.addr != UNRESOLVED
    }
}

/// [`Replica::addr`] of a named replica before it is resolved: port 0 of the unspecified
/// address, which a connect attempt can never reach.
const UNRESOLVED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// Parses `http://host:port[/path]`, by syntax alone: the host is an IPv4 literal, a bracketed
/// IPv6 literal or a host name (letters, digits, `-`, `_`, dot-separated labels); the port
/// defaults to 80. Names are resolved later, by the binary (`quipu::upstream::resolve`).
pub fn parse_replica(url: &str) -> Result<Replica, String> {
    let rest = if let Some(r) = url.strip_prefix("http://") {
        r
    } else if url.starts_with("https://") {
        return Err(format!(
            "\"{url}\": https upstreams are not supported by this build; reach the upstream over http inside its network"
        ));
    } else {
        return Err(format!(
            "\"{url}\" must start with http:// (e.g. \"http://10.0.0.5:8000/v1\")"
        ));
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if path.contains(['?', '#']) {
        return Err(format!(
            "\"{url}\": an upstream URL is a base path; remove the query or fragment"
        ));
    }
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("\"{url}\" has no host"));
    }
    let (host, port_text) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("\"{url}\": an IPv6 host needs its closing `]`"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("\"{url}\": expected `:port` after the IPv6 host"))?,
            ),
        };
        (inside, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port_text {
        None => 80,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("\"{url}\": the port must be a number from 1 to 65535"))?,
    };
    let ip: Option<IpAddr> = if authority.starts_with('[') {
        Some(IpAddr::V6(host.parse::<Ipv6Addr>().map_err(|_| {
            format!("\"{url}\": \"{host}\" is not an IPv6 address")
        })?))
    } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
        Some(IpAddr::V4(v4))
    } else if is_host_name(host) {
        None
    } else {
        return Err(format!(
            "\"{url}\": \"{host}\" is neither an IP address nor a host name"
        ));
    };
    let path = path.trim_end_matches('/');
    let api_base = if path.is_empty() {
        "/v1".to_owned()
    } else {
        path.to_owned()
    };
    Ok(Replica {
        url: url.to_owned(),
        authority: authority.to_owned(),
        host: host.to_owned(),
        port,
        addr: ip.map_or(UNRESOLVED, |ip| SocketAddr::new(ip, port)),
        chat_path: format!("{api_base}/chat/completions"),
        api_base,
    })
}

/// A DNS name as resolvers take it: dot-separated labels of letters, digits, `-` and `_`
/// (1–63 bytes each, at most 253 in all, one trailing dot allowed), whose last label is not
/// all digits (that would be a malformed IPv4 address).
fn is_host_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let labels_ok = name.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    let last_numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && !last_numeric
}
