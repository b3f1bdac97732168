//! Keeping a freed slot, briefly, for the tenant that freed it.
//!
//! Work conservation alone gives a slot to whoever waits the moment it frees. A tenant that
//! sends one request at a time (a chat user, an agent's loop) has nothing waiting at that
//! moment: its next request comes a few milliseconds after its previous one ends, by which
//! time a backlogged tenant's request has taken the slot, and it waits for the next slot to
//! free — up to a whole sequence when the backlog's sequences started together, as a batch
//! job's do. Its fair share exists on paper only.
//!
//! So when an interactive request ends while others wait, and its tenant has nothing queued
//! and runs less than its fair share, the slot is **held** for that tenant for
//! `return_hold` (default 20 ms): the tenant's next request takes it at once, and if none
//! comes in time the slot goes to the queue. A tenant's fair share here is this gateway's
//! share of the pool's slots times its weight over the weights of every tenant present
//! (running, waiting or holding); a tenant at or above it holds nothing, so a backlog never
//! holds slots against others, and a tenant never holds more than its share. The price is bounded: a slot idles at most
//! `return_hold` when the tenant does not come back, once per request of a tenant below its
//! share — 2.5 % of a 0.8 s sequence at worst, nothing when it returns in time.
//!
//! Holds are this gateway's own: with several gateways a tenant's next request may reach
//! another one, which may send it to the engine's own queue ([`super::overflow`]), where it
//! takes the held slot. So with several gateways and a fresh engine report, a hold that lapses
//! unused does not hand its slot to this gateway's backlog: the tenant may be running in it
//! through the other gateway. It counts as in use until the next report (which says), and as
//! this gateway's own for its guaranteed share — a **ghost** — until the tenant comes back
//! here, two reports in a row show the engine with room, or [`GHOST_LIFE`] passes. Without
//! the ghost, the gateway, below its guaranteed share, would send a request of its backlog to
//! wait in the engine, and that request would take the next slot the tenant frees (B
//! alternating between two gateways: p99 0.82 s instead of 0.29 s). The price, when the
//! tenant did not come back and the engine stays full: one slot of this gateway's share lent
//! to the others for a while.

use super::capacity::{share, Free};
use super::types::{Dispatch, Millis, Placement, Priority, TenantId, Ticket};
use super::Scheduler;
use std::num::NonZeroU32;

/// A slot kept for one tenant's next request until `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hold {
    pub tenant: TenantId,
    pub replica: usize,
    pub until: Millis,
}

/// A slot held for `tenant` whose hold lapsed while the engine stayed full: the tenant may
/// have taken it through another gateway (see [`super::capacity::ReplicaSlots::ghosts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ghost {
    pub tenant: TenantId,
    pub replica: usize,
    pub until: Millis,
}

/// How long a ghost lasts at most, if neither its tenant comes back nor two reports show the
/// engine with room: long enough for a client alternating between gateways to come back
/// (a few sequences), short enough that a gateway's guaranteed share is never lost for long.
pub(super) const GHOST_LIFE: Millis = Millis(10_000);

/// What one tenant has in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Presence {
    pub queued: u32,
    pub running: u32,
    pub held: u32,
    /// The weight of its latest request.
    pub weight: NonZeroU32,
}

impl Presence {
    pub fn new(weight: NonZeroU32) -> Presence {
        Presence {
            queued: 0,
            running: 0,
            held: 0,
            weight,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queued == 0 && self.running == 0 && self.held == 0
    }
}

impl Scheduler {
    /// Changes a tenant's presence, forgetting it once it has nothing in the pool.
    pub(super) fn presence(&mut self, tenant: TenantId, change: impl FnOnce(&mut Presence)) {
        if let Some(p) = self.per_tenant.get_mut(&tenant) {
            change(p);
            if p.is_empty() {
                self.per_tenant.remove(&tenant);
            }
        }
    }

    /// Slots held on `replica`.
    pub(super) fn held_on(&self, replica: usize) -> u32 {
        self.holds.iter().filter(|h| h.replica == replica).count() as u32
    }

    /// A request of `tenant` that ran on `replica` ended at `now`: hold its slot for the
    /// tenant's next request if others wait and the tenant is below its fair share.
    pub(super) fn maybe_hold(&mut self, tenant: TenantId, replica: usize, now: Millis) {
        let hold = self.config.return_hold;
        if hold == Millis::ZERO || self.queued.is_empty() {
            return;
        }
        let Some(p) = self.per_tenant.get(&tenant).copied() else {
            return;
        };
        if p.queued > 0 || !self.replicas.get(replica).is_some_and(|r| r.available) {
            return;
        }
        if !self.below_share(tenant, p.weight) {
            return;
        }
        self.holds.push(Hold {
            tenant,
            replica,
            until: now.plus(hold),
        });
        self.presence(tenant, |p| p.held += 1);
    }

    /// Whether `tenant` (of `weight`, if it has nothing in the pool yet) would still be within
    /// its fair share with one more slot: (running + held + 1) / slots ≤ weight / Σ weights of
    /// the tenants present, itself included. The slots are this gateway's share of them (all
    /// of them when it is alone): what it runs is all it knows of each tenant.
    pub(super) fn below_share(&self, tenant: TenantId, weight: NonZeroU32) -> bool {
        let Some(slots) = self.pool_slots() else {
            return false;
        };
        let p = self.per_tenant.get(&tenant).copied();
        let (mine, weight) = p.map_or((0, weight), |p| (p.running + p.held, p.weight));
        let others: u64 = (self.per_tenant.iter())
            .filter(|(t, _)| **t != tenant)
            .map(|(_, q)| u64::from(q.weight.get()))
            .sum();
        let weights = others + u64::from(weight.get());
        let wanted = u64::from(mine + 1).saturating_mul(weights);
        wanted <= slots.saturating_mul(u64::from(weight.get()))
    }

    /// This gateway's share of the slots of the pool's available replicas (`None`: one is
    /// unbounded, so nobody need wait behind anyone).
    fn pool_slots(&self) -> Option<u64> {
        (self.replicas.iter())
            .filter(|r| r.available)
            .map(|r| r.cap().map(|c| u64::from(share(c, self.gateways))))
            .sum()
    }

    /// Drops holds that lapsed by `now`, whose replica went down, or that hold nothing back
    /// (nobody waits).
    pub(super) fn lapse_holds(&mut self, now: Millis) {
        if self.holds.is_empty() {
            return;
        }
        let nobody_waits = self.queued.is_empty();
        let mut i = 0;
        while i < self.holds.len() {
            let h = self.holds[i];
            let up = self.replicas.get(h.replica).is_some_and(|r| r.available);
            if nobody_waits || h.until <= now || !up {
                self.holds.swap_remove(i);
                self.presence(h.tenant, |p| p.held = p.held.saturating_sub(1));
                if h.until <= now && up && self.gateways.count > 1 {
                    self.haunt(h, now);
                }
            } else {
                i += 1;
            }
        }
    }

    /// A hold lapsed unused while others wait: with a fresh engine report, the slot counts as
    /// in use until the next report, and as this gateway's own for its guaranteed share until
    /// the tenant comes back here or two reports in a row show the engine with room.
    fn haunt(&mut self, h: Hold, now: Millis) {
        let ttl = self.config.report_ttl;
        let Some(slots) = self.replicas.get_mut(h.replica) else {
            return;
        };
        if slots.fresh_report(now, ttl).is_none() {
            return;
        }
        slots.on_hold_lapsed(now, ttl);
        slots.ghosts += 1;
        self.ghosts.push(Ghost {
            tenant: h.tenant,
            replica: h.replica,
            until: now.plus(GHOST_LIFE),
        });
    }

    /// Lays the ghosts that `gone` picks: their tenant came back, the engine has room, or
    /// they lived their life.
    pub(super) fn lay_ghosts(&mut self, gone: impl Fn(&Ghost) -> bool) {
        let replicas = &mut self.replicas;
        self.ghosts.retain(|g| {
            let lay = gone(g);
            if lay {
                if let Some(r) = replicas.get_mut(g.replica) {
                    r.ghosts = r.ghosts.saturating_sub(1);
                }
            }
            !lay
        });
    }

    /// A new interactive ticket whose tenant holds a slot it may use takes that slot.
    pub(super) fn take_hold(
        &mut self,
        t: &Ticket,
        class: Priority,
        now: Millis,
    ) -> Option<Dispatch> {
        if class != Priority::Interactive {
            return None;
        }
        let i = self
            .holds
            .iter()
            .position(|h| h.tenant == t.tenant && !t.exclude.contains(&h.replica))?;
        let h = self.holds.swap_remove(i);
        self.presence(h.tenant, |p| p.held = p.held.saturating_sub(1));
        // The engine's report may have changed since: the slot must still be free.
        let room = match self.occupancy(h.replica, now).free {
            Free::Unbounded => true,
            Free::Slots(n) => n > self.held_on(h.replica),
        };
        if !room {
            return None;
        }
        self.classes[class as usize].dispatch(t.tenant, None, t.cost(), t.weight);
        let promoted = class != t.priority;
        Some(self.run(t, promoted, h.replica, Placement::Returned, now))
    }
}
