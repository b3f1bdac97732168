//! Replica health: the active checks (`GET {health.path}` every `health.interval_ms`) and the
//! verdicts the request path reads (check result, passive ejection, the
//! `quipu_upstream_healthy` gauge).
//!
//! The checks go through Quipu's own upstream client ([`crate::http::client`]), to each
//! replica's *current* address with the same TLS as its requests (verification, SNI, client
//! certificate) — so an `https://` replica, or one whose name moved, is checked exactly as it is
//! used. Pingora's load-balancing health checks key replicas by socket address, fixed at
//! start, and build their own peers; that could follow neither.
//!
//! `quipu_upstream_healthy` is 1 when the replica is resolved, its last check passed and no
//! ejection runs; it is recomputed on every check, ejection and success (so it returns to 1
//! when an ejection ends, with or without traffic).

use super::ModelPool;
use crate::config::Model;
use crate::h1::Method;
use crate::http::client::{self, Call};
use crate::http::deadline;
use crate::metrics::m;
use futures::future::join_all;
use pingora::connectors::TransportConnector;
use prometheus::IntGauge;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A health check's whole exchange (connect, TLS, response) must finish within this.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// The body of a health answer read at most (then the connection is closed).
const MAX_CHECK_BODY: usize = 64 * 1024;

/// What `quipu_upstream_healthy` of one replica is made of.
struct ReplicaHealth {
    url: String,
    /// The last active check's verdict (healthy until a check says otherwise).
    checked_healthy: AtomicBool,
    /// Milliseconds since the pool's epoch until which the replica is ejected.
    ejected_until_ms: AtomicU64,
    gauge: IntGauge,
}

/// The health state of a pool's replicas, shared by the request path and the checks.
pub struct PoolHealth {
    slug: String,
    epoch: Instant,
    replicas: Vec<ReplicaHealth>,
}

impl PoolHealth {
    pub fn new(model: &Model) -> PoolHealth {
        PoolHealth {
            slug: model.slug.clone(),
            epoch: Instant::now(),
            replicas: model
                .replicas
                .iter()
                .map(|r| {
                    let gauge = m()
                        .upstream_healthy
                        .with_label_values(&[&model.slug, &r.url]);
                    gauge.set(i64::from(r.is_resolved()));
                    ReplicaHealth {
                        url: r.url.clone(),
                        checked_healthy: AtomicBool::new(true),
                        ejected_until_ms: AtomicU64::new(0),
                        gauge,
                    }
                })
                .collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn ejected(&self, i: usize) -> bool {
        self.replicas[i].ejected_until_ms.load(Ordering::Relaxed) > self.now_ms()
    }

    pub fn checked_healthy(&self, i: usize) -> bool {
        self.replicas[i].checked_healthy.load(Ordering::Relaxed)
    }

    /// Ejects replica `i` for `period`.
    pub fn eject(&self, i: usize, period: Duration) {
        let until = self.now_ms().saturating_add(period.as_millis() as u64);
        self.replicas[i]
            .ejected_until_ms
            .store(until, Ordering::Relaxed);
        self.refresh(i);
    }

    /// Records a check's verdict (`Err` says why it failed); logs a change.
    pub fn set_checked(&self, i: usize, verdict: Result<(), String>) {
        let r = &self.replicas[i];
        let was = r.checked_healthy.swap(verdict.is_ok(), Ordering::Relaxed);
        self.refresh(i);
        match (was, verdict) {
            (false, Ok(())) => log::info!("replica {} of {} is healthy", r.url, self.slug),
            (true, Err(why)) => log::warn!(
                "replica {} of {} failed its health check: {why}",
                r.url,
                self.slug
            ),
            _ => {}
        }
    }

    /// Sets the replica's gauge from its check verdict and ejection.
    pub fn refresh(&self, i: usize) {
        let r = &self.replicas[i];
        let healthy = r.checked_healthy.load(Ordering::Relaxed) && !self.ejected(i);
        r.gauge.set(i64::from(healthy));
    }
}

/// Checks every replica of `pools` every model's interval, until the process ends. Runs on
/// the bookkeeping runtime with its own connector (checks never borrow a request's pooled
/// connection).
pub async fn run(pools: Arc<Vec<ModelPool>>, models: Vec<Model>) {
    let connector = TransportConnector::new(None);
    let mut checks = Vec::new();
    for (pool_index, model) in models.into_iter().enumerate() {
        let pools = pools.clone();
        let connector = &connector;
        checks.push(async move {
            let mut tick = tokio::time::interval(model.health.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let pool = &pools[pool_index];
                let all = (0..pool.replicas.len()).map(|i| check(connector, pool, &model, i));
                for (i, verdict) in join_all(all).await.into_iter().enumerate() {
                    if let Some(verdict) = verdict {
                        pool.health.set_checked(i, verdict);
                    }
                }
            }
        });
    }
    join_all(checks).await;
}

/// One check of replica `i`: `Some(verdict)`, or `None` when it has no address yet (the
/// resolver's business; its gauge stays as it is).
async fn check(
    connector: &TransportConnector,
    pool: &ModelPool,
    model: &Model,
    i: usize,
) -> Option<Result<(), String>> {
    let target = pool.target(i).ok()?;
    let by = deadline(tokio::time::Instant::now(), CHECK_TIMEOUT);
    let call = Call {
        method: Method::Get,
        target,
        timeouts: &model.timeouts,
        path: &model.health.path,
        body: &[],
        request_id: "health-check",
        api_key: model.upstream_api_key.as_deref(),
        header_deadline: by,
    };
    let verdict = match client::send(connector, &call).await {
        Ok(mut resp) => {
            let status = resp.status;
            // Read the (small) body so the exchange ends cleanly; the connection is closed.
            let _ = resp.read_all_by(MAX_CHECK_BODY, by).await;
            if status == 200 {
                Ok(())
            } else {
                Err(format!("it answered {status}"))
            }
        }
        Err(e) => {
            // The replica may have moved: have its name resolved again (requests do the same).
            if matches!(e, client::UpstreamError::Connect(_)) {
                pool.mark_stale(i);
            }
            Err(e.to_string())
        }
    };
    Some(verdict)
}
