//! The queue of a scheduled model pool: the I/O around [`crate::schedule::Scheduler`].
//!
//! A pool whose model has `max_concurrency` gets a [`Dispatcher`]. A request asks it for a slot
//! ([`Dispatcher::enqueue`]): it runs at once on the replica the scheduler names, waits in the
//! queue ([`Queued::granted`] resolves when the scheduler dispatches it or its wait times
//! out), or is refused. A [`Slot`] holds its place on the replica until it is dropped — when
//! the request ends, however it ends — and a [`Queued`] dropped before its turn (the client
//! hung up) leaves the queue at once. Each scheduler call's effects (other requests
//! dispatched or timed out) are delivered under the same lock, to one-shot channels: no
//! waiter polls.
//!
//! A timer task calls [`crate::schedule::Scheduler::tick`] at the scheduler's next wake-up
//! (timeouts, batch promotion, the end of an affinity wait, a stale engine report); the engine
//! load task ([`super::load`]) reports each replica's own gauges and availability.

use crate::metrics::m;
use crate::schedule::{
    Dispatch, EngineLoad, Enqueued, Millis, Priority, Refusal, RequestId, Scheduler,
    SchedulerConfig, Stage, Ticket, Verdict,
};
use parking_lot::Mutex;
use prometheus::IntGauge;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What a waiter learns: its dispatch, or why it leaves the queue.
type Answer = Result<Dispatch, Refusal>;

struct State {
    scheduler: Scheduler,
    waiters: HashMap<RequestId, oneshot::Sender<Answer>>,
}

/// The queue and slots of one model pool.
pub struct Dispatcher {
    slug: String,
    origin: Instant,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Wakes the timer task when a call moved the next wake-up earlier.
    wake: tokio::sync::Notify,
    depth: [IntGauge; 2],
    replica_urls: Vec<String>,
}

/// What [`Dispatcher::enqueue`] decided.
pub enum Admission<'a> {
    Run(Slot<'a>),
    Queued(Queued<'a>),
    Refused(Refusal),
}

/// A place on a replica, held until dropped.
pub struct Slot<'a> {
    dispatcher: &'a Dispatcher,
    id: RequestId,
    pub dispatch: Dispatch,
}

/// A request waiting in the queue; dropped before its turn, it leaves the queue.
pub struct Queued<'a> {
    dispatcher: &'a Dispatcher,
    id: RequestId,
    rx: Option<oneshot::Receiver<Answer>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.dispatcher.release(self.id);
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.rx.is_some() {
            self.dispatcher.release(self.id);
        }
    }
}

impl<'a> Queued<'a> {
    /// Resolves when the scheduler dispatches this request (its slot) or it leaves the queue
    /// (its wait timed out). Cancel-safe: dropping the future keeps the request queued; dropping
    /// the [`Queued`] removes it.
    pub async fn granted(&mut self) -> Result<Slot<'a>, Refusal> {
        let Some(rx) = self.rx.as_mut() else {
            return Err(Refusal::Duplicate);
        };
        let answer = rx.await.unwrap_or(Err(Refusal::Timeout));
        self.rx = None;
        answer.map(|dispatch| Slot {
            dispatcher: self.dispatcher,
            id: self.id,
            dispatch,
        })
    }
}

impl Dispatcher {
    /// The dispatcher of pool `slug` with `max_concurrency` per replica (indexed as the pool's
    /// replicas are).
    /// `gateways`: the gateway replicas in front of the same engines (`scheduling.gateways`);
    /// each is guaranteed its share of a replica's slots (see `schedule::capacity`).
    pub fn new(
        slug: &str,
        config: SchedulerConfig,
        gateways: NonZeroU32,
        max_concurrency: &[Option<NonZeroU32>],
        replica_urls: Vec<String>,
    ) -> Result<Dispatcher, String> {
        let mut scheduler = Scheduler::new(config, max_concurrency)
            .map_err(|e| format!("model `{slug}`: {e:?}"))?;
        // Gateways do not know their rank among each other: with a remainder, each counts on
        // the larger share (`ordinal` 0), which oversubscribes by at most the remainder.
        let gateways = quipu_core::schedule::Gateways {
            count: gateways.get(),
            ordinal: 0,
        };
        let _ = scheduler.set_gateways(gateways, quipu_core::schedule::Millis(0));
        let depth = [Priority::Interactive, Priority::Batch]
            .map(|p| m().queue_depth.with_label_values(&[slug, p.as_str()]));
        for reason in [
            "tenant_queue_full",
            "cluster_overloaded",
            "timeout",
            "no_replica",
            "cancelled",
        ] {
            m().queue_rejections.with_label_values(&[slug, reason]);
        }
        Ok(Dispatcher {
            slug: slug.to_owned(),
            origin: Instant::now(),
            state: Mutex::new(State {
                scheduler,
                waiters: HashMap::new(),
            }),
            next_id: AtomicU64::new(1),
            wake: tokio::sync::Notify::new(),
            depth,
            replica_urls,
        })
    }

    /// Now, as the scheduler counts time.
    pub fn now(&self) -> Millis {
        Millis(u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// A ticket for a new request (its id is this dispatcher's).
    pub fn ticket(&self, tenant: i64, prompt_tokens: u64, max_output_tokens: u64) -> Ticket {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        Ticket::new(id, crate::schedule::TenantId(tenant), self.now())
            .tokens(prompt_tokens, max_output_tokens)
    }

    /// Asks for a slot for `ticket` (see the module docs).
    pub fn enqueue(&self, ticket: Ticket) -> Admission<'_> {
        let id = ticket.id;
        let now = self.now();
        let (verdict, rx) = {
            let mut s = self.state.lock();
            let Enqueued { verdict, effects } = s.scheduler.enqueue(ticket, now);
            let rx = match verdict {
                Verdict::Queued => {
                    let (tx, rx) = oneshot::channel();
                    s.waiters.insert(id, tx);
                    Some(rx)
                }
                _ => None,
            };
            self.deliver(&mut s, effects, now);
            (verdict, rx)
        };
        self.wake.notify_one();
        match (verdict, rx) {
            (Verdict::Dispatched(dispatch), _) => {
                self.observe_dispatch(&dispatch);
                Admission::Run(Slot {
                    dispatcher: self,
                    id,
                    dispatch,
                })
            }
            (Verdict::Queued, Some(rx)) => Admission::Queued(Queued {
                dispatcher: self,
                id,
                rx: Some(rx),
            }),
            (Verdict::Refused(r), _) => {
                self.count_refusal(r);
                Admission::Refused(r)
            }
            // A queued verdict always gets its channel above.
            (Verdict::Queued, None) => Admission::Refused(Refusal::Duplicate),
        }
    }

    /// A request ended, queued or running: its slot frees, and whoever it lets run is told.
    fn release(&self, id: RequestId) {
        let now = self.now();
        let mut s = self.state.lock();
        s.waiters.remove(&id);
        let released = s.scheduler.release(id, now);
        if let Some(Stage::Queued) = released.was {
            m().queue_rejections
                .with_label_values(&[&self.slug, "cancelled"])
                .inc();
        }
        self.deliver(&mut s, released.effects, now);
    }

    /// Applies a call's effects: each dispatched or timed-out waiter gets its answer.
    fn deliver(&self, s: &mut State, effects: crate::schedule::Effects, now: Millis) {
        for d in effects.dispatched {
            self.observe_dispatch(&d);
            if let Some(tx) = s.waiters.remove(&d.id) {
                if tx.send(Ok(d)).is_err() {
                    // The waiter left between the dispatch and now: give the slot back.
                    let more = s.scheduler.release(d.id, now);
                    // Rare and bounded (each round frees what it took).
                    self.deliver(s, more.effects, now);
                }
            }
        }
        for e in effects.expired {
            self.count_refusal(Refusal::Timeout);
            if let Some(tx) = s.waiters.remove(&e.id) {
                let _ = tx.send(Err(Refusal::Timeout));
            }
        }
        let snap = s.scheduler.snapshot(now);
        self.depth[0].set(i64::try_from(snap.queued_interactive).unwrap_or(i64::MAX));
        self.depth[1].set(i64::try_from(snap.queued_batch).unwrap_or(i64::MAX));
        for (i, r) in snap.replicas.iter().enumerate() {
            let url = self.replica_urls.get(i).map_or("", String::as_str);
            m().slots_in_use
                .with_label_values(&[&self.slug, url])
                .set(i64::from(r.occupancy.in_use));
            if let Some(limit) = r.occupancy.limit {
                m().slots
                    .with_label_values(&[&self.slug, url])
                    .set(i64::from(limit));
            }
        }
    }

    fn observe_dispatch(&self, d: &Dispatch) {
        m().dispatches
            .with_label_values(&[&self.slug, d.placement.as_str()])
            .inc();
        m().queue_wait_seconds
            .with_label_values(&[&self.slug, d.priority.as_str()])
            .observe(d.waited.0 as f64 / 1000.0);
    }

    fn count_refusal(&self, r: Refusal) {
        m().queue_rejections
            .with_label_values(&[&self.slug, r.as_str()])
            .inc();
    }

    /// The engine of replica `i` reports its own load.
    pub fn report_load(&self, i: usize, load: EngineLoad) {
        let now = self.now();
        let mut s = self.state.lock();
        let effects = s.scheduler.set_reported_load(i, load, now);
        self.deliver(&mut s, effects, now);
    }

    /// Replica `i` became available or not (health checks, ejection, its name resolved).
    pub fn set_available(&self, i: usize, available: bool) {
        let now = self.now();
        let mut s = self.state.lock();
        let effects = s.scheduler.set_available(i, available, now);
        self.deliver(&mut s, effects, now);
    }

    /// Runs the scheduler's timed work forever: timeouts, promotions, affinity bounds.
    pub async fn run_timer(self: Arc<Self>) {
        loop {
            let wakeup = {
                let now = self.now();
                let mut s = self.state.lock();
                let effects = s.scheduler.tick(now);
                self.deliver(&mut s, effects, now);
                s.scheduler.next_wakeup(now)
            };
            let notified = self.wake.notified();
            match wakeup {
                Some(at) => {
                    let wait = Duration::from_millis(at.since(self.now()).0.max(1));
                    let _ = tokio::time::timeout(wait, notified).await;
                }
                None => notified.await,
            }
        }
    }
}
