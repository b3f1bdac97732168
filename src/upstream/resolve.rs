//! Host names of upstream replicas → socket addresses, through the system resolver.
//!
//! The configuration keeps a replica named by a host name unresolved
//! ([`Replica::is_resolved`](crate::config::Replica::is_resolved) is false): parsing does no DNS,
//! so `serve --check`, the store commands, tests and fuzzing never wait on a resolver.
//! [`resolve_upstreams`] fills in the addresses once, when `quipu serve` starts; the request
//! path never resolves a name. (Re-resolving while running is issue 17's.)

use crate::config::{Config, ConfigErrors};
use std::net::{SocketAddr, ToSocketAddrs};

/// Resolves the host names of upstream replicas (system resolver, first address), once, when
/// the server starts. Every failure is reported with its key; two replicas of a model that
/// turn out to be the same address are an error too.
pub fn resolve_upstreams(config: Config) -> Result<Config, ConfigErrors> {
    resolve_upstreams_with(config, &|host, port| {
        (host, port).to_socket_addrs().map(|a| a.collect())
    })
}

/// [`resolve_upstreams`] with an injected resolver (for tests).
pub fn resolve_upstreams_with(
    mut config: Config,
    resolve: &dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
) -> Result<Config, ConfigErrors> {
    let mut errs = Vec::new();
    for (i, m) in config.models.iter_mut().enumerate() {
        for (j, r) in m.replicas.iter_mut().enumerate() {
            if r.is_resolved() {
                continue;
            }
            match resolve(&r.host, r.port) {
                Ok(addrs) => match addrs.first() {
                    Some(a) => r.addr = *a,
                    None => errs.push(format!(
                        "models[{i}].upstreams[{j}]: \"{}\" resolves to no address",
                        r.host
                    )),
                },
                Err(e) => errs.push(format!(
                    "models[{i}].upstreams[{j}]: cannot resolve \"{}\": {e}",
                    r.host
                )),
            }
        }
        for (j, r) in m.replicas.iter().enumerate() {
            if let Some(k) = m.replicas[..j]
                .iter()
                .position(|o| o.is_resolved() && o.addr == r.addr)
            {
                errs.push(format!(
                    "models[{i}].upstreams[{j}] (\"{}\") is the same server as upstreams[{k}] ({})",
                    r.url, r.addr
                ));
            }
        }
    }
    if errs.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(errs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped configuration, its first model served by a named and an IP replica.
    fn two_replicas() -> Config {
        let text = crate::config::EMBEDDED_DEFAULT.replacen(
            "\"http://127.0.0.1:8000/v1\"",
            "\"http://vllm-a.invalid:8000\", \"http://10.0.0.9:8001\"",
            1,
        );
        Config::parse(&text, "t").unwrap()
    }

    #[test]
    fn names_resolve_at_start_and_literals_are_left_alone() {
        let c = two_replicas();
        assert!(!c.models[0].replicas[0].is_resolved());
        let asked = std::cell::RefCell::new(Vec::new());
        let resolved = resolve_upstreams_with(c.clone(), &|h, p| {
            asked.borrow_mut().push((h.to_owned(), p));
            Ok(vec![SocketAddr::from(([10, 0, 0, 7], p))])
        })
        .unwrap();
        assert_eq!(
            asked.into_inner(),
            vec![("vllm-a.invalid".to_owned(), 8000)]
        );
        let rs = &resolved.models[0].replicas;
        assert_eq!(rs[0].addr, "10.0.0.7:8000".parse().unwrap());
        assert!(rs[0].is_resolved());
        assert_eq!(rs[1].addr, "10.0.0.9:8001".parse().unwrap());
    }

    #[test]
    fn failures_name_the_key_and_one_server_twice_is_refused() {
        let c = two_replicas();
        let e = resolve_upstreams_with(c.clone(), &|_, _| Err(std::io::Error::other("NXDOMAIN")))
            .unwrap_err();
        assert!(e.0[0].contains("models[0].upstreams[0]") && e.0[0].contains("NXDOMAIN"));
        let e = resolve_upstreams_with(c.clone(), &|_, _| Ok(Vec::new())).unwrap_err();
        assert!(e.0[0].contains("resolves to no address"), "{e}");
        let e = resolve_upstreams_with(c, &|_, p| {
            Ok(vec![SocketAddr::from(([10, 0, 0, 9], p + 1))])
        })
        .unwrap_err();
        assert!(e.0[0].contains("same server"), "{e}");
    }
}
