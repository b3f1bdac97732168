//! The scheduler's behaviour, call by call, with time as a plain number.

use super::*;
use std::collections::{BTreeMap, VecDeque};

/// An engine's report without a slot count.
fn engine(running: u32, waiting: u32) -> EngineLoad {
    EngineLoad {
        running,
        waiting,
        slots: None,
    }
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn caps(c: &[Option<u32>]) -> Vec<Option<NonZeroU32>> {
    c.iter().map(|m| m.map(nz)).collect()
}

fn sched(c: &[Option<u32>]) -> Scheduler {
    sched_with(SchedulerConfig::default(), c)
}

fn sched_with(config: SchedulerConfig, c: &[Option<u32>]) -> Scheduler {
    Scheduler::new(config, &caps(c)).unwrap()
}

fn ticket(id: u64, tenant: i64, at: u64) -> Ticket {
    Ticket::new(RequestId(id), TenantId(tenant), Millis(at)).tokens(100, 100)
}

/// Enqueues at the ticket's arrival; the verdict, with nothing else happening meanwhile.
fn offer(s: &mut Scheduler, t: Ticket) -> Verdict {
    let now = t.arrived;
    let e = s.enqueue(t, now);
    assert!(e.effects.is_empty(), "{e:?}");
    e.verdict
}

fn dispatched(v: Verdict) -> Dispatch {
    match v {
        Verdict::Dispatched(d) => d,
        other => panic!("not dispatched: {other:?}"),
    }
}

fn ids(e: &Effects) -> Vec<u64> {
    e.dispatched.iter().map(|d| d.id.0).collect()
}

fn release(s: &mut Scheduler, id: u64, now: u64) -> Effects {
    s.release(RequestId(id), Millis(now)).effects
}

/// A tiny deterministic generator (xorshift64*), so the tests need no `rand`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One tenant of a saturation run: weight and a cost per request (prompt, max output).
struct Load {
    weight: u32,
    cost: Box<dyn FnMut() -> (u64, u64)>,
}

/// Tenant `i` of `loads` offers request `id` at `now`: the verdict and the request's cost.
fn offer_load(
    s: &mut Scheduler,
    loads: &mut [Load],
    i: usize,
    id: u64,
    now: u64,
) -> (Verdict, u64) {
    let (p, o) = (loads[i].cost)();
    let t = Ticket::new(RequestId(id), TenantId(i as i64), Millis(now))
        .tokens(p, o)
        .weight(nz(loads[i].weight));
    let cost = t.cost();
    (s.enqueue(t, Millis(now)).verdict, cost)
}

/// Every tenant keeps `2 × slots` requests queued on `slots` slots; the oldest running request
/// ends at each step. Returns, per dispatch in order, (tenant index, tokens).
fn saturate(loads: &mut [Load], slots: u32, dispatches: usize) -> Vec<(usize, u64)> {
    let config = SchedulerConfig {
        queue_timeout: Millis(u64::MAX / 2),
        batch_age_limit: Millis(u64::MAX / 4),
        ..SchedulerConfig::default()
    };
    let mut s = sched_with(config, &[Some(slots)]);
    let mut cost_of: HashMap<u64, u64> = HashMap::new();
    let mut running: VecDeque<u64> = VecDeque::new();
    let mut out = Vec::new();
    let mut next_id = 0;
    for _ in 0..2 * slots {
        for i in 0..loads.len() {
            next_id += 1;
            let (v, cost) = offer_load(&mut s, loads, i, next_id, 0);
            cost_of.insert(next_id, cost);
            if let Verdict::Dispatched(d) = v {
                running.push_back(d.id.0);
                out.push((i, cost));
            }
        }
    }
    let mut now = 0;
    while out.len() < dispatches {
        now += 1;
        let done = running.pop_front().unwrap();
        for d in release(&mut s, done, now).dispatched {
            running.push_back(d.id.0);
            let i = d.tenant.0 as usize;
            out.push((i, cost_of[&d.id.0]));
            // The tenant keeps its queue full.
            next_id += 1;
            let (v, cost) = offer_load(&mut s, loads, i, next_id, now);
            assert_eq!(v, Verdict::Queued);
            cost_of.insert(next_id, cost);
        }
    }
    out
}

fn tokens_of(run: &[(usize, u64)], tenant: usize) -> u64 {
    run.iter().filter(|d| d.0 == tenant).map(|d| d.1).sum()
}

#[test]
fn weights_one_to_three_get_tokens_one_to_three() {
    let mut rng_a = Rng(7);
    let mut rng_b = Rng(11);
    let mut loads = [
        Load {
            weight: 1,
            cost: Box::new(move || (100 + rng_a.below(900), 50)),
        },
        Load {
            weight: 3,
            cost: Box::new(move || (100 + rng_b.below(900), 50)),
        },
    ];
    let run = saturate(&mut loads, 4, 20_000);
    // Start-time fair queueing keeps the weighted lag within one request's cost at each weight
    // (at most 1049 tokens / 1 + 1049 / 3), at every point of the run.
    let (mut a, mut b) = (0f64, 0f64);
    for (k, &(i, c)) in run.iter().enumerate() {
        if i == 0 {
            a += c as f64;
        } else {
            b += c as f64;
        }
        if k > 0 {
            assert!(
                (a - b / 3.0).abs() <= 1050.0 * 4.0 / 3.0,
                "at {k}: {a} vs {b}/3"
            );
        }
    }
    let ratio = tokens_of(&run, 1) as f64 / tokens_of(&run, 0) as f64;
    assert!((ratio - 3.0).abs() < 0.003, "ratio {ratio}");
}

#[test]
fn long_prompts_get_the_same_tokens_not_the_same_requests() {
    let mut loads = [
        Load {
            weight: 1,
            cost: Box::new(|| (8000, 100)),
        },
        Load {
            weight: 1,
            cost: Box::new(|| (100, 100)),
        },
    ];
    let run = saturate(&mut loads, 8, 20_000);
    let (a, b) = (tokens_of(&run, 0) as f64, tokens_of(&run, 1) as f64);
    assert!((a / b - 1.0).abs() < 0.02, "tokens {a} vs {b}");
    let requests = |t| run.iter().filter(|d| d.0 == t).count() as f64;
    let per_request = requests(1) / requests(0);
    assert!((per_request - 8100.0 / 200.0).abs() < 2.0, "{per_request}");
}

#[test]
fn a_tenant_is_served_first_come_first_served() {
    let mut s = sched(&[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    for id in 2..=6 {
        assert_eq!(offer(&mut s, ticket(id, 1, id)), Verdict::Queued);
    }
    let mut order = Vec::new();
    let mut running = 1;
    for now in 10..15 {
        let e = release(&mut s, running, now);
        order.extend(ids(&e));
        running = *order.last().unwrap();
    }
    assert_eq!(order, vec![2, 3, 4, 5, 6]);
}

#[test]
fn an_idle_tenant_is_served_next_but_banks_no_credit() {
    let mut s = sched(&[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    let mut next = 2;
    for _ in 0..5 {
        assert_eq!(offer(&mut s, ticket(next, 1, 0)), Verdict::Queued);
        next += 1;
    }
    // Tenant 1 alone for a long while, five requests always waiting.
    let mut running = 1;
    let mut step = |s: &mut Scheduler, now: u64, running: &mut u64| {
        assert_eq!(offer(s, ticket(next, 1, now)), Verdict::Queued);
        next += 1;
        let e = release(s, *running, now);
        *running = e.dispatched[0].id.0;
        e.dispatched[0].tenant.0
    };
    for now in 1..500 {
        assert_eq!(step(&mut s, now, &mut running), 1);
    }
    // Tenant 2 arrives with a burst: its first request goes next...
    for k in 0..10 {
        assert_eq!(offer(&mut s, ticket(1000 + k, 2, 500)), Verdict::Queued);
    }
    let order: Vec<i64> = (501..511)
        .map(|now| step(&mut s, now, &mut running))
        .collect();
    // ...but 499 requests' worth of idle time buys it no run of the cluster: the two alternate.
    assert_eq!(order, vec![2, 1, 2, 1, 2, 1, 2, 1, 2, 1]);
}

#[test]
fn batch_runs_only_on_capacity_interactive_traffic_leaves() {
    let mut s = sched(&[Some(2)]);
    let batch = |id, at| ticket(id, 7, at).priority(Priority::Batch);
    // Alone, batch takes everything.
    dispatched(offer(&mut s, batch(1, 0)));
    dispatched(offer(&mut s, batch(2, 0)));
    assert_eq!(offer(&mut s, batch(3, 1)), Verdict::Queued);
    assert_eq!(offer(&mut s, batch(4, 1)), Verdict::Queued);
    // Interactive arrives later and still goes first.
    assert_eq!(offer(&mut s, ticket(10, 8, 2)), Verdict::Queued);
    assert_eq!(offer(&mut s, ticket(11, 8, 3)), Verdict::Queued);
    assert_eq!(ids(&release(&mut s, 1, 4)), vec![10]);
    assert_eq!(ids(&release(&mut s, 2, 5)), vec![11]);
    let e = release(&mut s, 10, 6);
    assert_eq!(ids(&e), vec![3]);
    assert_eq!(
        (e.dispatched[0].priority, e.dispatched[0].promoted),
        (Priority::Batch, false)
    );
    let snap = s.snapshot(Millis(6));
    assert_eq!((snap.queued_interactive, snap.queued_batch), (0, 1));
}

#[test]
fn batch_waiting_for_an_interactive_one_held_for_affinity_does_not_take_its_slot() {
    let mut s = sched(&[Some(1), Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0).prefer(0)));
    // Interactive 2 waits (≤ 50 ms) for replica 0; replica 1 is free.
    assert_eq!(offer(&mut s, ticket(2, 1, 10).prefer(0)), Verdict::Queued);
    let b = ticket(3, 9, 11).priority(Priority::Batch);
    assert_eq!(offer(&mut s, b), Verdict::Queued, "replica 1 is kept for 2");
    let e = s.tick(Millis(60));
    assert_eq!(ids(&e), vec![2]);
    assert_eq!(e.dispatched[0].replica, 1);
    assert_eq!(ids(&release(&mut s, 1, 70)), vec![3], "then batch runs");
}

#[test]
fn batch_is_promoted_after_its_age_limit() {
    let config = SchedulerConfig {
        batch_age_limit: Millis(1000),
        queue_timeout: Millis(5000),
        ..SchedulerConfig::default()
    };
    let mut s = sched_with(config, &[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    assert_eq!(
        offer(&mut s, ticket(2, 2, 0).priority(Priority::Batch)),
        Verdict::Queued
    );
    assert_eq!(s.next_wakeup(Millis(0)), Some(Millis(1000)));
    // Interactive tenant 1 keeps one request waiting: before the age limit it always wins.
    let mut running = 1;
    let mut next = 100;
    for now in (100..1000).step_by(100) {
        assert_eq!(offer(&mut s, ticket(next, 1, now)), Verdict::Queued);
        next += 1;
        let e = release(&mut s, running, now + 1);
        assert_eq!(e.dispatched[0].tenant, TenantId(1), "at {now}");
        running = e.dispatched[0].id.0;
    }
    assert_eq!(offer(&mut s, ticket(next, 1, 1000)), Verdict::Queued);
    // Promoted: it now competes as interactive, a newcomer to that class, so it goes next.
    let e = release(&mut s, running, 1001);
    let d = e.dispatched[0];
    assert_eq!((d.id.0, d.priority, d.promoted), (2, Priority::Batch, true));
    assert_eq!(d.waited, Millis(1001));
}

#[test]
fn a_preferred_replica_is_waited_for_then_spilled_from() {
    let mut s = sched(&[Some(1), Some(1)]);
    let d = dispatched(offer(&mut s, ticket(1, 1, 0).prefer(0)));
    assert_eq!((d.replica, d.placement), (0, Placement::Preferred));
    // 2 prefers the busy replica 0 and waits, though replica 1 is free.
    assert_eq!(offer(&mut s, ticket(2, 1, 100).prefer(0)), Verdict::Queued);
    assert_eq!(s.next_wakeup(Millis(100)), Some(Millis(150)));
    // A request with no preference takes replica 1 meanwhile (2 could not use it yet).
    let d = dispatched(offer(&mut s, ticket(3, 1, 110)));
    assert_eq!((d.replica, d.placement), (1, Placement::Balanced));
    // Replica 0 frees within the bound: 2 gets its cache-warm replica.
    let e = release(&mut s, 1, 120);
    assert_eq!((e.dispatched[0].id.0, e.dispatched[0].replica), (2, 0));
    assert_eq!(e.dispatched[0].placement, Placement::Preferred);
    // 4 prefers 0 (busy with 2); replica 1 frees; 4 still waits until its bound.
    assert_eq!(offer(&mut s, ticket(4, 1, 200).prefer(0)), Verdict::Queued);
    assert!(release(&mut s, 3, 210).is_empty());
    assert!(s.tick(Millis(249)).is_empty());
    let e = s.tick(Millis(250));
    let d = e.dispatched[0];
    assert_eq!((d.id.0, d.replica, d.placement), (4, 1, Placement::Spilled));
}

#[test]
fn a_preferred_replica_that_is_down_is_no_reason_to_wait() {
    let mut s = sched(&[Some(1), Some(1)]);
    assert!(s.set_available(0, false, Millis(0)).is_empty());
    let d = dispatched(offer(&mut s, ticket(1, 1, 0).prefer(0)));
    assert_eq!((d.replica, d.placement), (1, Placement::Spilled));
}

#[test]
fn caps_refuse_beyond_the_tenant_queue_and_the_pool_queue() {
    let config = SchedulerConfig {
        tenant_queue_cap: 2,
        max_queued: 3,
        ..SchedulerConfig::default()
    };
    let mut s = sched_with(config, &[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    assert_eq!(offer(&mut s, ticket(2, 1, 1)), Verdict::Queued);
    assert_eq!(offer(&mut s, ticket(3, 1, 2)), Verdict::Queued);
    assert_eq!(
        offer(&mut s, ticket(4, 1, 3)),
        Verdict::Refused(Refusal::TenantQueueFull)
    );
    assert_eq!(offer(&mut s, ticket(5, 2, 4)), Verdict::Queued);
    assert_eq!(
        offer(&mut s, ticket(6, 3, 5)),
        Verdict::Refused(Refusal::ClusterOverloaded)
    );
    assert_eq!(s.queued_for(TenantId(1)), 2);
    // A refused request left nothing behind: its id can come again.
    assert!(release(&mut s, 2, 6).is_empty());
    assert_eq!(offer(&mut s, ticket(4, 1, 7)), Verdict::Queued);
}

#[test]
fn with_no_queue_allowed_nothing_waits() {
    let config = SchedulerConfig {
        max_queued: 0,
        ..SchedulerConfig::default()
    };
    let mut s = sched_with(config, &[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    assert_eq!(
        offer(&mut s, ticket(2, 2, 0)),
        Verdict::Refused(Refusal::ClusterOverloaded)
    );
}

#[test]
fn requests_time_out_in_arrival_order_and_never_run_late() {
    let config = SchedulerConfig {
        queue_timeout: Millis(1000),
        batch_age_limit: Millis(500),
        ..SchedulerConfig::default()
    };
    let mut s = sched_with(config, &[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    assert_eq!(offer(&mut s, ticket(2, 1, 10)), Verdict::Queued);
    assert_eq!(offer(&mut s, ticket(3, 2, 20)), Verdict::Queued);
    assert_eq!(offer(&mut s, ticket(4, 2, 900)), Verdict::Queued);
    assert_eq!(s.next_wakeup(Millis(900)), Some(Millis(1010)));
    assert!(s.tick(Millis(1009)).is_empty());
    let e = s.tick(Millis(1020));
    let expired: Vec<(u64, u64)> = e.expired.iter().map(|x| (x.id.0, x.waited.0)).collect();
    assert_eq!(expired, vec![(2, 1010), (3, 1000)]);
    assert!(e.dispatched.is_empty());
    // The slot frees after 4 has waited its timeout: 4 expires, it does not start.
    let e = release(&mut s, 1, 1900);
    assert_eq!(e.expired.len(), 1);
    assert!(e.dispatched.is_empty());
    assert_eq!(s.next_wakeup(Millis(1900)), None);
    // A retry that already waited its timeout is refused at once rather than queued.
    let mut s = sched_with(config, &[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    let late = s.enqueue(ticket(5, 1, 0), Millis(1000));
    assert_eq!(late.verdict, Verdict::Refused(Refusal::Timeout));
}

#[test]
fn a_cancelled_request_leaves_the_queue_at_once_and_costs_nothing() {
    let mut s = sched(&[Some(1)]);
    dispatched(offer(&mut s, ticket(1, 9, 0)));
    assert_eq!(
        offer(&mut s, ticket(2, 1, 1).tokens(50_000, 0)),
        Verdict::Queued
    );
    assert_eq!(offer(&mut s, ticket(3, 2, 2)), Verdict::Queued);
    assert_eq!(offer(&mut s, ticket(4, 2, 3)), Verdict::Queued);
    let r = s.release(RequestId(2), Millis(4));
    assert_eq!(r.was, Some(Stage::Queued));
    assert!(r.effects.is_empty());
    assert_eq!(s.queued_for(TenantId(1)), 0);
    // Tenant 1 comes back. Had the cancelled 50k tokens been charged, tenant 2 would run
    // twice first; as it is, tenant 2's older head goes, then tenant 1.
    assert_eq!(offer(&mut s, ticket(5, 1, 5)), Verdict::Queued);
    assert_eq!(ids(&release(&mut s, 1, 6)), vec![3]);
    assert_eq!(ids(&release(&mut s, 3, 7)), vec![5]);
    assert_eq!(ids(&release(&mut s, 5, 8)), vec![4]);
    let r = s.release(RequestId(4), Millis(9));
    assert_eq!(r.was, Some(Stage::Running { replica: 0 }));
    assert_eq!(s.release(RequestId(4), Millis(10)).was, None);
}

#[test]
fn reported_load_holds_dispatch_while_the_engine_queues() {
    let config = SchedulerConfig {
        report_ttl: Millis(1000),
        ..SchedulerConfig::default()
    };
    let mut s = sched_with(config, &[Some(4)]);
    // Other gateways fill the engine: 4 running, 1 waiting in its own queue.
    let full = engine(4, 1);
    assert!(s.set_reported_load(0, full, Millis(0)).is_empty());
    assert_eq!(offer(&mut s, ticket(1, 1, 10)), Verdict::Queued);
    assert_eq!(offer(&mut s, ticket(2, 1, 20)), Verdict::Queued);
    // The engine's queue drained and one slot is free. One report is not believed (the slot
    // may be free for a millisecond); when the next one says the same: one dispatch, not two.
    let one_free = engine(3, 0);
    assert!(s.set_reported_load(0, one_free, Millis(300)).is_empty());
    let e = s.set_reported_load(0, one_free, Millis(500));
    assert_eq!(ids(&e), vec![1]);
    let snap = s.snapshot(Millis(500));
    let o = snap.replicas[0].occupancy;
    assert_eq!(
        (o.basis, o.in_use, o.free),
        (Basis::Reported, 4, Free::Slots(0))
    );
    // The report goes stale: the gateway falls back to its own count (1 of 4 in flight here).
    assert_eq!(s.next_wakeup(Millis(500)), Some(Millis(1500)));
    let e = s.tick(Millis(1500));
    assert_eq!(ids(&e), vec![2]);
    assert_eq!(
        s.snapshot(Millis(1500)).replicas[0].occupancy.basis,
        Basis::Share
    );
}

#[test]
fn gateways_split_the_slots_when_no_engine_reports() {
    let mut s = sched(&[Some(8)]);
    let two = Gateways {
        count: 2,
        ordinal: 1,
    };
    assert!(s.set_gateways(two, Millis(0)).is_empty());
    for id in 1..=4 {
        dispatched(offer(&mut s, ticket(id, 1, 0)));
    }
    assert_eq!(offer(&mut s, ticket(5, 1, 0)), Verdict::Queued);
    // The other gateway goes away: this one may use all 8.
    let e = s.set_gateways(Gateways::ONE, Millis(1));
    assert_eq!(ids(&e), vec![5]);
}

#[test]
fn unbounded_replicas_never_queue() {
    let mut s = sched(&[None, None]);
    let mut per_replica = [0u32; 2];
    for id in 0..5000u64 {
        let t = ticket(id, (id % 7) as i64, id / 10)
            .priority(if id % 3 == 0 {
                Priority::Batch
            } else {
                Priority::Interactive
            })
            .prefer((id % 2) as usize);
        let d = dispatched(offer(&mut s, t));
        per_replica[d.replica] += 1;
    }
    assert_eq!(
        per_replica,
        [2500, 2500],
        "each went to its preferred replica"
    );
    let snap = s.snapshot(Millis(500));
    assert_eq!(
        (snap.queued_interactive, snap.queued_batch, snap.running),
        (0, 0, 5000)
    );
    assert_eq!(s.next_wakeup(Millis(500)), None);
}

#[test]
fn requests_spread_over_replicas_by_free_slots() {
    let mut s = sched(&[Some(2), Some(4), None]);
    let at: Vec<usize> = (0..6)
        .map(|id| dispatched(offer(&mut s, ticket(id, 1, 0))).replica)
        .collect();
    // The unbounded replica always has the most room; among bounded ones, the emptiest.
    assert_eq!(at, vec![2; 6]);
    let mut s = sched(&[Some(2), Some(4)]);
    let at: Vec<usize> = (0..6)
        .map(|id| dispatched(offer(&mut s, ticket(id, 1, 0))).replica)
        .collect();
    assert_eq!(at, vec![1, 1, 0, 1, 0, 1]);
}

#[test]
fn no_usable_replica_and_duplicate_ids_are_refused() {
    let mut s = sched(&[Some(1), Some(1)]);
    assert_eq!(
        offer(&mut s, ticket(1, 1, 0).exclude(vec![0, 1])),
        Verdict::Refused(Refusal::NoReplica)
    );
    let d = dispatched(offer(&mut s, ticket(2, 1, 0).exclude(vec![0])));
    assert_eq!(d.replica, 1);
    assert_eq!(
        offer(&mut s, ticket(2, 1, 1)),
        Verdict::Refused(Refusal::Duplicate)
    );
    // A retry barred from the busy replica 1 waits only for replica 0.
    dispatched(offer(&mut s, ticket(3, 1, 2)));
    assert_eq!(
        offer(&mut s, ticket(4, 1, 3).exclude(vec![0])),
        Verdict::Queued
    );
    assert_eq!(offer(&mut s, ticket(5, 1, 4)), Verdict::Queued);
    assert_eq!(
        ids(&release(&mut s, 3, 5)),
        vec![5],
        "4 cannot use replica 0"
    );
    assert_eq!(ids(&release(&mut s, 2, 6)), vec![4]);
    s.set_available(0, false, Millis(7));
    s.set_available(1, false, Millis(7));
    assert_eq!(
        offer(&mut s, ticket(6, 1, 8)),
        Verdict::Refused(Refusal::NoReplica)
    );
}

#[test]
fn a_batch_age_limit_at_or_above_the_timeout_is_refused() {
    let config = SchedulerConfig {
        batch_age_limit: Millis(60_000),
        ..SchedulerConfig::default()
    };
    assert_eq!(
        Scheduler::new(config, &[]).err(),
        Some(ConfigProblem::BatchAgeNotBelowTimeout)
    );
    assert!(SchedulerConfig::default().check().is_ok());
}

/// Where the property run believes a live request is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Queued,
    Running(usize),
}

/// What the property run knows: live requests only (a request leaves when released, refused
/// or expired), every ticket, each tenant's last start per class, and how often each path ran
/// (immediate starts, queued starts, timeouts, refusals, starts on a held slot, starts in an
/// engine's own queue).
#[derive(Default)]
struct World {
    live: BTreeMap<u64, Fate>,
    tickets: HashMap<u64, Ticket>,
    last_start: HashMap<(i64, Priority), u64>,
    counts: [usize; 6],
}

impl World {
    fn started(&mut self, s: &Scheduler, d: Dispatch) {
        let t = &self.tickets[&d.id.0];
        assert!(!t.exclude.contains(&d.replica), "{d:?} excluded");
        assert!(
            s.replicas[d.replica].available,
            "{d:?} on a replica that is down"
        );
        if !matches!(d.placement, Placement::Returned | Placement::EngineQueue) {
            assert_eq!(
                d.placement == Placement::Preferred,
                t.preferred == Some(d.replica)
            );
            assert_eq!(d.placement == Placement::Balanced, t.preferred.is_none());
        }
        // A tenant's requests with no preference and no exclusions start in arrival order
        // within their class (promoted batch requests change class; they are left out).
        if t.preferred.is_none() && t.exclude.is_empty() && !d.promoted {
            if let Some(prev) = self.last_start.insert((t.tenant.0, t.priority), d.id.0) {
                assert!(
                    prev < d.id.0,
                    "{:?}: {prev} started after {}",
                    t.tenant,
                    d.id.0
                );
            }
        }
        match d.placement {
            Placement::Returned => self.counts[4] += 1,
            Placement::EngineQueue => self.counts[5] += 1,
            _ => {}
        }
        self.live.insert(d.id.0, Fate::Running(d.replica));
    }

    fn apply(&mut self, s: &Scheduler, effects: Effects) {
        for d in effects.dispatched {
            assert_eq!(self.live.get(&d.id.0), Some(&Fate::Queued), "{d:?}");
            self.started(s, d);
            self.counts[1] += 1;
        }
        for x in effects.expired {
            assert_eq!(self.live.remove(&x.id.0), Some(Fate::Queued));
            assert!(x.waited >= s.config().queue_timeout);
            self.counts[2] += 1;
        }
    }

    /// Occupancy and the queue agree with the fates; the state is settled.
    fn check(&self, s: &Scheduler, now: Millis, slots: &[Option<u32>]) {
        let snap = s.snapshot(now);
        for (i, r) in snap.replicas.iter().enumerate() {
            let running = self.live.values().filter(|f| **f == Fate::Running(i));
            let n = running.count() as u32;
            assert_eq!(r.local, n);
            // One more than the slots: a request sent to wait in the engine's own queue.
            assert!(n <= slots[i].map_or(u32::MAX, |m| m + 1), "replica {i}");
        }
        let queued: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, f)| **f == Fate::Queued)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(snap.queued_interactive + snap.queued_batch, queued.len());
        // Each tenant's presence (what the fair shares and holds count) is a recount of the
        // fates and holds, and a tenant with nothing in the pool is forgotten.
        let mut recount: HashMap<TenantId, (u32, u32, u32)> = HashMap::new();
        for (id, fate) in &self.live {
            let e = recount.entry(self.tickets[id].tenant).or_default();
            match fate {
                Fate::Queued => e.0 += 1,
                Fate::Running(_) => e.1 += 1,
            }
        }
        for h in &s.holds {
            recount.entry(h.tenant).or_default().2 += 1;
        }
        let presence: HashMap<TenantId, (u32, u32, u32)> = s
            .per_tenant
            .iter()
            .map(|(t, p)| (*t, (p.queued, p.running, p.held)))
            .collect();
        assert_eq!(presence, recount);
        let c = s.config();
        assert!(queued.len() <= c.max_queued as usize);
        // Settled: nothing waiting may use a free slot, nothing waits past its timeout.
        assert!(s.pick(now, &s.rooms(now)).is_none());
        for id in &queued {
            assert!(now.since(self.tickets[id].arrived) < c.queue_timeout);
        }
        if let Some(w) = s.next_wakeup(now) {
            assert!(w > now, "a wakeup in the past");
        }
    }
}

/// Random operations against the invariants: each request has one fate at a time and ends
/// once; no replica runs more than its slots; nothing waits past its timeout; after every
/// call no waiting request may use a free slot; dispatches respect exclusions, availability
/// and preferences; a tenant's unrestricted requests of one class start in arrival order.
#[test]
fn random_operations_keep_the_invariants() {
    let config = SchedulerConfig {
        queue_timeout: Millis(3000),
        batch_age_limit: Millis(1000),
        tenant_queue_cap: 20,
        max_queued: 60,
        // Long enough that a tenant's next request often comes back to its held slot.
        return_hold: Millis(100),
        ..SchedulerConfig::default()
    };
    let slots = [Some(2), Some(3), Some(1)];
    let mut totals = [0usize; 6];
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut s = sched_with(config, &slots);
        let mut w = World::default();
        let mut now = 0u64;
        for step in 0..6000u64 {
            now += rng.below(30);
            let at = Millis(now);
            // Alternate overload and light load, so both queueing and immediate starts happen.
            let mut op = rng.below(100);
            if (step / 500) % 2 == 1 && op < 40 && rng.below(4) != 0 {
                op = 80;
            }
            let effects = match op {
                0..=39 => {
                    let t = random_ticket(&mut rng, step, now);
                    w.tickets.insert(step, t.clone());
                    let e = s.enqueue(t, at);
                    // What became due happened before the new ticket's admission.
                    w.apply(&s, e.effects);
                    match e.verdict {
                        Verdict::Dispatched(d) => {
                            w.started(&s, d);
                            w.counts[0] += 1;
                        }
                        Verdict::Queued => {
                            w.live.insert(step, Fate::Queued);
                        }
                        Verdict::Refused(_) => w.counts[3] += 1,
                    }
                    Effects::default()
                }
                // Mostly running requests end; sometimes a waiting client hangs up.
                40..=79 => {
                    let running = rng.below(4) != 0;
                    let pool: Vec<(u64, Fate)> = w
                        .live
                        .iter()
                        .filter(|(_, f)| matches!(f, Fate::Running(_)) == running)
                        .map(|(id, f)| (*id, *f))
                        .collect();
                    if pool.is_empty() {
                        continue;
                    }
                    let (id, fate) = pool[rng.below(pool.len() as u64) as usize];
                    let r = s.release(RequestId(id), at);
                    let expected = match fate {
                        Fate::Queued => Stage::Queued,
                        Fate::Running(replica) => Stage::Running { replica },
                    };
                    assert_eq!(r.was, Some(expected), "seed {seed} step {step}");
                    w.live.remove(&id);
                    r.effects
                }
                80..=89 => s.tick(at),
                90..=93 => {
                    let load = engine(rng.below(4) as u32, rng.below(3) as u32);
                    s.set_reported_load(rng.below(3) as usize, load, at)
                }
                94..=96 => {
                    let up = rng.below(3) != 0;
                    s.set_available(rng.below(3) as usize, up, at)
                }
                _ => {
                    let count = 1 + rng.below(3) as u32;
                    let ordinal = rng.below(u64::from(count)) as u32;
                    s.set_gateways(Gateways { count, ordinal }, at)
                }
            };
            w.apply(&s, effects);
            w.check(&s, at, &slots);
        }
        for (total, c) in totals.iter_mut().zip(w.counts) {
            *total += c;
        }
    }
    // Every path was taken: immediate and queued starts, timeouts, refusals, held slots taken,
    // engine queues (timeouts are the rarest: several gateways' guaranteed shares start more at once).
    assert!(totals.iter().all(|&c| c > 20), "{totals:?}");
}

fn random_ticket(rng: &mut Rng, id: u64, now: u64) -> Ticket {
    let mut t = ticket(id, rng.below(5) as i64, now)
        .tokens(1 + rng.below(2000), rng.below(500))
        .weight(nz(1 + rng.below(4) as u32));
    if rng.below(4) == 0 {
        t = t.priority(Priority::Batch);
    }
    if rng.below(3) == 0 {
        // Replica 3 does not exist: a stale preference is ignored.
        t = t.prefer(rng.below(4) as usize);
    }
    if rng.below(10) == 0 {
        t = t.exclude(vec![rng.below(3) as usize]);
    }
    t
}

/// Four slots: tenant 1 runs three requests with five more waiting, tenant 2 runs one (id 100).
fn a_backlog_and_a_light_tenant(config: SchedulerConfig) -> Scheduler {
    let mut s = sched_with(config, &[Some(4)]);
    for id in 1..=3 {
        dispatched(offer(&mut s, ticket(id, 1, 0)));
    }
    dispatched(offer(&mut s, ticket(100, 2, 0)));
    for id in 4..=8 {
        assert_eq!(offer(&mut s, ticket(id, 1, 0)), Verdict::Queued);
    }
    s
}

#[test]
fn a_slot_freed_by_a_tenant_below_its_share_is_held_for_its_next_request() {
    let mut s = a_backlog_and_a_light_tenant(SchedulerConfig::default());
    // Tenant 2's request ends while tenant 1 waits: its slot is kept, not given away...
    assert!(release(&mut s, 100, 1000).dispatched.is_empty());
    assert_eq!(s.next_wakeup(Millis(1000)), Some(Millis(1020)));
    // ...and its next request, a few milliseconds later, starts at once.
    let d = dispatched(offer(&mut s, ticket(101, 2, 1005)));
    assert_eq!(
        (d.replica, d.waited, d.placement),
        (0, Millis(0), Placement::Returned)
    );
    // A slot tenant 1 frees goes to tenant 1's queue at once: it is above its share.
    assert_eq!(ids(&release(&mut s, 1, 1010)), vec![4]);
}

#[test]
fn a_held_slot_goes_to_the_queue_when_its_tenant_does_not_come_back() {
    let mut s = a_backlog_and_a_light_tenant(SchedulerConfig::default());
    assert!(release(&mut s, 100, 1000).dispatched.is_empty());
    assert!(s.tick(Millis(1019)).is_empty());
    assert_eq!(ids(&s.tick(Millis(1020))), vec![4]);
    // Too late: tenant 2's request now waits its turn like any other.
    assert_eq!(offer(&mut s, ticket(101, 2, 1025)), Verdict::Queued);
}

#[test]
fn nothing_is_held_without_a_queue_when_disabled_or_for_a_tenant_with_requests_waiting() {
    // Nobody waits: the slot is simply free, for anyone.
    let mut s = sched(&[Some(2)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    dispatched(offer(&mut s, ticket(100, 2, 0)));
    assert!(release(&mut s, 100, 10).dispatched.is_empty());
    dispatched(offer(&mut s, ticket(2, 1, 11)));
    // `return_hold = 0`: the freed slot goes to the queue at once.
    let off = SchedulerConfig {
        return_hold: Millis::ZERO,
        ..SchedulerConfig::default()
    };
    let mut s = a_backlog_and_a_light_tenant(off);
    assert_eq!(ids(&release(&mut s, 100, 1000)), vec![4]);
    // A tenant with a request of its own waiting is served by the fair queue instead.
    let mut s = a_backlog_and_a_light_tenant(SchedulerConfig::default());
    assert_eq!(offer(&mut s, ticket(101, 2, 500)), Verdict::Queued);
    assert_eq!(release(&mut s, 100, 1000).dispatched.len(), 1);
    // A batch request's end holds nothing.
    let mut s = sched(&[Some(2)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    dispatched(offer(&mut s, ticket(100, 2, 0).priority(Priority::Batch)));
    assert_eq!(offer(&mut s, ticket(2, 1, 0)), Verdict::Queued);
    assert_eq!(ids(&release(&mut s, 100, 10)), vec![2]);
}

#[test]
fn a_tenant_holds_no_more_than_its_fair_share() {
    // Eight slots, tenants of weight 1 (a share of four each): tenant 2 runs five, tenant 1
    // runs three with eight waiting.
    let mut s = sched(&[Some(8)]);
    for id in 100..105 {
        dispatched(offer(&mut s, ticket(id, 2, 0)));
    }
    for id in 1..=3 {
        dispatched(offer(&mut s, ticket(id, 1, 0)));
    }
    for id in 4..=11 {
        assert_eq!(offer(&mut s, ticket(id, 1, 0)), Verdict::Queued);
    }
    // Above its share, tenant 2's first end goes to the queue; at its share, the next is held.
    assert_eq!(ids(&release(&mut s, 100, 10)), vec![4]);
    assert!(release(&mut s, 101, 11).dispatched.is_empty());
    // Weight 3 against 1 makes its share six of the eight slots.
    let mut s = sched(&[Some(8)]);
    let heavy = |id| ticket(id, 2, 0).weight(nz(3));
    for id in 100..107 {
        dispatched(offer(&mut s, heavy(id)));
    }
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    for id in 2..=5 {
        assert_eq!(offer(&mut s, ticket(id, 1, 0)), Verdict::Queued);
    }
    assert_eq!(ids(&release(&mut s, 100, 10)), vec![2]);
    assert!(release(&mut s, 101, 11).dispatched.is_empty());
}

#[test]
fn a_tenant_below_its_share_may_wait_at_the_head_of_a_full_engines_queue() {
    // One of two gateways in front of an 8-slot engine: it runs tenant 1's four, with more of
    // tenant 1's waiting; the engine reports itself full, its own queue empty.
    let mut s = sched(&[Some(8)]);
    assert!(s
        .set_gateways(
            Gateways {
                count: 2,
                ordinal: 1
            },
            Millis(0)
        )
        .is_empty());
    for id in 1..=4 {
        dispatched(offer(&mut s, ticket(id, 1, 0)));
    }
    let full = engine(8, 0);
    assert!(s.set_reported_load(0, full, Millis(1)).is_empty());
    assert_eq!(offer(&mut s, ticket(5, 1, 2)), Verdict::Queued);
    // Tenant 2, below its share, goes on to the engine (a slot another gateway holds for
    // someone, or the first to free anywhere)...
    let d = dispatched(offer(&mut s, ticket(100, 2, 3)));
    assert_eq!(d.placement, Placement::EngineQueue);
    // ...one at a time: the engine now looks over-full.
    assert_eq!(offer(&mut s, ticket(101, 3, 4)), Verdict::Queued);
    // Not while the engine queues on its own, nor for a tenant above its share.
    let waiting = engine(8, 1);
    assert!(s.set_reported_load(0, waiting, Millis(5)).is_empty());
    assert_eq!(offer(&mut s, ticket(102, 4, 6)), Verdict::Queued);
    assert!(s.set_reported_load(0, full, Millis(7)).is_empty());
    assert_eq!(offer(&mut s, ticket(6, 1, 8)), Verdict::Queued);
    // A gateway alone keeps such a request in its own queue, to start at the next free slot.
    let mut s = sched(&[Some(2)]);
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    dispatched(offer(&mut s, ticket(2, 1, 0)));
    assert!(s.set_reported_load(0, full, Millis(1)).is_empty());
    assert_eq!(offer(&mut s, ticket(100, 2, 1)), Verdict::Queued);
    // Without a fresh report the engine's queue is unknown: nothing goes beyond the share.
    let mut s = sched(&[Some(4)]);
    assert!(s
        .set_gateways(
            Gateways {
                count: 2,
                ordinal: 0
            },
            Millis(0)
        )
        .is_empty());
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    dispatched(offer(&mut s, ticket(2, 1, 0)));
    assert_eq!(offer(&mut s, ticket(100, 2, 1)), Verdict::Queued);
}

#[test]
fn with_several_gateways_a_lapsed_hold_keeps_its_slot_from_the_backlog_until_the_engine_says() {
    // One of two gateways, on a 4-slot engine that reports itself: tenant 1 runs one request
    // here with three waiting, tenant 2 one; the other gateway runs the other two.
    let mut s = sched(&[Some(4)]);
    let two = Gateways {
        count: 2,
        ordinal: 0,
    };
    assert!(s.set_gateways(two, Millis(0)).is_empty());
    dispatched(offer(&mut s, ticket(1, 1, 0)));
    dispatched(offer(&mut s, ticket(100, 2, 0)));
    let full = engine(4, 0);
    assert!(s.set_reported_load(0, full, Millis(1)).is_empty());
    for id in 2..=4 {
        assert_eq!(offer(&mut s, ticket(id, 1, 2)), Verdict::Queued);
    }
    // Tenant 2's request ends; its slot is held, and the hold lapses: tenant 2 may have come
    // back through the other gateway and taken the slot, so the backlog does not get it...
    assert!(release(&mut s, 100, 10).dispatched.is_empty());
    assert!(s.tick(Millis(30)).is_empty());
    // ...even when the engine reports itself full again (this gateway below its share).
    assert!(s.set_reported_load(0, full, Millis(200)).is_empty());
    // Tenant 2 comes back here: the slot is this gateway's again, and its request goes first.
    let d = dispatched(offer(&mut s, ticket(101, 2, 300)));
    assert_eq!(d.tenant, TenantId(2));
    // Had it not come back, a report with room gives the slot to the backlog.
    let mut s2 = sched(&[Some(4)]);
    assert!(s2.set_gateways(two, Millis(0)).is_empty());
    dispatched(offer(&mut s2, ticket(1, 1, 0)));
    dispatched(offer(&mut s2, ticket(100, 2, 0)));
    assert!(s2.set_reported_load(0, full, Millis(1)).is_empty());
    for id in 2..=4 {
        assert_eq!(offer(&mut s2, ticket(id, 1, 2)), Verdict::Queued);
    }
    assert!(release(&mut s2, 100, 10).dispatched.is_empty());
    assert!(s2.tick(Millis(30)).is_empty());
    let room = engine(3, 0);
    // Two reports in a row: one alone may have caught the slot in the instant between the
    // tenant's requests through the other gateway.
    assert!(s2.set_reported_load(0, room, Millis(200)).is_empty());
    assert_eq!(ids(&s2.set_reported_load(0, room, Millis(400))), vec![2]);
}
