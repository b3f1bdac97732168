//! What the queue of a scheduled pool learns about its replicas between requests: whether each
//! is available (health checks, ejection, a resolved address), and, with `engine_load`, the
//! engine's own count of requests running and waiting (`GET /metrics`, read as
//! [`crate::upstream_profile::load`] says for each server), every
//! `scheduling.load_interval_ms`.
//!
//! A report that does not come (metrics off, the endpoint down) is simply not sent: the
//! scheduler stops trusting the last one after a few intervals and falls back to this
//! gateway's share of `max_concurrency`.

use super::ModelPool;
use crate::config::{Model, Scheduling};
use crate::h1::Method;
use crate::http::client::{self, Call};
use crate::http::deadline;
use crate::metrics::m;
use crate::upstream_profile::load::{parse_load, LOAD_PATH};
use crate::upstream_profile::{Server, ServerChoice};
use futures::future::join_all;
use pingora::connectors::TransportConnector;
use std::sync::Arc;
use std::time::Duration;
use strum::IntoEnumIterator;

/// A load read's whole exchange must finish within this (and within the interval).
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of a `/metrics` body read (vLLM's is tens of KiB).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// Keeps every scheduled pool's queue told about its replicas, until the process ends. Runs on
/// the bookkeeping runtime with its own connector.
pub async fn run(pools: Arc<Vec<ModelPool>>, models: Vec<Model>, scheduling: Scheduling) {
    let connector = TransportConnector::new(None);
    let mut tasks = Vec::new();
    for (index, model) in models.into_iter().enumerate() {
        if pools[index].dispatcher.is_none() {
            continue;
        }
        let (pools, connector) = (pools.clone(), &connector);
        tasks.push(async move {
            let mut tick = tokio::time::interval(scheduling.load_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let pool = &pools[index];
                let all = (0..pool.replicas.len()).map(|i| update(connector, pool, &model, i));
                join_all(all).await;
            }
        });
    }
    join_all(tasks).await;
}

/// Tells the queue whether replica `i` is available and, if it reads engines' load, what its
/// engine reports.
async fn update(connector: &TransportConnector, pool: &ModelPool, model: &Model, i: usize) {
    let Some(dispatcher) = pool.dispatcher.as_ref() else {
        return;
    };
    dispatcher.set_available(i, pool.is_available(i));
    if !model.capacity.reads_engine_load() {
        return;
    }
    let Some(body) = read_metrics(connector, pool, model, i).await else {
        return;
    };
    let servers: Vec<Server> = match (model.server, pool.detected_server(i)) {
        (ServerChoice::Known(s), _) | (ServerChoice::Auto, Some(s)) => vec![s],
        (ServerChoice::Auto, None) => Server::iter().collect(),
    };
    let Some(load) = servers.into_iter().find_map(|s| parse_load(s, &body)) else {
        return;
    };
    let url = &pool.replicas[i].replica.url;
    for (state, n) in [("running", load.running), ("waiting", load.waiting)] {
        m().engine_load
            .with_label_values(&[&model.slug, url, state])
            .set(i64::from(n));
    }
    dispatcher.report_load(i, load);
}

/// Replica `i`'s `/metrics` body, if it answers one in time.
async fn read_metrics(
    connector: &TransportConnector,
    pool: &ModelPool,
    model: &Model,
    i: usize,
) -> Option<String> {
    let target = pool.target(i).ok()?;
    let by = deadline(tokio::time::Instant::now(), READ_TIMEOUT);
    let call = Call {
        method: Method::Get,
        target,
        timeouts: &model.timeouts,
        path: LOAD_PATH,
        body: &[],
        request_id: "engine-load",
        api_key: model.upstream_api_key.as_deref(),
        header_deadline: by,
    };
    let mut resp = client::send(connector, &call).await.ok()?;
    if resp.status != 200 {
        return None;
    }
    let body = resp.read_all_by(MAX_BODY, by).await.ok()?;
    String::from_utf8(body.to_vec()).ok()
}
