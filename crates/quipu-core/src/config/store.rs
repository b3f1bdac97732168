//! `[store]` and `[billing]`: where the ledger and the keys live, how often they are written
//! and read, where unstored ledger rows spill at shutdown, and how much balance a replica
//! leases at a time, validated. Also [`redact_url`], for every message that shows a store URL.

use super::raw::{RawBilling, RawStore};
use super::secrets::secret;
use crate::money::{Pen, AMOUNT_DECIMALS};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Store {
    pub url: String,
    pub ledger_flush: Duration,
    pub ledger_batch_rows: usize,
    /// See [`RawStore::max_unstored_rows`].
    pub max_unstored_rows: usize,
    pub key_refresh: Duration,
    /// See [`RawStore::shutdown_flush_timeout_s`].
    pub shutdown_flush_timeout: Duration,
    /// The directory of ledger spill files (see `billing::spill`), resolved.
    pub spill_dir: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Billing {
    pub min_top_up: Pen,
    pub lease_chunk: Pen,
}

pub(super) fn validate_store(
    s: RawStore,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> Store {
    let url = secret(&s.url, "store.url", env, errs);
    if !(url.starts_with("sqlite://")
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://"))
    {
        errs.push(format!(
            "store.url must start with sqlite:// (a file) or postgres:// (a server), got \"{}\"",
            redact_url(&url)
        ));
    }
    if s.ledger_flush_ms == 0 || s.ledger_flush_ms > 10_000 {
        errs.push(format!(
            "store.ledger_flush_ms must be between 1 and 10000, got {}",
            s.ledger_flush_ms
        ));
    }
    if s.max_unstored_rows < s.ledger_batch_rows.max(1) {
        errs.push(format!(
            "store.max_unstored_rows must be at least store.ledger_batch_rows ({}), got {}",
            s.ledger_batch_rows.max(1),
            s.max_unstored_rows
        ));
    }
    if s.key_refresh_ms == 0 || s.key_refresh_ms > 1_500 {
        errs.push(format!(
            "store.key_refresh_ms must be between 1 and 1500 (a revocation must apply within 2 s, the reload query included), got {}",
            s.key_refresh_ms
        ));
    }
    if s.shutdown_flush_timeout_s == 0 || s.shutdown_flush_timeout_s > 3_600 {
        errs.push(format!(
            "store.shutdown_flush_timeout_s must be between 1 and 3600 (seconds a shutdown keeps \
             retrying an unreachable store before it writes the unstored ledger rows to a spill \
             file in store.spill_dir), got {}",
            s.shutdown_flush_timeout_s
        ));
    }
    let spill_dir = match s.spill_dir.as_deref().map(str::trim) {
        Some("") => {
            errs.push(
                "store.spill_dir must name a directory, got \"\"; leave it out for the default \
                 (ledger-spill beside the SQLite file, else data/ledger-spill)"
                    .into(),
            );
            PathBuf::new()
        }
        Some(dir) => PathBuf::from(dir),
        None => default_spill_dir(&url),
    };
    Store {
        url,
        ledger_flush: Duration::from_millis(s.ledger_flush_ms),
        ledger_batch_rows: s.ledger_batch_rows.max(1),
        max_unstored_rows: s.max_unstored_rows,
        key_refresh: Duration::from_millis(s.key_refresh_ms),
        shutdown_flush_timeout: Duration::from_secs(s.shutdown_flush_timeout_s),
        spill_dir,
    }
}

/// `ledger-spill` beside the SQLite file of `url`; `data/ledger-spill` for PostgreSQL or an
/// in-memory database.
fn default_spill_dir(url: &str) -> PathBuf {
    match url.strip_prefix("sqlite://") {
        Some(path) if !path.is_empty() && path != ":memory:" => Path::new(path)
            .parent()
            .map(|p| p.join("ledger-spill"))
            .unwrap_or_else(|| PathBuf::from("ledger-spill")),
        _ => PathBuf::from("data/ledger-spill"),
    }
}

/// A store URL with its password replaced, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

pub(super) fn validate_billing(b: RawBilling, errs: &mut Vec<String>) -> Billing {
    let min_top_up = Pen::parse(&b.min_top_up, AMOUNT_DECIMALS).unwrap_or_else(|e| {
        errs.push(format!("billing.min_top_up: {e}"));
        Pen::ZERO
    });
    let lease_chunk = Pen::parse(&b.lease_chunk, AMOUNT_DECIMALS).unwrap_or_else(|e| {
        errs.push(format!("billing.lease_chunk: {e}"));
        Pen::ZERO
    });
    if lease_chunk == Pen::ZERO {
        errs.push("billing.lease_chunk must be more than 0".into());
    }
    Billing {
        min_top_up,
        lease_chunk,
    }
}
