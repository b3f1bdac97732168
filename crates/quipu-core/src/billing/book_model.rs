//! Every interleaving of a few concurrent requests, the ledger writer, heartbeats, idle
//! returns, recalls and account reads against a model of the store, explored exhaustively
//! (depth-first, each distinct state once), with the [`super::book`] invariants checked in
//! every state reached:
//!
//! - the store never leases more than the balance, and no replica has reserved or billed
//!   more than the store leases it (so no write can overdraw the balance);
//! - a refusal for balance means this replica took all the store had unleased and still
//!   could not fit the request (with one replica: the balance minus what is reserved or not
//!   yet written does not cover it);
//! - an account read is never below zero, and exact when nothing moved under it;
//! - at rest, each book agrees with the store to the pico-sol, and the balance is the top-up
//!   minus every billed charge.
//!
//! The store model applies each call atomically, as one transaction does; a call's answer is a
//! separate step, so any other step may come between a commit and its answer.

use super::book::{
    account_view, Book, GrantReply, LeaseAsk, Pending, Reading, Refusal, Step, Timing,
};
use crate::money::Pen;
use std::collections::HashSet;

const NOW: u64 = 100;
const TIMING: Timing = Timing {
    fence: 1_000_000,
    dry_memory: 1_000_000,
    failure_memory: 1_000_000,
    doubt_settle: 10,
};

fn pen(c: i64) -> Pen {
    Pen::from_centimos(c)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Row {
    amount: Pen,
    spent: Pen,
    version: i64,
}

impl Row {
    fn reading(&self) -> Reading {
        Reading {
            amount: self.amount,
            spent: self.spent,
            version: self.version,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Ready,
    /// Its grant is in flight; `Some` once the store ran it.
    Asking(LeaseAsk, Option<GrantReply>),
    Waiting,
    Recalling,
    Running,
    Done,
    Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Request {
    replica: usize,
    charge: Pen,
    pending: Pending,
    phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Call<T> {
    Idle,
    Sent,
    Answered(T),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Replica {
    book: Book,
    /// Billed here, not yet taken by the writer.
    unwritten: Vec<Pen>,
    /// Taken by the writer: its rows, and the store's answer once committed.
    writing: Option<(Vec<Pen>, Option<Option<Reading>>)>,
    heartbeat: Call<Option<Reading>>,
    heartbeats_left: u8,
    release: Option<(Pen, Option<Option<Reading>>)>,
    idle_returns_left: u8,
    /// Another replica asked it to return what it holds free.
    recall_asked: bool,
    /// An account read: the store's snapshot, once taken.
    view: Call<(Pen, Option<Reading>)>,
    views_left: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    balance: Pen,
    rows: Vec<Option<Row>>,
    replicas: Vec<Replica>,
    requests: Vec<Request>,
    billed: Pen,
}

struct Config {
    balance: i64,
    chunk: i64,
    /// (replica, reservation, charge) in céntimos.
    requests: Vec<(usize, i64, i64)>,
    replicas: usize,
    heartbeats: u8,
    idle_returns: u8,
    views: u8,
}

impl World {
    fn new(c: &Config) -> World {
        World {
            balance: pen(c.balance),
            rows: vec![None; c.replicas],
            replicas: (0..c.replicas)
                .map(|_| Replica {
                    book: Book::default(),
                    unwritten: Vec::new(),
                    writing: None,
                    heartbeat: Call::Idle,
                    heartbeats_left: c.heartbeats,
                    release: None,
                    idle_returns_left: c.idle_returns,
                    recall_asked: false,
                    view: Call::Idle,
                    views_left: c.views,
                })
                .collect(),
            requests: c
                .requests
                .iter()
                .map(|&(replica, reserve, charge)| Request {
                    replica,
                    charge: pen(charge),
                    pending: Pending::new(pen(reserve)),
                    phase: Phase::Ready,
                })
                .collect(),
            billed: Pen::ZERO,
        }
    }

    fn leased(&self) -> Pen {
        self.rows.iter().flatten().map(|r| r.amount).sum()
    }

    /// Charges billed on replica `r` that are not in the store yet.
    fn unrecorded(&self, r: usize) -> Pen {
        let rep = &self.replicas[r];
        let writing: Pen = rep
            .writing
            .as_ref()
            .filter(|(_, done)| done.is_none())
            .map_or(Pen::ZERO, |(rows, _)| rows.iter().copied().sum());
        rep.unwritten.iter().copied().sum::<Pen>() + writing
    }

    fn reserved(&self, r: usize) -> Pen {
        self.replicas[r].book.held().reserved
    }

    fn amount(&self, r: usize) -> Pen {
        self.rows[r].map_or(Pen::ZERO, |row| row.amount)
    }

    fn bump(&mut self, r: usize, f: impl FnOnce(&mut Row)) -> Reading {
        let row = self.rows[r].get_or_insert(Row {
            amount: Pen::ZERO,
            spent: Pen::ZERO,
            version: 0,
        });
        f(row);
        row.version += 1;
        row.reading()
    }

    /// Every state one step away.
    fn successors(&self, chunk: Pen) -> Vec<World> {
        let mut out = Vec::new();
        for i in 0..self.requests.len() {
            if let Some(w) = self.step_request(i, chunk) {
                out.push(w);
            }
        }
        for r in 0..self.replicas.len() {
            out.extend(self.step_replica(r));
        }
        out
    }

    fn step_request(&self, i: usize, chunk: Pen) -> Option<World> {
        let mut w = self.clone();
        let req = w.requests[i].clone();
        let r = req.replica;
        match req.phase {
            Phase::Ready => {
                let mut pending = req.pending;
                let step = w.replicas[r].book.admit(&mut pending, chunk, &TIMING, NOW);
                w.requests[i].pending = pending;
                w.requests[i].phase = match step {
                    Step::Admit => Phase::Running,
                    Step::Ask(ask) => Phase::Asking(ask, None),
                    Step::Wait => Phase::Waiting,
                    Step::Recall => {
                        for (o, rep) in w.replicas.iter_mut().enumerate() {
                            rep.recall_asked |= o != r;
                        }
                        Phase::Recalling
                    }
                    Step::Refuse(refusal) => {
                        self.check_refusal(r, pending.amount, refusal);
                        Phase::Refused
                    }
                };
            }
            Phase::Asking(ask, None) => {
                let unleased = w.balance - w.leased();
                let granted = ask.grant(unleased);
                let elsewhere = w.leased() - w.amount(r);
                let reading = w.bump(r, |row| row.amount += granted);
                w.requests[i].phase = Phase::Asking(
                    ask,
                    Some(GrantReply {
                        reading,
                        granted,
                        elsewhere,
                    }),
                );
            }
            Phase::Asking(ask, Some(reply)) => {
                w.replicas[r].book.granted(NOW, &Ok(reply), NOW);
                w.requests[i].pending.granted(ask, &reply);
                w.requests[i].phase = Phase::Ready;
            }
            Phase::Waiting => {
                let busy = w
                    .requests
                    .iter()
                    .any(|q| q.replica == r && matches!(q.phase, Phase::Asking(..)))
                    || w.replicas[r].release.is_some();
                if busy {
                    return None;
                }
                w.requests[i].phase = Phase::Ready;
            }
            Phase::Recalling => {
                let asked_pending = w
                    .replicas
                    .iter()
                    .enumerate()
                    .any(|(o, rep)| o != r && (rep.recall_asked || rep.release.is_some()));
                if asked_pending {
                    return None;
                }
                // Every other replica answered: ask the store once more, then decide.
                let mut pending = req.pending;
                pending.money_returned();
                pending.recall_over();
                w.requests[i].pending = pending;
                w.requests[i].phase = Phase::Ready;
            }
            Phase::Running => {
                let reserved = req.pending.amount;
                let billed = w.replicas[r].book.settle(reserved, req.charge);
                w.billed += billed;
                w.replicas[r].unwritten.push(billed);
                w.requests[i].phase = Phase::Done;
            }
            Phase::Done | Phase::Refused => return None,
        }
        Some(w)
    }

    fn step_replica(&self, r: usize) -> Vec<World> {
        let mut out = Vec::new();
        let rep = &self.replicas[r];
        // The ledger writer: take, commit, answer.
        match &rep.writing {
            None if !rep.unwritten.is_empty() => {
                let mut w = self.clone();
                let rows = std::mem::take(&mut w.replicas[r].unwritten);
                w.replicas[r].writing = Some((rows, None));
                out.push(w);
            }
            Some((rows, None)) => {
                let mut w = self.clone();
                let total: Pen = rows.iter().copied().sum();
                w.balance -= total;
                let reading = w.rows[r].is_some().then(|| {
                    w.bump(r, |row| {
                        row.amount = (row.amount - total).max(Pen::ZERO);
                        row.spent += total;
                    })
                });
                w.replicas[r].writing = Some((rows.clone(), Some(reading)));
                out.push(w);
            }
            Some((_, Some(reading))) => {
                let mut w = self.clone();
                w.replicas[r].book.apply(*reading, NOW, NOW);
                w.replicas[r].writing = None;
                out.push(w);
            }
            None => {}
        }
        // Heartbeats.
        match &rep.heartbeat {
            Call::Idle if rep.heartbeats_left > 0 => {
                let mut w = self.clone();
                w.replicas[r].heartbeat = Call::Sent;
                w.replicas[r].heartbeats_left -= 1;
                out.push(w);
            }
            Call::Sent => {
                let mut w = self.clone();
                w.replicas[r].heartbeat = Call::Answered(w.rows[r].map(|row| row.reading()));
                out.push(w);
            }
            Call::Answered(reading) => {
                let mut w = self.clone();
                w.replicas[r].book.heartbeat(*reading, NOW, NOW);
                w.replicas[r].heartbeat = Call::Idle;
                out.push(w);
            }
            Call::Idle => {}
        }
        // Releases: an idle return, or a recall's answer; then the store, then the answer.
        match &rep.release {
            None => {
                if rep.idle_returns_left > 0 {
                    let mut w = self.clone();
                    w.replicas[r].idle_returns_left -= 1;
                    if let Some(amount) = w.replicas[r].book.release_idle(0, NOW) {
                        w.replicas[r].release = Some((amount, None));
                        out.push(w);
                    }
                }
                if rep.recall_asked {
                    let mut w = self.clone();
                    w.replicas[r].recall_asked = false;
                    if let Some(amount) = w.replicas[r].book.release_free() {
                        w.replicas[r].release = Some((amount, None));
                    }
                    out.push(w);
                }
            }
            Some((amount, None)) => {
                let mut w = self.clone();
                let reading = w.rows[r]
                    .is_some()
                    .then(|| w.bump(r, |row| row.amount = (row.amount - *amount).max(Pen::ZERO)));
                // The others hear that money came home.
                for (o, other) in w.replicas.iter_mut().enumerate() {
                    if o != r {
                        other.book.money_arrived();
                    }
                }
                w.replicas[r].release = Some((*amount, Some(reading)));
                out.push(w);
            }
            Some((amount, Some(reading))) => {
                let mut w = self.clone();
                w.replicas[r]
                    .book
                    .released(*amount, NOW, Ok(*reading), &TIMING, NOW);
                w.replicas[r].release = None;
                out.push(w);
            }
        }
        // Account reads: the store's snapshot, then this replica's book.
        match &rep.view {
            Call::Idle if rep.views_left > 0 => {
                let mut w = self.clone();
                w.replicas[r].views_left -= 1;
                w.replicas[r].view = Call::Sent;
                out.push(w);
            }
            Call::Sent => {
                let mut w = self.clone();
                w.replicas[r].view = Call::Answered((w.balance, w.rows[r].map(|x| x.reading())));
                out.push(w);
            }
            Call::Answered((balance, snapshot)) => {
                let mut w = self.clone();
                let view = account_view(*balance, *snapshot, &w.replicas[r].book.held());
                assert!(
                    view.available >= Pen::ZERO,
                    "an account read below zero: {view:?}\n{self:#?}"
                );
                if self.replicas.len() == 1 {
                    // Whatever was written between the snapshot and now, the read is exact.
                    let truth = self.balance - self.unrecorded(r) - self.reserved(r);
                    assert_eq!(view.available, truth, "{self:#?}");
                }
                w.replicas[r].view = Call::Idle;
                out.push(w);
            }
            Call::Idle => {}
        }
        out
    }

    fn check_refusal(&self, r: usize, amount: Pen, refusal: Refusal) {
        let Refusal::Insufficient { available, .. } = refusal else {
            panic!("refused for {refusal:?} with no store failure in the model");
        };
        let unleased = self.balance - self.leased();
        let own_free = self.amount(r) - self.reserved(r) - self.unrecorded(r);
        assert!(
            unleased + own_free < amount,
            "refused {amount:?} (saying {available:?} available) while the store had {unleased:?} unleased and this replica {own_free:?} free:\n{self:#?}"
        );
        assert!(
            available <= own_free.max(Pen::ZERO),
            "the refusal overstates what is available"
        );
        if self.replicas.len() == 1 {
            let truth = self.balance - self.unrecorded(r) - self.reserved(r);
            assert!(
                truth < amount,
                "refused while the balance covered it: {self:#?}"
            );
        }
    }

    fn check(&self) {
        assert!(
            self.leased() <= self.balance,
            "leases beyond the balance: {self:#?}"
        );
        for r in 0..self.replicas.len() {
            let at_risk = self.reserved(r) + self.unrecorded(r);
            assert!(
                at_risk <= self.amount(r),
                "replica {r} holds {at_risk:?} reserved or unwritten against a lease of {:?}:\n{self:#?}",
                self.amount(r)
            );
            let rep = &self.replicas[r];
            let asking = self
                .requests
                .iter()
                .any(|q| q.replica == r && matches!(q.phase, Phase::Asking(..)));
            let quiet = !asking
                && rep.unwritten.is_empty()
                && rep.writing.is_none()
                && rep.release.is_none()
                && !matches!(rep.heartbeat, Call::Answered(_))
                && !matches!(rep.heartbeat, Call::Sent);
            if quiet {
                let held = rep.book.held();
                assert_eq!(held.lease, self.amount(r), "replica {r} at rest: {self:#?}");
                assert_eq!(held.unrecorded, Pen::ZERO, "replica {r} at rest: {self:#?}");
            }
        }
    }

    fn finished(&self) -> bool {
        self.requests
            .iter()
            .all(|q| matches!(q.phase, Phase::Done | Phase::Refused))
            && self
                .replicas
                .iter()
                .all(|rep| rep.unwritten.is_empty() && rep.writing.is_none())
    }
}

/// Explores every state reachable from `c`; returns how many there were.
fn explore(c: &Config, top_up: i64) -> usize {
    let chunk = pen(c.chunk);
    let start = World::new(c);
    let mut seen = HashSet::new();
    let mut stack = vec![start];
    let mut ends = 0usize;
    while let Some(w) = stack.pop() {
        if !seen.insert(w.clone()) {
            continue;
        }
        assert!(
            seen.len() < 3_000_000,
            "the state space does not end: {w:#?}"
        );
        w.check();
        let next = w.successors(chunk);
        if next.is_empty() {
            assert!(w.finished(), "stuck: {w:#?}");
        }
        if w.finished() {
            ends += 1;
            assert_eq!(
                w.balance,
                pen(top_up) - w.billed,
                "the balance is the top-up minus every charge"
            );
            assert!(w.balance >= Pen::ZERO, "overdrawn: {w:#?}");
        }
        stack.extend(next);
    }
    assert!(ends > 0);
    seen.len()
}

/// Random interleavings from `c`, `runs` of them (a seeded generator: the same every run),
/// for configurations too large to explore whole.
fn walk(c: &Config, top_up: i64, runs: u32) {
    let chunk = pen(c.chunk);
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    for _ in 0..runs {
        let mut w = World::new(c);
        for _ in 0..10_000 {
            w.check();
            let mut options = w.successors(chunk);
            if options.is_empty() {
                break;
            }
            let pick = next(options.len());
            w = options.swap_remove(pick);
        }
        assert!(w.finished(), "stuck or endless: {w:#?}");
        assert_eq!(w.balance, pen(top_up) - w.billed);
        assert!(w.balance >= Pen::ZERO, "overdrawn: {w:#?}");
    }
}

#[test]
fn one_replica_three_requests_every_interleaving() {
    // Each reserves S/ 0.40 and costs S/ 0.30; the balance pays for three charges but not
    // three reservations at once; the chunk makes each grant cover about one request.
    let c = Config {
        balance: 100,
        chunk: 40,
        requests: vec![(0, 40, 30), (0, 40, 30), (0, 40, 30)],
        replicas: 1,
        heartbeats: 1,
        idle_returns: 1,
        views: 1,
    };
    let states = explore(&c, 100);
    eprintln!("{states} states");
    assert!(states > 1_000, "{states} states");
}

#[test]
fn one_replica_tight_balance_and_charges_below_reservations() {
    // Two reservations fit, a third only once a charge lands below its reservation.
    let c = Config {
        balance: 90,
        chunk: 10,
        requests: vec![(0, 40, 25), (0, 40, 40), (0, 40, 10)],
        replicas: 1,
        heartbeats: 1,
        idle_returns: 1,
        views: 1,
    };
    let states = explore(&c, 90);
    eprintln!("{states} states");
}

#[test]
fn two_replicas_recall_and_never_overdraw() {
    // The chunk lets one replica take more than it needs, so the other must call it home.
    let c = Config {
        balance: 100,
        chunk: 60,
        requests: vec![(0, 40, 30), (0, 40, 40), (1, 40, 20), (1, 40, 40)],
        replicas: 2,
        heartbeats: 2,
        idle_returns: 2,
        views: 2,
    };
    walk(&c, 100, 30_000);
}

#[test]
fn two_replicas_small_every_interleaving() {
    let c = Config {
        balance: 80,
        chunk: 60,
        requests: vec![(0, 40, 30), (1, 40, 40)],
        replicas: 2,
        heartbeats: 1,
        idle_returns: 1,
        views: 1,
    };
    let states = explore(&c, 80);
    eprintln!("{states} states");
}
