//! Admission by reservation against leased balance: the I/O around
//! [`quipu_core::billing::book`].
//!
//! Before a request is forwarded, its worst-case cost is **reserved**; when it ends — on every
//! path — the reservation is replaced by the real charge, **capped at the reservation** (what
//! the tokens cost beyond it is reported as unbilled, never charged). A replica admits only
//! against money it holds a **lease** on (see `store`), so no tenant can be overdrawn, however
//! many replicas share the store.
//!
//! The bookkeeping is the core's [`Book`], one per tenant: a pure state machine whose
//! invariants (no overdraft, no refusal while the balance covers a request, exact at rest) are
//! proven over every interleaving in its model test. This module only wires it: it asks the
//! book what to do, makes the store calls it asks for, and hands every answer back — the
//! lease rows the ledger writer's `record` returns ([`Accounts::recorded`]), the heartbeat's,
//! grants and releases. The book's mutex is held for one event, never across I/O, so the
//! common path (the lease covers the request) is one short critical section.
//!
//! **Store calls outlive the requests that asked for them.** A lease call runs in its own
//! task and applies its answer to the book itself, so a request that gives up (its deadline,
//! its client gone) never leaves a call half-applied: the book would otherwise wait forever for
//! an answer nobody brings.
//!
//! **Leases come home when needed.** A replica that would refuse a request for balance other
//! replicas hold asks them to return what they hold free ([`ReplicaSignal::RecallLeases`],
//! PostgreSQL `NOTIFY`), waits up to [`RECALL_WAIT`] for one to say it did
//! ([`ReplicaSignal::LeasesReturned`]) and asks the store again. Every release — called home,
//! or idle for a few seconds — is announced the same way, so other replicas that found the
//! store dry ask again instead of refusing from memory.

use crate::money::Pen;
use crate::store::{LeaseAsk, LeaseReading, ReplicaSignal, Store, StoreError, TenantId};
use parking_lot::Mutex;
use quipu_core::billing::book::{self, Book, CallFailed, Held, Pending, Step, Tick, Timing};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most time a request waits for admission (lease calls and recalls included).
pub const LEASE_CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// After the store had no unleased money, requests of the tenant that do not fit the lease are
/// refused without asking again for this long (unless money comes home meanwhile).
pub const DRY_MEMORY: Duration = Duration::from_secs(1);
/// After a lease call failed, requests that need the store fail at once for this long instead
/// of each waiting out its own timeout.
pub const FAILURE_MEMORY: Duration = Duration::from_secs(1);
/// Most time a request short of balance waits for other replicas to return free leases.
pub const RECALL_WAIT: Duration = Duration::from_millis(250);
/// A release whose answer was lost stays counted as given back until a reading sent this long
/// after the failure says where the money is.
pub const DOUBT_SETTLE: Duration = Duration::from_secs(2);

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The balance (minus what is reserved or not yet written) does not cover the worst case.
    Insufficient { needed: Pen, available: Pen },
    /// The store could not be asked for more balance.
    StoreUnavailable(String),
}

/// An admitted request's hold on the tenant's money. Settle it with [`Accounts::settle`]; if it
/// is dropped unsettled (a cancelled task), the hold is released without a charge.
pub struct Reservation {
    pub tenant: TenantId,
    pub amount: Pen,
    accounts: Option<Arc<Accounts>>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("tenant", &self.tenant)
            .field("amount", &self.amount)
            .finish()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(a) = self.accounts.take() {
            log::warn!(
                "reservation of tenant {} dropped without settlement; released",
                self.tenant
            );
            a.account(self.tenant)
                .book
                .lock()
                .settle(self.amount, Pen::ZERO);
        }
    }
}

/// One tenant's book and the wake-ups around it.
struct Account {
    book: Mutex<Book>,
    /// A lease call of this tenant ended.
    call_ended: tokio::sync::Notify,
    /// Another replica says it returned money on this tenant.
    returned: tokio::sync::Notify,
}

/// Per-tenant money state of this replica.
pub struct Accounts {
    store: Arc<dyn Store>,
    replica: String,
    chunk: Pen,
    timing: Timing,
    /// The origin of the books' [`Tick`]s.
    origin: Instant,
    accounts: Mutex<HashMap<TenantId, Arc<Account>>>,
}

/// Totals across tenants, for metrics and drain checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub open: u64,
    pub reserved: Pen,
    /// Billed, not yet in the store as the newest readings have it.
    pub unrecorded: Pen,
    pub leased: Pen,
}

/// One tenant's money state, for the account routes, tests and diagnostics.
pub type TenantView = Held;

fn timed_out() -> Refusal {
    Refusal::StoreUnavailable(format!(
        "no answer from the store within {LEASE_CALL_TIMEOUT:?}"
    ))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Accounts {
    /// `fence`: how long after the store's last confirmation a lease may still be admitted
    /// against; keep it well under the stale-lease threshold other replicas reclaim at.
    pub fn new(
        store: Arc<dyn Store>,
        replica: String,
        chunk: Pen,
        fence: Duration,
    ) -> Arc<Accounts> {
        Arc::new(Accounts {
            store,
            replica,
            chunk,
            timing: Timing {
                fence: ms(fence),
                dry_memory: ms(DRY_MEMORY),
                failure_memory: ms(FAILURE_MEMORY),
                doubt_settle: ms(DOUBT_SETTLE),
            },
            origin: Instant::now(),
            accounts: Mutex::new(HashMap::new()),
        })
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    fn now(&self) -> Tick {
        ms(self.origin.elapsed())
    }

    fn account(&self, tenant: TenantId) -> Arc<Account> {
        self.accounts
            .lock()
            .entry(tenant)
            .or_insert_with(|| {
                Arc::new(Account {
                    book: Mutex::new(Book::default()),
                    call_ended: tokio::sync::Notify::new(),
                    returned: tokio::sync::Notify::new(),
                })
            })
            .clone()
    }

    fn known(&self, tenant: TenantId) -> Option<Arc<Account>> {
        self.accounts.lock().get(&tenant).cloned()
    }

    /// Reserves `amount` for a request of `tenant`.
    pub async fn reserve(
        self: &Arc<Self>,
        tenant: TenantId,
        amount: Pen,
    ) -> Result<Reservation, Refusal> {
        let acct = self.account(tenant);
        let mut admission = Admission {
            acct: &acct,
            req: Pending::new(amount),
        };
        let deadline = tokio::time::Instant::now() + LEASE_CALL_TIMEOUT;
        let mut recall_until = None;
        loop {
            // Armed before the book is asked, so a call that ends in between still wakes us.
            let call_ended = acct.call_ended.notified();
            tokio::pin!(call_ended);
            call_ended.as_mut().enable();
            let step = {
                let mut book = acct.book.lock();
                book.admit(&mut admission.req, self.chunk, &self.timing, self.now())
            };
            match step {
                Step::Admit => {
                    return Ok(Reservation {
                        tenant,
                        amount,
                        accounts: Some(self.clone()),
                    })
                }
                Step::Refuse(r) => return Err(refusal(r)),
                Step::Wait => {
                    if tokio::time::timeout_at(deadline, call_ended).await.is_err() {
                        return Err(timed_out());
                    }
                }
                Step::Ask(ask) => {
                    let call = self.spawn_grant(tenant, acct.clone(), ask);
                    match tokio::time::timeout_at(deadline, call).await {
                        Ok(Ok(Ok(reply))) => admission.req.granted(ask, &reply),
                        // The book has the failure: asking it again refuses.
                        Ok(Ok(Err(CallFailed))) => {}
                        Ok(Err(_)) | Err(_) => return Err(timed_out()),
                    }
                }
                Step::Recall => {
                    let until = *recall_until.get_or_insert_with(|| {
                        (tokio::time::Instant::now() + RECALL_WAIT).min(deadline)
                    });
                    if self.recall(&acct, tenant, until).await {
                        admission.req.money_returned();
                    } else {
                        admission.req.recall_over();
                    }
                }
            }
        }
    }

    /// One grant in its own task, which applies the answer to the book whatever becomes of the
    /// request that asked (see the module docs).
    fn spawn_grant(
        &self,
        tenant: TenantId,
        acct: Arc<Account>,
        ask: book::LeaseAsk,
    ) -> tokio::task::JoinHandle<Result<book::GrantReply, CallFailed>> {
        let store = self.store.clone();
        let replica = self.replica.clone();
        let (origin, sent) = (self.origin, self.now());
        let ask = LeaseAsk {
            need: ask.need,
            want: ask.want,
        };
        tokio::spawn(async move {
            let call = store.grant_lease(&replica, tenant, ask);
            let result = match tokio::time::timeout(LEASE_CALL_TIMEOUT, call).await {
                Ok(Ok(g)) => Ok(book::GrantReply::from(g)),
                Ok(Err(e)) => {
                    log::warn!("a lease grant for tenant {tenant} failed: {e}");
                    Err(CallFailed)
                }
                Err(_) => {
                    log::warn!("a lease grant for tenant {tenant} timed out");
                    Err(CallFailed)
                }
            };
            acct.book
                .lock()
                .granted(sent, &result, ms(origin.elapsed()));
            acct.call_ended.notify_waiters();
            result
        })
    }

    /// Asks the other replicas to return their free leases on `tenant` and waits until one
    /// says it did (true) or `until` (false; also at once when there is nobody to ask).
    async fn recall(&self, acct: &Account, tenant: TenantId, until: tokio::time::Instant) -> bool {
        let returned = acct.returned.notified();
        tokio::pin!(returned);
        returned.as_mut().enable();
        let signal = ReplicaSignal::RecallLeases {
            tenant,
            by: self.replica.clone(),
        };
        match tokio::time::timeout_at(until, self.store.notify_replicas(&signal)).await {
            Ok(Ok(true)) => crate::metrics::m()
                .lease_recalls
                .with_label_values(&["sent"])
                .inc(),
            // No channel to other replicas (SQLite): nobody to ask.
            Ok(Ok(false)) => return false,
            Ok(Err(e)) => {
                log::warn!("cannot ask other replicas for the leases of tenant {tenant}: {e}");
                return false;
            }
            Err(_) => return false,
        }
        tokio::time::timeout_at(until, returned).await.is_ok()
    }

    /// Replaces a reservation by the real charge, capped at the reservation (unwritten until
    /// the ledger writes it). Returns what is billed: `charge.min(reservation.amount)`.
    pub fn settle(&self, mut reservation: Reservation, charge: Pen) -> Pen {
        reservation.accounts = None;
        self.account(reservation.tenant)
            .book
            .lock()
            .settle(reservation.amount, charge)
    }

    /// The ledger writer's `record`, sent at `sent` (see [`Accounts::tick`]), changed these
    /// lease rows of this replica.
    pub fn recorded(&self, sent: Tick, leases: &[(TenantId, LeaseReading)]) {
        let now = self.now();
        for (tenant, reading) in leases {
            self.account(*tenant)
                .book
                .lock()
                .apply(Some(*reading), sent, now);
        }
    }

    /// Now, as the books count time: what a caller passes back as a call's `sent`.
    pub fn tick(&self) -> Tick {
        self.now()
    }

    /// The store refused to record `charge` of `tenant` for good (the row went to the
    /// dead-letter table): it will never be charged against the lease.
    pub fn abandoned(&self, tenant: TenantId, charge: Pen) {
        self.account(tenant).book.lock().abandon(charge);
    }

    /// Gives back the leases of tenants idle for `idle_for` with nothing in flight or unwritten.
    pub async fn return_idle_leases(&self, idle_for: Duration) {
        for (tenant, acct) in self.snapshot() {
            let release = acct.book.lock().release_idle(ms(idle_for), self.now());
            if let Some(amount) = release {
                self.release(tenant, &acct, amount).await;
            }
        }
    }

    /// Gives back what this replica holds free on `tenant` at once (another replica asked for
    /// it), waiting up to [`RECALL_WAIT`] for a lease call in flight to end first. Returns what
    /// was given back.
    pub async fn give_back_free(&self, tenant: TenantId) -> Pen {
        let Some(acct) = self.known(tenant) else {
            return Pen::ZERO;
        };
        let until = tokio::time::Instant::now() + RECALL_WAIT;
        loop {
            let call_ended = acct.call_ended.notified();
            tokio::pin!(call_ended);
            call_ended.as_mut().enable();
            let (release, busy) = {
                let mut book = acct.book.lock();
                let busy = book.call_in_flight();
                (book.release_free(), busy)
            };
            match release {
                Some(amount) => return self.release(tenant, &acct, amount).await,
                None if busy => {
                    if tokio::time::timeout_at(until, call_ended).await.is_err() {
                        return Pen::ZERO;
                    }
                }
                None => return Pen::ZERO,
            }
        }
    }

    /// Releases `amount` (the book subtracted it already) and tells the other replicas.
    async fn release(&self, tenant: TenantId, acct: &Account, amount: Pen) -> Pen {
        let sent = self.now();
        let call = self.store.release_lease(&self.replica, tenant, amount);
        let result = match tokio::time::timeout(LEASE_CALL_TIMEOUT, call).await {
            Ok(Ok(reading)) => Ok(reading),
            Ok(Err(e)) => {
                log::warn!("returning lease of tenant {tenant} failed: {e}");
                Err(CallFailed)
            }
            Err(_) => {
                log::warn!("returning lease of tenant {tenant} timed out");
                Err(CallFailed)
            }
        };
        let given = result.is_ok();
        acct.book
            .lock()
            .released(amount, sent, result, &self.timing, self.now());
        acct.call_ended.notify_waiters();
        if !given {
            return Pen::ZERO;
        }
        let done = ReplicaSignal::LeasesReturned { tenant };
        if let Err(e) = self.store.notify_replicas(&done).await {
            log::warn!("cannot tell replicas a lease came home: {e}");
        }
        amount
    }

    /// Handles the signals other replicas send through the store until the channel closes:
    /// returns free leases when asked ([`ReplicaSignal::RecallLeases`]), and notes money that
    /// came home ([`ReplicaSignal::LeasesReturned`]).
    pub async fn follow_signals(
        self: Arc<Self>,
        mut signals: tokio::sync::mpsc::Receiver<ReplicaSignal>,
    ) {
        while let Some(signal) = signals.recv().await {
            match signal {
                ReplicaSignal::RecallLeases { tenant, by } => {
                    if by == self.replica {
                        continue;
                    }
                    let me = self.clone();
                    tokio::spawn(async move {
                        if me.give_back_free(tenant).await > Pen::ZERO {
                            crate::metrics::m()
                                .lease_recalls
                                .with_label_values(&["returned"])
                                .inc();
                        }
                    });
                }
                ReplicaSignal::LeasesReturned { tenant } => self.money_arrived(tenant),
            }
        }
    }

    /// Money came home to `tenant`'s balance (another replica returned a lease, or a top-up):
    /// requests that found the store dry ask again.
    pub fn money_arrived(&self, tenant: TenantId) {
        if let Some(acct) = self.known(tenant) {
            acct.book.lock().money_arrived();
            acct.returned.notify_waiters();
        }
    }

    /// Refreshes this replica's leases in the store and hands every book the row the store
    /// holds for it (none: the row is gone).
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        let sent = self.now();
        let stored = tokio::time::timeout(LEASE_CALL_TIMEOUT, self.store.heartbeat(&self.replica))
            .await
            .map_err(|_| StoreError::Backend("the lease heartbeat timed out".into()))??;
        let stored: HashMap<TenantId, LeaseReading> = stored.into_iter().collect();
        for tenant in stored.keys() {
            // A row this replica did not know about (a grant whose answer was lost).
            self.account(*tenant);
        }
        let now = self.now();
        for (tenant, acct) in self.snapshot() {
            let mut book = acct.book.lock();
            book.heartbeat(stored.get(&tenant).copied(), sent, now);
            if book.is_lost() {
                log::error!(
                    "the store no longer has this replica's lease on tenant {tenant} (it was cut \
                     off from the store for too long): its requests are refused; restart this \
                     replica"
                );
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> Vec<(TenantId, Arc<Account>)> {
        self.accounts
            .lock()
            .iter()
            .map(|(t, a)| (*t, a.clone()))
            .collect()
    }

    /// One tenant's state (zeros if unknown).
    pub fn view(&self, tenant: TenantId) -> TenantView {
        self.known(tenant)
            .map(|a| a.book.lock().held())
            .unwrap_or_default()
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for (_, a) in self.snapshot() {
            let h = a.book.lock().held();
            t.open += h.open;
            t.reserved += h.reserved;
            t.unrecorded += h.unrecorded;
            t.leased += h.lease;
        }
        t
    }
}

/// A request in admission; leaving it early (a cancelled task) tells the book.
struct Admission<'a> {
    acct: &'a Account,
    req: Pending,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        // An answered request is forgotten already: no lock on the common path.
        if self.req.in_admission() {
            self.acct.book.lock().forget(&mut self.req);
        }
    }
}

fn refusal(r: book::Refusal) -> Refusal {
    match r {
        book::Refusal::Insufficient { needed, available } => {
            Refusal::Insufficient { needed, available }
        }
        book::Refusal::StoreFailed => {
            Refusal::StoreUnavailable("a lease call failed a moment ago".into())
        }
        book::Refusal::LeaseLost => Refusal::StoreUnavailable(
            "this replica's leases are gone from the store; it must restart".into(),
        ),
    }
}
