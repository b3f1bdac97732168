//! How many more requests one replica may take now: its slots, the requests this gateway runs
//! there, and the load the engine itself reports.
//!
//! The rule, per replica (`cap` is `max_concurrency`, else the slot count the engine reports,
//! e.g. the length of llama.cpp's `/slots`):
//!
//! - **No cap and no fresh report**: unbounded, today's behaviour; nothing ever waits.
//! - **A fresh engine report** (`running`, `waiting` read at time `t`, younger than
//!   `report_ttl`): the engine's gauges are the truth shared by every gateway replica in front
//!   of it, so the full `cap` applies. The engine's load now is estimated as
//!   `running + waiting + added − removed`, where `added` counts this gateway's dispatches
//!   there since `t` (not in the report yet) and `removed` this gateway's requests there that
//!   ended since `t` and were dispatched before it (in the report, gone now). In use is
//!   `max(local in-flight, that estimate)`; free is `cap + allowance − in use`. Independently,
//!   while the engine's own queue (`waiting − removed`) is longer than the allowance, nothing
//!   is dispatched there: the engine queues for a reason of its own (a full KV cache, say).
//!   Without a cap, that queue rule alone gates: dispatch while the engine's queue is empty.
//!   Other gateways' dispatches and releases show up at the next report; until then a replica
//!   may get a few more requests than it has slots (they wait in the engine briefly, and the
//!   next report stops everyone), or fewer (a slot idles until the report).
//!   **Room is believed once two reports in a row show it**: the estimate is the larger of the
//!   latest report's and the one before it (each with this gateway's own changes since it, so
//!   only other gateways' releases wait for the second report). A single report can catch a
//!   slot free for a millisecond: between a sequence's end and its replacement's arrival
//!   (ends cluster when sequences started together), or while another gateway holds it for a
//!   returning tenant. Taken on one report's word, that slot goes to this gateway's backlog and
//!   the request it was meant for waits a whole sequence in the engine's queue — measured with
//!   two gateways, once or twice a minute, 0.13–0.77 s. The price: room another gateway leaves
//!   is taken one report later.
//!   With several gateways, each is also **guaranteed its share** of `cap` (below): a gateway
//!   running fewer than its share may dispatch up to it even when the report says the engine
//!   is full. Without it, the gateway that holds the slots would starve the others: it sees
//!   its own requests end at once and refills their slots, while the others see a slot free
//!   only at the next report, when it is taken again. With the guarantee, the others'
//!   requests wait in the engine's queue for at most one sequence, the report's `waiting`
//!   stops the gateways above their share, and each keeps what it then holds while it has
//!   work: a slot its own request frees is its own to refill. Lapsed holds count as in use
//!   until the next report, and ghosts as this gateway's own for the guarantee (see the
//!   scheduler's `hold` module).
//! - **A cap and no fresh report**: this gateway runs at most its share of `cap`:
//!   `cap / gateways`, the remainder going to the lowest ordinals, so the shares add up to
//!   exactly `cap` — but at least 1, so that no gateway is shut out of a replica with fewer
//!   slots than there are gateways (such a replica may then hold up to `gateways − cap`
//!   requests in its own queue). One gateway gets the whole `cap`.

use super::types::Millis;

/// An engine's own view of its load, as scraped from its metrics: vLLM
/// `vllm:num_requests_running` / `vllm:num_requests_waiting`, SGLang `sglang:num_running_reqs`
/// / `sglang:num_queue_reqs`, llama.cpp `llamacpp:requests_processing` /
/// `llamacpp:requests_deferred` (or `/slots`: processing slots, and the slot count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineLoad {
    pub running: u32,
    pub waiting: u32,
    /// How many sequences the engine runs at once, when it says (llama.cpp's slot count).
    pub slots: Option<u32>,
}

/// The live gateway replicas in front of the same engines, and this one's place among them
/// (0-based, e.g. its rank among the live gateways' ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gateways {
    pub count: u32,
    pub ordinal: u32,
}

impl Gateways {
    /// A gateway alone.
    pub const ONE: Gateways = Gateways {
        count: 1,
        ordinal: 0,
    };
}

/// This gateway's share of `slots`: `slots / count`, plus one for the first `slots % count`
/// ordinals, and never below 1.
pub fn share(slots: u32, gateways: Gateways) -> u32 {
    let n = gateways.count.max(1);
    let k = gateways.ordinal % n;
    (slots / n + u32::from(k < slots % n)).max(1)
}

/// Free room on a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Free {
    Slots(u32),
    Unbounded,
}

impl Free {
    pub fn any(self) -> bool {
        self != Free::Slots(0)
    }
}

/// What bounds a replica now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// No cap, no fresh report: unbounded.
    Unbounded,
    /// The gateway's share of the cap, counted with its own in-flight requests.
    Share,
    /// The engine's fresh report.
    Reported,
}

/// One replica's load as the scheduler sees it now (for decisions and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    pub basis: Basis,
    /// Requests counted against the limit.
    pub in_use: u32,
    /// The most that may be in use (`None`: unbounded).
    pub limit: Option<u32>,
    pub free: Free,
}

/// The last report and this gateway's changes since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub load: EngineLoad,
    pub at: Millis,
    /// This gateway's dispatches there since `at`.
    pub added: u32,
    /// This gateway's requests there, dispatched before `at`, that ended since.
    pub removed: u32,
    /// Holds this gateway let lapse there since `at`: another gateway may have given the slot
    /// to the tenant it was held for, so it counts as in use until the next report says.
    pub lapsed: u32,
}

impl Report {
    /// The engine's load now, as far as this gateway knows: the report, with this gateway's
    /// changes since and its lapsed holds counted in.
    pub fn engine_estimate(&self) -> u32 {
        (self.load.running)
            .saturating_add(self.load.waiting)
            .saturating_add(self.added)
            .saturating_add(self.lapsed)
            .saturating_sub(self.removed)
    }
}

/// The slot state of one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSlots {
    pub max_concurrency: Option<u32>,
    pub available: bool,
    /// Requests this gateway runs there.
    pub local: u32,
    /// The slot count the engine reported last (kept when a report goes stale: it does not
    /// change while the engine runs).
    pub engine_slots: Option<u32>,
    pub report: Option<Report>,
    /// The report before it, kept counting this gateway's changes: room is believed only when
    /// both show it.
    pub previous: Option<Report>,
    /// Slots this gateway held for a tenant that went on through another gateway (a hold
    /// that lapsed while the engine stayed full): counted as this gateway's own for its
    /// guaranteed share, so it does not claim them back from under that tenant.
    pub ghosts: u32,
}

impl ReplicaSlots {
    pub fn new(max_concurrency: Option<u32>) -> ReplicaSlots {
        ReplicaSlots {
            max_concurrency,
            available: true,
            local: 0,
            engine_slots: None,
            report: None,
            previous: None,
            ghosts: 0,
        }
    }

    /// The replica's slots: the configured `max_concurrency`, else what the engine reported.
    pub fn cap(&self) -> Option<u32> {
        self.max_concurrency.or(self.engine_slots)
    }

    /// The report, if it is younger than `ttl` at `now`.
    pub fn fresh_report(&self, now: Millis, ttl: Millis) -> Option<&Report> {
        self.report.as_ref().filter(|r| now.since(r.at) < ttl)
    }

    /// The engine's load now as far as this gateway believes it: the larger of the fresh
    /// report's estimate and the previous report's, when that one is fresh too (`None`: no
    /// fresh report).
    pub fn engine_estimate(&self, now: Millis, ttl: Millis) -> Option<u32> {
        let latest = self.fresh_report(now, ttl)?.engine_estimate();
        let previous = self
            .previous
            .filter(|p| now.since(p.at) < ttl)
            .map_or(0, |p| p.engine_estimate());
        Some(latest.max(previous))
    }

    /// Whether the latest report shows the engine with room, and the one before it did too
    /// (unless that one is older than `ttl` by the latest's time).
    pub fn reports_show_room(&self, ttl: Millis) -> bool {
        let (Some(cap), Some(latest)) = (self.cap(), self.report.as_ref()) else {
            return false;
        };
        let room = |r: &Report| r.load.running.saturating_add(r.load.waiting) < cap;
        let previous = self.previous.filter(|p| latest.at.since(p.at) < ttl);
        room(latest) && previous.as_ref().is_none_or(room)
    }

    /// Load and free room at `now` (see the module docs for the rule).
    pub fn occupancy(
        &self,
        now: Millis,
        ttl: Millis,
        allowance: u32,
        gateways: Gateways,
    ) -> Occupancy {
        let cap = self.cap();
        if let (Some(r), Some(engine)) =
            (self.fresh_report(now, ttl), self.engine_estimate(now, ttl))
        {
            let in_use = self.local.max(engine);
            let queue_full = r.load.waiting.saturating_sub(r.removed) > allowance;
            let limit = cap.map(|c| c.saturating_add(allowance));
            let free = match (queue_full, limit) {
                (true, _) => Free::Slots(0),
                (false, None) => Free::Unbounded,
                (false, Some(l)) => Free::Slots(l.saturating_sub(in_use)),
            };
            let guaranteed = match cap {
                Some(c) if gateways.count > 1 => share(c, gateways),
                _ => 0,
            };
            let free = match free {
                Free::Slots(n) if self.local + self.ghosts < guaranteed => {
                    Free::Slots(n.max(guaranteed - self.local - self.ghosts))
                }
                other => other,
            };
            return Occupancy {
                basis: Basis::Reported,
                in_use,
                limit,
                free,
            };
        }
        match cap {
            None => Occupancy {
                basis: Basis::Unbounded,
                in_use: self.local,
                limit: None,
                free: Free::Unbounded,
            },
            Some(c) => {
                let limit = share(c, gateways);
                Occupancy {
                    basis: Basis::Share,
                    in_use: self.local,
                    limit: Some(limit),
                    free: Free::Slots(limit.saturating_sub(self.local)),
                }
            }
        }
    }

    /// Whether one more request may be sent to wait at the head of the engine's own queue: a
    /// fresh report says the engine's queue is empty (within `allowance`) and, with this
    /// gateway's changes since, the engine is at most full — not already over.
    pub fn may_overflow(&self, now: Millis, ttl: Millis, allowance: u32) -> bool {
        let (Some(cap), Some(r), Some(engine)) = (
            self.cap(),
            self.fresh_report(now, ttl),
            self.engine_estimate(now, ttl),
        ) else {
            return false;
        };
        r.load.waiting.saturating_sub(r.removed) <= allowance
            && engine.max(self.local) <= cap.saturating_add(allowance)
    }

    /// A new report replaces the last one (and its counts of changes since).
    pub fn set_report(&mut self, load: EngineLoad, now: Millis) {
        if load.slots.is_some() {
            self.engine_slots = load.slots;
        }
        self.previous = self.report.take();
        self.report = Some(Report {
            load,
            at: now,
            added: 0,
            removed: 0,
            lapsed: 0,
        });
    }

    /// A hold on this replica lapsed at `now` (see [`Report::lapsed`]).
    pub fn on_hold_lapsed(&mut self, now: Millis, ttl: Millis) {
        for r in self.reports_mut().filter(|r| now.since(r.at) < ttl) {
            r.lapsed = r.lapsed.saturating_add(1);
        }
    }

    pub fn on_dispatch(&mut self) {
        self.local = self.local.saturating_add(1);
        for r in self.reports_mut() {
            r.added = r.added.saturating_add(1);
        }
    }

    /// A request dispatched at `dispatched_at` ended.
    pub fn on_release(&mut self, dispatched_at: Millis) {
        self.local = self.local.saturating_sub(1);
        for r in self.reports_mut() {
            if dispatched_at >= r.at && r.added > 0 {
                r.added -= 1;
            } else {
                r.removed = r.removed.saturating_add(1);
            }
        }
    }

    /// The latest report and the one before it, each counting this gateway's changes since.
    fn reports_mut(&mut self) -> impl Iterator<Item = &mut Report> {
        self.report.iter_mut().chain(self.previous.iter_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Millis = Millis(1000);

    fn occ(r: &ReplicaSlots, now: u64) -> Occupancy {
        r.occupancy(Millis(now), TTL, 0, Gateways::ONE)
    }

    fn load(running: u32) -> EngineLoad {
        engine(running, 0)
    }

    fn engine(running: u32, waiting: u32) -> EngineLoad {
        EngineLoad {
            running,
            waiting,
            slots: None,
        }
    }

    #[test]
    fn room_others_leave_is_believed_when_two_reports_in_a_row_show_it() {
        let mut r = ReplicaSlots::new(Some(8));
        r.set_report(load(8), Millis(0));
        // One report catches a slot free (a sequence ended, its replacement not there yet):
        // not believed.
        r.set_report(load(7), Millis(200));
        assert_eq!(occ(&r, 210).free, Free::Slots(0));
        // The next one says the same: taken.
        r.set_report(load(7), Millis(400));
        assert_eq!(occ(&r, 410).free, Free::Slots(1));
        // A previous report gone stale does not count.
        r.set_report(load(8), Millis(500));
        r.set_report(load(6), Millis(1600));
        assert_eq!(occ(&r, 1610).free, Free::Slots(2));
    }

    #[test]
    fn this_gateways_own_releases_count_at_once_against_both_reports() {
        // This gateway runs 4 of the 8 slots; other traffic the rest.
        let mut r = ReplicaSlots::new(Some(8));
        for _ in 0..4 {
            r.on_dispatch();
        }
        r.set_report(load(8), Millis(0));
        r.set_report(load(8), Millis(200));
        // Its own request ends: the slot is free now, not a report later.
        r.on_release(Millis(0));
        assert_eq!(occ(&r, 210).free, Free::Slots(1));
        // Refilled at once, and the refill counts against the previous report too: a next
        // report that misses it in flight does not make room for another.
        r.on_dispatch();
        r.set_report(load(7), Millis(400));
        assert_eq!(occ(&r, 410).free, Free::Slots(0));
    }

    #[test]
    fn with_several_gateways_each_may_run_its_share_of_a_full_engine() {
        let two = Gateways {
            count: 2,
            ordinal: 1,
        };
        let mut r = ReplicaSlots::new(Some(8));
        // Another gateway holds every slot: this one may still start its share.
        r.set_report(engine(8, 0), Millis(0));
        assert_eq!(r.occupancy(Millis(10), TTL, 0, two).free, Free::Slots(4));
        for _ in 0..4 {
            r.on_dispatch();
        }
        assert_eq!(r.occupancy(Millis(10), TTL, 0, two).free, Free::Slots(0));
        // At its share, a full engine (or its queue) stops it like anyone.
        r.set_report(engine(8, 4), Millis(20));
        assert_eq!(r.occupancy(Millis(30), TTL, 0, two).free, Free::Slots(0));
        // Alone, nothing is guaranteed beyond what the engine has free.
        let mut alone = ReplicaSlots::new(Some(8));
        alone.set_report(engine(8, 0), Millis(0));
        assert_eq!(
            alone.occupancy(Millis(10), TTL, 0, Gateways::ONE).free,
            Free::Slots(0)
        );
    }

    #[test]
    fn shares_add_up_to_the_slots_and_never_fall_to_zero() {
        for slots in 1..=20u32 {
            for count in 1..=6u32 {
                let shares: Vec<u32> = (0..count)
                    .map(|ordinal| share(slots, Gateways { count, ordinal }))
                    .collect();
                let sum: u32 = shares.iter().sum();
                if slots >= count {
                    assert_eq!(sum, slots, "{slots} slots, {count} gateways: {shares:?}");
                } else {
                    assert_eq!(shares, vec![1; count as usize]);
                }
                let (lo, hi) = (shares.iter().min(), shares.iter().max());
                assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "{shares:?}");
            }
        }
        assert_eq!(
            share(
                8,
                Gateways {
                    count: 0,
                    ordinal: 3
                }
            ),
            8,
            "no count: alone"
        );
    }

    #[test]
    fn without_cap_or_report_a_replica_is_unbounded() {
        let mut r = ReplicaSlots::new(None);
        for _ in 0..1000 {
            r.on_dispatch();
        }
        assert_eq!(occ(&r, 0).free, Free::Unbounded);
        assert_eq!(occ(&r, 0).basis, Basis::Unbounded);
    }

    #[test]
    fn local_counts_bound_a_capped_replica_and_gateways_split_it() {
        let mut r = ReplicaSlots::new(Some(8));
        for _ in 0..3 {
            r.on_dispatch();
        }
        assert_eq!(occ(&r, 0).free, Free::Slots(5));
        let two = Gateways {
            count: 2,
            ordinal: 1,
        };
        let o = r.occupancy(Millis(0), TTL, 0, two);
        assert_eq!(
            (o.basis, o.limit, o.free),
            (Basis::Share, Some(4), Free::Slots(1))
        );
        r.on_release(Millis(0));
        assert_eq!(occ(&r, 0).free, Free::Slots(6));
    }

    #[test]
    fn a_fresh_report_is_the_shared_truth_and_counts_changes_since() {
        let mut r = ReplicaSlots::new(Some(8));
        r.on_dispatch(); // ours, dispatched at 0, before the report
        r.set_report(engine(6, 0), Millis(100));
        // Other gateways run 5: the report says 6 where we count 1.
        let two = Gateways {
            count: 2,
            ordinal: 0,
        };
        let o = r.occupancy(Millis(150), TTL, 0, two);
        assert_eq!((o.basis, o.in_use, o.limit), (Basis::Reported, 6, Some(8)));
        assert_eq!(
            o.free,
            Free::Slots(3),
            "the full cap, and at least its share of 4 (it runs 1)"
        );
        r.on_dispatch(); // at 150: not in the report
        assert_eq!(occ(&r, 150).in_use, 7);
        r.on_release(Millis(150)); // the one just added
        assert_eq!(occ(&r, 160).in_use, 6);
        r.on_release(Millis(0)); // the one the report counted
        assert_eq!(occ(&r, 170).in_use, 5);
        assert_eq!(occ(&r, 170).free, Free::Slots(3));
    }

    #[test]
    fn a_non_empty_engine_queue_stops_dispatch_until_it_drains() {
        let mut r = ReplicaSlots::new(Some(8));
        r.set_report(engine(3, 2), Millis(0));
        assert_eq!(
            occ(&r, 10).free,
            Free::Slots(0),
            "waiting 2 with 3 of 8 running"
        );
        // A request of ours that the report did not count ends: it lets nobody in.
        r.on_dispatch();
        r.on_release(Millis(5));
        assert_eq!(occ(&r, 10).free, Free::Slots(0));
        assert_eq!(
            r.occupancy(Millis(10), TTL, 2, Gateways::ONE).free,
            Free::Slots(5),
            "an allowance of 2 tolerates them: 8 + 2 − 5"
        );
        r.on_release(Millis(0));
        assert_eq!(occ(&r, 10).free, Free::Slots(0), "one of two let in");
        r.on_release(Millis(0));
        assert_eq!(occ(&r, 10).free, Free::Slots(5), "queue drained: 8 − 3");
    }

    #[test]
    fn a_stale_report_falls_back_to_the_share() {
        let mut r = ReplicaSlots::new(Some(4));
        r.set_report(engine(4, 9), Millis(0));
        assert_eq!(occ(&r, 999).free, Free::Slots(0));
        let o = occ(&r, 1000);
        assert_eq!((o.basis, o.free), (Basis::Share, Free::Slots(4)));
    }

    #[test]
    fn engine_slots_give_a_cap_and_the_queue_rule_gates_an_uncapped_engine() {
        let mut r = ReplicaSlots::new(None);
        r.set_report(
            EngineLoad {
                running: 1,
                waiting: 0,
                slots: Some(2),
            },
            Millis(0),
        );
        assert_eq!(occ(&r, 0).free, Free::Slots(1));
        assert_eq!(
            occ(&r, 5000).limit,
            Some(2),
            "slot count outlives the report"
        );
        let mut v = ReplicaSlots::new(None);
        v.set_report(engine(40, 0), Millis(0));
        assert_eq!(occ(&v, 0).free, Free::Unbounded);
        v.set_report(engine(40, 1), Millis(1));
        assert_eq!(occ(&v, 1).free, Free::Slots(0));
        assert_eq!(
            occ(&v, 1001).free,
            Free::Unbounded,
            "stale: today's behaviour"
        );
    }
}
