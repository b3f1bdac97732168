//! The ledger writer: request rows, batched off the request path, written idempotently.
//!
//! The `logging` phase hands each finished request's row to [`LedgerHandle::record`], which
//! never blocks (an unbounded queue: rows are money and are never dropped; the queue depth is a
//! metric). A writer task collects rows for up to `flush_interval` (or `batch_rows` rows) and
//! writes them in one store transaction, keyed by request id, so a retried batch never charges
//! twice. A failed write is retried with backoff, rows kept.
//!
//! Durability: a graceful shutdown (SIGTERM, or the end of a graceful upgrade) drains the queue
//! before the process exits. A crash loses at most the rows of the last `flush_interval`
//! (50 ms by default) plus, while the store is unreachable, the rows queued meanwhile.

use super::accounts::Accounts;
use crate::metrics::m;
use crate::money::Pen;
use crate::store::{LedgerRow, Store, TenantId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Sends rows to the writer. Cheap to clone.
#[derive(Clone)]
pub struct LedgerHandle {
    tx: mpsc::UnboundedSender<LedgerRow>,
    queued: Arc<AtomicI64>,
}

impl LedgerHandle {
    /// Queues a row. If the writer is gone (only after shutdown) the row is logged so it can be
    /// recovered by hand, never silently lost.
    pub fn record(&self, row: LedgerRow) {
        let n = self.queued.fetch_add(1, Ordering::Relaxed) + 1;
        m().ledger_queue.set(n);
        if let Err(e) = self.tx.send(row) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            log::error!("ledger writer is gone; unrecorded row: {:?}", e.0);
        }
    }

    pub fn queued(&self) -> i64 {
        self.queued.load(Ordering::Relaxed)
    }
}

/// The writer half. Run [`LedgerWriter::run`] on a runtime that outlives the proxy.
pub struct LedgerWriter {
    rx: mpsc::UnboundedReceiver<LedgerRow>,
    queued: Arc<AtomicI64>,
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
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicI64::new(0));
    (
        LedgerHandle {
            tx,
            queued: queued.clone(),
        },
        LedgerWriter {
            rx,
            queued,
            store,
            accounts,
            flush_interval,
            batch_rows,
        },
    )
}

impl LedgerWriter {
    /// Writes batches until every [`LedgerHandle`] is dropped or `stop` turns true; then
    /// writes whatever is still queued and returns.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut batch: Vec<LedgerRow> = Vec::with_capacity(self.batch_rows);
        loop {
            let first = tokio::select! {
                r = self.rx.recv() => r,
                _ = stop.wait_for(|s| *s) => None,
            };
            let Some(first) = first else { break };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.flush_interval;
            while batch.len() < self.batch_rows {
                match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    Ok(Some(row)) => batch.push(row),
                    Ok(None) | Err(_) => break,
                }
            }
            self.write(&mut batch).await;
        }
        // Shutdown: everything still queued goes out now.
        while let Ok(row) = self.rx.try_recv() {
            batch.push(row);
            if batch.len() >= self.batch_rows {
                self.write(&mut batch).await;
            }
        }
        if !batch.is_empty() {
            self.write(&mut batch).await;
        }
    }

    async fn write(&self, batch: &mut Vec<LedgerRow>) {
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
                    for r in batch.iter() {
                        *per_tenant.entry(r.tenant_id).or_default() += r.charge;
                    }
                    for (tenant, charged) in per_tenant {
                        self.accounts.flushed(tenant, charged);
                    }
                    let left = self.queued.fetch_sub(batch.len() as i64, Ordering::Relaxed)
                        - batch.len() as i64;
                    m().ledger_queue.set(left.max(0));
                    batch.clear();
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
