//! The scheduler's moves: admitting a ticket, settling what time made due, and dispatching
//! until no waiting request may use a free slot.

use super::capacity::{Free, Occupancy};
use super::fair::QKey;
use super::hold::Presence;
use super::types::{
    Dispatch, Effects, Expired, Millis, Placement, Priority, Refusal, Ticket, Verdict,
};
use super::{Entry, Running, Scheduler, LOOKAHEAD};
use std::cmp::Reverse;

/// A replica with a free slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Room {
    replica: usize,
    free: Free,
    in_use: u32,
}

const CLASSES: [Priority; 2] = [Priority::Interactive, Priority::Batch];

impl Scheduler {
    pub(super) fn occupancy(&self, replica: usize, now: Millis) -> Occupancy {
        let c = &self.config;
        self.replicas[replica].occupancy(now, c.report_ttl, c.engine_queue_allowance, self.gateways)
    }

    /// The class a ticket waits in at `now`.
    fn class_of(&self, t: &Ticket, now: Millis) -> Priority {
        match t.priority {
            Priority::Batch if now.since(t.arrived) < self.config.batch_age_limit => {
                Priority::Batch
            }
            _ => Priority::Interactive,
        }
    }

    /// Timeouts, promotions and ends of affinity waits due at `now`, then dispatches.
    pub(super) fn settle(&mut self, now: Millis) -> Effects {
        let expired = self.expire(now);
        self.lapse_holds(now);
        if !self.ghosts.is_empty() {
            self.lay_ghosts(|g| g.until <= now);
        }
        let age = self.config.batch_age_limit;
        while let Some(&key) = self.promotable.first() {
            if now.since(key.arrived) < age {
                break;
            }
            self.promote(key);
        }
        let wait = self.config.affinity_wait;
        while let Some(&key) = self.affinity_pending.first() {
            if now.since(key.arrived) < wait {
                break;
            }
            self.affinity_pending.remove(&key);
        }
        Effects {
            dispatched: self.pump(now),
            expired,
        }
    }

    fn expire(&mut self, now: Millis) -> Vec<Expired> {
        let mut out = Vec::new();
        while let Some(&key) = self.queued.keys().next() {
            if now.since(key.arrived) < self.config.queue_timeout {
                break;
            }
            if let Some(e) = self.unqueue(key) {
                out.push(Expired {
                    id: e.ticket.id,
                    tenant: e.ticket.tenant,
                    priority: e.ticket.priority,
                    waited: now.since(key.arrived),
                });
            }
        }
        out
    }

    /// A batch request that waited `batch_age_limit` moves to its tenant's interactive queue.
    fn promote(&mut self, key: QKey) {
        self.promotable.remove(&key);
        let Some(e) = self.queued.get_mut(&key) else {
            return;
        };
        if e.class != Priority::Batch {
            return;
        }
        e.class = Priority::Interactive;
        let (tenant, excluding) = (e.ticket.tenant, !e.ticket.exclude.is_empty());
        self.classes[Priority::Batch as usize].remove(tenant, key);
        self.classes[Priority::Interactive as usize].push(tenant, key);
        if excluding {
            self.excluding[Priority::Batch as usize] -= 1;
            self.excluding[Priority::Interactive as usize] += 1;
        }
    }

    /// Replicas with a free slot now (slots held for a returning tenant are not free).
    pub(super) fn rooms(&self, now: Millis) -> Vec<Room> {
        (0..self.replicas.len())
            .filter(|&i| self.replicas[i].available)
            .filter_map(|i| {
                let o = self.occupancy(i, now);
                let free = match o.free {
                    Free::Slots(n) => Free::Slots(n.saturating_sub(self.held_on(i))),
                    unbounded => unbounded,
                };
                free.any().then_some(Room {
                    replica: i,
                    free,
                    in_use: o.in_use,
                })
            })
            .collect()
    }

    /// Whether a waiting interactive request may use `replica` (then no batch request may).
    fn interactive_wants(&self, replica: usize) -> bool {
        let waiting = self.classes[Priority::Interactive as usize].len();
        waiting > self.excluding[Priority::Interactive as usize]
            || (waiting > 0
                && self.queued.values().any(|e| {
                    e.class == Priority::Interactive && !e.ticket.exclude.contains(&replica)
                }))
    }

    /// The rooms a request of `class` may take.
    fn rooms_for(&self, class: Priority, rooms: &[Room]) -> Vec<Room> {
        match class {
            Priority::Interactive => rooms.to_vec(),
            Priority::Batch => rooms
                .iter()
                .copied()
                .filter(|r| !self.interactive_wants(r.replica))
                .collect(),
        }
    }

    /// Where a ticket may go among `rooms`: its preferred replica if free; elsewhere once it
    /// waited `affinity_wait` (or at once, when the preferred one is down or excluded).
    fn place(&self, t: &Ticket, now: Millis, rooms: &[Room]) -> Option<(usize, Placement)> {
        let usable = |r: usize| !t.exclude.contains(&r);
        let preferred = t
            .preferred
            .filter(|&p| self.replicas.get(p).is_some_and(|s| s.available) && usable(p));
        if let Some(p) = preferred {
            if rooms.iter().any(|r| r.replica == p) {
                return Some((p, Placement::Preferred));
            }
            if now.since(t.arrived) < self.config.affinity_wait {
                return None;
            }
        }
        // The most free slots (an unbounded replica: the fewest in use), ties rotating.
        let n = self.replicas.len().max(1);
        let best = rooms.iter().filter(|r| usable(r.replica)).max_by_key(|r| {
            let turn = (r.replica + n - self.cursor % n) % n;
            (r.free, Reverse(r.in_use), Reverse(turn))
        })?;
        let placement = if t.preferred.is_some() {
            Placement::Spilled
        } else {
            Placement::Balanced
        };
        Some((best.replica, placement))
    }

    /// The next waiting request to start, and where: by class, then fair order, then FIFO
    /// within the tenant (looking past requests that may not use any free slot).
    pub(super) fn pick(&self, now: Millis, rooms: &[Room]) -> Option<(QKey, usize, Placement)> {
        for class in CLASSES {
            if self.classes[class as usize].is_empty() {
                continue;
            }
            let rooms = self.rooms_for(class, rooms);
            if rooms.is_empty() {
                continue;
            }
            for (_, keys) in self.classes[class as usize].flows() {
                for key in keys.take(LOOKAHEAD) {
                    let Some(e) = self.queued.get(key) else {
                        continue;
                    };
                    if let Some((r, p)) = self.place(&e.ticket, now, &rooms) {
                        return Some((*key, r, p));
                    }
                }
            }
        }
        None
    }

    /// Dispatches until no waiting request may use a free slot.
    pub(super) fn pump(&mut self, now: Millis) -> Vec<Dispatch> {
        let mut out = Vec::new();
        while !self.queued.is_empty() {
            let rooms = self.rooms(now);
            if rooms.is_empty() {
                break;
            }
            let Some((key, replica, placement)) = self.pick(now, &rooms) else {
                break;
            };
            let Some(e) = self.queued.get(&key) else {
                break;
            };
            let (class, tenant) = (e.class, e.ticket.tenant);
            let (cost, weight) = (e.ticket.cost(), e.ticket.weight);
            self.classes[class as usize].dispatch(tenant, Some(key), cost, weight);
            let Some(e) = self.forget(key) else {
                break;
            };
            let promoted = e.class != e.ticket.priority;
            out.push(self.run(&e.ticket, promoted, replica, placement, now));
        }
        out
    }

    /// A ticket starts on `replica`.
    pub(super) fn run(
        &mut self,
        t: &Ticket,
        promoted: bool,
        replica: usize,
        placement: Placement,
        now: Millis,
    ) -> Dispatch {
        self.replicas[replica].on_dispatch();
        self.running.insert(
            t.id,
            Running {
                replica,
                dispatched_at: now,
                tenant: t.tenant,
                holdable: t.priority == Priority::Interactive,
            },
        );
        let p = (self.per_tenant)
            .entry(t.tenant)
            .or_insert(Presence::new(t.weight));
        p.running += 1;
        p.weight = t.weight;
        if placement != Placement::Preferred {
            self.cursor = replica + 1;
        }
        Dispatch {
            id: t.id,
            tenant: t.tenant,
            replica,
            priority: t.priority,
            promoted,
            placement,
            waited: now.since(t.arrived),
        }
    }

    /// The verdict on a new ticket, the state being settled at `now`.
    pub(super) fn admit(&mut self, t: Ticket, now: Millis) -> Verdict {
        if self.ids.contains_key(&t.id) || self.running.contains_key(&t.id) {
            return Verdict::Refused(Refusal::Duplicate);
        }
        let usable =
            (0..self.replicas.len()).any(|r| self.replicas[r].available && !t.exclude.contains(&r));
        if !usable {
            return Verdict::Refused(Refusal::NoReplica);
        }
        let class = self.class_of(&t, now);
        if let Some(d) = self.take_hold(&t, class, now) {
            return Verdict::Dispatched(d);
        }
        let rooms = self.rooms_for(class, &self.rooms(now));
        if let Some((replica, placement)) = self.place(&t, now, &rooms) {
            // Settled: nobody waiting may use this slot, so taking it overtakes no one.
            self.classes[class as usize].dispatch(t.tenant, None, t.cost(), t.weight);
            let promoted = class != t.priority;
            return Verdict::Dispatched(self.run(&t, promoted, replica, placement, now));
        }
        if let Some(d) = self.overflow(&t, class, now) {
            return Verdict::Dispatched(d);
        }
        let c = &self.config;
        if now.since(t.arrived) >= c.queue_timeout {
            return Verdict::Refused(Refusal::Timeout);
        }
        if self.queued_for(t.tenant) >= c.tenant_queue_cap {
            return Verdict::Refused(Refusal::TenantQueueFull);
        }
        if self.queued.len() >= c.max_queued as usize {
            return Verdict::Refused(Refusal::ClusterOverloaded);
        }
        self.insert(t, class, now);
        Verdict::Queued
    }

    fn insert(&mut self, t: Ticket, class: Priority, now: Millis) {
        self.seq += 1;
        let key = QKey {
            arrived: t.arrived,
            seq: self.seq,
        };
        self.classes[class as usize].push(t.tenant, key);
        if class == Priority::Batch {
            self.promotable.insert(key);
        }
        if t.preferred.is_some() && now.since(t.arrived) < self.config.affinity_wait {
            self.affinity_pending.insert(key);
        }
        if !t.exclude.is_empty() {
            self.excluding[class as usize] += 1;
        }
        let p = (self.per_tenant)
            .entry(t.tenant)
            .or_insert(Presence::new(t.weight));
        p.queued += 1;
        p.weight = t.weight;
        self.ids.insert(t.id, key);
        self.queued.insert(key, Entry { ticket: t, class });
    }

    /// Takes a waiting request out without service (cancelled, expired).
    pub(super) fn unqueue(&mut self, key: QKey) -> Option<Entry> {
        let (class, tenant) = self.queued.get(&key).map(|e| (e.class, e.ticket.tenant))?;
        self.classes[class as usize].remove(tenant, key);
        self.forget(key)
    }

    /// Drops a request from every index but the fair queue.
    fn forget(&mut self, key: QKey) -> Option<Entry> {
        let e = self.queued.remove(&key)?;
        self.ids.remove(&e.ticket.id);
        self.promotable.remove(&key);
        self.affinity_pending.remove(&key);
        if !e.ticket.exclude.is_empty() {
            self.excluding[e.class as usize] -= 1;
        }
        self.presence(e.ticket.tenant, |p| p.queued = p.queued.saturating_sub(1));
        Some(e)
    }
}
