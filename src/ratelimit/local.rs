//! Exact in-process counts: one atomic word per window count, holding the window's number and
//! the count, updated by compare-and-swap — lock-free, exact across worker threads, and a
//! request is only counted if it is admitted. The engine of one replica (the embedded store),
//! and the word the shared engine's slices are kept in (`shared`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of a packed count; the window number takes the other 24 (its low bits: windows are
/// only ever compared with the current one and the next).
const COUNT_BITS: u32 = 40;
pub(super) const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
pub(super) const WINDOW_MASK: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// A count within one fixed window: `(window << 40) | count` in one atomic.
#[derive(Default)]
pub struct WindowCount(AtomicU64);

pub(super) fn unpack(v: u64) -> (u64, u64) {
    (v >> COUNT_BITS, v & COUNT_MAX)
}

pub(super) fn pack(window: u64, count: u64) -> u64 {
    ((window & WINDOW_MASK) << COUNT_BITS) | count.min(COUNT_MAX)
}

impl WindowCount {
    /// The window a stored value counts toward: `window`, unless another thread already moved
    /// it to the next one (its clock read came a moment later).
    fn current(stored: u64, window: u64) -> (u64, u64) {
        let (w, c) = unpack(stored);
        let window = window & WINDOW_MASK;
        if w == window || w == (window + 1) & WINDOW_MASK {
            (w, c)
        } else {
            (window, 0)
        }
    }

    /// The count in `window`.
    pub fn get(&self, window: u64) -> u64 {
        Self::current(self.0.load(Ordering::Acquire), window).1
    }

    /// Adds `n` unless that would pass `limit`; returns the window it counted in, if it did.
    pub fn try_add(&self, window: u64, n: u64, limit: u64) -> Option<u64> {
        let mut stored = self.0.load(Ordering::Acquire);
        loop {
            let (w, c) = Self::current(stored, window);
            let next = c.saturating_add(n);
            if next > limit {
                return None;
            }
            match self.0.compare_exchange_weak(
                stored,
                pack(w, next),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(w),
                Err(now) => stored = now,
            }
        }
    }

    /// Adds `n`.
    pub fn add(&self, window: u64, n: u64) {
        let _ = self.try_add(window, n, u64::MAX);
    }

    /// Takes back `n` counted in window `counted_in` (an admission undone), unless that window
    /// is over.
    pub fn undo(&self, counted_in: u64, n: u64) {
        let mut stored = self.0.load(Ordering::Acquire);
        loop {
            let (w, c) = unpack(stored);
            if w != counted_in & WINDOW_MASK {
                return;
            }
            match self.0.compare_exchange_weak(
                stored,
                pack(w, c.saturating_sub(n)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => stored = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_window_count_is_exact_and_resets_with_the_window() {
        let c = WindowCount::default();
        assert_eq!(c.try_add(7, 1, 2), Some(7));
        assert_eq!(c.try_add(7, 1, 2), Some(7));
        assert_eq!(c.try_add(7, 1, 2), None, "the third passes the limit");
        assert_eq!(c.get(7), 2);
        assert_eq!(c.get(8), 0, "a new window starts at zero");
        assert_eq!(c.try_add(8, 1, 2), Some(8));
        // A caller whose clock read a moment before the rollover counts in the new window.
        assert_eq!(c.try_add(7, 1, 2), Some(8));
        assert_eq!(c.get(8), 2);
        c.undo(8, 1);
        assert_eq!(c.get(8), 1);
        c.undo(7, 1);
        assert_eq!(c.get(8), 1, "an undo for a finished window does nothing");
        c.add(8, 1 << 50);
        assert_eq!(
            c.get(8),
            COUNT_MAX,
            "saturates instead of spilling into the window"
        );
    }

    #[test]
    fn exact_across_threads() {
        let c = Arc::new(WindowCount::default());
        let admitted: usize = (0..8)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    (0..10_000)
                        .filter(|_| c.try_add(3, 1, 50_000).is_some())
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(admitted, 50_000);
        assert_eq!(c.get(3), 50_000);
    }
}
