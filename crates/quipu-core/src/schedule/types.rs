//! The scheduler's vocabulary: time, identities, the ticket a request queues with, the
//! configuration, and the typed decisions the scheduler hands back to the I/O layer.

use std::num::NonZeroU32;

/// A point in time or a span, in milliseconds since an origin the caller chooses (a
/// monotonic clock read at startup, say). The scheduler never reads a clock: every call that
/// depends on time is given `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    pub const ZERO: Millis = Millis(0);

    /// The span from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Millis) -> Millis {
        Millis(self.0.saturating_sub(earlier.0))
    }

    /// `self` moved forward by `span` (saturating).
    pub fn plus(self, span: Millis) -> Millis {
        Millis(self.0.saturating_add(span.0))
    }
}

/// The caller's id of one request, unique among the requests a scheduler holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// The tenant a request is queued and charged for (the store's tenant id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub i64);

/// Interactive traffic first; `Batch` (a key's `priority = "batch"`) only on the capacity
/// interactive traffic leaves free, until it has waited `batch_age_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Interactive = 0,
    Batch = 1,
}

impl Priority {
    /// The metric label: `interactive` or `batch`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }
}

/// What the scheduler needs to know about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub id: RequestId,
    pub tenant: TenantId,
    /// The tenant's share weight (default 1): a tenant of weight 3 gets three times the tokens
    /// of a tenant of weight 1 while both have requests waiting.
    pub weight: NonZeroU32,
    pub priority: Priority,
    /// The prompt's size in tokens (the admission estimate is fine).
    pub prompt_tokens: u64,
    /// The output the request may generate: its `max_tokens`, or what the caller assumes when
    /// the client set none.
    pub max_output_tokens: u64,
    /// The replica whose prefix cache holds this prompt's beginning (the affinity table's
    /// answer), if any.
    pub preferred: Option<usize>,
    /// Replicas this request must not go to (ones a retried request already failed on).
    pub exclude: Vec<usize>,
    /// When the request arrived: queue order within the tenant, the queue timeout, the batch
    /// age limit and the affinity bound all count from here. A retry keeps its first arrival.
    pub arrived: Millis,
}

impl Ticket {
    /// An interactive ticket of weight 1 with no tokens, preference or exclusions.
    pub fn new(id: RequestId, tenant: TenantId, arrived: Millis) -> Ticket {
        Ticket {
            id,
            tenant,
            weight: NonZeroU32::MIN,
            priority: Priority::Interactive,
            prompt_tokens: 0,
            max_output_tokens: 0,
            preferred: None,
            exclude: Vec::new(),
            arrived,
        }
    }

    pub fn tokens(mut self, prompt: u64, max_output: u64) -> Ticket {
        self.prompt_tokens = prompt;
        self.max_output_tokens = max_output;
        self
    }

    pub fn weight(mut self, weight: NonZeroU32) -> Ticket {
        self.weight = weight;
        self
    }

    pub fn priority(mut self, priority: Priority) -> Ticket {
        self.priority = priority;
        self
    }

    pub fn prefer(mut self, replica: usize) -> Ticket {
        self.preferred = Some(replica);
        self
    }

    pub fn exclude(mut self, replicas: Vec<usize>) -> Ticket {
        self.exclude = replicas;
        self
    }

    /// What the request costs its tenant in the fair share: prompt plus requested output
    /// tokens (at least 1, so an empty request still takes a turn).
    pub fn cost(&self) -> u64 {
        self.prompt_tokens
            .saturating_add(self.max_output_tokens)
            .max(1)
    }
}

/// The scheduler's knobs for one model pool. [`Default`] gives the documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The longest a request waits in the queue; then it is answered with
    /// [`Refusal::Timeout`] (default 60 s).
    pub queue_timeout: Millis,
    /// Queued requests per tenant beyond which a new one is refused with
    /// [`Refusal::TenantQueueFull`] (default 256). Requests that start at once never count.
    pub tenant_queue_cap: u32,
    /// Queued requests in the whole pool beyond which a new one is refused with
    /// [`Refusal::ClusterOverloaded`] (default 4096; 0: nothing ever waits).
    pub max_queued: u32,
    /// A batch request that has waited this long competes as interactive (default 20 s). Must
    /// be below `queue_timeout`, or batch requests could time out before they ever run.
    pub batch_age_limit: Millis,
    /// How long a request with a preferred replica waits for a slot there before it takes one
    /// anywhere (default 50 ms; see the module docs for why).
    pub affinity_wait: Millis,
    /// How long an engine's reported load stays trusted (default 5 s; about three scrape
    /// intervals). An older report is ignored and the gateway's share of `max_concurrency`
    /// applies instead.
    pub report_ttl: Millis,
    /// Requests allowed to wait inside an engine's own queue (default 0: dispatch only while it
    /// is empty). A small value trades a little engine queueing for no idle gap between a
    /// sequence ending and the next one starting.
    pub engine_queue_allowance: u32,
    /// How long a slot freed by an interactive request stays kept for its tenant's next
    /// request, when others wait and that tenant is below its fair share (default 20 ms; 0:
    /// never). See the scheduler's `hold` module for why.
    pub return_hold: Millis,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            queue_timeout: Millis(60_000),
            tenant_queue_cap: 256,
            max_queued: 4096,
            batch_age_limit: Millis(20_000),
            affinity_wait: Millis(50),
            report_ttl: Millis(5_000),
            engine_queue_allowance: 0,
            return_hold: Millis(20),
        }
    }
}

/// A configuration the scheduler cannot honour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigProblem {
    /// `batch_age_limit` ≥ `queue_timeout`: a batch request would time out before it is ever
    /// promoted, so batch traffic could starve forever.
    BatchAgeNotBelowTimeout,
}

impl SchedulerConfig {
    pub fn check(&self) -> Result<(), ConfigProblem> {
        if self.batch_age_limit >= self.queue_timeout {
            return Err(ConfigProblem::BatchAgeNotBelowTimeout);
        }
        Ok(())
    }
}

/// How a dispatched request's replica was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Its preferred (cache-warm) replica.
    Preferred,
    /// It had a preferred replica but went elsewhere: the bound passed, or the preferred one
    /// is down or excluded.
    Spilled,
    /// It had no preference: the replica with the most free slots.
    Balanced,
    /// The slot its tenant's previous request freed, kept for it (see the `hold` module).
    Returned,
    /// Sent to wait at the head of a full engine's own queue, its tenant being below its
    /// share (see the `overflow` module).
    EngineQueue,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Preferred => "preferred",
            Placement::Spilled => "spilled",
            Placement::Balanced => "balanced",
            Placement::Returned => "returned",
            Placement::EngineQueue => "engine_queue",
        }
    }
}

/// One decision: this request runs now, on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    pub id: RequestId,
    pub tenant: TenantId,
    /// The replica's index in the pool.
    pub replica: usize,
    /// The ticket's priority (a promoted batch request still says `Batch`).
    pub priority: Priority,
    /// It ran as interactive because it had waited `batch_age_limit`.
    pub promoted: bool,
    pub placement: Placement,
    /// Time from arrival to this dispatch (the queue wait).
    pub waited: Millis,
}

/// Why a request is not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its tenant already has `tenant_queue_cap` requests waiting (HTTP 429 `queue_full`).
    TenantQueueFull,
    /// The pool already has `max_queued` requests waiting (HTTP 503 / 529).
    ClusterOverloaded,
    /// It waited `queue_timeout` (HTTP 503 / 529); reported in [`Effects::expired`].
    Timeout,
    /// No replica it may use is available (all down, or all excluded).
    NoReplica,
    /// The scheduler already holds a request with this id (a caller bug).
    Duplicate,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::TenantQueueFull => "tenant_queue_full",
            Refusal::ClusterOverloaded => "cluster_overloaded",
            Refusal::Timeout => "timeout",
            Refusal::NoReplica => "no_replica",
            Refusal::Duplicate => "duplicate",
        }
    }
}

/// A queued request that waited `queue_timeout`: answer it with [`Refusal::Timeout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub id: RequestId,
    pub tenant: TenantId,
    pub priority: Priority,
    pub waited: Millis,
}

/// What a call did to requests other than the one it was about: start these, answer those.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    pub dispatched: Vec<Dispatch>,
    pub expired: Vec<Expired>,
}

impl Effects {
    pub fn is_empty(&self) -> bool {
        self.dispatched.is_empty() && self.expired.is_empty()
    }
}

/// The fate of an enqueued ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It runs now.
    Dispatched(Dispatch),
    /// It waits; a later [`Effects::dispatched`] or [`Effects::expired`] names it.
    Queued,
    Refused(Refusal),
}

/// What [`super::Scheduler::enqueue`] decided: the new ticket's verdict, and what happened to
/// others meanwhile (timeouts and dispatches due at `now`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub verdict: Verdict,
    pub effects: Effects,
}

/// Where a released request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Queued,
    Running { replica: usize },
}

/// What [`super::Scheduler::release`] did: where the request was (`None`: unknown, e.g.
/// already expired), and the dispatches its freed slot allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub was: Option<Stage>,
    pub effects: Effects,
}
