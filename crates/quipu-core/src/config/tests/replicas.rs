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
