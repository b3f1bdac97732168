//! Upstream replica URLs: what parses, what is refused, and that parsing never resolves names.

use super::*;

#[test]
fn replica_urls() {
    let r = parse_replica("http://127.0.0.1:9000/openai/v1/").unwrap();
    assert_eq!(r.api_base, "/openai/v1");
    assert_eq!(r.authority, "127.0.0.1:9000");
    assert_eq!(r.addr, "127.0.0.1:9000".parse().unwrap());
    assert!(r.is_resolved());
    let r = parse_replica("http://[::1]:8000/v1").unwrap();
    assert_eq!(r.addr, "[::1]:8000".parse().unwrap());
    assert_eq!(r.authority, "[::1]:8000");
    let r = parse_replica("http://[fd00::5]").unwrap();
    assert_eq!(r.addr, "[fd00::5]:80".parse().unwrap());
    // A name is checked for syntax only; its address comes at start.
    let r = parse_replica("http://localhost").unwrap();
    assert_eq!((r.host.as_str(), r.port), ("localhost", 80));
    assert!(!r.is_resolved());
    let r = parse_replica("http://vllm-0.vllm.svc.cluster.local:8000/v1").unwrap();
    assert_eq!(
        (r.host.as_str(), r.port),
        ("vllm-0.vllm.svc.cluster.local", 8000)
    );
    let r = parse_replica("https://llm.example.com/v1").unwrap();
    assert!(r.tls);
    assert_eq!(
        (r.port, r.sni(), r.authority.as_str()),
        (443, "llm.example.com", "llm.example.com")
    );
    let r = parse_replica("https://10.0.0.5:8443").unwrap();
    assert_eq!((r.tls, r.port, r.sni()), (true, 8443, "10.0.0.5"));
    assert!(!parse_replica("http://x:1").unwrap().tls);
    assert!(parse_replica("ftp://x:1")
        .unwrap_err()
        .contains("http:// or https://"));
    for bad in [
        "10.0.0.1:80",
        "http://",
        "http://user@host:80",
        "http://host:0",
        "http://host:65536",
        "http://host:http",
        "http://[::1",
        "http://[::1]x",
        "http://[not-v6]:80",
        "http://10.0.0.256",
        "http://bad host",
        "http://-lead.example",
        "http://a..b",
        "http://host/v1?x=1",
        "http://ñ.example",
    ] {
        assert!(parse_replica(bad).is_err(), "{bad}");
    }
}

#[test]
fn parsing_never_resolves_names() {
    // A name that no resolver knows parses fine: no DNS at parse time (the binary resolves
    // names at start, see quipu::upstream::resolve, tested there).
    let text = MINIMAL.replace(
        "http://127.0.0.1:8000",
        "http://vllm-a.invalid:8000\", \"http://10.0.0.9:8001",
    );
    let c = parse(&text).unwrap();
    let rs = &c.models[0].replicas;
    assert!(!rs[0].is_resolved());
    assert_eq!((rs[0].host.as_str(), rs[0].port), ("vllm-a.invalid", 8000));
    assert_eq!(rs[1].addr, "10.0.0.9:8001".parse().unwrap());
    // Syntactic duplicates are caught at parse time.
    let text = MINIMAL.replace(
        "http://127.0.0.1:8000",
        "http://Host.example:8000\", \"http://host.example:8000/v1",
    );
    assert!(parse(&text).unwrap_err().0[0].contains("repeats"));
}

/// `(authority, host, port, addr, api_base)` of a URL that parses.
fn parts(url: &str) -> (String, String, u16, String, String) {
    let r = parse_replica(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    (r.authority, r.host, r.port, r.addr.to_string(), r.api_base)
}

fn refusal(url: &str) -> String {
    match parse_replica(url) {
        Ok(r) => panic!("{url} parsed: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn ipv6_literals() {
    let p = |a: &str, h: &str, port, addr: &str| {
        (
            a.to_owned(),
            h.to_owned(),
            port,
            addr.to_owned(),
            "/v1".to_owned(),
        )
    };
    assert_eq!(
        parts("http://[::1]:8000"),
        p("[::1]:8000", "::1", 8000, "[::1]:8000")
    );
    assert_eq!(
        parts("http://[fd00::5]"),
        p("[fd00::5]", "fd00::5", 80, "[fd00::5]:80")
    );
    assert_eq!(
        parts("http://[::ffff:10.0.0.1]:9000/"),
        p(
            "[::ffff:10.0.0.1]:9000",
            "::ffff:10.0.0.1",
            9000,
            "[::ffff:10.0.0.1]:9000"
        )
    );
    for (url, says) in [
        ("http://[::1", "needs its closing `]`"),
        ("http://[::1/v1", "needs its closing `]`"),
        ("http://[::1]x", "expected `:port` after the IPv6 host"),
        ("http://[::1]:", "the port must be a number from 1 to 65535"),
        ("http://[not-v6]:80", "\"not-v6\" is not an IPv6 address"),
        ("http://[v1.x]", "\"v1.x\" is not an IPv6 address"),
        ("http://::1:8000", "an IPv6 host is written in brackets"),
        (
            "http://fd00::5:8000/v1",
            "an IPv6 host is written in brackets",
        ),
    ] {
        let e = refusal(url);
        assert!(
            e.starts_with(&format!("\"{url}\"")) && e.contains(says),
            "{url}: {e}"
        );
    }
}

#[test]
fn ports() {
    for (url, port) in [
        ("http://h", 80),
        ("http://h:1", 1),
        ("http://h:8000/v1", 8000),
        ("http://h:080", 80),
        ("http://h:65535", 65535),
    ] {
        assert_eq!(parts(url).2, port, "{url}");
        assert_eq!(
            parts(url).0,
            url["http://".len()..].split('/').next().unwrap()
        );
    }
    for url in [
        "http://h:0",
        "http://h:65536",
        "http://h:99999999",
        "http://h:http",
        "http://h:",
        "http://h:+80",
        "http://h:-1",
        "http://10.0.0.1:8 0",
    ] {
        let e = refusal(url);
        assert!(
            e.contains("the port must be a number from 1 to 65535")
                || e.contains("is not a valid URL"),
            "{url}: {e}"
        );
    }
    assert!(refusal("http://h:80:90").contains("\"h:80\" is neither an IP address nor a host name"));
}

#[test]
fn paths() {
    for (url, base, chat) in [
        ("http://h", "/v1", "/v1/chat/completions"),
        ("http://h/", "/v1", "/v1/chat/completions"),
        ("http://h/v1", "/v1", "/v1/chat/completions"),
        (
            "http://h:9000/openai/v1/",
            "/openai/v1",
            "/openai/v1/chat/completions",
        ),
        ("http://h/a%20b", "/a%20b", "/a%20b/chat/completions"),
        ("http://h//v1", "//v1", "//v1/chat/completions"),
    ] {
        let r = parse_replica(url).unwrap();
        assert_eq!((r.api_base.as_str(), r.chat_path()), (base, chat), "{url}");
    }
    for (url, says) in [
        ("http://h/v1?x=1", "remove the query or fragment"),
        ("http://h/v1?", "remove the query or fragment"),
        ("http://h?x", "remove the query or fragment"),
        ("http://h/v1#top", "remove the query or fragment"),
        ("http://h#top", "remove the query or fragment"),
        // Bytes a request line cannot carry are refused, not sent upstream.
        ("http://h/a b", "is not a valid URL"),
        ("http://h/a\tb", "is not a valid URL"),
        ("http://h/a\r\nHost: x", "is not a valid URL"),
    ] {
        let e = refusal(url);
        assert!(e.contains(says), "{url}: {e}");
    }
}

#[test]
fn credentials_are_refused() {
    for url in [
        "http://user@h:80",
        "http://user:secret@h",
        "http://@h",
        "http://u@[::1]:8000/v1",
    ] {
        let e = refusal(url);
        assert!(e.contains("credentials in an upstream URL"), "{url}: {e}");
        assert!(e.contains("upstream_api_key"), "{url}: {e}");
    }
}

#[test]
fn schemes() {
    for (url, says) in [
        ("ftp://h", "must start with http://"),
        ("HTTP://h", "must start with http://"),
        ("http:/h", "must start with http://"),
        ("http:h", "must start with http://"),
        ("//h:80", "must start with http://"),
        ("10.0.0.1:80", "must start with http://"),
        ("h:80/v1", "must start with http://"),
        ("", "must start with http://"),
    ] {
        let e = refusal(url);
        assert!(e.contains(says), "{url}: {e}");
    }
    for url in ["https://h:1", "https://h/v1"] {
        assert!(parse_replica(url).unwrap().tls, "{url}");
    }
    for url in [
        "http://",
        "http:///v1",
        "http://:80",
        "http://?x",
        "https://",
        "https://:443",
    ] {
        let e = refusal(url);
        assert!(
            e.ends_with("has no host") || e.contains("query"),
            "{url}: {e}"
        );
    }
}

#[test]
fn hosts() {
    for (url, host) in [
        ("http://localhost", "localhost"),
        ("http://vllm_0.svc.", "vllm_0.svc."),
        ("http://Host.Example:1", "Host.Example"),
        ("http://10.0.0.5", "10.0.0.5"),
    ] {
        assert_eq!(parts(url).1, host, "{url}");
    }
    for (url, host) in [
        ("http://10.0.0.256", "10.0.0.256"),
        ("http://-lead.example", "-lead.example"),
        ("http://a..b", "a..b"),
        ("http://bad host", "bad host"),
        ("http://ñ.example", "ñ.example"),
        ("http://1.2.3", "1.2.3"),
    ] {
        let e = refusal(url);
        assert!(
            e.contains(&format!(
                "\"{host}\" is neither an IP address nor a host name"
            )),
            "{url}: {e}"
        );
    }
    let long = format!("http://{}.example", "a".repeat(64));
    assert!(refusal(&long).contains("neither an IP address nor a host name"));
}
