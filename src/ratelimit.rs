//! Requests-per-minute and tokens-per-minute limits, per key and per tenant.
//!
//! Counts are exact: each key and each tenant has its own [`RateCounters`], held in the key
//! snapshot's [`Windows`] of each key (`auth` carries them over when it rebuilds the snapshot), so there is no shared
//! table to collide in — a sketch shared by thousands of keys over-counts and refuses keys under
//! their limit. Each count is one atomic word holding the window's number and the count,
//! updated by compare-and-swap: lock-free, exact across worker threads, and a request is only
//! counted if it is admitted.
//!
//! Windows are fixed 60-second periods of the gateway's clock; at most `limit` requests are
//! admitted per window, and a refused request is told, in `retry-after`, when the window ends.
//! Token limits count the tokens of finished requests (usage is only known at the end): once a
//! window's tokens reach the limit, further requests are refused until it ends.
//!
//! What that allows, knowingly: requests already admitted when the token count crosses the
//! limit still finish, so concurrent requests can take a window past its token limit by what
//! they use; and fixed windows admit up to twice a limit across a window boundary. Both are
//! the price of an exact count with one atomic operation per request and no per-key history.
//!
//! Why not `pingora-limits`: its `Rate` estimates counts in a count-min sketch shared by every
//! key, which over-counts on hash collisions — a key under its limit can be refused because of
//! another tenant's traffic. Limits here are per key and per tenant, and must be exact.

use crate::config::Limits;
use crate::store::KeyLimits;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
/// Bits of a packed count; the window number takes the other 24 (31 years of minutes).
const COUNT_BITS: u32 = 40;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const WINDOW_MASK: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// A count within one fixed window: `(window << 40) | count` in one atomic.
#[derive(Default)]
pub struct WindowCount(AtomicU64);

fn unpack(v: u64) -> (u64, u64) {
    (v >> COUNT_BITS, v & COUNT_MAX)
}

fn pack(window: u64, count: u64) -> u64 {
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

/// One key's or one tenant's windows.
#[derive(Default)]
pub struct RateCounters {
    requests: WindowCount,
    tokens: WindowCount,
}

impl std::fmt::Debug for RateCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RateCounters")
    }
}

/// The windows a request counts in: its key's, and its tenant's (shared by the tenant's keys).
#[derive(Debug, Default, Clone)]
pub struct Windows {
    pub key: Arc<RateCounters>,
    pub tenant: Arc<RateCounters>,
}

/// Whose limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Scope {
    Key,
    Tenant,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Limit {
    Requests,
    Tokens,
}

/// Which limit refused a request, and when to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub scope: Scope,
    pub limit: Limit,
    /// Seconds until the window ends (at least 1).
    pub retry_after: u64,
}

pub struct RateLimiter {
    defaults: Limits,
    epoch: Instant,
}

impl RateLimiter {
    pub fn new(defaults: Limits) -> RateLimiter {
        RateLimiter {
            defaults,
            epoch: Instant::now(),
        }
    }

    /// The current window's number and the seconds left in it (at least 1).
    fn window(&self) -> (u64, u64) {
        let elapsed = self.epoch.elapsed();
        let window = elapsed.as_secs() / WINDOW.as_secs();
        let end = Duration::from_secs((window + 1) * WINDOW.as_secs());
        let left = end.saturating_sub(elapsed).as_secs_f64().ceil().max(1.0) as u64;
        (window, left)
    }

    fn key_limits(&self, limits: &KeyLimits) -> (u64, u64) {
        (
            limits
                .requests_per_minute
                .unwrap_or(self.defaults.key_requests_per_minute),
            limits
                .tokens_per_minute
                .unwrap_or(self.defaults.key_tokens_per_minute),
        )
    }

    /// Counts a request against its key and tenant; refuses it if a limit is reached (a refused
    /// request is not counted). `limits` are the key's own (the defaults fill what it lacks).
    pub fn admit(&self, limits: &KeyLimits, w: &Windows) -> Result<(), Limited> {
        let (key_rpm, key_tpm) = self.key_limits(limits);
        let tenant_rpm = self.defaults.tenant_requests_per_minute;
        let tenant_tpm = self.defaults.tenant_tokens_per_minute;
        let (window, retry_after) = self.window();
        let refuse = |scope, limit| {
            Err(Limited {
                scope,
                limit,
                retry_after,
            })
        };
        // Token windows first: they do not count this request.
        if key_tpm > 0 && w.key.tokens.get(window) >= key_tpm {
            return refuse(Scope::Key, Limit::Tokens);
        }
        if tenant_tpm > 0 && w.tenant.tokens.get(window) >= tenant_tpm {
            return refuse(Scope::Tenant, Limit::Tokens);
        }
        let key_counted = if key_rpm > 0 {
            match w.key.requests.try_add(window, 1, key_rpm) {
                Some(counted) => Some(counted),
                None => return refuse(Scope::Key, Limit::Requests),
            }
        } else {
            None
        };
        if tenant_rpm > 0 && w.tenant.requests.try_add(window, 1, tenant_rpm).is_none() {
            if let Some(counted) = key_counted {
                w.key.requests.undo(counted, 1);
            }
            return refuse(Scope::Tenant, Limit::Requests);
        }
        Ok(())
    }

    /// Adds a finished request's tokens to its key's and tenant's windows.
    pub fn consumed(&self, limits: &KeyLimits, w: &Windows, tokens: u64) {
        let (window, _) = self.window();
        let (_, key_tpm) = self.key_limits(limits);
        if key_tpm > 0 {
            w.key.tokens.add(window, tokens);
        }
        if self.defaults.tenant_tokens_per_minute > 0 {
            w.tenant.tokens.add(window, tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn rpm(n: u64) -> KeyLimits {
        KeyLimits {
            requests_per_minute: Some(n),
            tokens_per_minute: None,
        }
    }

    #[test]
    fn thousands_of_keys_get_exactly_their_limit() {
        // Every key at its limit: a shared sketch would refuse some of them early.
        let keys: Vec<Windows> = (0..20_000).map(|_| Windows::default()).collect();
        let rl = RateLimiter::new(Limits::default());
        for (i, w) in keys.iter().enumerate() {
            for _ in 0..3 {
                assert_eq!(
                    rl.admit(&rpm(3), w),
                    Ok(()),
                    "key {i} refused under its limit"
                );
            }
        }
        for w in keys.iter().step_by(997) {
            let e = rl.admit(&rpm(3), w).unwrap_err();
            assert_eq!((e.scope, e.limit), (Scope::Key, Limit::Requests));
            assert!((1..=60).contains(&e.retry_after));
        }
    }

    #[test]
    fn tenant_and_token_limits() {
        let rl = RateLimiter::new(Limits {
            tenant_requests_per_minute: 2,
            tenant_tokens_per_minute: 100,
            key_tokens_per_minute: 50,
            ..Limits::default()
        });
        let none = KeyLimits::default();
        let p = Windows::default();
        let q = Windows::default();
        assert!(rl.admit(&none, &p).is_ok() && rl.admit(&none, &p).is_ok());
        let e = rl.admit(&none, &p).unwrap_err();
        assert_eq!((e.scope, e.limit), (Scope::Tenant, Limit::Requests));
        assert!(rl.admit(&none, &q).is_ok(), "another tenant is unaffected");
        rl.consumed(&none, &q, 50);
        let e = rl.admit(&none, &q).unwrap_err();
        assert_eq!((e.scope, e.limit), (Scope::Key, Limit::Tokens));
        // Two keys of one tenant share its window.
        let shared = Windows {
            key: Arc::default(),
            tenant: p.tenant.clone(),
        };
        let e = rl.admit(&none, &shared).unwrap_err();
        assert_eq!(e.scope, Scope::Tenant);
    }
}
