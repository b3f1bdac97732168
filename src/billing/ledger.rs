//! The ledger writer: request rows, batched off the request path, written idempotently.
//!
//! The `logging` phase hands each finished request's row to [`LedgerHandle::record`], which
//! never blocks and wakes no other thread (an unbounded queue: rows are money and are never
//! dropped; the queue depth is a metric). Every `flush_interval` the writer takes what queued
//! and writes it in store transactions of up to `batch_rows` rows, keyed by request id, so a
//! retried batch never charges twice. A failed write is retried with backoff, rows kept.
//!
//! Durability: a graceful shutdown (SIGTERM, or the end of a graceful upgrade) drains the queue
//! before the process exits. A crash loses at most the rows of the last `flush_interval`
//! (50 ms by default) plus, while the store is unreachable, the rows queued meanwhile.

use super::accounts::Accounts;
use crate::metrics::m;
use crate::money::Pen;
use crate::store::{LedgerRow, Store, TenantId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rows waiting for the writer. A plain vector under a mutex: the request path pushes (tens of
/// nanoseconds, no wake-up of another thread), the writer swaps the vector out on its tick.
#[derive(Default)]
struct Queue {
    rows: Mutex<Vec<LedgerRow>>,
}

/// Hands rows to the writer. Cheap to clone.
#[derive(Clone)]
pub struct LedgerHandle {
    queue: Arc<Queue>,
}

impl LedgerHandle {
    /// Queues a row; never blocks, never drops one.
    pub fn record(&self, row: LedgerRow) {
        self.queue.rows.lock().push(row);
    }

    /// Rows not yet taken by the writer.
    pub fn queued(&self) -> usize {
        self.queue.rows.lock().len()
    }
}

/// The writer half. Run [`LedgerWriter::run`] on a runtime that outlives the proxy.
pub struct LedgerWriter {
    queue: Arc<Queue>,
    store: Arc<dyn Store>,
    accounts: Arc<Accounts>,
    flush_interval: Duration,
    batch_rows: usize,
}

pub fn channel(
    store: Arc<dyn Store>,
    accounts: Arc<Accounts>,
    flush_interval: Duration,
    batch_rows: usize,
) -> (LedgerHandle, LedgerWriter) {
    let queue = Arc::new(Queue::default());
    (
        LedgerHandle {
            queue: queue.clone(),
        },
        LedgerWriter {
            queue,
            store,
            accounts,
            flush_interval,
            batch_rows,
        },
    )
}

impl LedgerWriter {
    /// Writes what has queued every flush interval until `stop` turns true; then writes
    /// whatever is still queued and returns.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = tick.tick() => false,
                _ = stop.wait_for(|s| *s) => true,
            };
            self.drain().await;
            if stopping {
                // Requests still settling after the signal (the drain watcher waits for them)
                // land here on the last pass.
                self.drain().await;
                return;
            }
        }
    }

    async fn drain(&self) {
        let mut rows = std::mem::take(&mut *self.queue.rows.lock());
        m().ledger_queue.set(rows.len() as i64);
        while !rows.is_empty() {
            let rest = rows.split_off(rows.len().min(self.batch_rows));
            self.write(&rows).await;
            rows = rest;
        }
        m().ledger_queue.set(self.queue.rows.lock().len() as i64);
    }

    async fn write(&self, batch: &[LedgerRow]) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let started = Instant::now();
            match self.store.record(self.accounts.replica(), batch).await {
                Ok(new) => {
                    let secs = started.elapsed().as_secs_f64();
                    m().ledger_flush_seconds
                        .with_label_values(&["ok"])
                        .observe(secs);
                    m().ledger_rows.with_label_values(&["new"]).inc_by(new);
                    m().ledger_rows
                        .with_label_values(&["duplicate"])
                        .inc_by(batch.len() as u64 - new.min(batch.len() as u64));
                    let mut per_tenant: HashMap<TenantId, Pen> = HashMap::new();
                    for r in batch {
                        *per_tenant.entry(r.tenant_id).or_default() += r.charge;
                    }
                    for (tenant, charged) in per_tenant {
                        self.accounts.flushed(tenant, charged);
                    }
                    return;
                }
                Err(e) => {
                    m().ledger_flush_seconds
                        .with_label_values(&["error"])
                        .observe(started.elapsed().as_secs_f64());
                    log::error!(
                        "ledger write of {} rows failed, retrying in {backoff:?}: {e}",
                        batch.len()
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}
