//! Weighted fair queueing across tenants, in tokens: start-time fair queueing with tags
//! assigned when a request is dispatched rather than when it arrives.
//!
//! Each tenant has a flow (a FIFO of its queued requests) and a virtual `finish`: the virtual
//! time its service so far reaches. Dispatching a request of cost `c` (tokens) from a flow of
//! weight `w` starts it at `S = finish` and moves `finish` to `S + c / w`; the queue's virtual
//! time `V` follows the largest start dispatched. The next request comes from the waiting flow
//! with the smallest `finish` (ties: the older head). So over any busy period each waiting
//! tenant's tokens grow in proportion to its weight, within one request's cost.
//!
//! **No banked credit.** A flow that starts waiting after being idle has its `finish` raised to
//! `V`: the idle time is not saved up for a burst later. It is not pushed behind either: at
//! `V` it is at or before every waiting flow, so it is served next (no starvation).
//!
//! Tags are given at dispatch, not on arrival, so a request that leaves the queue unserved
//! (cancelled, timed out, promoted to the other class) costs its tenant nothing.
//!
//! Virtual times are `u128` in units of 2⁻²⁰ token: exact enough that rounding never matters,
//! and no overflow in the life of a process.

use super::types::{Millis, TenantId};
use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU32;

/// A queued request's place: arrival, then the scheduler's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QKey {
    pub arrived: Millis,
    pub seq: u64,
}

const SCALE_BITS: u32 = 20;

/// Virtual service of `cost` tokens at `weight`.
fn service(cost: u64, weight: NonZeroU32) -> u128 {
    (u128::from(cost) << SCALE_BITS) / u128::from(weight.get())
}

#[derive(Debug, Default)]
struct Flow {
    finish: u128,
    queue: BTreeSet<QKey>,
}

/// The flows of one priority class.
#[derive(Debug, Default)]
pub struct FairQueue {
    vtime: u128,
    flows: HashMap<TenantId, Flow>,
    /// Waiting flows by (finish, head), the dispatch order.
    order: BTreeSet<(u128, QKey, TenantId)>,
    len: usize,
}

impl FairQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn order_key(&self, tenant: TenantId) -> Option<(u128, QKey, TenantId)> {
        let f = self.flows.get(&tenant)?;
        f.queue.first().map(|h| (f.finish, *h, tenant))
    }

    /// Runs `change` on the tenant's flow, keeping `order` in step.
    fn with_flow<R>(&mut self, tenant: TenantId, change: impl FnOnce(&mut Flow, u128) -> R) -> R {
        if let Some(k) = self.order_key(tenant) {
            self.order.remove(&k);
        }
        let vtime = self.vtime;
        let flow = self.flows.entry(tenant).or_default();
        let out = change(flow, vtime);
        let idle = flow.queue.is_empty();
        if idle && flow.finish <= self.vtime {
            // Nothing to remember: a flow at or behind V is raised to V when it comes back.
            self.flows.remove(&tenant);
        }
        if let Some(k) = self.order_key(tenant) {
            self.order.insert(k);
        }
        out
    }

    /// Queues a request (its tag is given when it is dispatched).
    pub fn push(&mut self, tenant: TenantId, key: QKey) {
        let added = self.with_flow(tenant, |f, vtime| {
            if f.queue.is_empty() {
                f.finish = f.finish.max(vtime);
            }
            f.queue.insert(key)
        });
        self.len += usize::from(added);
    }

    /// Takes a request out of the queue without service (cancelled, expired, moved).
    pub fn remove(&mut self, tenant: TenantId, key: QKey) -> bool {
        let removed = self.with_flow(tenant, |f, _| f.queue.remove(&key));
        self.len -= usize::from(removed);
        removed
    }

    /// Charges a dispatch of `cost` tokens to the tenant, taking `key` out of its queue if it
    /// was queued (`None`: it starts without having waited).
    pub fn dispatch(&mut self, tenant: TenantId, key: Option<QKey>, cost: u64, weight: NonZeroU32) {
        let (start, removed) = self.with_flow(tenant, |f, vtime| {
            // A waiting flow was raised to V when it started waiting; one that was not waiting
            // is raised now.
            let start = if f.queue.is_empty() {
                f.finish.max(vtime)
            } else {
                f.finish
            };
            f.finish = start.saturating_add(service(cost, weight));
            (start, key.is_some_and(|k| f.queue.remove(&k)))
        });
        self.len -= usize::from(removed);
        self.vtime = self.vtime.max(start);
    }

    /// Waiting tenants in dispatch order, each with its queue (oldest first).
    pub fn flows(&self) -> impl Iterator<Item = (TenantId, impl Iterator<Item = &QKey>)> + '_ {
        self.order
            .iter()
            .filter_map(|(_, _, t)| self.flows.get(t).map(|f| (*t, f.queue.iter())))
    }

    /// The queue's virtual time and a tenant's virtual finish, in tokens (for tests).
    #[cfg(test)]
    pub fn clocks(&self, tenant: TenantId) -> (f64, Option<f64>) {
        let tokens = |v: u128| v as f64 / f64::from(1u32 << SCALE_BITS);
        (
            tokens(self.vtime),
            self.flows.get(&tenant).map(|f| tokens(f.finish)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: NonZeroU32 = NonZeroU32::MIN;

    fn key(seq: u64) -> QKey {
        QKey {
            arrived: Millis(seq),
            seq,
        }
    }

    fn next(q: &FairQueue) -> Option<(TenantId, QKey)> {
        q.flows()
            .next()
            .and_then(|(t, mut keys)| keys.next().map(|k| (t, *k)))
    }

    #[test]
    fn the_smallest_finish_goes_first_and_weights_divide_the_cost() {
        let (a, b) = (TenantId(1), TenantId(2));
        let mut q = FairQueue::default();
        for s in 0..8 {
            q.push(if s % 2 == 0 { a } else { b }, key(s));
        }
        let three = NonZeroU32::new(3).unwrap_or(ONE);
        let mut served = Vec::new();
        while let Some((t, k)) = next(&q) {
            q.dispatch(t, Some(k), 300, if t == b { three } else { ONE });
            served.push(t.0);
        }
        // a and b tie at 0 (a's head is older); b runs at 0, 100, 200; at 300 they tie again.
        assert_eq!(served, vec![1, 2, 2, 2, 1, 2, 1, 1]);
        assert!(q.is_empty());
    }

    #[test]
    fn an_idle_flow_is_raised_to_virtual_time() {
        let (a, b) = (TenantId(1), TenantId(2));
        let mut q = FairQueue::default();
        for s in 0..3 {
            q.push(a, key(s));
        }
        for _ in 0..3 {
            let (t, k) = next(&q).unwrap();
            q.dispatch(t, Some(k), 100, ONE);
        }
        assert_eq!(q.clocks(a), (200.0, Some(300.0)));
        q.push(b, key(10));
        assert_eq!(q.clocks(b).1, Some(200.0), "no credit for the idle time");
        q.push(a, key(11));
        assert_eq!(next(&q).map(|n| n.0), Some(b), "but served next");
    }

    #[test]
    fn a_request_removed_unserved_costs_nothing() {
        let a = TenantId(1);
        let mut q = FairQueue::default();
        q.push(a, key(0));
        q.push(a, key(1));
        assert!(q.remove(a, key(0)));
        assert!(!q.remove(a, key(0)));
        assert_eq!(q.len(), 1);
        assert_eq!(q.clocks(a).1, Some(0.0));
        q.dispatch(a, Some(key(1)), 50, ONE);
        assert_eq!(q.clocks(a), (0.0, Some(50.0)));
        assert!(q.is_empty());
    }

    #[test]
    fn a_dispatch_without_queueing_is_charged_too() {
        let (a, b) = (TenantId(1), TenantId(2));
        let mut q = FairQueue::default();
        q.dispatch(a, None, 1000, ONE);
        q.push(a, key(1));
        q.push(b, key(2));
        assert_eq!(next(&q).map(|n| n.0), Some(b), "a already had 1000 tokens");
    }
}
