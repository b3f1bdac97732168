//! `[responses]`: the stored responses of the Responses API (`store: true`, its default) — how
//! long they are kept, how many bytes of them each tenant may keep, how often the cleanup runs,
//! and how many bytes may wait in memory for the store.
//!
//! A stored response keeps its object and its whole conversation (every earlier turn's items),
//! so a long conversation continued turn by turn with `previous_response_id` grows with the
//! square of its turns; the per-tenant cap bounds what that costs the store: the cleanup
//! deletes a tenant's oldest responses beyond it.

use super::raw::RawResponses;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Responses {
    /// Stored responses older than this are deleted by the cleanup.
    pub retention: Duration,
    /// Bytes (response objects and conversations) one tenant may keep; the cleanup deletes
    /// its oldest responses beyond.
    pub max_bytes_per_tenant: u64,
    /// How often the cleanup runs.
    pub cleanup_interval: Duration,
    /// Stored responses waiting for the store, in bytes, beyond which new ones are not stored
    /// (logged and counted): what a store outage may hold in memory.
    pub max_queued_bytes: usize,
}

const MIB: u64 = 1024 * 1024;

pub(super) fn validate_responses(r: RawResponses, errs: &mut Vec<String>) -> Responses {
    let mut within = |key: &str, v: u64, lo: u64, hi: u64, unit: &str| {
        if !(lo..=hi).contains(&v) {
            errs.push(format!(
                "responses.{key} must be between {lo} and {hi} ({unit}), got {v}"
            ));
        }
    };
    within("retention_days", r.retention_days, 1, 3650, "days");
    within(
        "max_mib_per_tenant",
        r.max_mib_per_tenant,
        1,
        1 << 20,
        "MiB",
    );
    within(
        "cleanup_interval_s",
        r.cleanup_interval_s,
        1,
        86_400,
        "seconds",
    );
    within("max_queued_mib", r.max_queued_mib, 1, 1 << 16, "MiB");
    Responses {
        retention: Duration::from_secs(r.retention_days.saturating_mul(86_400)),
        max_bytes_per_tenant: r.max_mib_per_tenant.saturating_mul(MIB),
        cleanup_interval: Duration::from_secs(r.cleanup_interval_s),
        max_queued_bytes: usize::try_from(r.max_queued_mib.saturating_mul(MIB))
            .unwrap_or(usize::MAX),
    }
}
