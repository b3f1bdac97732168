//! The shared engine on the request path: slices of the store's windows, held in atomic words.
//!
//! Each key's and tenant's requests and tokens have a [`Slot`]: for a window, what this
//! replica took from the store's count (`granted`) and what it used of it (`used`), each one
//! atomic word holding the window's number and the count (as in [`super::local`]). Two such
//! pairs alternate by the window's parity, so the next window's slice can arrive (taken a
//! moment before the window starts) while the current one is in use.
//!
//! A request takes one from its slice by compare-and-swap; a finished request adds its tokens.
//! When a slice runs low, the slot asks the [`super::sync`] task for more (one flag, one
//! channel send; never a wait). Only a slot that holds nothing for the window makes its
//! request wait, for at most [`SLICE_WAIT`], on the next answer from the store; a slot the
//! store said is used up ("dry") refuses at once for [`DRY_MEMORY`], then asks again (an idle
//! replica may have given a slice back meanwhile).

use super::local::{pack, unpack, WINDOW_MASK};
use super::{Now, RateCounters, WindowClock};
use crate::metrics::m;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// Longest a request waits for a slice of a window its replica holds nothing of.
pub const SLICE_WAIT: Duration = Duration::from_millis(1500);
/// How long a slot the store said is used up refuses without asking again (at most; a
/// twentieth of the window when that is shorter).
pub const DRY_MEMORY: Duration = Duration::from_millis(1000);

/// The two counts of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Dim {
    Requests,
    Tokens,
}

/// What a window's slice holds: taken from the store, and used here. Each `(window, count)`.
#[derive(Default)]
struct Pair {
    granted: AtomicU64,
    used: AtomicU64,
}

/// The count a packed word holds for `window` (0 if it holds another window's).
fn count_in(stored: u64, window: u64) -> u64 {
    let (w, c) = unpack(stored);
    if w == window & WINDOW_MASK {
        c
    } else {
        0
    }
}

/// Adds `n` to the count of `window` in `word` (starting from 0 if it held another window).
fn add_in(word: &AtomicU64, window: u64, n: u64) {
    let mut stored = word.load(Ordering::Acquire);
    loop {
        let next = pack(window, count_in(stored, window).saturating_add(n));
        match word.compare_exchange_weak(stored, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => stored = now,
        }
    }
}

/// One count (requests or tokens) of one key or tenant: its slices of the shared windows.
#[derive(Default)]
pub struct Slot {
    pairs: [Pair; 2],
    /// `(window & mask) + 1` of a window the store said is used up; 0: none.
    dry_window: AtomicU64,
    /// Until when (ms since the epoch) that holds.
    dry_until_ms: AtomicI64,
    /// A request for a slice is queued or in flight.
    pub(super) fetching: AtomicBool,
    /// When a request last used the slot (ms since the epoch).
    pub(super) last_use_ms: AtomicI64,
    /// The limit it was last used with (the sync task asks with it).
    pub(super) limit: AtomicU64,
    /// The slice to ask for next (0: not sized yet), and when the last one arrived.
    slice: AtomicU64,
    granted_at_ms: AtomicI64,
    /// `(window & mask) + 1` of the next window a slice was asked for ahead of time.
    pub(super) prefetched: AtomicU64,
    /// Woken when an answer for this slot arrives.
    pub(super) notify: Notify,
}

impl Slot {
    fn pair(&self, window: u64) -> &Pair {
        &self.pairs[(window & 1) as usize]
    }

    pub fn granted(&self, window: u64) -> u64 {
        count_in(self.pair(window).granted.load(Ordering::Acquire), window)
    }

    pub fn used(&self, window: u64) -> u64 {
        count_in(self.pair(window).used.load(Ordering::Acquire), window)
    }

    /// Takes one from the window's slice: what is left after it, or `None` if nothing was.
    pub fn take_one(&self, window: u64) -> Option<u64> {
        let p = self.pair(window);
        let granted = count_in(p.granted.load(Ordering::Acquire), window);
        let mut stored = p.used.load(Ordering::Acquire);
        loop {
            let used = count_in(stored, window);
            if used >= granted {
                return None;
            }
            match p.used.compare_exchange_weak(
                stored,
                pack(window, used + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(granted - used - 1),
                Err(now) => stored = now,
            }
        }
    }

    /// Gives back one taken in `window` (an admission undone), unless that window is over.
    pub fn undo_one(&self, window: u64) {
        let word = &self.pair(window).used;
        let mut stored = word.load(Ordering::Acquire);
        loop {
            let (w, c) = unpack(stored);
            if w != window & WINDOW_MASK || c == 0 {
                return;
            }
            match word.compare_exchange_weak(
                stored,
                pack(w, c - 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => stored = now,
            }
        }
    }

    pub fn add_used(&self, window: u64, n: u64) {
        add_in(&self.pair(window).used, window, n);
    }

    /// Adds `n` to the window's slice (an answer from the store).
    pub fn add_granted(&self, window: u64, n: u64) {
        add_in(&self.pair(window).granted, window, n);
    }

    /// Lowers the window's slice to what is used of it; returns what it took off (to give
    /// back to the store). A request taking one at the same moment may end up past the slice:
    /// that is reported as usage beyond it, like tokens.
    pub fn shrink_to_used(&self, window: u64) -> u64 {
        let p = self.pair(window);
        let mut stored = p.granted.load(Ordering::Acquire);
        loop {
            let granted = count_in(stored, window);
            let used = self.used(window);
            if granted <= used {
                return 0;
            }
            match p.granted.compare_exchange_weak(
                stored,
                pack(window, used),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return granted - used,
                Err(now) => stored = now,
            }
        }
    }

    /// Used beyond the slice (tokens of the last requests, reported to the store).
    pub fn beyond(&self, window: u64) -> u64 {
        self.used(window).saturating_sub(self.granted(window))
    }

    fn is_dry(&self, now: &Now) -> bool {
        self.dry_window.load(Ordering::Acquire) == (now.window & WINDOW_MASK) + 1
            && now.now_ms < self.dry_until_ms.load(Ordering::Acquire)
    }

    /// The store had nothing left for `window`, as of `now_ms`.
    pub(super) fn mark_dry(&self, window: u64, now_ms: i64, memory_ms: i64) {
        self.dry_until_ms
            .store(now_ms.saturating_add(memory_ms), Ordering::Release);
        self.dry_window
            .store((window & WINDOW_MASK) + 1, Ordering::Release);
    }

    /// The slice to ask for: a sixteenth of the limit at first; doubled (up to a quarter)
    /// when the last one lasted under [`FAST_SLICE_MS`], halved back when it lasted over
    /// [`SLOW_SLICE_MS`]. Small slices keep what idle replicas hold small; growing ones keep
    /// a busy key at a handful of store calls per second.
    pub(super) fn next_slice(&self, limit: u64, now_ms: i64) -> u64 {
        let base = limit.div_ceil(16).max(1);
        let most = (limit / 4).max(base);
        let last = self.slice.load(Ordering::Relaxed);
        if last == 0 {
            return base;
        }
        let lasted = now_ms - self.granted_at_ms.load(Ordering::Relaxed);
        if lasted < FAST_SLICE_MS {
            (last * 2).min(most)
        } else if lasted > SLOW_SLICE_MS {
            (last / 2).max(base)
        } else {
            last.clamp(base, most)
        }
    }

    /// A slice of `size` arrived at `now_ms`.
    pub(super) fn sized(&self, size: u64, now_ms: i64) {
        self.slice.store(size, Ordering::Relaxed);
        self.granted_at_ms.store(now_ms, Ordering::Relaxed);
    }

    /// When to ask for more: half a slice left.
    fn low_water(&self) -> u64 {
        (self.slice.load(Ordering::Relaxed) / 2).max(1)
    }

    fn touch(&self, now: &Now, limit: u64) {
        self.last_use_ms.store(now.now_ms, Ordering::Relaxed);
        if self.limit.load(Ordering::Relaxed) != limit {
            self.limit.store(limit, Ordering::Relaxed);
        }
    }
}

/// A slice lasting less than this was too small: the next is twice as large.
pub const FAST_SLICE_MS: i64 = 250;
/// A slice lasting more than this was too large: the next is half as large.
pub const SLOW_SLICE_MS: i64 = 2_000;

/// A slot's ask for a slice of `window`, queued for the sync task.
pub(super) struct Fetch {
    pub counters: Arc<RateCounters>,
    pub dim: Dim,
    pub window: u64,
}

/// The shared engine's state: the counters it keeps in step and the queue of asks.
pub struct Shared {
    pub(super) clock: Arc<WindowClock>,
    queue: mpsc::UnboundedSender<Fetch>,
    /// Counters used lately (the sync task reports, returns and prefetches for them).
    pub(super) registry: Mutex<Vec<Arc<RateCounters>>>,
}

impl Shared {
    pub(super) fn new(clock: Arc<WindowClock>) -> (Arc<Shared>, mpsc::UnboundedReceiver<Fetch>) {
        let (queue, rx) = mpsc::unbounded_channel();
        (
            Arc::new(Shared {
                clock,
                queue,
                registry: Mutex::new(Vec::new()),
            }),
            rx,
        )
    }

    /// How long a dry slot refuses without asking: [`DRY_MEMORY`], or a twentieth of the
    /// window if shorter.
    pub(super) fn dry_memory_ms(&self) -> i64 {
        let ms = (self.clock.window_ms() / 20).min(DRY_MEMORY.as_millis() as u64);
        i64::try_from(ms).unwrap_or(1000).max(1)
    }

    fn register(&self, c: &Arc<RateCounters>) {
        if !c.registered.load(Ordering::Relaxed) && !c.registered.swap(true, Ordering::AcqRel) {
            self.registry.lock().push(c.clone());
        }
    }

    /// Asks the sync task for a slice of `window` (once until it answers).
    fn fetch(&self, c: &Arc<RateCounters>, dim: Dim, window: u64) {
        if !c.slot(dim).fetching.swap(true, Ordering::AcqRel) {
            let sent = self.queue.send(Fetch {
                counters: c.clone(),
                dim,
                window,
            });
            if sent.is_err() {
                c.slot(dim).fetching.store(false, Ordering::Release);
            }
        }
    }

    /// Waits for the next answer for `dim` of `c` after asking for a slice, unless `ready`
    /// already holds; returns `ready()` afterwards.
    async fn wait_for_slice(
        &self,
        c: &Arc<RateCounters>,
        dim: Dim,
        now: &Now,
        ready: impl Fn() -> bool,
    ) -> bool {
        let slot = c.slot(dim);
        let mut answered = std::pin::pin!(slot.notify.notified());
        answered.as_mut().enable();
        // An answer may have arrived between the caller's look and `enable`.
        if ready() {
            return true;
        }
        m().rate_window_waits.inc();
        self.fetch(c, dim, now.window);
        let _ = tokio::time::timeout(SLICE_WAIT, answered).await;
        ready()
    }

    /// Counts one request against `c`'s requests slice; `false`: the window is used up.
    pub(super) async fn take_request(&self, c: &Arc<RateCounters>, limit: u64, now: &Now) -> bool {
        let slot = c.slot(Dim::Requests);
        slot.touch(now, limit);
        self.register(c);
        let took = |slot: &Slot| match slot.take_one(now.window) {
            Some(left) => {
                if left < slot.low_water() {
                    self.fetch(c, Dim::Requests, now.window);
                }
                true
            }
            None => false,
        };
        if took(slot) {
            return true;
        }
        if slot.is_dry(now) {
            return false;
        }
        // Nothing held: the one case a request waits for the store.
        self.wait_for_slice(c, Dim::Requests, now, || {
            slot.granted(now.window) > slot.used(now.window)
        })
        .await;
        took(slot)
    }

    /// Whether `c`'s tokens slice has some left (a request is admitted while it does).
    pub(super) async fn tokens_left(&self, c: &Arc<RateCounters>, limit: u64, now: &Now) -> bool {
        let slot = c.slot(Dim::Tokens);
        slot.touch(now, limit);
        self.register(c);
        let left = || slot.used(now.window) < slot.granted(now.window);
        if left() {
            return true;
        }
        if slot.is_dry(now) {
            return false;
        }
        self.wait_for_slice(c, Dim::Tokens, now, left).await
    }

    /// A finished request used `tokens` of `c`'s window.
    pub(super) fn consumed(&self, c: &Arc<RateCounters>, limit: u64, now: &Now, tokens: u64) {
        let slot = c.slot(Dim::Tokens);
        slot.touch(now, limit);
        self.register(c);
        slot.add_used(now.window, tokens);
        let (used, granted) = (slot.used(now.window), slot.granted(now.window));
        if used.saturating_add(slot.low_water()) > granted {
            // Running low, or past the slice: ask for more (and report what is beyond it).
            self.fetch(c, Dim::Tokens, now.window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_admits_exactly_its_slice_and_alternates_windows() {
        let s = Slot::default();
        assert_eq!(s.take_one(10), None, "nothing granted yet");
        s.add_granted(10, 3);
        assert_eq!(s.take_one(10), Some(2));
        assert_eq!(s.take_one(10), Some(1));
        // The next window's slice arrives early, beside the current one.
        s.add_granted(11, 2);
        assert_eq!(s.take_one(10), Some(0));
        assert_eq!(s.take_one(10), None);
        assert_eq!((s.granted(11), s.used(11)), (2, 0));
        assert_eq!(s.take_one(11), Some(1));
        // Window 12 reuses window 10's words, starting from nothing.
        assert_eq!((s.granted(12), s.used(12)), (0, 0));
        s.add_granted(12, 1);
        assert_eq!((s.granted(12), s.used(12)), (1, 0));
        s.undo_one(11);
        assert_eq!(s.used(11), 0);
        s.undo_one(11);
        assert_eq!(s.used(11), 0, "never below zero");
    }

    #[test]
    fn shrinking_gives_back_the_unused_part_and_tokens_may_go_beyond() {
        let s = Slot::default();
        s.add_granted(5, 10);
        s.add_used(5, 4);
        assert_eq!(s.shrink_to_used(5), 6);
        assert_eq!((s.granted(5), s.used(5)), (4, 4));
        assert_eq!(s.shrink_to_used(5), 0);
        s.add_used(5, 7);
        assert_eq!(s.beyond(5), 7);
        s.add_granted(5, 7);
        assert_eq!(s.beyond(5), 0);
    }

    #[test]
    fn slices_grow_when_they_go_fast_and_shrink_when_slow() {
        let s = Slot::default();
        assert_eq!(s.next_slice(60, 0), 4, "a sixteenth of 60, rounded up");
        assert_eq!(s.next_slice(5, 0), 1);
        s.sized(4, 1_000);
        assert_eq!(
            s.next_slice(60, 1_100),
            8,
            "used up in 100 ms: twice as large"
        );
        s.sized(15, 1_000);
        assert_eq!(s.next_slice(60, 1_100), 15, "never above a quarter");
        assert_eq!(s.next_slice(60, 5_000), 7, "halved after a slow one");
        assert_eq!(s.next_slice(60, 1_500), 15);
    }

    #[test]
    fn exact_across_threads() {
        let s = Arc::new(Slot::default());
        s.add_granted(3, 25_000);
        let taken: usize = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || (0..10_000).filter(|_| s.take_one(3).is_some()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(taken, 25_000);
        assert_eq!(s.used(3), 25_000);
    }
}
