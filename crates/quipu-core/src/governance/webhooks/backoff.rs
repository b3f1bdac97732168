//! When to try a failed delivery again, and when to give up: exponential backoff with
//! jitter, capped. Pure: the caller passes the random draw in ([`Backoff::delay`]'s `jitter`).
//!
//! With the defaults a delivery is tried at once, then after about 30 s, 1, 2, 4, 8, 16, 32
//! and 64 minutes, 2 h 8 min, 4 h 16 min, then every 6 hours, 20 attempts in all: the last
//! one about two and a half days after the first (at most 62 h 31 min, at least half of that
//! with the jitter), after which the event is marked failed.
//!
//! Jitter is "equal jitter": a delay is between half and all of its nominal value, so
//! endpoints that fail together (one receiver behind many events) are not retried in lockstep,
//! and no retry comes sooner than half the schedule.

use std::time::Duration;

/// A retry schedule (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The nominal delay after the first failed attempt.
    pub first: Duration,
    /// Each further delay is this many times the one before, up to `max_delay`.
    pub factor: u32,
    pub max_delay: Duration,
    /// Attempts in all, the first included; after the last failure, give up.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            first: Duration::from_secs(30),
            factor: 2,
            max_delay: Duration::from_secs(6 * 3600),
            max_attempts: 20,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Try again after this long.
    After(Duration),
    /// That was the last attempt.
    GiveUp,
}

impl Backoff {
    /// The nominal delay after failed attempt number `attempt` (1 for the first): `first ×
    /// factor^(attempt−1)`, at most `max_delay`; `None` when `attempt` was the last.
    pub fn nominal(&self, attempt: u32) -> Option<Duration> {
        if attempt == 0 || attempt >= self.max_attempts {
            return None;
        }
        let mut d = self.first;
        for _ in 1..attempt {
            if d >= self.max_delay {
                break;
            }
            d = d.saturating_mul(self.factor);
        }
        Some(d.min(self.max_delay))
    }

    /// After failed attempt number `attempt`: retry after the nominal delay scaled into
    /// `[½, 1]` of it by `jitter` (a uniform random `u32`: 0 gives half, `u32::MAX` all of
    /// it), or give up.
    pub fn delay(&self, attempt: u32, jitter: u32) -> Retry {
        let Some(nominal) = self.nominal(attempt) else {
            return Retry::GiveUp;
        };
        let half = nominal.as_millis() / 2;
        let extra = (nominal.as_millis() - half) * u128::from(jitter) / u128::from(u32::MAX);
        let ms = u64::try_from(half + extra).unwrap_or(u64::MAX);
        Retry::After(Duration::from_millis(ms))
    }

    /// The nominal delays, in order (one fewer than `max_attempts`).
    pub fn schedule(&self) -> impl Iterator<Item = Duration> + '_ {
        (1..self.max_attempts).map_while(|a| self.nominal(a))
    }

    /// The longest time from the first attempt to the last (all delays at their nominal
    /// value): when an event is given up at the latest.
    pub fn give_up_after(&self) -> Duration {
        self.schedule()
            .fold(Duration::ZERO, |sum, d| sum.saturating_add(d))
    }
}
