//! One upstream server of a model: its URL parsed into the parts the upstream client needs.
//!
//! By syntax alone: a host name is kept as written and resolved by the binary while it runs
//! (`quipu::upstream::resolve`), never here and never on the request path.

use http::uri::{Authority, InvalidUri, Uri};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// One upstream server of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The URL as configured (for logs and metrics labels).
    pub url: String,
    /// `https://`: the connection is TLS, verified as the model's `upstream_tls` says.
    pub tls: bool,
    /// `host:port` as written, sent as the `Host` header.
    pub authority: String,
    /// The host as written (an IP literal without brackets, or a name).
    pub host: String,
    pub port: u16,
    /// Where to connect when the host is an IP literal; for a name, the unroutable
    /// `0.0.0.0:0` (see [`Replica::is_resolved`]): the binary resolves names while it runs and
    /// keeps the current address with the replica's live state.
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

    /// The TLS server name to send and verify: the host as written (an IP literal is verified
    /// against the certificate's IP addresses).
    pub fn sni(&self) -> &str {
        &self.host
    }
}

/// [`Replica::addr`] of a named replica before it is resolved: port 0 of the unspecified
/// address, which a connect attempt can never reach.
const UNRESOLVED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// Parses `http[s]://host[:port][/path]`, by syntax alone. The URL's grammar is RFC 3986's,
/// read by [`http::Uri`]; what it may say is Quipu's: the scheme is `http` or `https`; there is
/// a host and no credentials, query or fragment; the host is an IPv4 literal, a bracketed IPv6
/// literal or a host name ([`is_host_name`]); the port, 80 (`http`) or 443 (`https`) if absent,
/// is 1 to 65535; the path, `/v1` if absent, is the OpenAI API root. Names are resolved by the
/// binary (`quipu::upstream::resolve`).
pub fn parse_replica(url: &str) -> Result<Replica, String> {
    let tls = url.starts_with("https://");
    if !tls && !url.starts_with("http://") {
        return Err(format!(
            "\"{url}\" must start with http:// or https:// (e.g. \"http://10.0.0.5:8000/v1\")"
        ));
    }
    let uri: Uri = url.parse().map_err(|e| unparsable(url, &e))?;
    // `Uri` drops a fragment without a word: look for one in the text.
    if uri.query().is_some() || url.contains('#') {
        return Err(format!(
            "\"{url}\": an upstream URL is a base path; remove the query or fragment"
        ));
    }
    let authority = uri
        .authority()
        .map(Authority::as_str)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| no_host(url))?;
    if authority.contains('@') {
        return Err(format!(
            "\"{url}\": credentials in an upstream URL are not sent; remove them and set upstream_api_key"
        ));
    }
    // `Uri` reads the host and port leniently (`[::1]x`, `host:http` pass with no port), so the
    // text after the host is checked here.
    let host_text = uri.host().unwrap_or_default();
    if host_text.is_empty() {
        return Err(no_host(url));
    }
    // The authority is the host then the port (no credentials, checked above).
    let after_host = authority
        .strip_prefix(host_text)
        .ok_or_else(|| no_host(url))?;
    let port = match after_host {
        "" if tls => 443,
        "" => 80,
        after => match after.strip_prefix(':') {
            Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad_port(url))?,
            Some(_) => return Err(bad_port(url)),
            None => return Err(format!("\"{url}\": expected `:port` after the IPv6 host")),
        },
    };
    let (host, ip) = match host_text
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
    {
        Some(v6) => match v6.parse::<Ipv6Addr>() {
            Ok(ip) => (v6, Some(IpAddr::V6(ip))),
            Err(_) => return Err(format!("\"{url}\": \"{v6}\" is not an IPv6 address")),
        },
        None => match host_text.parse::<Ipv4Addr>() {
            Ok(ip) => (host_text, Some(IpAddr::V4(ip))),
            Err(_) if is_host_name(host_text) => (host_text, None),
            Err(_) => {
                return Err(format!(
                    "\"{url}\": \"{host_text}\" is neither an IP address nor a host name"
                ))
            }
        },
    };
    let path = uri.path().trim_end_matches('/');
    let api_base = if path.is_empty() {
        "/v1".to_owned()
    } else {
        path.to_owned()
    };
    Ok(Replica {
        url: url.to_owned(),
        tls,
        authority: authority.to_owned(),
        host: host.to_owned(),
        port,
        addr: ip.map_or(UNRESOLVED, |ip| SocketAddr::new(ip, port)),
        chat_path: format!("{api_base}/chat/completions"),
        api_base,
    })
}

fn no_host(url: &str) -> String {
    format!("\"{url}\" has no host")
}

fn bad_port(url: &str) -> String {
    format!("\"{url}\": the port must be a number from 1 to 65535")
}

/// Why `Uri` refused an `http://` URL, in the operator's terms where the cause is plain.
fn unparsable(url: &str, e: &InvalidUri) -> String {
    let authority = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .and_then(|rest| rest.split(['/', '?', '#']).next())
        .unwrap_or_default();
    if authority.is_empty() {
        no_host(url)
    } else if authority.starts_with('[') && !authority.contains(']') {
        format!("\"{url}\": an IPv6 host needs its closing `]`")
    } else {
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        if host.parse::<Ipv6Addr>().is_ok() {
            return format!(
                "\"{url}\": an IPv6 host is written in brackets (e.g. \"http://[fd00::5]:8000/v1\")"
            );
        }
        if authority.starts_with('[') || is_host_name(host) || host.parse::<Ipv4Addr>().is_ok() {
            format!("\"{url}\" is not a valid URL ({e}); write it like \"http://10.0.0.5:8000/v1\"")
        } else {
            format!("\"{url}\": \"{host}\" is neither an IP address nor a host name")
        }
    }
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
