//! Replica pools: which upstream server gets a request.
//!
//! Each model has a pool of replicas, and this module picks one per attempt:
//!
//! - **in-flight counts** per replica (an RAII [`ReplicaGuard`] per attempt), for least-loaded
//!   selection;
//! - **health**: a replica whose active health check fails is out ([`super::health`]); after
//!   `max_failures` consecutive failed attempts a replica is ejected for a while (passive
//!   ejection) — unless every replica that passes its health checks is ejected, when they are
//!   used anyway rather than refusing every request (ejection never takes a whole healthy pool
//!   out);
//! - **addresses**: each replica's current address, kept by [`super::resolve`] while the
//!   gateway runs (a replica whose name has not resolved yet is skipped); a connect failure
//!   asks for it to be resolved again at once;
//! - **prefix-cache affinity**: requests whose upstream prompt starts with the same bytes as an
//!   earlier one go to the replica that served it, where the KV cache already holds that
//!   prefix — unless that replica is busier than the least-loaded one by more than a slack.
//!
//! The affinity table is lock-free: a direct-mapped array of `AtomicU64`, one slot per block
//! hash (48-bit tag + replica index), so routing takes no lock. A collision simply forgets an
//! old prefix, like a CPU cache. Prompts are hashed in 1 KiB blocks, each hash chained on the
//! previous one, so "the same first N KiB" is a lookup per block, longest match wins.

use super::dispatch::{Dispatcher, Slot};
use super::health::PoolHealth;
use crate::config::{Model, Replica, Routing, Scheduling};
use crate::http::client::{Target, UpstreamError};
use crate::http::upstream_tls::UpstreamTlsMaterial;
use crate::metrics::m;
use crate::upstream_profile::Server;
use arc_swap::ArcSwapOption;
use prometheus::{IntCounter, IntGauge};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Bytes of upstream prompt per affinity block.
pub const AFFINITY_BLOCK: usize = 1024;
const AFFINITY_SLOTS: usize = 1 << 16;
/// A replica holding the prefix is skipped when it has this many more requests in flight than
/// the least-loaded replica.
const AFFINITY_SLACK: usize = 4;

/// Live state of one replica.
pub struct ReplicaState {
    pub replica: Replica,
    /// Where it is now: its IP literal, or its name's last resolved address (`None` until it
    /// first resolves).
    addr: ArcSwapOption<SocketAddr>,
    /// A connect failed: resolve the name again now (see [`super::resolve`]).
    pub(super) stale: AtomicBool,
    in_flight: AtomicUsize,
    consecutive_failures: AtomicU32,
    /// This replica's metric children, resolved once so picks do no label lookups.
    in_flight_gauge: IntGauge,
    selected: [OnceLock<IntCounter>; Pick::COUNT],
    /// The server it runs, once detected (see `upstream_profile`).
    server: OnceLock<Server>,
}

/// The replicas of one model.
pub struct ModelPool {
    pub slug: String,
    pub replicas: Vec<ReplicaState>,
    /// TLS to its `https://` replicas.
    tls: Option<Arc<UpstreamTlsMaterial>>,
    routing: Routing,
    max_failures: u32,
    eject_for: Duration,
    /// Health verdicts and ejections, shared with the health checks.
    pub(super) health: PoolHealth,
    /// Wakes the resolver when a connect failure made an address stale.
    pub(super) resolve_now: Arc<tokio::sync::Notify>,
    rr: AtomicUsize,
    affinity: Box<[AtomicU64]>,
    /// `quipu_prefix_affinity_total` children: hit, overloaded, miss.
    affinity_outcomes: [OnceLock<IntCounter>; 3],
    /// The queue of a model with `max_concurrency` (see [`super::dispatch`]).
    pub dispatcher: Option<Arc<Dispatcher>>,
}

/// Why a replica was chosen (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    LeastLoaded,
    RoundRobin,
    Affinity,
    /// A scheduled pool's queue chose it (see [`super::dispatch`]).
    Scheduled,
}

impl Pick {
    const COUNT: usize = 4;

    pub fn as_str(self) -> &'static str {
        match self {
            Pick::LeastLoaded => "least_loaded",
            Pick::RoundRobin => "round_robin",
            Pick::Affinity => "affinity",
            Pick::Scheduled => "scheduled",
        }
    }
}

/// Holds one in-flight slot on a replica; released on drop.
pub struct ReplicaGuard<'a> {
    pool: &'a ModelPool,
    pub index: usize,
    pub pick: Pick,
    /// Its address when picked (only resolved replicas are picked).
    addr: SocketAddr,
    /// Its place in a scheduled pool's slots, given back with the guard.
    _slot: Option<Slot<'a>>,
}

impl ReplicaGuard<'_> {
    pub fn replica(&self) -> &Replica {
        &self.pool.replicas[self.index].replica
    }

    /// Where to send this attempt: the replica's address when it was picked.
    pub fn target(&self) -> Target<'_> {
        self.pool.target_at(self.index, self.addr)
    }

    /// The attempt worked: the replica is healthy as far as we know.
    pub fn succeeded(&self) {
        self.pool.replicas[self.index]
            .consecutive_failures
            .store(0, Ordering::Relaxed);
        self.pool.health.refresh(self.index);
    }

    /// The attempt failed (`kind` is a metric label); ejects after too many in a row. A failed
    /// connect also has the replica's name resolved again: it may have moved.
    pub fn failed(&self, kind: &str) {
        let r = &self.pool.replicas[self.index];
        if kind == "connect" {
            self.pool.mark_stale(self.index);
        }
        m().upstream_failures
            .with_label_values(&[&self.pool.slug, &r.replica.url, kind])
            .inc();
        let n = r.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.pool.max_failures {
            let again = self.pool.health.ejected(self.index);
            self.pool.health.eject(self.index, self.pool.eject_for);
            if again {
                return;
            }
            log::warn!(
                "replica {} of {} ejected for {:?} after {n} consecutive failures",
                r.replica.url,
                self.pool.slug,
                self.pool.eject_for
            );
        }
    }
}

impl Drop for ReplicaGuard<'_> {
    fn drop(&mut self) {
        let r = &self.pool.replicas[self.index];
        r.in_flight.fetch_sub(1, Ordering::Relaxed);
        // inc/dec, not set(): two threads setting the value they each computed can leave a
        // stale count behind.
        r.in_flight_gauge.dec();
    }
}

/// Chained hashes of each full [`AFFINITY_BLOCK`] of `prompt`.
pub fn block_hashes(prompt: &[u8]) -> Vec<u64> {
    let state = ahash::RandomState::with_seeds(0x5155_4950, 0x7175_6970, 0x6b76_6361, 0x6368_6521);
    let mut prev = 0u64;
    prompt
        .chunks_exact(AFFINITY_BLOCK)
        .map(|block| {
            prev = state.hash_one((prev, block));
            prev
        })
        .collect()
}

impl ModelPool {
    /// Builds the pool of `model`; `tls` is its upstream TLS (loaded at start), `scheduling`
    /// the queue's knobs if the model has `max_concurrency`.
    pub fn new(
        model: &Model,
        tls: Option<Arc<UpstreamTlsMaterial>>,
        scheduling: &Scheduling,
    ) -> Result<ModelPool, String> {
        let dispatcher = match model.capacity.max_concurrency {
            Some(n) => Some(Arc::new(Dispatcher::new(
                &model.slug,
                scheduling.scheduler,
                scheduling.gateways,
                &vec![Some(n); model.replicas.len()],
                model.replicas.iter().map(|r| r.url.clone()).collect(),
            )?)),
            None => None,
        };
        let replicas = model
            .replicas
            .iter()
            .map(|r| {
                let in_flight_gauge = m()
                    .upstream_in_flight
                    .with_label_values(&[&model.slug, &r.url]);
                in_flight_gauge.set(0);
                ReplicaState {
                    replica: r.clone(),
                    addr: ArcSwapOption::from_pointee(r.is_resolved().then_some(r.addr)),
                    stale: AtomicBool::new(false),
                    in_flight: AtomicUsize::new(0),
                    consecutive_failures: AtomicU32::new(0),
                    in_flight_gauge,
                    selected: Default::default(),
                    server: OnceLock::new(),
                }
            })
            .collect();
        Ok(ModelPool {
            slug: model.slug.clone(),
            replicas,
            tls,
            routing: model.routing,
            max_failures: model.health.max_failures,
            eject_for: (model.health.interval * 2).max(Duration::from_secs(1)),
            health: PoolHealth::new(model),
            resolve_now: Arc::new(tokio::sync::Notify::new()),
            rr: AtomicUsize::new(0),
            affinity: (0..AFFINITY_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            affinity_outcomes: Default::default(),
            dispatcher,
        })
    }

    /// A connect to replica `i` failed: if it is named, have the name resolved again now.
    pub fn mark_stale(&self, i: usize) {
        if let Some(r) = self.replicas.get(i) {
            if !r.replica.is_resolved() {
                r.stale.store(true, Ordering::Relaxed);
                self.resolve_now.notify_one();
            }
        }
    }

    /// Replica `i`'s current address.
    pub fn addr(&self, i: usize) -> Option<SocketAddr> {
        self.replicas.get(i)?.addr.load().as_deref().copied()
    }

    /// Sets replica `i`'s address (the resolver); returns whether it changed.
    pub(super) fn set_addr(&self, i: usize, addr: SocketAddr) -> bool {
        let Some(r) = self.replicas.get(i) else {
            return false;
        };
        let old = r.addr.swap(Some(Arc::new(addr)));
        old.as_deref() != Some(&addr)
    }

    /// Where an exchange with replica `i` goes; a connect error while its name has not
    /// resolved yet.
    pub fn target(&self, i: usize) -> Result<Target<'_>, UpstreamError> {
        let addr = self.addr(i).ok_or_else(|| {
            let host = &self.replicas[i].replica.host;
            UpstreamError::Connect(format!("\"{host}\" has not resolved to an address yet"))
        })?;
        Ok(self.target_at(i, addr))
    }

    fn target_at(&self, i: usize, addr: SocketAddr) -> Target<'_> {
        let r = &self.replicas[i].replica;
        Target {
            addr,
            authority: &r.authority,
            tls: match (&self.tls, r.tls) {
                (Some(tls), true) => Some((r.sni(), tls.as_ref())),
                _ => None,
            },
        }
    }

    /// The server replica `i` runs, if it has been detected.
    pub fn detected_server(&self, i: usize) -> Option<Server> {
        self.replicas.get(i)?.server.get().copied()
    }

    /// Records the server replica `i` runs (the first detection stays).
    pub fn set_detected_server(&self, i: usize, server: Server) {
        if let Some(r) = self.replicas.get(i) {
            if r.server.set(server).is_ok() {
                log::info!("replica {} of {} runs {server}", r.replica.url, self.slug);
            }
        }
    }

    /// Resolved, healthy per the health checks and not ejected.
    pub fn is_available(&self, i: usize) -> bool {
        self.passes_checks(i) && !self.health.ejected(i)
    }

    /// Resolved and healthy per the health checks (ejected or not).
    fn passes_checks(&self, i: usize) -> bool {
        self.replicas[i].addr.load().is_some() && self.health.checked_healthy(i)
    }

    pub fn in_flight(&self, i: usize) -> usize {
        self.replicas[i].in_flight.load(Ordering::Relaxed)
    }

    /// Picks a replica not in `exclude`, or `None` if none is available. `prompt_blocks` are the
    /// request's [`block_hashes`] (empty unless the pool routes by prefix affinity).
    pub fn pick(&self, prompt_blocks: &[u64], exclude: &[usize]) -> Option<ReplicaGuard<'_>> {
        let mut candidates: Vec<usize> = (0..self.replicas.len())
            .filter(|i| !exclude.contains(i) && self.is_available(*i))
            .collect();
        if candidates.is_empty() {
            // Every replica that passes its health checks is ejected: ejection is a preference
            // built from per-request failures (a 503 for one overloaded moment), not a verdict,
            // so rather than refuse everything, use them anyway (Envoy's "panic routing").
            // Replicas that fail their health checks stay out.
            candidates = (0..self.replicas.len())
                .filter(|i| !exclude.contains(i) && self.passes_checks(*i))
                .collect();
        }
        if candidates.is_empty() {
            return None;
        }
        let start = self.rr.fetch_add(1, Ordering::Relaxed);
        let n = candidates.len();
        let least = || {
            (0..n)
                .map(|k| candidates[(start + k) % n])
                .min_by_key(|&i| self.in_flight(i))
                .unwrap_or(candidates[0])
        };
        let (index, pick) = match self.routing {
            Routing::RoundRobin => (candidates[start % n], Pick::RoundRobin),
            Routing::LeastLoaded => (least(), Pick::LeastLoaded),
            Routing::PrefixAffinity => {
                let fallback = least();
                match self.affinity_lookup(prompt_blocks) {
                    Some(i) if candidates.contains(&i) => {
                        if self.in_flight(i) <= self.in_flight(fallback) + AFFINITY_SLACK {
                            self.affinity_outcome(0, "hit");
                            (i, Pick::Affinity)
                        } else {
                            self.affinity_outcome(1, "overloaded");
                            (fallback, Pick::LeastLoaded)
                        }
                    }
                    _ => {
                        if !prompt_blocks.is_empty() {
                            self.affinity_outcome(2, "miss");
                        }
                        (fallback, Pick::LeastLoaded)
                    }
                }
            }
        };
        if self.routing == Routing::PrefixAffinity {
            self.affinity_record(prompt_blocks, index);
        }
        self.take(index, pick, None)
    }

    /// The replica a scheduled pool's queue dispatched a request to, holding its `slot`;
    /// `None` if it is no longer usable (it failed its health check or lost its address since).
    pub fn pick_at<'a>(
        &'a self,
        slot: Slot<'a>,
        prompt_blocks: &[u64],
    ) -> Option<ReplicaGuard<'a>> {
        let index = slot.dispatch.replica;
        if index >= self.replicas.len() || !self.passes_checks(index) {
            return None;
        }
        if self.routing == Routing::PrefixAffinity {
            self.affinity_record(prompt_blocks, index);
        }
        self.take(index, Pick::Scheduled, Some(slot))
    }

    /// The replica whose prefix cache holds this prompt's beginning, for the queue's affinity.
    pub fn preferred(&self, prompt_blocks: &[u64]) -> Option<usize> {
        if self.routing != Routing::PrefixAffinity {
            return None;
        }
        let i = self.affinity_lookup(prompt_blocks)?;
        let found = if self.is_available(i) { "hit" } else { "miss" };
        self.affinity_outcome(usize::from(found == "miss") * 2, found);
        Some(i)
    }

    /// Counts replica `index` in flight and hands out its guard.
    fn take<'a>(
        &'a self,
        index: usize,
        pick: Pick,
        slot: Option<Slot<'a>>,
    ) -> Option<ReplicaGuard<'a>> {
        let r = &self.replicas[index];
        // Candidates are resolved, and an address, once known, is only ever replaced.
        let addr = self.addr(index)?;
        r.in_flight.fetch_add(1, Ordering::Relaxed);
        r.in_flight_gauge.inc();
        r.selected[pick as usize]
            .get_or_init(|| {
                m().upstream_selected.with_label_values(&[
                    &self.slug,
                    &r.replica.url,
                    pick.as_str(),
                ])
            })
            .inc();
        Some(ReplicaGuard {
            pool: self,
            index,
            pick,
            addr,
            _slot: slot,
        })
    }

    fn affinity_outcome(&self, i: usize, outcome: &str) {
        self.affinity_outcomes[i]
            .get_or_init(|| m().affinity_hits.with_label_values(&[&self.slug, outcome]))
            .inc();
    }

    /// Whether prefix affinity applies to this pool (callers skip hashing otherwise).
    pub fn uses_affinity(&self) -> bool {
        self.routing == Routing::PrefixAffinity && self.replicas.len() > 1
    }

    fn slot(&self, h: u64) -> &AtomicU64 {
        &self.affinity[(h as usize) % AFFINITY_SLOTS]
    }

    fn affinity_lookup(&self, blocks: &[u64]) -> Option<usize> {
        blocks.iter().rev().find_map(|&h| {
            let v = self.slot(h).load(Ordering::Relaxed);
            (v != 0 && v >> 16 == h >> 16).then_some((v & 0xffff) as usize)
        })
    }

    fn affinity_record(&self, blocks: &[u64], replica: usize) {
        for &h in blocks {
            self.slot(h)
                .store((h & !0xffff) | replica as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, EMBEDDED_DEFAULT};

    fn pool(routing: &str, n: usize) -> ModelPool {
        pool_at(routing, n, 18000)
    }

    fn pool_at(routing: &str, n: usize, port: usize) -> ModelPool {
        let mut text = EMBEDDED_DEFAULT.to_owned();
        let ups: Vec<String> = (0..n)
            .map(|i| format!("\"http://127.0.0.1:{}/v1\"", port + i))
            .collect();
        text = text.replacen(
            "upstreams = [\"http://127.0.0.1:8000/v1\"]",
            &format!("upstreams = [{}]\nrouting = \"{routing}\"", ups.join(",")),
            1,
        );
        let c = Config::parse(&text, "t").unwrap();
        ModelPool::new(&c.models[0], None, &c.scheduling).unwrap()
    }

    #[test]
    fn least_loaded_spreads() {
        let p = pool("least_loaded", 3);
        let a = p.pick(&[], &[]).unwrap();
        let b = p.pick(&[], &[]).unwrap();
        let c = p.pick(&[], &[]).unwrap();
        let mut seen = vec![a.index, b.index, c.index];
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2]);
        let freed = b.index;
        drop(b);
        let d = p.pick(&[], &[]).unwrap();
        assert_eq!(d.index, freed, "the idle replica is the least loaded");
        assert_eq!(p.in_flight(d.index), 1);
    }

    #[test]
    fn exclusion_and_ejection() {
        let p = pool("least_loaded", 2);
        let g = p.pick(&[], &[0]).unwrap();
        assert_eq!(g.index, 1);
        for _ in 0..3 {
            g.failed("connect");
        }
        drop(g);
        assert!(!p.is_available(1));
        assert_eq!(p.pick(&[], &[]).unwrap().index, 0);
        // The only replica left is ejected but passes its health checks: used anyway.
        assert_eq!(p.pick(&[], &[0]).unwrap().index, 1);
        assert!(p.pick(&[], &[0, 1]).is_none());
        // Both ejected: still served, by the least loaded.
        let g = p.pick(&[], &[1]).unwrap();
        for _ in 0..3 {
            g.failed("status_503");
        }
        drop(g);
        assert!(!p.is_available(0) && !p.is_available(1));
        assert!(p.pick(&[], &[]).is_some());
    }

    #[test]
    fn the_health_gauge_comes_back_when_an_ejection_ends() {
        let p = pool_at("least_loaded", 1, 18100);
        let gauge = || {
            m().upstream_healthy
                .with_label_values(&[&p.slug, &p.replicas[0].replica.url])
                .get()
        };
        assert_eq!(gauge(), 1);
        let g = p.pick(&[], &[]).unwrap();
        for _ in 0..3 {
            g.failed("connect");
        }
        assert_eq!(gauge(), 0, "ejected");
        drop(g);
        std::thread::sleep(p.eject_for + Duration::from_millis(50));
        assert!(p.is_available(0));
        // No traffic: the next health check recomputes it.
        p.health.refresh(0);
        assert_eq!(gauge(), 1);
        // Traffic: a success after an ejection also does.
        let g = p.pick(&[], &[]).unwrap();
        for _ in 0..3 {
            g.failed("connect");
        }
        assert_eq!(gauge(), 0);
        std::thread::sleep(p.eject_for + Duration::from_millis(50));
        g.succeeded();
        assert_eq!(gauge(), 1);
        // A failed health check keeps it at 0 whatever the ejection.
        p.health.set_checked(0, Err("down".into()));
        g.succeeded();
        assert_eq!(gauge(), 0);
    }

    #[test]
    fn a_named_replica_is_skipped_until_it_resolves() {
        let text = EMBEDDED_DEFAULT.replacen(
            "upstreams = [\"http://127.0.0.1:8000/v1\"]",
            "upstreams = [\"http://vllm-a.invalid:8000/v1\", \"https://127.0.0.1:18301/v1\"]",
            1,
        );
        let c = Config::parse(&text, "t").unwrap();
        let p = ModelPool::new(&c.models[0], None, &c.scheduling).unwrap();
        assert!(!p.is_available(0) && p.is_available(1));
        assert_eq!(p.pick(&[], &[]).unwrap().index, 1);
        assert!(matches!(p.target(0), Err(UpstreamError::Connect(_))));
        assert!(p.set_addr(0, "10.0.0.7:8000".parse().unwrap()));
        assert!(
            !p.set_addr(0, "10.0.0.7:8000".parse().unwrap()),
            "unchanged"
        );
        let t = p.target(0).unwrap();
        assert_eq!(
            (t.addr, t.authority),
            ("10.0.0.7:8000".parse().unwrap(), "vllm-a.invalid:8000")
        );
        assert!(p.is_available(0));
    }

    #[test]
    fn affinity_follows_the_prefix() {
        let p = pool("prefix_affinity", 2);
        let conv: Vec<u8> = (0..5000u32).flat_map(|i| i.to_le_bytes()).collect();
        let turn1 = block_hashes(&conv[..8000]);
        let turn2 = block_hashes(&conv[..15000]);
        let first = p.pick(&turn1, &[]).unwrap().index;
        for _ in 0..10 {
            let g = p.pick(&turn2, &[]).unwrap();
            assert_eq!(g.index, first);
            assert_eq!(g.pick, Pick::Affinity);
        }
        // A different conversation is free to go elsewhere.
        let other: Vec<u8> = (0..3000u32).flat_map(|i| (i * 7).to_be_bytes()).collect();
        let _busy = p.pick(&turn2, &[]).unwrap();
        let g = p.pick(&block_hashes(&other), &[]).unwrap();
        assert_ne!(g.index, first);
    }

    #[test]
    fn affinity_yields_to_load() {
        let p = pool("prefix_affinity", 2);
        let conv = vec![7u8; 4096];
        let h = block_hashes(&conv);
        let first = p.pick(&h, &[]).unwrap().index;
        let mut held = Vec::new();
        for _ in 0..=AFFINITY_SLACK {
            held.push(p.pick(&h, &[]).unwrap());
        }
        assert!(held.iter().all(|g| g.index == first));
        let g = p.pick(&h, &[]).unwrap();
        assert_ne!(g.index, first, "overloaded holder skipped");
    }

    #[test]
    fn block_hashes_chain() {
        let a = block_hashes(&[1u8; 3000]);
        assert_eq!(a.len(), 2);
        let b = block_hashes(&[1u8; 2048]);
        assert_eq!(a, b);
        let mut c = vec![1u8; 2048];
        c[0] = 2;
        assert_ne!(block_hashes(&c)[1], a[1]);
    }
}
