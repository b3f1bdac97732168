//! `[scheduling]` and each model's capacity: how many requests Quipu has running on each
//! replica, and how those beyond wait (see [`crate::schedule`] for the policy).
//!
//! A model with `max_concurrency` (per replica: the engine's `--max-num-seqs`, llama.cpp's
//! `--parallel`) is scheduled: requests beyond its replicas' slots wait in Quipu, per tenant,
//! and the next one is picked by weighted fair queueing across tenants. A model without it
//! forwards every admitted request at once, as an engine's own queue then decides (today's
//! behaviour); nothing is queued and the scheduler is never called.
//!
//! `engine_load` reads each scheduled replica's own gauges (vLLM and SGLang `/metrics`,
//! llama.cpp `/slots` or its `--metrics`) every `load_interval_ms`: a fresh report is the
//! truth shared by every gateway replica in front of the same engines, so capacity is not
//! counted twice; without one each gateway runs its share of `max_concurrency`
//! (`gateways` of them, configured).

use super::raw::RawScheduling;
use crate::schedule::{Millis, SchedulerConfig};
use std::num::NonZeroU32;
use std::time::Duration;

/// The queue's knobs, the same for every scheduled pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduling {
    pub scheduler: SchedulerConfig,
    /// How often an engine's own load is read.
    pub load_interval: Duration,
    /// Gateway replicas in front of the same engines, when their load cannot be read: each
    /// runs `max_concurrency / gateways` (the remainder to the first ones).
    pub gateways: NonZeroU32,
    /// A streaming client that waits this long in the queue gets its response head and the
    /// format's keep-alive, so its own timeout does not fire.
    pub stream_head_after: Duration,
}

/// Whether to read an engine's own load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineLoadMode {
    /// Read it where the model is scheduled (it has `max_concurrency`).
    Auto,
    Off,
}

/// One model's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Requests running at once on each replica; `None`: not scheduled.
    pub max_concurrency: Option<NonZeroU32>,
    pub engine_load: EngineLoadMode,
}

impl Capacity {
    /// Whether requests of this model go through the scheduler.
    pub fn scheduled(&self) -> bool {
        self.max_concurrency.is_some()
    }

    /// Whether the engines' own load is read.
    pub fn reads_engine_load(&self) -> bool {
        self.scheduled() && self.engine_load == EngineLoadMode::Auto
    }
}

pub(super) fn validate_scheduling(r: RawScheduling, errs: &mut Vec<String>) -> Scheduling {
    let mut positive = |key: &str, v: u64| {
        if v == 0 {
            errs.push(format!("scheduling.{key} must be more than 0"));
        }
    };
    positive("queue_timeout_ms", r.queue_timeout_ms);
    positive("load_interval_ms", r.load_interval_ms);
    positive("gateways", u64::from(r.gateways));
    let scheduler = SchedulerConfig {
        queue_timeout: Millis(r.queue_timeout_ms),
        tenant_queue_cap: r.tenant_queue_cap,
        max_queued: r.max_queued,
        batch_age_limit: Millis(r.batch_age_limit_ms),
        affinity_wait: Millis(r.affinity_wait_ms),
        report_ttl: Millis(r.load_interval_ms.saturating_mul(3).max(1_000)),
        engine_queue_allowance: r.engine_queue_allowance,
        return_hold: Millis(r.return_hold_ms),
    };
    if scheduler.check().is_err() {
        errs.push(format!(
            "scheduling.batch_age_limit_ms ({}) must be below scheduling.queue_timeout_ms ({}), \
             or batch requests could time out before they ever run",
            r.batch_age_limit_ms, r.queue_timeout_ms
        ));
    }
    Scheduling {
        scheduler,
        load_interval: Duration::from_millis(r.load_interval_ms),
        gateways: NonZeroU32::new(r.gateways).unwrap_or(NonZeroU32::MIN),
        stream_head_after: Duration::from_millis(r.stream_head_after_ms),
    }
}

pub(super) fn validate_capacity(
    max_concurrency: Option<u32>,
    engine_load: &str,
    key: &str,
    errs: &mut Vec<String>,
) -> Capacity {
    let max_concurrency = match max_concurrency {
        Some(0) => {
            errs.push(format!(
                "{key}.max_concurrency must be at least 1 (leave it out to forward every request at once)"
            ));
            None
        }
        Some(n) => NonZeroU32::new(n),
        None => None,
    };
    let engine_load = match engine_load {
        "auto" => EngineLoadMode::Auto,
        "off" => EngineLoadMode::Off,
        other => {
            errs.push(format!(
                "{key}.engine_load must be \"auto\" or \"off\", got \"{other}\""
            ));
            EngineLoadMode::Auto
        }
    };
    Capacity {
        max_concurrency,
        engine_load,
    }
}
