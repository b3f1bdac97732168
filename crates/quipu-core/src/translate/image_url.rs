//! Which image URLs a client may have the upstream fetch. One function for both client
//! formats ([`check_image_url`]), so the chat and messages translators cannot drift apart.
//!
//! The gateway never fetches a URL itself, but vLLM and SGLang fetch the `image_url` of a
//! request server-side, from inside the inference network. Forwarding any URL would let a
//! client make the model server request `http://169.254.169.254/…` (cloud metadata, with its
//! credentials) or any internal host: a server-side request forgery. So with the default
//! policy ([`ImageUrlPolicy::Forward`]) only URLs that name a public host are forwarded:
//!
//! - the scheme is `http` or `https`, and the URL has no whitespace, control characters or
//!   backslashes (parsers disagree on those: `\` is a path separator to some);
//! - no userinfo (`user:pass@host`, the classic way to hide the real host);
//! - an IP literal must be a global unicast address: not loopback, private (RFC 1918),
//!   shared (100.64/10), link-local, unique-local, unspecified, multicast, reserved,
//!   benchmarking or documentation space, nor an IPv6 address that embeds such an IPv4
//!   address (mapped, compatible, NAT64, 6to4). IPv4 is read the way resolvers and URL
//!   parsers read it, so `http://2130706433/`, `http://0x7f.1/` and `http://0177.0.0.1/` are
//!   all 127.0.0.1;
//! - a host name must contain a dot and may not be `localhost`, `*.localhost` or end in a
//!   suffix reserved for private or special use (`.local`, `.internal`, `.home.arpa`, …); it
//!   must be ASCII (IDNA mapping can turn other characters into `localhost`) without
//!   percent-escapes.
//!
//! What no syntactic check can stop is a public name that resolves to a private address (DNS
//! rebinding, `127.0.0.1.nip.io`): only the fetcher can, so operators should also restrict
//! the upstream (`vllm serve --allowed-media-domains …`, an egress firewall). Operators whose
//! upstream is restricted that way may choose [`ImageUrlPolicy::ForwardAny`] (any http(s)
//! URL); [`ImageUrlPolicy::Reject`] accepts inline (base64) images only.

use crate::config::ImageUrlPolicy;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Why an image URL is not forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageUrlRejection {
    /// The operator accepts no image URLs (`image_urls = "reject"`).
    NotAccepted,
    /// This URL may not be fetched; the reason, written for the client.
    Refused(String),
}

impl ImageUrlRejection {
    pub fn message(&self) -> String {
        match self {
            ImageUrlRejection::NotAccepted => {
                "image URLs are not accepted by this gateway; send the image inline as base64"
                    .to_owned()
            }
            ImageUrlRejection::Refused(why) => why.clone(),
        }
    }
}

fn refuse(why: impl Into<String>) -> Result<(), ImageUrlRejection> {
    Err(ImageUrlRejection::Refused(why.into()))
}

/// Host-name suffixes for private or special use (RFC 6761, RFC 8375, ICANN's `.internal`,
/// and the unofficial ones home and office networks use).
const PRIVATE_SUFFIXES: &[&str] = &[
    "localhost",
    "local",
    "localdomain",
    "internal",
    "intranet",
    "lan",
    "home",
    "corp",
    "private",
    "home.arpa",
    "test",
    "invalid",
    "example",
];

/// Whether `url` (decoded, as the upstream will read it) may be forwarded under `policy`.
pub fn check_image_url(url: &str, policy: ImageUrlPolicy) -> Result<(), ImageUrlRejection> {
    if policy == ImageUrlPolicy::Reject {
        return Err(ImageUrlRejection::NotAccepted);
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return refuse("image URLs must start with http:// or https://");
    };
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return refuse("only http:// and https:// image URLs are accepted");
    }
    if policy == ImageUrlPolicy::ForwardAny {
        return Ok(());
    }
    if url.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'\\') {
        return refuse(
            "an image URL may not contain whitespace, control characters or backslashes",
        );
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return refuse("image URLs may not carry credentials (user@host)");
    }
    // (host, the port as written if there is a `:`)
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((inside, after)) = v6.split_once(']') else {
            return refuse("the image URL's IPv6 host lacks its closing `]`");
        };
        match after {
            "" => (inside, None),
            _ => match after.strip_prefix(':') {
                Some(p) => (inside, Some(p)),
                None => return refuse("the image URL has text after its IPv6 host"),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if let Some(p) = port {
        let digits = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !(digits && p.parse::<u16>().is_ok_and(|p| p > 0)) {
            return refuse("the image URL's port must be a number from 1 to 65535");
        }
    }
    if host.is_empty() {
        return refuse("the image URL has no host");
    }
    if authority.starts_with('[') {
        let Ok(ip) = host.parse::<Ipv6Addr>() else {
            return refuse(format!("\"{host}\" is not a valid IPv6 address"));
        };
        return if v6_is_public(ip) {
            Ok(())
        } else {
            refuse(format!(
                "image URLs may not point to a private, local or reserved address ({ip})"
            ))
        };
    }
    if !host.is_ascii() {
        return refuse(
            "the image URL's host must be ASCII; write an internationalized name in its xn-- form",
        );
    }
    if host.contains('%') {
        return refuse("the image URL's host may not contain percent-escapes");
    }
    let name = host.to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    let last = name.rsplit('.').next().unwrap_or_default();
    if ends_in_number(last) {
        return match parse_ipv4(name) {
            Some(ip) if v4_is_public(ip) => Ok(()),
            Some(ip) => refuse(format!(
                "image URLs may not point to a private, local or reserved address ({ip})"
            )),
            None => refuse(format!("\"{host}\" is not a valid IPv4 address")),
        };
    }
    if !name.split('.').all(|l| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }) {
        return refuse(format!("\"{host}\" is not a valid host name"));
    }
    if !name.contains('.') {
        return refuse(format!(
            "\"{host}\" is not a public host name (it has no dot); image URLs must name a public host"
        ));
    }
    if let Some(s) = PRIVATE_SUFFIXES
        .iter()
        .find(|s| name == **s || name.strip_suffix(**s).is_some_and(|h| h.ends_with('.')))
    {
        return refuse(format!(
            "\"{host}\" is a private or special-use name (.{s}); image URLs must name a public host"
        ));
    }
    Ok(())
}

/// Whether a host's last label makes URL parsers read it as IPv4 (WHATWG "ends in a number"):
/// all digits, or `0x` and hex digits.
fn ends_in_number(label: &str) -> bool {
    if !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    label
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// IPv4 as `inet_aton` and URL parsers read it: one to four parts, each decimal, octal
/// (leading `0`) or hex (`0x`); the last part fills the remaining bytes (`127.1`,
/// `2130706433`).
fn parse_ipv4(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for p in &parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"))
        {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (*p, 10)
        };
        if digits.is_empty() && radix != 16 {
            return None;
        }
        let mut v: u64 = 0;
        for c in digits.chars() {
            let d = u64::from(c.to_digit(radix)?);
            v = v.checked_mul(u64::from(radix))?.checked_add(d)?;
            if v > u64::from(u32::MAX) {
                return None;
            }
        }
        values.push(v);
    }
    let (last, init) = values.split_last()?;
    if init.iter().any(|v| *v > 255) {
        return None;
    }
    let last_bits = 8 * (4 - init.len() as u32);
    if last_bits < 32 && *last >= 1u64 << last_bits {
        return None;
    }
    let mut n: u64 = 0;
    for (i, v) in init.iter().enumerate() {
        n |= v << (24 - 8 * i as u32);
    }
    n |= last;
    u32::try_from(n).ok().map(Ipv4Addr::from)
}

/// A globally routable unicast address (what an internal target is not: loopback, private,
/// link-local and cloud metadata, CGNAT, documentation, multicast, …). Shared with the webhook
/// sender, which delivers to tenants' endpoints only at such addresses unless told otherwise.
pub fn ip_is_public(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4_is_public(v4),
        std::net::IpAddr::V6(v6) => v6_is_public(v6),
    }
}

/// A globally routable unicast IPv4 address.
fn v4_is_public(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0                                   // "this network", unspecified
        || a == 10                             // private
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || a == 127                            // loopback
        || (a == 169 && b == 254)              // link-local (cloud metadata)
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0)      // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2)      // documentation
        || (a == 192 && b == 168)              // private
        || (a == 198 && (b == 18 || b == 19))  // benchmarking
        || (a == 198 && b == 51 && c == 100)   // documentation
        || (a == 203 && b == 0 && c == 113)    // documentation
        || a >= 224) // multicast, reserved, broadcast
}

/// A globally routable unicast IPv6 address, whose embedded IPv4 address (if any) is too.
fn v6_is_public(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    // ::/96 (unspecified, loopback, IPv4-compatible) and ::ffff:0:0/96 (IPv4-mapped).
    if s[..5] == [0; 5] && (s[5] == 0 || s[5] == 0xffff) {
        return v4_is_public(embedded(s[6], s[7]));
    }
    // NAT64, well-known prefix 64:ff9b::/96; the local-use prefix 64:ff9b:1::/48.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_is_public(embedded(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return false;
    }
    // 6to4: 2002:AABB:CCDD::/48 routes to AA.BB.CC.DD.
    if s[0] == 0x2002 {
        return v4_is_public(embedded(s[1], s[2]));
    }
    !((s[0] & 0xfe00) == 0xfc00      // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
        || (s[0] & 0xff00) == 0xff00 // multicast ff00::/8
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) // discard-only 100::/64
        || (s[0] == 0x2001 && s[1] == 0xdb8)) // documentation 2001:db8::/32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward(url: &str) -> Result<(), ImageUrlRejection> {
        check_image_url(url, ImageUrlPolicy::Forward)
    }

    #[test]
    fn public_urls_pass() {
        for url in [
            "https://example.com/cat.png",
            "http://example.com/cat.png",
            "HTTPS://Images.Example.COM:8443/a/b.jpg?size=2#x",
            "https://upload.wikimedia.org/wikipedia/commons/a/a9/Example.jpg",
            "https://example.com.",
            "https://8.8.8.8/x.png",
            "https://1.1.1.1:443/x.png",
            "https://[2606:4700:4700::1111]/x.png",
            "https://[2001:4860:4860::8888]:8080/x.png",
            "https://xn--nandu-pta.pe/logo.png",
            "https://my_bucket.s3.amazonaws.com/a.png",
            "https://172.32.0.1/x",
            "https://100.128.0.1/x",
            "https://[::ffff:8.8.8.8]/x",
            "https://[2002:808:808::1]/x",
        ] {
            assert_eq!(forward(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn internal_targets_are_refused() {
        for url in [
            // cloud metadata, loopback, private, link-local
            "http://169.254.169.254/latest/meta-data/",
            "http://127.0.0.1/",
            "http://127.255.255.254:8000/",
            "http://10.0.0.5:8000/v1/models",
            "http://172.16.0.1/",
            "http://172.31.255.255/",
            "http://192.168.1.1/",
            "http://100.64.0.1/",
            "http://100.100.100.200/latest/meta-data",
            "http://192.0.0.192/",
            "http://0.0.0.0/",
            "http://0/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://198.18.0.1/",
            // IPv4 in the forms resolvers and URL parsers accept
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://127.0.1/",
            "http://0xA9.0xFE.0xA9.0xFE/",
            "http://0251.0376.0251.0376/",
            "http://2852039166/",
            "http://127.0.0.1./",
            // IPv6
            "http://[::1]/",
            "http://[::]/",
            "http://[0:0:0:0:0:0:0:1]:8000/",
            "http://[fe80::1]/",
            "http://[fd00:ec2::254]/",
            "http://[fc00::1]/",
            "http://[ff02::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[64:ff9b:1::1]/",
            "http://[2002:7f00:1::]/",
            "http://[2002:a9fe:a9fe::1]/",
            "http://[fec0::1]/",
            // names
            "http://localhost/",
            "http://LOCALHOST:8000/",
            "http://localhost./",
            "http://api.localhost/",
            "http://metadata/computeMetadata/v1/",
            "http://metadata.google.internal/computeMetadata/v1/",
            "http://vllm-0/",
            "http://printer.local/",
            "http://router.home.arpa/",
            "http://nas.lan/",
            "http://intranet.corp/",
        ] {
            let e = forward(url).expect_err(url);
            assert!(matches!(e, ImageUrlRejection::Refused(_)), "{url}");
        }
    }

    #[test]
    fn confusing_urls_are_refused() {
        for url in [
            "ftp://example.com/a.png",
            "file:///etc/passwd",
            "gopher://example.com/",
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
            "example.com/a.png",
            "//example.com/a.png",
            "https://user:pass@example.com/a.png",
            "https://example.com@169.254.169.254/",
            "https://169.254.169.254#@example.com/",
            "https://example.com\\@127.0.0.1/",
            "https://exa mple.com/",
            "https://example.com/a b.png",
            "https://example.com\t/",
            "https:///a.png",
            "https://:443/a.png",
            "https://example.com:0/",
            "https://example.com:65536/",
            "https://example.com:+80/",
            "https://example.com:/",
            "https://[::1/",
            "https://[fe80::1%25eth0]/",
            "https://%6c%6fcalhost/",
            "https://ⓛocalhost/",
            "https://ex..ample.com/",
            "https://1.2.3.4.5/",
            "https://256.0.0.1/",
            "https://0x100000000/",
            "https://4294967296/",
            "https://1.2.3.09/",
            "https://example.123/",
        ] {
            assert!(forward(url).is_err(), "{url}");
        }
    }

    #[test]
    fn ipv4_parsing_matches_inet_aton() {
        for (text, want) in [
            ("127.0.0.1", Some([127, 0, 0, 1])),
            ("2130706433", Some([127, 0, 0, 1])),
            ("0x7f.1", Some([127, 0, 0, 1])),
            ("0177.1", Some([127, 0, 0, 1])),
            ("127.1.1", Some([127, 1, 0, 1])),
            ("0x", Some([0, 0, 0, 0])),
            ("0", Some([0, 0, 0, 0])),
            ("255.255.255.255", Some([255, 255, 255, 255])),
            ("4294967295", Some([255, 255, 255, 255])),
            ("4294967296", None),
            ("1.16777216", None),
            ("1.2.65536", None),
            ("256.1", None),
            ("08", None),
            ("1.2.3.4.5", None),
            ("1..2", None),
        ] {
            assert_eq!(parse_ipv4(text), want.map(Ipv4Addr::from), "{text}");
        }
    }

    #[test]
    fn policies() {
        let internal = "http://169.254.169.254/latest";
        assert_eq!(
            check_image_url(internal, ImageUrlPolicy::Reject),
            Err(ImageUrlRejection::NotAccepted)
        );
        assert_eq!(
            check_image_url("https://example.com/a.png", ImageUrlPolicy::Reject),
            Err(ImageUrlRejection::NotAccepted)
        );
        // forward_any: the operator's upstream restricts fetching; only the scheme is checked.
        assert_eq!(
            check_image_url(internal, ImageUrlPolicy::ForwardAny),
            Ok(())
        );
        assert!(check_image_url("file:///etc/passwd", ImageUrlPolicy::ForwardAny).is_err());
        assert!(forward(internal).unwrap_err().message().contains("private"));
    }
}
