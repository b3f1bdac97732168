//! Admission by reservation against leased balance.
//!
//! Before a request is forwarded, its worst-case cost is **reserved**; when it ends — on every
//! path — the reservation is replaced by the real charge. A replica admits only against money it
//! holds a **lease** on (see `store`): `Σ leases ≤ balance` in the store, and locally
//!
//! ```text
//! reserved + unflushed ≤ lease
//! ```
//!
//! where `unflushed` is charges settled here but not yet written to the ledger. So no tenant can
//! be overdrawn, whatever the concurrency and however many replicas share the store.
//!
//! The common path is one short per-tenant critical section, no I/O. Only when a tenant's lease
//! runs short does a request wait on the store for more (one round trip per `lease_chunk` of
//! spending; acquisitions for one tenant are serialised so a burst makes one round trip, not a
//! hundred). Unused leases are handed back after a few idle seconds so other replicas can use
//! the money.

use crate::money::Pen;
use crate::store::{Store, StoreError, TenantId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct State {
    lease: Pen,
    reserved: Pen,
    unflushed: Pen,
    open: u64,
    last_activity: Option<Instant>,
}

impl State {
    fn headroom(&self) -> Pen {
        self.lease - self.reserved - self.unflushed
    }
}

struct Account {
    state: Mutex<State>,
    /// Serialises lease acquisitions and returns for this tenant.
    lease_lock: tokio::sync::Mutex<()>,
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

impl Accounts {
    pub fn new(store: Arc<dyn Store>, replica: String, chunk: Pen) -> Arc<Accounts> {
        Arc::new(Accounts {
            store,
            replica,
            chunk,
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
                })
            })
            .clone()
    }

    fn try_reserve(acct: &Account, amount: Pen) -> Result<(), Pen> {
        let mut s = acct.state.lock();
        s.last_activity = Some(Instant::now());
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
        if Self::try_reserve(&acct, amount).is_ok() {
            return Ok(reservation());
        }
        let _serial = acct.lease_lock.lock().await;
        let headroom = match Self::try_reserve(&acct, amount) {
            Ok(()) => return Ok(reservation()),
            Err(h) => h,
        };
        let want = (amount - headroom).max(self.chunk);
        let granted = self
            .store
            .acquire_lease(&self.replica, tenant, want)
            .await
            .map_err(|e: StoreError| Refusal::StoreUnavailable(e.to_string()))?;
        acct.state.lock().lease += granted;
        match Self::try_reserve(&acct, amount) {
            Ok(()) => Ok(reservation()),
            Err(available) => Err(Refusal::Insufficient {
                needed: amount,
                available: available.max(Pen::ZERO),
            }),
        }
    }

    /// Replaces a reservation by the real charge (kept as unflushed until the ledger writes it).
    pub fn settle(&self, mut reservation: Reservation, charge: Pen) {
        reservation.accounts = None;
        self.release(reservation.tenant, reservation.amount, charge);
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
    }

    /// Gives back leases of tenants idle for `idle_for` with nothing reserved or unflushed.
    pub async fn return_idle_leases(&self, idle_for: Duration) {
        let accounts: Vec<(TenantId, Arc<Account>)> = self
            .accounts
            .lock()
            .iter()
            .map(|(t, a)| (*t, a.clone()))
            .collect();
        for (tenant, acct) in accounts {
            let Ok(_serial) = acct.lease_lock.try_lock() else {
                continue;
            };
            let give_back = {
                let s = acct.state.lock();
                let idle = s.last_activity.is_none_or(|t| t.elapsed() >= idle_for);
                if idle && s.open == 0 && s.unflushed == Pen::ZERO && s.lease > Pen::ZERO {
                    s.lease
                } else {
                    continue;
                }
            };
            match self
                .store
                .release_lease(&self.replica, tenant, give_back)
                .await
            {
                Ok(()) => {
                    let mut s = acct.state.lock();
                    s.lease = (s.lease - give_back).max(Pen::ZERO);
                }
                Err(e) => log::warn!("returning the lease of tenant {tenant} failed: {e}"),
            }
        }
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
