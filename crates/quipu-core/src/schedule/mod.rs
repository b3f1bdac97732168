//! Who runs next on a model pool whose replicas have finite slots: capacity-aware dispatch
//! and weighted fair queueing across tenants. Pure policy: no clock (every call is given
//! `now`), no I/O, no async; the proxy wires it (one [`Scheduler`] per model pool behind a
//! lock, each call's [`Effects`] delivered after unlocking).
//!
//! # The model
//!
//! - **Capacity** ([`capacity`]): each replica has `max_concurrency` slots (`None`: unbounded,
//!   nothing ever waits — today's behaviour). Where the engine reports its own load (vLLM
//!   `vllm:num_requests_running` / `…_waiting`, SGLang, llama.cpp), a fresh report is the
//!   truth shared by all gateway replicas and dispatch stops while the engine's own queue is
//!   non-empty; without one, each of `n` gateways runs its share of the slots. The rule, with
//!   its arithmetic, is in [`capacity`].
//! - **Fair queueing** ([`fair`]): requests that find no free slot wait in a FIFO per tenant;
//!   when a slot frees, the tenant with the smallest virtual finish goes next (start-time fair
//!   queueing in tokens: cost = prompt + requested output tokens, divided by the tenant's
//!   `weight`). A tenant that was idle banks no credit, and is served next when it comes
//!   back.
//! - **Priority**: `Batch` requests run only on slots no interactive request may use: while an
//!   interactive request waits that could go to a replica, no batch request starts there. A
//!   batch request that has waited `batch_age_limit` is promoted: it joins its tenant's
//!   interactive queue in its arrival order and competes there with its tenant's fair share
//!   — so a batch backlog cannot starve, and an aged backlog cannot take the whole cluster
//!   either (it gets what one more interactive tenant of that weight would get).
//! - **Prefix-cache affinity**: a ticket may name a preferred replica (the affinity table's
//!   answer). It goes there when that replica has a free slot; after waiting `affinity_wait`
//!   it takes a free slot anywhere (it also spills at once when the preferred replica is down
//!   or excluded). Default 50 ms: a cache hit saves the prefill of the shared prefix, which for
//!   the long prompts where affinity matters (a system prompt and a conversation, thousands of
//!   tokens) costs tens to hundreds of milliseconds of GPU time and adds as much to time to
//!   first token; waiting up to 50 ms for the warm replica costs at most a fifth of a 250 ms
//!   time-to-first-token target, and under saturation a request that queued longer than that
//!   is no longer held back at all (the cache-warm replica is a preference, never a reason to
//!   keep a slot idle for long).
//! - **A freed slot is held for its tenant** ([`hold`]): when an interactive request of a
//!   tenant below its fair share ends while others wait, its slot is kept `return_hold` for
//!   that tenant's next request, so a tenant sending one request at a time is not pushed
//!   behind a backlog each time it comes back.
//! - **FIFO within a tenant**, among requests that can use the same replica: a request held
//!   for its preferred replica (at most `affinity_wait`) or barred from a replica (a retry's
//!   exclusions) does not hold back its tenant's younger requests that may go elsewhere. The
//!   search for such a younger request looks at the first [`LOOKAHEAD`] of the tenant's queue.
//! - **Work conserving**: after every call, no queued request may use any free slot (the
//!   scheduler dispatches until that holds); a held slot is not free, for at most
//!   `return_hold`. So a new request starts at once exactly when a
//!   slot it may use is free — nobody waiting could have used that slot.
//! - **Bounds**: a request that waited `queue_timeout` leaves the queue in the next call's
//!   [`Effects::expired`] (the proxy answers it 503/529); a new request is refused when its
//!   tenant already has `tenant_queue_cap` waiting ([`Refusal::TenantQueueFull`], 429) or the
//!   pool has `max_queued` waiting ([`Refusal::ClusterOverloaded`], 503/529). A request whose
//!   client hangs up is [`Scheduler::release`]d and leaves the queue at once, charged nothing
//!   in the fair share (tags are given at dispatch).
//!
//! # Wiring
//!
//! ```text
//! enqueue(ticket, now) → Verdict::Dispatched(d)  → forward to replica d.replica
//!                        Verdict::Queued         → wait for a Dispatch or an Expired naming it
//!                        Verdict::Refused(r)     → answer r (nothing charged)
//! release(id, now)     when a request ends for any reason, queued or running
//! tick(now)            at next_wakeup(now) (timeouts, promotions, affinity bounds, stale reports)
//! set_reported_load / set_available / set_gateways / set_max_concurrency  as they change
//! ```
//!
//! Every call returns [`Effects`]: requests to start now, requests timed out.

pub mod capacity;
mod dispatch;
pub mod fair;
mod hold;
mod overflow;
#[cfg(test)]
mod tests;
pub mod types;

pub use capacity::{share, Basis, EngineLoad, Free, Gateways, Occupancy, Report};
pub use types::*;

use capacity::ReplicaSlots;
use fair::{FairQueue, QKey};
use hold::{Ghost, Hold, Presence};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::num::NonZeroU32;

/// How far into one tenant's queue the scheduler looks for a request that may use a free slot
/// when the requests before it may not (they wait for their preferred replica).
pub const LOOKAHEAD: usize = 32;

#[derive(Debug)]
struct Entry {
    ticket: Ticket,
    /// The class it waits in (a promoted batch request waits as interactive).
    class: Priority,
}

#[derive(Debug)]
struct Running {
    replica: usize,
    dispatched_at: Millis,
    tenant: TenantId,
    /// It ran as an interactive request: its end may hold the slot for its tenant.
    holdable: bool,
}

/// The scheduler of one model pool.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    gateways: Gateways,
    replicas: Vec<ReplicaSlots>,
    /// Where the search for the least-loaded replica starts, so ties rotate.
    cursor: usize,
    seq: u64,
    queued: BTreeMap<QKey, Entry>,
    ids: HashMap<RequestId, QKey>,
    running: HashMap<RequestId, Running>,
    /// Per class: interactive, batch.
    classes: [FairQueue; 2],
    /// Batch requests not yet promoted, oldest first.
    promotable: BTreeSet<QKey>,
    /// Requests with a preferred replica still within `affinity_wait`.
    affinity_pending: BTreeSet<QKey>,
    /// What each tenant has in the pool: queued, running, held.
    per_tenant: HashMap<TenantId, Presence>,
    /// Slots kept for a returning tenant ([`hold`]).
    holds: Vec<Hold>,
    /// Lapsed holds whose tenant may have gone on through another gateway ([`hold`]).
    ghosts: Vec<Ghost>,
    /// Per class: queued requests with exclusions.
    excluding: [usize; 2],
}

/// The pool's state, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Waiting as interactive (promoted batch requests included) and as batch.
    pub queued_interactive: usize,
    pub queued_batch: usize,
    pub running: usize,
    pub replicas: Vec<ReplicaView>,
}

/// One replica's slots, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaView {
    pub available: bool,
    pub max_concurrency: Option<u32>,
    /// Requests this gateway runs there.
    pub local: u32,
    /// What counts against the limit now, and the limit.
    pub occupancy: Occupancy,
    pub report: Option<Report>,
}

impl Scheduler {
    /// A scheduler for a pool whose replicas have these `max_concurrency` values, in the
    /// pool's order.
    pub fn new(
        config: SchedulerConfig,
        max_concurrency: &[Option<NonZeroU32>],
    ) -> Result<Scheduler, ConfigProblem> {
        config.check()?;
        Ok(Scheduler {
            config,
            gateways: Gateways::ONE,
            replicas: max_concurrency
                .iter()
                .map(|m| ReplicaSlots::new(m.map(NonZeroU32::get)))
                .collect(),
            cursor: 0,
            seq: 0,
            queued: BTreeMap::new(),
            ids: HashMap::new(),
            running: HashMap::new(),
            classes: Default::default(),
            promotable: BTreeSet::new(),
            affinity_pending: BTreeSet::new(),
            per_tenant: HashMap::new(),
            holds: Vec::new(),
            ghosts: Vec::new(),
            excluding: [0; 2],
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Offers a request: it starts now, waits, or is refused. `effects` are what else became
    /// due at `now` (timeouts, dispatches), as from [`Scheduler::tick`].
    pub fn enqueue(&mut self, ticket: Ticket, now: Millis) -> Enqueued {
        let mut effects = self.settle(now);
        // Its tenant is back here with nothing queued: the slots kept for it as ghosts are
        // this gateway's to fill again, this ticket first.
        let back = self.ghosts.iter().any(|g| g.tenant == ticket.tenant)
            && self.queued_for(ticket.tenant) == 0;
        if back {
            let tenant = ticket.tenant;
            self.lay_ghosts(|g| g.tenant == tenant);
        }
        let verdict = self.admit(ticket, now);
        if back {
            effects.dispatched.extend(self.pump(now));
        }
        Enqueued { verdict, effects }
    }

    /// A request ended (done, failed, or its client went away), queued or running: it leaves
    /// the queue, or frees its slot for the next one.
    pub fn release(&mut self, id: RequestId, now: Millis) -> Released {
        let was = if let Some(key) = self.ids.get(&id).copied() {
            self.unqueue(key);
            Some(Stage::Queued)
        } else if let Some(r) = self.running.remove(&id) {
            if let Some(slots) = self.replicas.get_mut(r.replica) {
                slots.on_release(r.dispatched_at);
            }
            // The tenant stays present until a hold is decided (a hold needs its weight and
            // counts), then is forgotten if it has nothing left in the pool.
            if let Some(p) = self.per_tenant.get_mut(&r.tenant) {
                p.running = p.running.saturating_sub(1);
            }
            if r.holdable {
                self.maybe_hold(r.tenant, r.replica, now);
            }
            self.presence(r.tenant, |_| {});
            Some(Stage::Running { replica: r.replica })
        } else {
            None
        };
        Released {
            was,
            effects: self.settle(now),
        }
    }

    /// What became due by `now`: timeouts, promotions, ends of affinity waits, stale reports.
    /// Call it at [`Scheduler::next_wakeup`].
    pub fn tick(&mut self, now: Millis) -> Effects {
        self.settle(now)
    }

    /// The engine's own load on a replica, read at `now`.
    pub fn set_reported_load(&mut self, replica: usize, load: EngineLoad, now: Millis) -> Effects {
        if let Some(r) = self.replicas.get_mut(replica) {
            let slots = load.slots.filter(|&s| s > 0);
            r.set_report(EngineLoad { slots, ..load }, now);
            if r.reports_show_room(self.config.report_ttl) && r.ghosts > 0 {
                self.lay_ghosts(|g| g.replica == replica);
            }
        }
        self.settle(now)
    }

    /// Whether a replica may be dispatched to (health checks, ejection).
    pub fn set_available(&mut self, replica: usize, available: bool, now: Millis) -> Effects {
        if let Some(r) = self.replicas.get_mut(replica) {
            r.available = available;
        }
        self.settle(now)
    }

    /// The live gateway replicas sharing these engines, and this one's ordinal among them.
    pub fn set_gateways(&mut self, gateways: Gateways, now: Millis) -> Effects {
        self.gateways = gateways;
        self.settle(now)
    }

    pub fn set_max_concurrency(
        &mut self,
        replica: usize,
        max: Option<NonZeroU32>,
        now: Millis,
    ) -> Effects {
        if let Some(r) = self.replicas.get_mut(replica) {
            r.max_concurrency = max.map(NonZeroU32::get);
        }
        self.settle(now)
    }

    /// When something becomes due without any call: the next timeout, batch promotion, end
    /// of an affinity wait, or report going stale after `now` (`None`: nothing waits).
    pub fn next_wakeup(&self, now: Millis) -> Option<Millis> {
        if self.queued.is_empty() {
            return None;
        }
        let c = &self.config;
        let due = |set: Option<&QKey>, after: Millis| set.map(|k| k.arrived.plus(after));
        [
            due(self.queued.keys().next(), c.queue_timeout),
            due(self.promotable.first(), c.batch_age_limit),
            due(self.affinity_pending.first(), c.affinity_wait),
            self.holds.iter().map(|h| h.until).min(),
            self.ghosts.iter().map(|g| g.until).min(),
        ]
        .into_iter()
        .chain(
            self.replicas
                .iter()
                .filter_map(|r| r.report.map(|rep| rep.at.plus(c.report_ttl)))
                .filter(|&stale| stale > now)
                .map(Some),
        )
        .flatten()
        .min()
    }

    /// Requests a tenant has waiting.
    pub fn queued_for(&self, tenant: TenantId) -> u32 {
        self.per_tenant.get(&tenant).map_or(0, |p| p.queued)
    }

    pub fn snapshot(&self, now: Millis) -> Snapshot {
        Snapshot {
            queued_interactive: self.classes[Priority::Interactive as usize].len(),
            queued_batch: self.classes[Priority::Batch as usize].len(),
            running: self.running.len(),
            replicas: (0..self.replicas.len())
                .map(|i| ReplicaView {
                    available: self.replicas[i].available,
                    max_concurrency: self.replicas[i].max_concurrency,
                    local: self.replicas[i].local,
                    occupancy: self.occupancy(i, now),
                    report: self.replicas[i].report,
                })
                .collect(),
        }
    }
}
