//! Keeps the shared engine's slices in step with the store: one task per replica, on the
//! billing runtime, never on a request's path.
//!
//! It wakes when a slot asks for a slice ([`super::shared::Fetch`]) and every [`TICK`], and
//! sends everything due in **one** call ([`LeaseStore::take_quota`]): slices asked for (with
//! the usage a slot reports beyond its last slice), tokens used beyond slices, slices an idle
//! slot gives back ([`IDLE`]), and, in the last moments of a window ([`LEAD`]), a first slice
//! of the next window for every slot used in this one, so the new window starts without a
//! wait.
//! Each answer also carries the store's clock, which aligns this replica's windows.
//!
//! When the store does not answer, slots that were waiting count alone for the rest of the
//! window (their slice becomes the whole limit: the local engine's numbers), and the failure
//! is logged and counted (`quipu_rate_window_calls_total{result="error"}`).

use super::shared::{Dim, Fetch, Shared};
use super::{Now, RateCounters};
use crate::metrics::m;
use crate::store::{LeaseStore, QuotaAsk, QuotaGrant, Store};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often the task looks at every slot in use, even when none asks.
pub const TICK: Duration = Duration::from_millis(100);
/// A slot unused this long gives back the part of its slice it holds unused (at most; a tenth
/// of the window when that is shorter).
pub const IDLE: Duration = Duration::from_millis(1000);
/// How long before a window ends its successor's first slices are taken (at most; a tenth of
/// the window when that is shorter).
pub const LEAD: Duration = Duration::from_millis(2000);
/// Longest wait for the store's answer to one batch.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Slots are forgotten by the task after this many windows unused (a request brings them
/// back).
const FORGET_AFTER_WINDOWS: i64 = 3;

/// What one ask of a batch is for.
struct Entry {
    counters: Arc<RateCounters>,
    dim: Dim,
    window: u64,
    /// A slot is waiting or running low in the current window (a grant of nothing means the
    /// window is used up).
    wanted: bool,
    ask: QuotaAsk,
}

/// One call's asks, at most one per (slot, window).
#[derive(Default)]
struct Batch {
    entries: Vec<Entry>,
    index: HashMap<(usize, Dim, u64), usize>,
}

impl Batch {
    /// The entry of `dim` of `c` in `window`, made if new.
    fn entry(
        &mut self,
        c: &Arc<RateCounters>,
        dim: Dim,
        window: u64,
        window_ms: u64,
    ) -> &mut Entry {
        let key = (Arc::as_ptr(c) as usize, dim, window);
        let i = *self.index.entry(key).or_insert_with(|| {
            let len = i64::try_from(window_ms).unwrap_or(60_000);
            self.entries.push(Entry {
                counters: c.clone(),
                dim,
                window,
                wanted: false,
                ask: QuotaAsk {
                    subject: c.subject.window_name(dim),
                    window_ms: len,
                    window_start: i64::try_from(window).unwrap_or(0).saturating_mul(len),
                    add: 0,
                    want: 0,
                    limit: c.slot(dim).limit.load(Ordering::Relaxed),
                },
            });
            self.entries.len() - 1
        });
        &mut self.entries[i]
    }
}

fn ms(d: Duration, window_ms: u64) -> i64 {
    let d = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    i64::try_from(d.min(window_ms / 10).max(1)).unwrap_or(1)
}

/// The asks due now: `fetches` (slots asking), and on a tick what every registered slot owes.
fn build(shared: &Shared, fetches: Vec<Fetch>, tick: bool, now: &Now) -> Batch {
    let window_ms = shared.clock.window_ms();
    let mut batch = Batch::default();
    for f in fetches {
        let slot = f.counters.slot(f.dim);
        if f.window != now.window && f.window != now.window + 1 {
            // Asked in a window that is over: nothing to take for it.
            slot.fetching.store(false, Ordering::Release);
            slot.notify.notify_waiters();
            continue;
        }
        let beyond = slot.beyond(f.window);
        let want = slot.next_slice(slot.limit.load(Ordering::Relaxed), now.now_ms);
        let e = batch.entry(&f.counters, f.dim, f.window, window_ms);
        e.wanted = true;
        e.ask.add = i64::try_from(beyond).unwrap_or(i64::MAX);
        e.ask.want = want;
    }
    if !tick {
        return batch;
    }
    let idle_ms = ms(IDLE, window_ms);
    let lead_ms = ms(LEAD, window_ms);
    let forget_ms = i64::try_from(window_ms)
        .unwrap_or(60_000)
        .saturating_mul(FORGET_AFTER_WINDOWS);
    let mut registry = shared.registry.lock();
    registry.retain(|c| {
        let mut in_use = false;
        for dim in [Dim::Requests, Dim::Tokens] {
            let slot = c.slot(dim);
            let last_use = slot.last_use_ms.load(Ordering::Relaxed);
            if last_use == 0 {
                continue;
            }
            in_use |= now.now_ms - last_use < forget_ms;
            let w = now.window;
            let beyond = slot.beyond(w);
            if beyond > 0 && !slot.fetching.load(Ordering::Acquire) {
                let e = batch.entry(c, dim, w, window_ms);
                e.ask.add = e.ask.add.max(i64::try_from(beyond).unwrap_or(i64::MAX));
            }
            let idle = now.now_ms - last_use >= idle_ms;
            if idle && !slot.fetching.load(Ordering::Acquire) {
                for window in [w, w + 1] {
                    let back = slot.shrink_to_used(window);
                    if back > 0 {
                        let e = batch.entry(c, dim, window, window_ms);
                        e.ask.add -= i64::try_from(back).unwrap_or(0);
                    }
                }
            }
            let next = w + 1;
            let marker = (next & super::local::WINDOW_MASK) + 1;
            let limit = slot.limit.load(Ordering::Relaxed);
            if !idle
                && now.left_ms <= u64::try_from(lead_ms).unwrap_or(0)
                && slot.used(w) > 0
                && slot.granted(next) == 0
                && limit >= 8
                && slot.prefetched.swap(marker, Ordering::AcqRel) != marker
            {
                let want = slot.next_slice(limit, now.now_ms);
                let e = batch.entry(c, dim, next, window_ms);
                e.ask.want = e.ask.want.max(want);
            }
        }
        if !in_use {
            c.registered.store(false, Ordering::Release);
        }
        in_use
    });
    batch
}

/// Applies the store's answers to the slots and wakes the requests waiting on them.
fn apply(shared: &Shared, batch: Batch, grants: &[QuotaGrant], now: &Now) {
    let dry_ms = shared.dry_memory_ms();
    for (e, g) in batch.entries.into_iter().zip(grants) {
        let slot = e.counters.slot(e.dim);
        // Usage beyond the slice is now counted in the store: the slice covers it.
        let taken = u64::try_from(e.ask.add.max(0)).unwrap_or(0) + g.granted;
        if taken > 0 {
            slot.add_granted(e.window, taken);
        }
        if g.granted > 0 {
            slot.sized(g.granted, now.now_ms);
        } else if e.wanted && e.ask.want > 0 && e.window == now.window {
            slot.mark_dry(e.window, now.now_ms, dry_ms);
        }
        if e.wanted {
            slot.fetching.store(false, Ordering::Release);
        }
        slot.notify.notify_waiters();
    }
}

/// The store did not answer: slots that were waiting count alone for this window.
fn fail(batch: Batch, now: &Now) {
    for e in batch.entries {
        let slot = e.counters.slot(e.dim);
        if e.wanted {
            if e.window == now.window {
                let held = slot.granted(e.window);
                slot.add_granted(e.window, e.ask.limit.saturating_sub(held));
            }
            slot.fetching.store(false, Ordering::Release);
        }
        slot.notify.notify_waiters();
    }
}

/// Sends `batch` to the store and applies the answer; returns whether the store answered.
async fn send(
    shared: &Shared,
    store: &(impl LeaseStore + ?Sized),
    batch: Batch,
    now: &Now,
) -> bool {
    if batch.entries.is_empty() {
        return true;
    }
    let asks: Vec<QuotaAsk> = batch.entries.iter().map(|e| e.ask.clone()).collect();
    let sent_ms = crate::store::now_ms();
    let started = Instant::now();
    match tokio::time::timeout(CALL_TIMEOUT, store.take_quota(&asks)).await {
        Ok(Ok((grants, store_ms))) => {
            let rtt = i64::try_from(started.elapsed().as_millis()).unwrap_or(0);
            shared.clock.observe(store_ms, sent_ms, rtt);
            m().rate_window_calls.with_label_values(&["ok"]).inc();
            apply(shared, batch, &grants, now);
            true
        }
        Ok(Err(e)) => {
            m().rate_window_calls.with_label_values(&["error"]).inc();
            log::warn!("shared rate windows: the store failed ({e}); counting alone this window");
            fail(batch, now);
            false
        }
        Err(_) => {
            m().rate_window_calls.with_label_values(&["error"]).inc();
            log::warn!(
                "shared rate windows: no answer from the store within {CALL_TIMEOUT:?}; counting alone this window"
            );
            fail(batch, now);
            false
        }
    }
}

/// The task: runs until the limiter (and so the queue's sender) is dropped.
pub(super) async fn run(
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    mut queue: mpsc::UnboundedReceiver<Fetch>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let window_ms = shared.clock.window_ms();
    let expire_every = Duration::from_millis(window_ms.max(60_000));
    let mut expired_at = Instant::now();
    loop {
        let mut fetches = Vec::new();
        let ticked = tokio::select! {
            f = queue.recv() => match f {
                Some(f) => {
                    fetches.push(f);
                    false
                }
                None => return,
            },
            _ = tick.tick() => true,
        };
        while let Ok(f) = queue.try_recv() {
            fetches.push(f);
        }
        let now = shared.clock.now();
        let batch = build(&shared, fetches, ticked, &now);
        send(&shared, store.as_ref(), batch, &now).await;
        if ticked && expired_at.elapsed() >= expire_every {
            expired_at = Instant::now();
            let age = i64::try_from(window_ms.saturating_mul(2)).unwrap_or(i64::MAX);
            if let Err(e) = store.expire_quota(age).await {
                log::warn!("shared rate windows: expiring old windows failed: {e}");
            }
        }
    }
}

/// Gives back every unused slice of the current and next window (at shutdown).
pub(super) async fn give_back(
    shared: &Shared,
    store: &(impl LeaseStore + ?Sized),
    timeout: Duration,
) {
    let now = shared.clock.now();
    let window_ms = shared.clock.window_ms();
    let mut batch = Batch::default();
    for c in shared.registry.lock().iter() {
        for dim in [Dim::Requests, Dim::Tokens] {
            for window in [now.window, now.window + 1] {
                let back = c.slot(dim).shrink_to_used(window);
                if back > 0 {
                    let e = batch.entry(c, dim, window, window_ms);
                    e.ask.add -= i64::try_from(back).unwrap_or(0);
                }
            }
        }
    }
    if batch.entries.is_empty() {
        return;
    }
    let asks: Vec<QuotaAsk> = batch.entries.iter().map(|e| e.ask.clone()).collect();
    match tokio::time::timeout(timeout, store.take_quota(&asks)).await {
        Ok(Ok(_)) => log::info!("gave back {} unused rate-window slices", asks.len()),
        Ok(Err(e)) => log::warn!("could not give back unused rate-window slices: {e}"),
        Err(_) => log::warn!("could not give back unused rate-window slices within {timeout:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;
    use crate::ratelimit::{Subject, WindowClock};

    #[test]
    fn with_the_store_gone_a_waiting_slot_counts_alone_for_the_window() {
        let clock = Arc::new(WindowClock::new(&Limits::default()));
        let (shared, _queue) = Shared::new(clock.clone());
        let now = clock.now();
        let c = Arc::new(RateCounters::new(Subject::Key("key_alone".into())));
        let slot = c.slot(Dim::Requests);
        slot.limit.store(5, Ordering::Relaxed);
        slot.fetching.store(true, Ordering::Relaxed);
        let fetch = Fetch {
            counters: c.clone(),
            dim: Dim::Requests,
            window: now.window,
        };
        let batch = build(&shared, vec![fetch], false, &now);
        assert_eq!(batch.entries.len(), 1);
        assert_eq!(batch.entries[0].ask.subject, "key:key_alone:requests");
        assert_eq!(batch.entries[0].ask.want, 1, "a sixteenth of 5, at least 1");
        fail(batch, &now);
        assert!(!slot.fetching.load(Ordering::Relaxed));
        let admitted = (0..10)
            .filter(|_| slot.take_one(now.window).is_some())
            .count();
        assert_eq!(admitted, 5, "the local engine's numbers");
    }

    #[test]
    fn a_tick_reports_tokens_beyond_the_slice_and_returns_idle_slices() {
        let clock = Arc::new(WindowClock::new(&Limits::default()));
        let (shared, _queue) = Shared::new(clock.clone());
        let now = clock.now();
        let busy = Arc::new(RateCounters::new(Subject::Tenant(3)));
        let idle = Arc::new(RateCounters::new(Subject::Key("key_idle".into())));
        for (c, last_use) in [(&busy, now.now_ms), (&idle, now.now_ms - 5_000)] {
            let slot = c.slot(Dim::Tokens);
            slot.limit.store(400, Ordering::Relaxed);
            slot.last_use_ms.store(last_use, Ordering::Relaxed);
            c.registered.store(true, Ordering::Relaxed);
            shared.registry.lock().push(c.clone());
        }
        busy.slot(Dim::Tokens).add_granted(now.window, 25);
        busy.slot(Dim::Tokens).add_used(now.window, 31);
        idle.slot(Dim::Tokens).add_granted(now.window, 25);
        idle.slot(Dim::Tokens).add_used(now.window, 10);
        let batch = build(&shared, Vec::new(), true, &now);
        let asks: Vec<(&str, i64, u64)> = batch
            .entries
            .iter()
            .map(|e| (e.ask.subject.as_str(), e.ask.add, e.ask.want))
            .collect();
        assert!(asks.contains(&("tenant:3:tokens", 6, 0)), "{asks:?}");
        assert!(asks.contains(&("key:key_idle:tokens", -15, 0)), "{asks:?}");
        assert_eq!(idle.slot(Dim::Tokens).granted(now.window), 10);
        let grants = vec![
            QuotaGrant {
                granted: 0,
                taken: 0
            };
            batch.entries.len()
        ];
        apply(&shared, batch, &grants, &now);
        assert_eq!(
            busy.slot(Dim::Tokens).beyond(now.window),
            0,
            "reported once"
        );
    }
}
