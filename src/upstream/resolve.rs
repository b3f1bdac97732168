//! Upstream host names → addresses, while the gateway runs.
//!
//! A replica named by a host name (a Kubernetes Service, a VM behind a DNS record) is resolved
//! when `quipu serve` starts and then again: when its record's TTL runs out (at least every
//! `server.dns_refresh_s`), and at once after a connect to it failed (it may have moved). The
//! address in use changes only when the name no longer resolves to it; a failed lookup keeps
//! the last address. The request path reads the current address; it never waits on DNS.
//!
//! Lookups use hickory's resolver: the system's configuration (`/etc/resolv.conf`,
//! `/etc/hosts`) by default, or the name servers in `server.dns_servers`.
//! `quipu serve --check` reports every upstream name that does not resolve ([`check_names`]).

use super::ModelPool;
use crate::config::Config;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{Resolver, TokioResolver};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A lookup is never repeated sooner than this (a TTL of 0, a connect failure storm).
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// After a failed lookup, the next try comes this soon (or at `dns_refresh_s`, if sooner).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// The resolver for upstream names.
pub struct Dns {
    resolver: TokioResolver,
}

impl Dns {
    /// The system's resolver, or one asking `servers` (UDP, then TCP).
    pub fn new(servers: &[SocketAddr]) -> Result<Dns, String> {
        let builder = if servers.is_empty() {
            Resolver::builder_tokio()
                .map_err(|e| format!("cannot read the system's DNS configuration: {e}"))?
        } else {
            let mut config = ResolverConfig::new();
            for s in servers {
                config.add_name_server(NameServerConfig::new(*s, Protocol::Udp));
                config.add_name_server(NameServerConfig::new(*s, Protocol::Tcp));
            }
            Resolver::builder_with_config(config, TokioConnectionProvider::default())
        };
        // No cache of its own: the follow loop schedules lookups by the records' TTLs, and a
        // lookup after a connect failure must ask the name servers, not get the address that
        // just failed back from a cache.
        let mut builder = builder;
        builder.options_mut().cache_size = 0;
        Ok(Dns {
            resolver: builder.build(),
        })
    }

    /// The addresses of `host` with the port, and how long they are valid.
    pub async fn lookup(
        &self,
        host: &str,
        port: u16,
    ) -> Result<(Vec<SocketAddr>, Duration), String> {
        let found = self
            .resolver
            .lookup_ip(host)
            .await
            .map_err(|e| e.to_string())?;
        let ttl = found
            .valid_until()
            .saturating_duration_since(std::time::Instant::now());
        let addrs: Vec<SocketAddr> = found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
        if addrs.is_empty() {
            return Err("no address".into());
        }
        Ok((addrs, ttl))
    }
}

/// Every upstream name of `config` that does not resolve now, with its key (`serve --check`).
pub async fn check_names(config: &Config, dns: &Dns) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, m) in config.models.iter().enumerate() {
        for (j, r) in m.replicas.iter().enumerate() {
            if r.is_resolved() {
                continue;
            }
            if let Err(e) = dns.lookup(&r.host, r.port).await {
                problems.push(format!(
                    "models[{i}].upstreams[{j}]: \"{}\" does not resolve: {e}",
                    r.host
                ));
            }
        }
    }
    problems
}

/// When a named replica is looked up next.
struct Due {
    pool: usize,
    replica: usize,
    at: Instant,
    /// When it was last looked up.
    last: Instant,
    /// The last lookup failed (the next failure is not logged again).
    failing: bool,
}

/// Keeps the address of every named replica current, until the process ends: resolves each
/// at once, then as its TTL, `refresh` and connect failures say.
pub async fn follow(pools: Arc<Vec<ModelPool>>, dns: Dns, refresh: Duration) {
    let mut due: Vec<Due> = Vec::new();
    for (p, pool) in pools.iter().enumerate() {
        for (r, state) in pool.replicas.iter().enumerate() {
            if !state.replica.is_resolved() {
                due.push(Due {
                    pool: p,
                    replica: r,
                    at: Instant::now(),
                    last: Instant::now(),
                    failing: false,
                });
            }
        }
    }
    if due.is_empty() {
        return;
    }
    let wake: Vec<_> = pools.iter().map(|p| p.resolve_now.clone()).collect();
    loop {
        let now = Instant::now();
        for d in due.iter_mut() {
            let pool = &pools[d.pool];
            let stale = pool.replicas[d.replica]
                .stale
                .swap(false, Ordering::Relaxed);
            if stale {
                // A connect failed: look again now, but not more than once a second.
                d.at = d.at.min(d.last + MIN_REFRESH);
            }
            if d.at > now {
                continue;
            }
            let next = lookup_one(&dns, pool, d, refresh).await;
            d.last = Instant::now();
            d.at = d.last + next;
        }
        let earliest = due.iter().map(|d| d.at).min().unwrap_or(now + refresh);
        let any_stale = async {
            let waits = wake.iter().map(|n| Box::pin(n.notified()));
            futures::future::select_all(waits).await;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(earliest) => {}
            _ = any_stale => {}
        }
    }
}

/// Looks one replica up and records its address; returns how long until the next lookup.
async fn lookup_one(dns: &Dns, pool: &ModelPool, d: &mut Due, refresh: Duration) -> Duration {
    let r = &pool.replicas[d.replica].replica;
    match dns.lookup(&r.host, r.port).await {
        Ok((addrs, ttl)) => {
            if d.failing {
                log::info!("\"{}\" resolves again", r.host);
            }
            d.failing = false;
            // Keep the address in use while the name still points at it.
            let current = pool.addr(d.replica);
            let chosen = match current {
                Some(c) if addrs.contains(&c) => c,
                _ => addrs[0],
            };
            if pool.set_addr(d.replica, chosen) {
                match current {
                    Some(old) => log::info!(
                        "replica {} of {}: \"{}\" now resolves to {chosen} (was {old})",
                        r.url,
                        pool.slug,
                        r.host
                    ),
                    None => log::info!(
                        "replica {} of {}: \"{}\" resolves to {chosen}",
                        r.url,
                        pool.slug,
                        r.host
                    ),
                }
                pool.health.refresh(d.replica);
            }
            ttl.clamp(MIN_REFRESH, refresh.max(MIN_REFRESH))
        }
        Err(e) => {
            if !d.failing {
                log::warn!(
                    "replica {} of {}: cannot resolve \"{}\" ({e}); {}",
                    r.url,
                    pool.slug,
                    r.host,
                    match pool.addr(d.replica) {
                        Some(a) => format!("keeping {a}"),
                        None => "it gets no requests until it resolves".into(),
                    }
                );
            }
            d.failing = true;
            RETRY_AFTER_FAILURE.min(refresh).max(MIN_REFRESH)
        }
    }
}
