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
//! **Caps are pools like balances.** A key's spend cap for the current period and its tenant's
//! monthly cap are each a pool of money (`quipu_core::billing::pool`) with its own book and
//! leases on it (`cap_leases`): a request reserves its worst case against every cap that
//! applies and then the balance ([`Accounts::reserve_with_caps`]), all or nothing, and its
//! charge settles against all of them; the ledger row names the caps so the store charges
//! them in the same transaction as the balance. A cap is then as exact under concurrency and
//! across replicas as the balance.
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
use crate::store::{
    CapPool, CapTerms, LeaseAsk, LeaseGrant, LeaseReading, Pool, Recorded, ReplicaSignal, Store,
    StoreError, StoreResult, TenantId,
};
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
    /// What is left of the `index`th cap of [`Accounts::reserve_with_caps`] (spent, or held
    /// by requests in flight) does not cover the worst case.
    CapReached { index: usize, available: Pen },
    /// The store could not be asked for more balance.
    StoreUnavailable(String),
}

/// A cap a request reserves against: its pool and what the pool holds at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapClaim {
    pub pool: CapPool,
    pub terms: CapTerms,
}

/// An admitted request's hold on the tenant's money. Settle it with [`Accounts::settle`]; if it
/// is dropped unsettled (a cancelled task), the hold is released without a charge.
pub struct Reservation {
    pub tenant: TenantId,
    pub amount: Pen,
    /// The books it holds `amount` on: its caps' (in the order given), then the balance's,
    /// kept so that settling looks nothing up.
    held: Vec<Arc<Account>>,
    /// How many of `held` are caps.
    caps: usize,
    accounts: Option<Arc<Accounts>>,
}

impl Reservation {
    /// How many caps it holds money on besides the balance.
    pub fn caps_held(&self) -> usize {
        self.caps
    }

    fn release(&mut self, charge: Pen) -> Pen {
        let mut billed = charge;
        for acct in self.held.drain(..) {
            billed = acct.book.lock().settle(self.amount, charge);
        }
        billed
    }
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
            drop(a);
            log::warn!(
                "reservation of tenant {} dropped without settlement; released",
                self.tenant
            );
            self.release(Pen::ZERO);
        }
    }
}

/// One tenant's book and the wake-ups around it.
struct Account {
    book: Mutex<Book>,
    /// A lease call of this tenant ended.
    call_ended: tokio::sync::Notify,
    /// Another replica says it returned money on this pool.
    returned: tokio::sync::Notify,
    /// A cap pool's terms as the last request that reserved against it knew them.
    terms: Mutex<Option<CapTerms>>,
    /// Whether this replica has told the tenant that the cap refused a request.
    refusal_told: std::sync::atomic::AtomicBool,
}

/// Per-tenant money state of this replica.
pub struct Accounts {
    store: Arc<dyn Store>,
    replica: String,
    chunk: Pen,
    timing: Timing,
    /// The origin of the books' [`Tick`]s.
    origin: Instant,
    /// Hashed with aHash: a cap pool's key (a key id and a period) is hashed on every
    /// admission and settlement, where SipHash cost a thousand instructions a lookup.
    accounts: Mutex<HashMap<Pool, Arc<Account>, ahash::RandomState>>,
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
            accounts: Mutex::new(HashMap::default()),
        })
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    fn now(&self) -> Tick {
        ms(self.origin.elapsed())
    }

    fn account(&self, pool: &Pool) -> Arc<Account> {
        if let Some(a) = self.accounts.lock().get(pool) {
            return a.clone();
        }
        self.accounts
            .lock()
            .entry(pool.clone())
            .or_insert_with(|| {
                Arc::new(Account {
                    book: Mutex::new(Book::default()),
                    call_ended: tokio::sync::Notify::new(),
                    returned: tokio::sync::Notify::new(),
                    terms: Mutex::new(None),
                    refusal_told: std::sync::atomic::AtomicBool::new(false),
                })
            })
            .clone()
    }

    fn known(&self, pool: &Pool) -> Option<Arc<Account>> {
        self.accounts.lock().get(pool).cloned()
    }

    /// Reserves `amount` for a request of `tenant` against its balance alone.
    pub async fn reserve(
        self: &Arc<Self>,
        tenant: TenantId,
        amount: Pen,
    ) -> Result<Reservation, Refusal> {
        self.reserve_with_caps(tenant, amount, &[]).await
    }

    /// Reserves `amount` for a request of `tenant` against every cap in `caps`, in order, and
    /// then its balance: all of them, or none (a refusal gives back what was held already).
    pub async fn reserve_with_caps(
        self: &Arc<Self>,
        tenant: TenantId,
        amount: Pen,
        caps: &[CapClaim],
    ) -> Result<Reservation, Refusal> {
        let mut reservation = Reservation {
            tenant,
            amount,
            held: Vec::with_capacity(caps.len() + 1),
            caps: 0,
            accounts: None,
        };
        for (index, claim) in caps.iter().enumerate() {
            let pool = Pool::Cap(claim.pool.clone());
            let acct = self.account(&pool);
            *acct.terms.lock() = Some(claim.terms);
            match self.reserve_in(&pool, &acct, amount).await {
                Ok(()) => {
                    reservation.held.push(acct);
                    reservation.caps += 1;
                    reservation.accounts = Some(self.clone());
                }
                // Dropping `reservation` gives back the caps held so far.
                Err(Refusal::Insufficient { available, .. }) => {
                    return Err(Refusal::CapReached { index, available })
                }
                Err(other) => return Err(other),
            }
        }
        let pool = Pool::Balance(tenant);
        let acct = self.account(&pool);
        self.reserve_in(&pool, &acct, amount).await?;
        reservation.held.push(acct);
        reservation.accounts = Some(self.clone());
        Ok(reservation)
    }

    /// Reserves `amount` on one pool's book (see the module docs).
    async fn reserve_in(
        self: &Arc<Self>,
        pool: &Pool,
        acct: &Arc<Account>,
        amount: Pen,
    ) -> Result<(), Refusal> {
        let mut admission = Admission {
            acct,
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
                Step::Admit => return Ok(()),
                Step::Refuse(r) => return Err(refusal(r)),
                Step::Wait => {
                    if tokio::time::timeout_at(deadline, call_ended).await.is_err() {
                        return Err(timed_out());
                    }
                }
                Step::Ask(ask) => {
                    let call = self.spawn_grant(pool.clone(), acct.clone(), ask);
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
                    if self.recall(acct, pool, until).await {
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
        pool: Pool,
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
        let terms = *acct.terms.lock();
        tokio::spawn(async move {
            let call = grant(&*store, &replica, &pool, terms, ask);
            let result = match tokio::time::timeout(LEASE_CALL_TIMEOUT, call).await {
                Ok(Ok(g)) => Ok(book::GrantReply::from(g)),
                Ok(Err(e)) => {
                    log::warn!("a lease grant on {pool} failed: {e}");
                    Err(CallFailed)
                }
                Err(_) => {
                    log::warn!("a lease grant on {pool} timed out");
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

    /// Asks the other replicas to return their free leases on `pool` and waits until one
    /// says it did (true) or `until` (false; also at once when there is nobody to ask).
    async fn recall(&self, acct: &Account, pool: &Pool, until: tokio::time::Instant) -> bool {
        let returned = acct.returned.notified();
        tokio::pin!(returned);
        returned.as_mut().enable();
        let signal = ReplicaSignal::RecallLeases {
            pool: pool.clone(),
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
                log::warn!("cannot ask other replicas for their leases on {pool}: {e}");
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
        reservation.release(charge)
    }

    /// The ledger writer's `record`, sent at `sent` (see [`Accounts::tick`]), changed these
    /// lease rows of this replica.
    pub fn recorded(&self, sent: Tick, recorded: &Recorded) {
        let now = self.now();
        let balances = recorded.leases.iter().map(|(t, r)| (Pool::Balance(*t), r));
        let caps = recorded
            .cap_leases
            .iter()
            .map(|(c, r)| (Pool::Cap(c.clone()), r));
        for (pool, reading) in balances.chain(caps) {
            self.account(&pool)
                .book
                .lock()
                .apply(Some(*reading), sent, now);
        }
    }

    /// Now, as the books count time: what a caller passes back as a call's `sent`.
    pub fn tick(&self) -> Tick {
        self.now()
    }

    /// The store refused to record `charge` of `tenant` (reserved against `caps` too) for good
    /// (the row went to the dead-letter table): it will never be charged against the leases.
    pub fn abandoned(&self, tenant: TenantId, caps: &[CapPool], charge: Pen) {
        for cap in caps {
            self.account(&Pool::Cap(cap.clone()))
                .book
                .lock()
                .abandon(charge);
        }
        self.account(&Pool::Balance(tenant))
            .book
            .lock()
            .abandon(charge);
    }

    /// Gives back the leases of tenants idle for `idle_for` with nothing in flight or unwritten.
    pub async fn return_idle_leases(&self, idle_for: Duration) {
        for (pool, acct) in self.snapshot() {
            let release = acct.book.lock().release_idle(ms(idle_for), self.now());
            if let Some(amount) = release {
                self.release(&pool, &acct, amount).await;
            }
        }
    }

    /// Gives back what this replica holds free on `tenant` at once (another replica asked for
    /// it), waiting up to [`RECALL_WAIT`] for a lease call in flight to end first. Returns what
    /// was given back.
    pub async fn give_back_free(&self, pool: &Pool) -> Pen {
        let Some(acct) = self.known(pool) else {
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
                Some(amount) => return self.release(pool, &acct, amount).await,
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
    async fn release(&self, pool: &Pool, acct: &Account, amount: Pen) -> Pen {
        let sent = self.now();
        let call = async {
            match pool {
                Pool::Balance(t) => self.store.release_lease(&self.replica, *t, amount).await,
                Pool::Cap(c) => self.store.release_cap_lease(&self.replica, c, amount).await,
            }
        };
        let result = match tokio::time::timeout(LEASE_CALL_TIMEOUT, call).await {
            Ok(Ok(reading)) => Ok(reading),
            Ok(Err(e)) => {
                log::warn!("returning the lease on {pool} failed: {e}");
                Err(CallFailed)
            }
            Err(_) => {
                log::warn!("returning the lease on {pool} timed out");
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
        let done = ReplicaSignal::LeasesReturned { pool: pool.clone() };
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
                ReplicaSignal::RecallLeases { pool, by } => {
                    if by == self.replica {
                        continue;
                    }
                    let me = self.clone();
                    tokio::spawn(async move {
                        if me.give_back_free(&pool).await > Pen::ZERO {
                            crate::metrics::m()
                                .lease_recalls
                                .with_label_values(&["returned"])
                                .inc();
                        }
                    });
                }
                ReplicaSignal::LeasesReturned { pool } => self.arrived(&pool),
            }
        }
    }

    /// A request was refused by the cap pool `pool`: writes `event` (its `cap.reached_100`) to
    /// the webhook outbox in the background, once per pool and replica. A period's spending
    /// may stop short of 100 % (admission keeps it within a request's worst case of the cap),
    /// so the charge that crosses 100 % may never come; the event's id depends only on the cap
    /// and its period, so the outbox keeps one however many replicas write it.
    pub fn cap_refused(&self, pool: &CapPool, event: crate::store::webhooks::WebhookEvent) {
        let acct = self.account(&Pool::Cap(pool.clone()));
        if acct
            .refusal_told
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let (store, tenant) = (self.store.clone(), pool.tenant);
        tokio::spawn(async move {
            if let Err(e) = store.emit(&[(tenant, event)]).await {
                log::warn!("the cap alert of tenant {tenant} could not be written: {e}");
                acct.refusal_told
                    .store(false, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }

    /// Money came home to `tenant`'s balance (another replica returned a lease, or a top-up):
    /// requests that found the store dry ask again.
    pub fn money_arrived(&self, tenant: TenantId) {
        self.arrived(&Pool::Balance(tenant));
    }

    /// Money came home to `pool`.
    fn arrived(&self, pool: &Pool) {
        if let Some(acct) = self.known(pool) {
            acct.book.lock().money_arrived();
            acct.returned.notify_waiters();
        }
    }

    /// Refreshes this replica's leases in the store and hands every book the row the store
    /// holds for it (none: the row is gone).
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        let sent = self.now();
        let beats = async {
            let balances = self.store.heartbeat(&self.replica).await?;
            let caps = self.store.cap_heartbeat(&self.replica).await?;
            StoreResult::Ok((balances, caps))
        };
        let (balances, caps) = tokio::time::timeout(LEASE_CALL_TIMEOUT, beats)
            .await
            .map_err(|_| StoreError::Backend("the lease heartbeat timed out".into()))??;
        let stored: HashMap<Pool, LeaseReading> = balances
            .into_iter()
            .map(|(t, r)| (Pool::Balance(t), r))
            .chain(caps.into_iter().map(|(c, r)| (Pool::Cap(c), r)))
            .collect();
        for pool in stored.keys() {
            // A row this replica did not know about (a grant whose answer was lost).
            self.account(pool);
        }
        let now = self.now();
        for (pool, acct) in self.snapshot() {
            let mut book = acct.book.lock();
            book.heartbeat(stored.get(&pool).copied(), sent, now);
            if book.is_lost() {
                log::error!(
                    "the store no longer has this replica's lease on {pool} (it was cut off \
                     from the store for too long): its requests are refused; restart this \
                     replica"
                );
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> Vec<(Pool, Arc<Account>)> {
        self.accounts
            .lock()
            .iter()
            .map(|(p, a)| (p.clone(), a.clone()))
            .collect()
    }

    /// One tenant's state (zeros if unknown).
    pub fn view(&self, tenant: TenantId) -> TenantView {
        self.pool_view(&Pool::Balance(tenant))
    }

    /// One pool's state (zeros if unknown).
    pub fn pool_view(&self, pool: &Pool) -> TenantView {
        self.known(pool)
            .map(|a| a.book.lock().held())
            .unwrap_or_default()
    }

    /// Totals over the balances (a request held on caps too is counted once).
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for (pool, a) in self.snapshot() {
            if !matches!(pool, Pool::Balance(_)) {
                continue;
            }
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

/// A lease grant on `pool`: its balance, or a cap with the terms it was last reserved under.
async fn grant(
    store: &dyn Store,
    replica: &str,
    pool: &Pool,
    terms: Option<CapTerms>,
    ask: LeaseAsk,
) -> StoreResult<LeaseGrant> {
    match (pool, terms) {
        (Pool::Balance(t), _) => store.grant_lease(replica, *t, ask).await,
        (Pool::Cap(c), Some(terms)) => store.grant_cap_lease(replica, c, terms, ask).await,
        // A pool seen only in the store's rows (a lost grant's answer) is never asked for more
        // before a request has reserved against it, which sets its terms.
        (Pool::Cap(c), None) => Err(StoreError::Invalid(format!(
            "no terms known for cap pool {c}"
        ))),
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
