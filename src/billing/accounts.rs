//! Admission by reservation against leased balance.
//!
//! Before a request is forwarded, its worst-case cost is **reserved**; when it ends — on every
//! path — the reservation is replaced by the real charge, **capped at the reservation** (what
//! the tokens cost beyond it is reported as unbilled, never charged). A replica admits only
//! against money it holds a **lease** on (see `store`): `Σ leases ≤ balance` in the store, and
//! locally
//!
//! ```text
//! reserved + unflushed ≤ lease
//! ```
//!
//! where `unflushed` is charges settled here but not yet written to the ledger. Since no charge
//! exceeds its reservation, no tenant can be overdrawn, whatever the concurrency and however
//! many replicas share the store.
//!
//! The common path is one short per-tenant critical section, no I/O. Only when a tenant's lease
//! runs short does a request wait on the store for more (one round trip per `lease_chunk` of
//! spending; acquisitions for one tenant are serialised so a burst makes one round trip, not a
//! hundred). Unused leases are handed back after a few idle seconds so other replicas can use
//! the money. While a tenant's unleased balance is small next to `lease_chunk`, a grant is
//! only a share of it ([`quipu_core::billing::lease`]), so one replica does not take it all.
//!
//! **Leases come home when needed.** A replica that would refuse a request for balance that
//! other replicas hold asks them to return what they hold idle ([`ReplicaSignal::RecallLeases`],
//! PostgreSQL `NOTIFY`), waits a short while ([`RECALL_WAIT`]) for their answer
//! ([`ReplicaSignal::LeasesReturned`]) and asks the store again: a 402 then means the money is
//! spent, or held by requests in flight. A replica told to return gives back its lease minus
//! what its open reservations and unwritten charges need ([`Accounts::give_back_idle`]).
//!
//! **Fencing.** Another replica deletes a lease whose heartbeat is older than the stale
//! threshold (the owner is presumed dead). So a lease is only admitted against while the store
//! confirmed it recently: by [`Accounts::heartbeat`] (which also corrects the local lease to
//! the stored one: a reclaimed lease becomes 0, a grant whose reply was lost is picked up) or
//! by a grant. Past the `fence` (a fraction of the stale threshold) without confirmation, the
//! next request goes to the store first.
//!
//! **Corrections race with flushes.** The ledger writer lowers the stored lease (in `record`)
//! and then the local one ([`Accounts::flushed`]). A stored amount read while a flush was in
//! between would overstate the lease, so each account counts its flushes and a correction only
//! *lowers* the local lease when one happened meanwhile. Every race errs towards a smaller
//! local lease, which the next heartbeat restores.

use crate::money::Pen;
use crate::store::{LeaseAsk, ReplicaSignal, Store, StoreError, TenantId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most time a request waits for more lease (queueing behind other acquisitions included).
pub const LEASE_CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// After the store refused more money (it had none unleased), requests of the tenant that do
/// not fit the local lease are refused without asking again for this long.
pub const DRY_MEMORY: Duration = Duration::from_secs(1);
/// After a lease call failed, requests queued behind it fail at once for this long instead of
/// each waiting out its own timeout.
pub const FAILURE_MEMORY: Duration = Duration::from_secs(1);
/// Most time a request short of balance waits for other replicas to return idle leases before
/// it is refused.
pub const RECALL_WAIT: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
struct State {
    lease: Pen,
    reserved: Pen,
    unflushed: Pen,
    open: u64,
    last_activity: Option<Instant>,
    /// When the store last confirmed `lease` (taken before the confirming call was sent).
    confirmed: Option<Instant>,
    /// Flushes applied so far (see the module docs on corrections).
    flushes: u64,
    /// The store had no unleased balance left for this tenant at this time.
    dry_at: Option<Instant>,
    /// A lease call for this tenant failed at this time.
    failed_at: Option<Instant>,
}

impl State {
    fn headroom(&self) -> Pen {
        self.lease - self.reserved - self.unflushed
    }

    fn fresh(&self, fence: Duration) -> bool {
        self.confirmed.is_some_and(|t| t.elapsed() < fence)
    }

    /// Applies the lease the store reported, read by a call started when this account had
    /// applied `flushes_before` flushes and held `lease_before` (plus `added` by that call).
    /// If anything moved the local lease meanwhile, the stored amount may predate it: then it
    /// may only lower the lease.
    fn correct(&mut self, stored: Pen, flushes_before: u64, lease_before: Pen, added: Pen) {
        let untouched = self.flushes == flushes_before && self.lease == lease_before;
        self.lease = if untouched {
            stored
        } else {
            (self.lease + added).min(stored)
        };
    }
}

struct Account {
    state: Mutex<State>,
    /// Serialises lease acquisitions, returns and corrections for this tenant.
    lease_lock: tokio::sync::Mutex<()>,
    /// Woken when another replica says it returned lease on this tenant.
    returned: tokio::sync::Notify,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The balance (minus what is reserved) does not cover the worst case.
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
            a.release(self.tenant, self.amount, Pen::ZERO);
        }
    }
}

/// Per-tenant money state of this replica.
pub struct Accounts {
    store: Arc<dyn Store>,
    replica: String,
    chunk: Pen,
    fence: Duration,
    accounts: Mutex<HashMap<TenantId, Arc<Account>>>,
}

/// Totals across tenants, for metrics and drain checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub open: u64,
    pub reserved: Pen,
    pub unflushed: Pen,
    pub leased: Pen,
}

/// One tenant's money state, for tests and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantView {
    pub lease: Pen,
    pub reserved: Pen,
    pub unflushed: Pen,
    pub open: u64,
}

fn timed_out() -> Refusal {
    Refusal::StoreUnavailable(format!(
        "no answer from the store within {LEASE_CALL_TIMEOUT:?}"
    ))
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
            fence,
            accounts: Mutex::new(HashMap::new()),
        })
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    fn account(&self, tenant: TenantId) -> Arc<Account> {
        self.accounts
            .lock()
            .entry(tenant)
            .or_insert_with(|| {
                Arc::new(Account {
                    state: Mutex::new(State::default()),
                    lease_lock: tokio::sync::Mutex::new(()),
                    returned: tokio::sync::Notify::new(),
                })
            })
            .clone()
    }

    fn try_reserve(&self, acct: &Account, amount: Pen) -> Result<(), Pen> {
        let mut s = acct.state.lock();
        s.last_activity = Some(Instant::now());
        if !s.fresh(self.fence) {
            return Err(Pen::ZERO);
        }
        let headroom = s.headroom();
        if headroom >= amount {
            s.reserved += amount;
            s.open += 1;
            Ok(())
        } else {
            Err(headroom)
        }
    }

    /// Reserves `amount` for a request of `tenant`.
    pub async fn reserve(
        self: &Arc<Self>,
        tenant: TenantId,
        amount: Pen,
    ) -> Result<Reservation, Refusal> {
        let acct = self.account(tenant);
        let reservation = || Reservation {
            tenant,
            amount,
            accounts: Some(self.clone()),
        };
        if self.try_reserve(&acct, amount).is_ok() {
            return Ok(reservation());
        }
        let deadline = tokio::time::Instant::now() + LEASE_CALL_TIMEOUT;
        let serial = tokio::time::timeout_at(deadline, acct.lease_lock.lock())
            .await
            .map_err(|_| timed_out())?;
        let headroom = match self.try_reserve(&acct, amount) {
            Ok(()) => return Ok(reservation()),
            Err(h) => h,
        };
        let (flushes, local) = {
            let s = acct.state.lock();
            if let Some(at) = s.failed_at.filter(|t| t.elapsed() < FAILURE_MEMORY) {
                return Err(Refusal::StoreUnavailable(format!(
                    "a lease call failed {:?} ago",
                    at.elapsed()
                )));
            }
            let dry = s.dry_at.is_some_and(|t| t.elapsed() < DRY_MEMORY);
            if dry && s.fresh(self.fence) {
                // The store had nothing unleased a moment ago: refuse without a write
                // transaction per refusal.
                return Err(Refusal::Insufficient {
                    needed: amount,
                    available: headroom.max(Pen::ZERO),
                });
            }
            (s.flushes, s.lease)
        };
        let ask = LeaseAsk {
            need: amount - headroom.max(Pen::ZERO),
            want: self.chunk,
        };
        let grant = self
            .grant(&acct, tenant, ask, flushes, local, deadline)
            .await?;
        if self.try_reserve(&acct, amount).is_ok() {
            return Ok(reservation());
        }
        if grant.elsewhere > Pen::ZERO
            && self.recall(&acct, tenant, amount, deadline, serial).await? == Some(true)
        {
            return Ok(reservation());
        }
        // The store has nothing unleased that would do, and the other replicas returned what
        // they could: refuse the tenant's requests that do not fit for a moment without asking.
        let available = {
            let mut s = acct.state.lock();
            s.dry_at = Some(Instant::now());
            s.headroom()
        };
        Err(Refusal::Insufficient {
            needed: amount,
            available: available.max(Pen::ZERO),
        })
    }

    /// One lease call for `ask` (the caller holds the tenant's lease lock), applied to the
    /// local state as the module docs say. `flushes`/`local`: the account's flush count and
    /// lease when the caller read its headroom.
    async fn grant(
        &self,
        acct: &Account,
        tenant: TenantId,
        ask: LeaseAsk,
        flushes: u64,
        local: Pen,
        deadline: tokio::time::Instant,
    ) -> Result<crate::store::LeaseGrant, Refusal> {
        let sent = Instant::now();
        let call = self.store.grant_lease(&self.replica, tenant, ask);
        let grant = match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(g)) => g,
            Ok(Err(e)) => {
                acct.state.lock().failed_at = Some(Instant::now());
                return Err(Refusal::StoreUnavailable(e.to_string()));
            }
            Err(_) => {
                // The grant may still commit: the next heartbeat picks it up.
                acct.state.lock().failed_at = Some(Instant::now());
                return Err(timed_out());
            }
        };
        let mut s = acct.state.lock();
        s.correct(grant.held, flushes, local, grant.granted);
        s.confirmed = Some(sent);
        s.failed_at = None;
        s.dry_at = None;
        Ok(grant)
    }

    /// Asks the other replicas to return their idle leases on `tenant`, then asks the store
    /// again each time one says it did, until `amount` fits or [`RECALL_WAIT`] is over.
    /// `Some(true)`: it fits now (reserved); `Some(false)`/`None`: still short (`None` when the
    /// store has no channel to the other replicas).
    ///
    /// `serial` (the tenant's lease lock) is let go while it waits: replicas short at the same
    /// moment ask each other, and [`Accounts::give_back_idle`] returns only a lease whose lock
    /// is free — held, every one of them would wait out [`RECALL_WAIT`] and refuse while
    /// together they held enough. Let go, each returns what it holds idle, the money pools in
    /// the store, and the first to ask again takes what its request needs.
    async fn recall(
        &self,
        acct: &Account,
        tenant: TenantId,
        amount: Pen,
        deadline: tokio::time::Instant,
        serial: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Option<bool>, Refusal> {
        let until = tokio::time::Instant::now() + RECALL_WAIT;
        let until = until.min(deadline);
        let mut returned = std::pin::pin!(acct.returned.notified());
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
            Ok(Ok(false)) => return Ok(None),
            Ok(Err(e)) => {
                log::warn!("cannot ask other replicas for the leases of tenant {tenant}: {e}");
                return Ok(None);
            }
            Err(_) => return Ok(None),
        }
        drop(serial);
        loop {
            if tokio::time::timeout_at(until, returned.as_mut())
                .await
                .is_err()
            {
                return Ok(Some(false));
            }
            returned.set(acct.returned.notified());
            returned.as_mut().enable();
            let _serial = tokio::time::timeout_at(deadline, acct.lease_lock.lock())
                .await
                .map_err(|_| timed_out())?;
            if self.try_reserve(acct, amount).is_ok() {
                return Ok(Some(true));
            }
            let (flushes, local, headroom) = {
                let s = acct.state.lock();
                (s.flushes, s.lease, s.headroom())
            };
            let ask = LeaseAsk {
                need: amount - headroom.max(Pen::ZERO),
                want: self.chunk,
            };
            let grant = self
                .grant(acct, tenant, ask, flushes, local, deadline)
                .await?;
            if self.try_reserve(acct, amount).is_ok() {
                return Ok(Some(true));
            }
            if grant.elsewhere == Pen::ZERO {
                return Ok(Some(false));
            }
        }
    }

    /// Replaces a reservation by the real charge, capped at the reservation (kept as unflushed
    /// until the ledger writes it). Returns what is billed: `charge.min(reservation.amount)`.
    pub fn settle(&self, mut reservation: Reservation, charge: Pen) -> Pen {
        reservation.accounts = None;
        let billed = charge.min(reservation.amount).max(Pen::ZERO);
        self.release(reservation.tenant, reservation.amount, billed);
        billed
    }

    fn release(&self, tenant: TenantId, reserved: Pen, charge: Pen) {
        let acct = self.account(tenant);
        let mut s = acct.state.lock();
        s.reserved -= reserved;
        s.unflushed += charge;
        s.open = s.open.saturating_sub(1);
        s.last_activity = Some(Instant::now());
    }

    /// The ledger wrote `charged` of `tenant`'s charges: the store lowered balance and lease.
    pub fn flushed(&self, tenant: TenantId, charged: Pen) {
        let acct = self.account(tenant);
        let mut s = acct.state.lock();
        s.unflushed -= charged;
        s.lease = (s.lease - charged).max(Pen::ZERO);
        s.flushes += 1;
    }

    /// The store refused to record `charge` of `tenant` (the row went to the dead-letter
    /// table): nothing moved in the store, so only the local unflushed amount goes.
    pub fn abandoned(&self, tenant: TenantId, charge: Pen) {
        let acct = self.account(tenant);
        acct.state.lock().unflushed -= charge;
    }

    /// Gives back leases of tenants idle for `idle_for` with nothing reserved or unflushed.
    ///
    /// The local lease is zeroed *before* the store call, under the state lock, so the
    /// lock-free admission path cannot reserve against money being given back. If the call
    /// fails it is not restored here (the release may have committed anyway): the next
    /// heartbeat sets the local lease to what the store holds.
    pub async fn return_idle_leases(&self, idle_for: Duration) {
        for (tenant, acct) in self.snapshot() {
            let Ok(_serial) = acct.lease_lock.try_lock() else {
                continue;
            };
            let give_back = {
                let mut s = acct.state.lock();
                let idle = s.last_activity.is_none_or(|t| t.elapsed() >= idle_for);
                if idle && s.open == 0 && s.unflushed == Pen::ZERO && s.lease > Pen::ZERO {
                    std::mem::take(&mut s.lease)
                } else {
                    continue;
                }
            };
            let call = self.store.release_lease(&self.replica, tenant, give_back);
            match tokio::time::timeout(LEASE_CALL_TIMEOUT, call).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log::warn!(
                    "returning the lease of tenant {tenant} failed: {e}; the next heartbeat restores it"
                ),
                Err(_) => log::warn!(
                    "returning the lease of tenant {tenant} timed out; the next heartbeat restores it"
                ),
            }
        }
    }

    /// Gives back the part of this replica's lease on `tenant` that nothing here needs (the
    /// lease minus open reservations and unwritten charges), at once: another replica asked
    /// for it (see the module docs). Returns what was given back. It waits for the tenant's
    /// lease lock (at most [`RECALL_WAIT`], after which the asker has given up): a request of
    /// this replica holds it for one store call, and lets it go while it waits for leases
    /// itself — so replicas short at the same moment each return what they hold idle instead
    /// of each keeping it for itself. As in [`Accounts::return_idle_leases`], the local lease
    /// is lowered first, under the state lock, so admission cannot reserve against money being
    /// given back.
    pub async fn give_back_idle(&self, tenant: TenantId) -> Pen {
        let Some(acct) = self.accounts.lock().get(&tenant).cloned() else {
            return Pen::ZERO;
        };
        let Ok(_serial) = tokio::time::timeout(RECALL_WAIT, acct.lease_lock.lock()).await else {
            return Pen::ZERO;
        };
        let give_back = {
            let mut s = acct.state.lock();
            let idle = s.headroom();
            if idle <= Pen::ZERO {
                return Pen::ZERO;
            }
            s.lease -= idle;
            idle
        };
        let call = self.store.release_lease(&self.replica, tenant, give_back);
        match tokio::time::timeout(LEASE_CALL_TIMEOUT, call).await {
            Ok(Ok(())) => give_back,
            Ok(Err(e)) => {
                log::warn!(
                    "returning the idle lease of tenant {tenant} failed: {e}; the next heartbeat restores it"
                );
                Pen::ZERO
            }
            Err(_) => {
                log::warn!(
                    "returning the idle lease of tenant {tenant} timed out; the next heartbeat restores it"
                );
                Pen::ZERO
            }
        }
    }

    /// Handles the signals other replicas send through the store until the channel closes:
    /// returns idle leases when asked ([`ReplicaSignal::RecallLeases`]) and says so, and wakes
    /// requests waiting for returned leases ([`ReplicaSignal::LeasesReturned`]).
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
                        let given = me.give_back_idle(tenant).await;
                        if given > Pen::ZERO {
                            crate::metrics::m()
                                .lease_recalls
                                .with_label_values(&["returned"])
                                .inc();
                            let done = ReplicaSignal::LeasesReturned { tenant };
                            if let Err(e) = me.store.notify_replicas(&done).await {
                                log::warn!("cannot tell replicas a lease came home: {e}");
                            }
                        }
                    });
                }
                ReplicaSignal::LeasesReturned { tenant } => {
                    if let Some(acct) = self.accounts.lock().get(&tenant) {
                        acct.returned.notify_waiters();
                    }
                }
            }
        }
    }

    /// Refreshes this replica's leases in the store and corrects the local ones to what the
    /// store holds (see the module docs). A tenant whose lease lock is busy is skipped this
    /// time (its acquisition confirms it).
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        let before: HashMap<TenantId, (u64, Pen)> = self
            .snapshot()
            .into_iter()
            .map(|(t, a)| {
                let s = a.state.lock();
                (t, (s.flushes, s.lease))
            })
            .collect();
        let sent = Instant::now();
        let stored = tokio::time::timeout(LEASE_CALL_TIMEOUT, self.store.heartbeat(&self.replica))
            .await
            .map_err(|_| StoreError::Backend("the lease heartbeat timed out".into()))??;
        let stored: HashMap<TenantId, Pen> = stored.into_iter().collect();
        for tenant in stored.keys() {
            // A lease this replica did not know about (a grant whose reply was lost).
            self.account(*tenant);
        }
        for (tenant, acct) in self.snapshot() {
            let Ok(_serial) = acct.lease_lock.try_lock() else {
                continue;
            };
            let held = stored.get(&tenant).copied().unwrap_or(Pen::ZERO);
            let mut s = acct.state.lock();
            // An account created during the call started from nothing.
            let (flushes, lease) = before.get(&tenant).copied().unwrap_or_default();
            s.correct(held, flushes, lease, Pen::ZERO);
            if s.lease != held {
                log::debug!(
                    "tenant {tenant}: local lease {} vs stored {}",
                    s.lease.to_decimal(),
                    held.to_decimal()
                );
            }
            s.confirmed = Some(sent);
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
        let acct = self.accounts.lock().get(&tenant).cloned();
        acct.map(|a| {
            let s = a.state.lock();
            TenantView {
                lease: s.lease,
                reserved: s.reserved,
                unflushed: s.unflushed,
                open: s.open,
            }
        })
        .unwrap_or_default()
    }

    pub fn totals(&self) -> Totals {
        let accounts = self.accounts.lock();
        let mut t = Totals::default();
        for a in accounts.values() {
            let s = a.state.lock();
            t.open += s.open;
            t.reserved += s.reserved;
            t.unflushed += s.unflushed;
            t.leased += s.lease;
        }
        t
    }
}
