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
    assert!(parse_replica("https://x:1").unwrap_err().contains("https"));
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
fn parsing_never_resolves_names_and_start_does() {
    // A name that no resolver knows parses fine: no DNS at parse time.
    let text = MINIMAL.replace(
        "http://127.0.0.1:8000",
        "http://vllm-a.invalid:8000\", \"http://10.0.0.9:8001",
    );
    let c = parse(&text).unwrap();
    let rs = &c.models[0].replicas;
    assert!(!rs[0].is_resolved());
    assert_eq!(rs[1].addr, "10.0.0.9:8001".parse().unwrap());
    // At start: names resolve through the resolver, literals are left alone.
    let asked = std::cell::RefCell::new(Vec::new());
    let resolved = c
        .clone()
        .resolve_upstreams_with(&|h, p| {
            asked.borrow_mut().push((h.to_owned(), p));
            Ok(vec![SocketAddr::from(([10, 0, 0, 7], p))])
        })
        .unwrap();
    assert_eq!(
        asked.into_inner(),
        vec![("vllm-a.invalid".to_owned(), 8000)]
    );
    assert_eq!(
        resolved.models[0].replicas[0].addr,
        "10.0.0.7:8000".parse().unwrap()
    );
    // Failures name the key; two entries that are one server are refused.
    let e = c
        .clone()
        .resolve_upstreams_with(&|_, _| Err(std::io::Error::other("NXDOMAIN")))
        .unwrap_err();
    assert!(e.0[0].contains("models[0].upstreams[0]") && e.0[0].contains("NXDOMAIN"));
    let e = c
        .clone()
        .resolve_upstreams_with(&|_, _| Ok(Vec::new()))
        .unwrap_err();
    assert!(e.0[0].contains("resolves to no address"), "{e}");
    let e = c
        .resolve_upstreams_with(&|_, p| Ok(vec![SocketAddr::from(([10, 0, 0, 9], p + 1))]))
        .unwrap_err();
    assert!(e.0[0].contains("same server"), "{e}");
    // Syntactic duplicates are caught at parse time.
    let text = MINIMAL.replace(
        "http://127.0.0.1:8000",
        "http://Host.example:8000\", \"http://host.example:8000/v1",
    );
    assert!(parse(&text).unwrap_err().0[0].contains("repeats"));
}
