//! The ledger writer: request rows, batched off the request path, written idempotently.
//!
//! The request path's last step (`Gateway::finish`) hands each request's row to
//! [`LedgerHandle::record`], which never blocks and wakes no other thread (an unbounded queue:
//! rows are money and are never dropped; the queue depth is a metric). Every `flush_interval`
//! the writer takes what queued and writes it in store transactions of up to `batch_rows` rows
//! (the gathering is `store::batch`'s), keyed by request id, so a retried batch never charges
//! twice. A failed write is retried with backoff, rows kept.
//!
//! A row the store can never write (an invalid value, an unknown tenant) must not hold up the
//! rows behind it: such rows are caught before the write where possible, and a batch the store
//! refuses as invalid is split until the bad row is alone. That row goes to the store's
//! dead-letter table (`ledger_rejects`), is logged at error level with its full contents and
//! counted (`quipu_ledger_rows_total{result="rejected"}`); its charge is not applied, for the
//! operator to settle by hand. Only transient failures are retried.
//!
//! Durability: a graceful shutdown (SIGTERM, or the end of a graceful upgrade) drains the queue
//! before the process exits. If the store cannot be reached then, the writer keeps retrying for
//! `store.shutdown_flush_timeout_s` after the stop signal, then writes every row it could not
//! store to a spill file (see [`super::spill`]), logs an error naming the file and the command
//! that imports it (`quipu ledger import FILE`), counts the rows
//! (`quipu_ledger_rows_total{result="spilled"}`) and lets the shutdown go on: a store that is
//! down never holds a SIGTERM up until the supervisor's SIGKILL, which would lose the queue. A
//! crash loses at most the rows of the last `flush_interval` (10 ms by default) plus, while the
//! store is unreachable, the rows queued meanwhile — at most `store.max_unstored_rows`: at that
//! many rows owed to the store the queue reports a backlog ([`LedgerHandle::backlogged`]) and
//! the gateway admits no new billable request until the store has caught up, so an outage
//! costs availability, never an unbounded amount of unwritten money (or memory).

use super::accounts::Accounts;
use super::spill;
use crate::metrics::m;
use crate::money::Pen;
use crate::store::batch::{self, BatchQueue, Sink};
use crate::store::{LedgerRow, LedgerStore, Store, StoreError};
use parking_lot::Mutex;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The queue depth gauge: rows owed to the store.
fn publish(owed: usize) {
    m().ledger_queue.set(owed as i64);
}

/// Hands rows to the writer. Cheap to clone.
#[derive(Clone)]
pub struct LedgerHandle {
    queue: Arc<BatchQueue<LedgerRow>>,
    /// Rows owed at which admission stops (`store.max_unstored_rows`).
    cap: usize,
}

impl LedgerHandle {
    /// Queues a row; never blocks, never drops one.
    pub fn record(&self, row: LedgerRow) {
        self.queue.push(row);
    }

    /// Rows not yet written: queued, or taken by the writer and not yet in the store.
    pub fn queued(&self) -> usize {
        self.queue.owed()
    }

    /// Whether `store.max_unstored_rows` rows are owed to the store: new billable requests
    /// must then be refused. No lock: one atomic load.
    pub fn backlogged(&self) -> bool {
        self.queue.owed() >= self.cap
    }
}

/// What the writer does at shutdown when the store cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownPolicy {
    /// How long after the stop signal the writer keeps retrying the store.
    pub flush_timeout: Duration,
    /// Where the rows it could not store then go (see [`super::spill`]).
    pub spill_dir: PathBuf,
}

impl ShutdownPolicy {
    pub fn of(store: &crate::config::Store) -> ShutdownPolicy {
        ShutdownPolicy {
            flush_timeout: store.shutdown_flush_timeout,
            spill_dir: store.spill_dir.clone(),
        }
    }
}

/// The writer half. Run [`LedgerWriter::run`] on a runtime that outlives the proxy.
pub struct LedgerWriter<S: ?Sized = dyn Store> {
    queue: Arc<BatchQueue<LedgerRow>>,
    store: Arc<S>,
    accounts: Arc<Accounts>,
    flush_interval: Duration,
    batch_rows: usize,
    shutdown: ShutdownPolicy,
    /// The stop signal, once [`LedgerWriter::run`] has it.
    stop: Option<watch::Receiver<bool>>,
    /// When the writer stops retrying: set when it first sees the stop signal.
    give_up_at: Mutex<Option<tokio::time::Instant>>,
    /// The deadline passed: every row not yet stored goes to `unstored` without a try.
    out_of_time: AtomicBool,
    /// Rows given up on at shutdown, for the spill file.
    unstored: Mutex<Vec<LedgerRow>>,
}

/// Why a write did not happen.
enum Failure {
    /// The store refused it for good (the row, or a row of the batch, can never be written).
    Refused(StoreError),
    /// The shutdown deadline passed while the store was unreachable.
    OutOfTime,
}

pub fn channel<S: LedgerStore + ?Sized>(
    store: Arc<S>,
    accounts: Arc<Accounts>,
    flush_interval: Duration,
    batch_rows: usize,
    max_unstored_rows: usize,
    shutdown: ShutdownPolicy,
) -> (LedgerHandle, LedgerWriter<S>) {
    let queue = Arc::new(BatchQueue::default());
    (
        LedgerHandle {
            queue: queue.clone(),
            cap: max_unstored_rows.max(1),
        },
        LedgerWriter {
            queue,
            store,
            accounts,
            flush_interval,
            batch_rows,
            shutdown,
            stop: None,
            give_up_at: Mutex::new(None),
            out_of_time: AtomicBool::new(false),
            unstored: Mutex::new(Vec::new()),
        },
    )
}

/// The writer's batches go to the store, with the ledger's failure policy (see the module
/// docs); the queue gauge follows what is owed.
impl<S: LedgerStore + ?Sized> Sink<LedgerRow> for LedgerWriter<S> {
    async fn write(&self, batch: Vec<LedgerRow>) {
        self.write_batch(batch).await;
    }

    fn taken(&self, taken: usize, owed: usize) {
        publish(owed);
        crate::threads::note_ledger_backlog(taken);
    }

    fn paid(&self, owed: usize) {
        publish(owed);
    }
}

impl<S: LedgerStore + ?Sized> LedgerWriter<S> {
    /// Writes what has queued every flush interval until `stop` turns true (or its sender is
    /// dropped); then writes whatever is still queued (requests still settling after the
    /// signal, which the drain watcher waits for, land in that last pass) and returns how many
    /// rows it could not store (they are in a spill file, or failing that in the error log; see
    /// the module docs).
    pub async fn run(mut self, stop: watch::Receiver<bool>) -> usize {
        self.stop = Some(stop.clone());
        let queue = Arc::clone(&self.queue);
        batch::run(
            &queue,
            &self,
            self.flush_interval,
            self.batch_rows,
            Some(stop),
        )
        .await;
        publish(queue.owed());
        self.spill()
    }

    /// Whether shutdown has started.
    fn stopping(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|rx| *rx.borrow() || rx.has_changed().is_err())
    }

    /// Resolves once shutdown has started (never, outside [`LedgerWriter::run`]).
    async fn stopped(&self) {
        match self.stop.clone() {
            Some(mut rx) => {
                // An error means the sender is gone: that is a stop too.
                let _ = rx.wait_for(|s| *s).await;
            }
            None => std::future::pending().await,
        }
    }

    /// When to give up on the store: `None` until shutdown starts, then the stop signal (as
    /// first seen) plus the flush timeout.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        if !self.stopping() {
            return None;
        }
        let timeout = self.shutdown.flush_timeout;
        Some(
            *self
                .give_up_at
                .lock()
                .get_or_insert_with(|| tokio::time::Instant::now() + timeout),
        )
    }

    /// Runs a store call to its end, or once shutdown has started, until the deadline
    /// (`None`: out of time; the call may or may not have taken effect, which the idempotent
    /// import of the spilled rows makes harmless).
    async fn bounded<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        tokio::pin!(call);
        if self.deadline().is_none() {
            tokio::select! {
                r = &mut call => return Some(r),
                () = self.stopped() => {}
            }
        }
        let at = self.deadline()?;
        tokio::time::timeout_at(at, call).await.ok()
    }

    /// Waits `backoff` before a retry (cut short by the stop signal); false when the shutdown
    /// deadline has passed and the writer must give up instead.
    async fn pause(&self, backoff: Duration) -> bool {
        match self.deadline() {
            Some(at) => {
                tokio::time::sleep_until(at.min(tokio::time::Instant::now() + backoff)).await;
                tokio::time::Instant::now() < at
            }
            None => {
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = self.stopped() => {}
                }
                true
            }
        }
    }

    /// Gives up on rows: they go to the spill file at the end of [`LedgerWriter::run`].
    fn set_aside(&self, rows: Vec<LedgerRow>) {
        self.out_of_time.store(true, Ordering::Relaxed);
        self.unstored.lock().extend(rows);
    }

    /// Writes the rows given up on to a spill file (or, if that fails, to the error log);
    /// returns how many there were.
    fn spill(&self) -> usize {
        let rows = std::mem::take(&mut *self.unstored.lock());
        if rows.is_empty() {
            return 0;
        }
        let n = rows.len();
        m().ledger_rows
            .with_label_values(&["spilled"])
            .inc_by(n as u64);
        let total: Pen = rows.iter().map(|r| r.charge).sum();
        let replica = self.accounts.replica();
        let dir = &self.shutdown.spill_dir;
        let timeout = self.shutdown.flush_timeout.as_secs();
        match spill::write(dir, replica, &rows) {
            Ok(path) => log::error!(
                "the store could not be reached within store.shutdown_flush_timeout_s ({timeout} s) \
                 of the shutdown: {n} ledger rows (charges S/ {}) were NOT stored and were written \
                 to the spill file {} instead. Their charges are not in the tenants' balances yet: \
                 once the store is reachable, run `quipu ledger import {}` with this gateway's \
                 configuration (importing twice never charges twice)",
                total.to_decimal(),
                path.display(),
                path.display()
            ),
            Err(e) => {
                log::error!(
                    "the store could not be reached within store.shutdown_flush_timeout_s \
                     ({timeout} s) of the shutdown, and writing the {n} unstored ledger rows \
                     (charges S/ {}) to a spill file in {} failed: {e}. They follow, one per log \
                     line after \"unstored ledger row: \": save what follows that prefix, one row \
                     per line, to a file and run `quipu ledger import FILE` once the store is \
                     reachable",
                    total.to_decimal(),
                    dir.display()
                );
                for row in &rows {
                    log::error!("unstored ledger row: {}", spill::encode_line(replica, row));
                }
            }
        }
        n
    }

    /// Writes a batch; rows that can never be written are set aside (see the module docs).
    async fn write_batch(&self, batch: Vec<LedgerRow>) {
        if self.out_of_time.load(Ordering::Relaxed) {
            self.set_aside(batch);
            return;
        }
        let (good, bad): (Vec<LedgerRow>, Vec<LedgerRow>) = batch
            .into_iter()
            .partition(|r| crate::store::validate_row(r).is_ok());
        for row in bad {
            let reason = crate::store::validate_row(&row)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            self.reject(row, &reason).await;
        }
        // Halves still to write, in order (the last is next).
        let mut todo = vec![good];
        while let Some(batch) = todo.pop() {
            if batch.is_empty() {
                continue;
            }
            match self.write_retrying(&batch).await {
                Ok(()) => {}
                Err(Failure::OutOfTime) => {
                    self.set_aside(batch);
                    for rest in todo.drain(..) {
                        self.set_aside(rest);
                    }
                }
                Err(Failure::Refused(e)) if batch.len() == 1 => {
                    let reason = e.to_string();
                    if let Some(row) = batch.into_iter().next() {
                        self.reject(row, &reason).await;
                    }
                }
                Err(Failure::Refused(_)) => {
                    let mut first = batch;
                    let second = first.split_off(first.len() / 2);
                    todo.push(second);
                    todo.push(first);
                }
            }
        }
    }

    /// Writes a batch, retrying transient failures (at shutdown, until the deadline); returns a
    /// permanent one.
    async fn write_retrying(&self, batch: &[LedgerRow]) -> Result<(), Failure> {
        let mut backoff = Duration::from_millis(50);
        loop {
            let started = Instant::now();
            let sent = self.accounts.tick();
            let Some(result) = self
                .bounded(self.store.record(self.accounts.replica(), batch))
                .await
            else {
                m().ledger_flush_seconds
                    .with_label_values(&["error"])
                    .observe(started.elapsed().as_secs_f64());
                log::error!(
                    "ledger write of {} rows still unanswered at the shutdown deadline; giving up on the store",
                    batch.len()
                );
                return Err(Failure::OutOfTime);
            };
            match result {
                Ok(recorded) => {
                    let secs = started.elapsed().as_secs_f64();
                    m().ledger_flush_seconds
                        .with_label_values(&["ok"])
                        .observe(secs);
                    let new = recorded.new;
                    m().ledger_rows.with_label_values(&["new"]).inc_by(new);
                    m().ledger_rows
                        .with_label_values(&["duplicate"])
                        .inc_by(batch.len() as u64 - new.min(batch.len() as u64));
                    // The lease rows as the write left them: the books count these charges
                    // as written from here on (a retried batch's rows included).
                    self.accounts.recorded(sent, &recorded);
                    return Ok(());
                }
                Err(e) if !e.is_transient() => {
                    m().ledger_flush_seconds
                        .with_label_values(&["error"])
                        .observe(started.elapsed().as_secs_f64());
                    if batch.len() > 1 {
                        log::warn!(
                            "the store refused a ledger batch of {} rows ({e}); splitting it to find the bad row",
                            batch.len()
                        );
                    }
                    return Err(Failure::Refused(e));
                }
                Err(e) => {
                    m().ledger_flush_seconds
                        .with_label_values(&["error"])
                        .observe(started.elapsed().as_secs_f64());
                    // Rows are still arriving while the store is away: keep the gauge true.
                    publish(self.queue.owed());
                    match self.deadline() {
                        None => log::error!(
                            "ledger write of {} rows failed, retrying in {backoff:?}: {e}",
                            batch.len()
                        ),
                        Some(at) => log::error!(
                            "ledger write of {} rows failed during shutdown, retrying for {:?} more \
                             before spilling the unstored rows to {}: {e}",
                            batch.len(),
                            at.saturating_duration_since(tokio::time::Instant::now()),
                            self.shutdown.spill_dir.display()
                        ),
                    }
                    if !self.pause(backoff).await {
                        return Err(Failure::OutOfTime);
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Puts a row the store refused into the dead-letter table (retrying transient failures).
    async fn reject(&self, row: LedgerRow, reason: &str) {
        if self.out_of_time.load(Ordering::Relaxed) {
            // Spilled as it is: the import refuses it again and sets it aside then.
            self.set_aside(vec![row]);
            return;
        }
        log::error!(
            "ledger row {} of tenant {} cannot be written ({reason}); moved to the dead-letter table ledger_rejects, charge {} NOT applied: {}",
            row.request_id,
            row.tenant_id,
            row.charge.to_decimal(),
            row.to_json()
        );
        m().ledger_rows.with_label_values(&["rejected"]).inc();
        let mut backoff = Duration::from_millis(50);
        loop {
            let Some(result) = self.bounded(self.store.reject(&row, reason)).await else {
                self.set_aside(vec![row]);
                return;
            };
            match result {
                Ok(()) => break,
                Err(e) if e.is_transient() => {
                    publish(self.queue.owed());
                    log::error!(
                        "storing rejected ledger row {} failed, retrying in {backoff:?}: {e}",
                        row.request_id
                    );
                    if !self.pause(backoff).await {
                        self.set_aside(vec![row]);
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    // The error log above holds the row: it is the record of last resort.
                    log::error!(
                        "storing rejected ledger row {} failed for good: {e}",
                        row.request_id
                    );
                    break;
                }
            }
        }
        let caps: Vec<crate::store::CapPool> = row
            .caps
            .iter()
            .filter_map(|id| crate::store::CapPool::parse(id, row.tenant_id))
            .collect();
        self.accounts.abandoned(row.tenant_id, &caps, row.charge);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::TenantId;

    fn row(id: &str, tenant: TenantId, picos: i128) -> LedgerRow {
        LedgerRow {
            request_id: id.into(),
            at: crate::store::now_ms(),
            tenant_id: tenant,
            key_id: "key_x".into(),
            model: "colibri".into(),
            format: "chat".into(),
            input_tokens: 10,
            cached_tokens: 0,
            output_tokens: 5,
            charge: Pen::from_picos(picos),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
            caps: Vec::new(),
        }
    }

    fn test_policy() -> ShutdownPolicy {
        ShutdownPolicy {
            flush_timeout: Duration::from_secs(30),
            spill_dir: std::env::temp_dir().join("quipu-ledger-test-spill-unused"),
        }
    }

    #[tokio::test]
    async fn admission_stops_at_max_unstored_rows_and_resumes_once_written() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(":memory:").await.unwrap());
        let t = store.create_tenant("acme").await.unwrap().id;
        store.top_up(t, Pen::from_centimos(1000), "").await.unwrap();
        let accounts = Accounts::new(
            store.clone(),
            "r1".into(),
            Pen::from_centimos(500),
            Duration::from_secs(15),
        );
        let (handle, writer) = channel(
            store.clone(),
            accounts,
            Duration::from_millis(5),
            2,
            3,
            test_policy(),
        );
        handle.record(row("a", t, 1_000));
        handle.record(row("b", t, 1_000));
        assert!(!handle.backlogged());
        handle.record(row("c", t, 1_000));
        assert!(handle.backlogged(), "3 rows owed with a cap of 3");
        let (_stop_tx, stop) = tokio::sync::watch::channel(true);
        assert_eq!(writer.run(stop).await, 0);
        assert_eq!(handle.queued(), 0);
        assert!(!handle.backlogged());
        assert_eq!(store.ledger_rows(Some(t)).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn bad_rows_are_set_aside_and_the_rows_behind_them_are_written() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(":memory:").await.unwrap());
        let t = store.create_tenant("acme").await.unwrap().id;
        store.top_up(t, Pen::from_centimos(1000), "").await.unwrap();
        let accounts = Accounts::new(
            store.clone(),
            "r1".into(),
            Pen::from_centimos(500),
            Duration::from_secs(15),
        );
        let (handle, writer) = channel(
            store.clone(),
            accounts,
            Duration::from_millis(5),
            4,
            1_000,
            test_policy(),
        );
        let mut good = Vec::new();
        for i in 0..10 {
            let r = row(&format!("good-{i}"), t, 1_000_000);
            good.push(r.clone());
            handle.record(r);
            if i == 3 {
                // Caught before the write: a count no column can hold.
                let mut huge = row("huge", t, 1_000_000);
                huge.output_tokens = u64::MAX;
                handle.record(huge);
            }
            if i == 6 {
                // Only the store can tell: the tenant does not exist. Its batch is split
                // until the row is alone.
                handle.record(row("orphan", 987_654, 1_000_000));
            }
        }
        assert_eq!(handle.queued(), 12);
        let (_stop_tx, stop) = tokio::sync::watch::channel(true);
        let unstored = tokio::time::timeout(Duration::from_secs(10), writer.run(stop))
            .await
            .expect("the writer finished instead of retrying the bad rows forever");
        assert_eq!(unstored, 0);
        assert_eq!(handle.queued(), 0);
        assert_eq!(store.ledger_rows(Some(t)).await.unwrap(), good);
        let rejected: Vec<String> = store
            .rejected_rows()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.request_id)
            .collect();
        assert_eq!(rejected.len(), 2);
        assert!(rejected.contains(&"huge".to_owned()) && rejected.contains(&"orphan".to_owned()));
        assert_eq!(
            store.balance(t).await.unwrap().balance,
            Pen::from_centimos(1000) - Pen::from_picos(10_000_000)
        );
    }
}
