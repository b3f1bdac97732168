//! Requests-per-minute and tokens-per-minute limits, per key and per tenant, exact for one
//! replica and held within a small tolerance across many.
//!
//! **Windows** are fixed periods of the wall clock (UTC), `limits.window_s` long (60 s), so
//! every replica counts the same window and a restart does not open a fresh one. At most
//! `limit` requests are admitted per window; a refused request is told, in `retry-after`, when
//! the window ends. Token limits count the tokens of finished requests (usage is only known at
//! the end): once a window's tokens reach the limit, further requests are refused until it
//! ends. What that allows, knowingly: requests already admitted when the token count crosses
//! the limit still finish, so concurrent requests can take a window past its token limit by
//! what they use; and fixed windows admit up to twice a limit across a window boundary.
//!
//! Each key and each tenant has its own [`RateCounters`], held by the key snapshot (`auth`
//! carries them over when it rebuilds the snapshot), so there is no shared table to collide
//! in — a sketch shared by thousands of keys over-counts and refuses keys under their limit
//! (why not `pingora-limits`: its `Rate` is such a sketch).
//!
//! Two engines (`limits.engine`):
//!
//! - **Local** ([`local`]): one atomic word per count, compare-and-swap, exact — the engine of
//!   one replica on the embedded store. Each replica counts alone, so N replicas admit N × the
//!   limit.
//! - **Shared** ([`shared`], kept in step by [`sync`]): the store counts each window (one row
//!   per key or tenant, limit and window); each replica takes a *slice* of the window's quota
//!   in one statement, in the background, admits against it with the same atomic words (no
//!   store round trip on a request's path), takes more when it runs low, reports tokens used
//!   beyond its slice, and gives back what it holds idle. A request waits on the store only
//!   when its replica holds no slice yet (a key's first request on a replica in a window, or
//!   traffic faster than slices arrive). What the shared engine allows beyond the local one:
//!   each replica may end a window with up to one request's tokens past the token limit (the
//!   last request it admitted against its slice), and a slice given back by an idle replica is
//!   lost to the window if none asks for it again. With the store unreachable a replica counts
//!   alone (the local engine's numbers) until it answers again.
//!
//! PostgreSQL is the shared engine's store, not Redis/Valkey: several replicas already need
//! it, so there is no new service to run, secure and watch; slices make the store's cost one
//! statement per slice, not per request, which PostgreSQL takes easily (docs/replicas.md has
//! the figures).

mod local;
pub mod shared;
mod sync;

pub use local::WindowCount;

use crate::config::{LimitEngine, Limits};
use crate::store::{Backend, KeyLimits, LeaseStore, Store, TenantId};
use shared::{Dim, Shared, Slot};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

/// Whose windows a [`RateCounters`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Key(String),
    Tenant(TenantId),
}

impl Default for Subject {
    fn default() -> Self {
        Subject::Key(String::new())
    }
}

impl Subject {
    /// The name of one of its windows in the store: `key:<id>:requests`, `tenant:7:tokens`.
    fn window_name(&self, dim: Dim) -> String {
        let dim: &str = dim.into();
        match self {
            Subject::Key(id) => format!("key:{id}:{dim}"),
            Subject::Tenant(id) => format!("tenant:{id}:{dim}"),
        }
    }
}

/// One key's or one tenant's windows.
#[derive(Default)]
pub struct RateCounters {
    subject: Subject,
    requests: WindowCount,
    tokens: WindowCount,
    /// The shared engine's slices.
    shared_requests: Slot,
    shared_tokens: Slot,
    /// In the shared engine's list of counters it keeps in step.
    registered: AtomicBool,
}

impl RateCounters {
    pub fn new(subject: Subject) -> RateCounters {
        RateCounters {
            subject,
            ..RateCounters::default()
        }
    }

    fn slot(&self, dim: Dim) -> &Slot {
        match dim {
            Dim::Requests => &self.shared_requests,
            Dim::Tokens => &self.shared_tokens,
        }
    }
}

impl std::fmt::Debug for RateCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RateCounters({:?})", self.subject)
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

/// Where a window stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The window's number: milliseconds since the epoch ÷ the window's length.
    pub window: u64,
    /// Its start, milliseconds since the epoch.
    pub start_ms: i64,
    /// Milliseconds until it ends (at least 1).
    pub left_ms: u64,
    /// The clock's reading, milliseconds since the epoch.
    pub now_ms: i64,
}

impl Now {
    /// `retry-after` for a refusal in this window: whole seconds until it ends, at least 1.
    pub fn retry_after(&self) -> u64 {
        self.left_ms.div_ceil(1000).max(1)
    }
}

/// Windows aligned to the wall clock, corrected by the store's clock when the shared engine
/// learns it (so replicas whose clocks disagree still count the same window).
pub struct WindowClock {
    window_ms: u64,
    /// Store clock minus ours, milliseconds.
    offset_ms: AtomicI64,
    /// A fixed reading, for tests.
    frozen_ms: Option<i64>,
}

impl WindowClock {
    fn new(limits: &Limits) -> WindowClock {
        WindowClock {
            window_ms: u64::try_from(limits.window.as_millis())
                .unwrap_or(60_000)
                .max(1),
            offset_ms: AtomicI64::new(0),
            frozen_ms: None,
        }
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    pub fn now(&self) -> Now {
        let ms = self
            .frozen_ms
            .unwrap_or_else(crate::store::now_ms)
            .saturating_add(self.offset_ms.load(Ordering::Relaxed))
            .max(0);
        let len = i64::try_from(self.window_ms).unwrap_or(60_000);
        let window = ms / len;
        let start_ms = window * len;
        Now {
            window: window as u64,
            start_ms,
            left_ms: u64::try_from(start_ms + len - ms).unwrap_or(1).max(1),
            now_ms: ms,
        }
    }

    /// Learns the store's clock: it read `store_ms` during a call sent at `sent_ms` (our
    /// clock, uncorrected) that took `rtt_ms`.
    fn observe(&self, store_ms: i64, sent_ms: i64, rtt_ms: i64) {
        let offset = store_ms - (sent_ms + rtt_ms / 2);
        let old = self.offset_ms.load(Ordering::Relaxed);
        // Round trips jitter by a millisecond or two: only a real difference moves windows.
        if (offset - old).abs() > 5 {
            self.offset_ms.store(offset, Ordering::Relaxed);
        }
    }
}

pub struct RateLimiter {
    defaults: Limits,
    clock: Arc<WindowClock>,
    shared: Option<Arc<Shared>>,
}

impl RateLimiter {
    /// The local engine: exact in-process counts.
    pub fn new(defaults: Limits) -> RateLimiter {
        RateLimiter {
            clock: Arc::new(WindowClock::new(&defaults)),
            defaults,
            shared: None,
        }
    }

    /// The engine `defaults.engine` names for `store`: shared windows, and the task that keeps
    /// them in step with the store (run it on a runtime of its own, like the ledger writer),
    /// or the local engine and no task.
    pub fn for_store(
        defaults: Limits,
        store: Arc<dyn Store>,
    ) -> (RateLimiter, Option<impl std::future::Future<Output = ()>>) {
        let shared = match defaults.engine {
            LimitEngine::Store => true,
            LimitEngine::Local => false,
            LimitEngine::Auto => store.kind() == Backend::Postgres,
        };
        let mut rl = RateLimiter::new(defaults);
        if !shared {
            return (rl, None);
        }
        let (shared, queue) = Shared::new(rl.clock.clone());
        let task = sync::run(shared.clone(), store, queue);
        rl.shared = Some(shared);
        (rl, Some(task))
    }

    /// A limiter whose clock stands still at `ms` (tests: no window edge mid-test).
    pub fn frozen_at(defaults: Limits, ms: i64) -> RateLimiter {
        let mut rl = RateLimiter::new(defaults);
        rl.clock = Arc::new(WindowClock {
            frozen_ms: Some(ms),
            ..WindowClock::new(&defaults)
        });
        rl
    }

    /// `local` or `store`: what the log and `/metrics` say.
    pub fn engine(&self) -> &'static str {
        if self.shared.is_some() {
            "store"
        } else {
            "local"
        }
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
    pub async fn admit(&self, limits: &KeyLimits, w: &Windows) -> Result<(), Limited> {
        let (key_rpm, key_tpm) = self.key_limits(limits);
        let tenant_rpm = self.defaults.tenant_requests_per_minute;
        let tenant_tpm = self.defaults.tenant_tokens_per_minute;
        let now = self.clock.now();
        let refuse = |scope, limit| Limited {
            scope,
            limit,
            retry_after: now.retry_after(),
        };
        let Some(shared) = &self.shared else {
            return self.admit_local(now.window, [key_rpm, key_tpm, tenant_rpm, tenant_tpm], w);
        };
        // Token windows first: they do not count this request.
        if key_tpm > 0 && !shared.tokens_left(&w.key, key_tpm, &now).await {
            return Err(refuse(Scope::Key, Limit::Tokens));
        }
        if tenant_tpm > 0 && !shared.tokens_left(&w.tenant, tenant_tpm, &now).await {
            return Err(refuse(Scope::Tenant, Limit::Tokens));
        }
        if key_rpm > 0 && !shared.take_request(&w.key, key_rpm, &now).await {
            return Err(refuse(Scope::Key, Limit::Requests));
        }
        if tenant_rpm > 0 && !shared.take_request(&w.tenant, tenant_rpm, &now).await {
            if key_rpm > 0 {
                w.key.slot(Dim::Requests).undo_one(now.window);
            }
            return Err(refuse(Scope::Tenant, Limit::Requests));
        }
        Ok(())
    }

    /// The local engine's admission; `limits`: key rpm, key tpm, tenant rpm, tenant tpm.
    fn admit_local(&self, window: u64, limits: [u64; 4], w: &Windows) -> Result<(), Limited> {
        let [key_rpm, key_tpm, tenant_rpm, tenant_tpm] = limits;
        let retry_after = self.clock.now().retry_after();
        let refuse = |scope, limit| {
            Err(Limited {
                scope,
                limit,
                retry_after,
            })
        };
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
        let now = self.clock.now();
        let (_, key_tpm) = self.key_limits(limits);
        let tenant_tpm = self.defaults.tenant_tokens_per_minute;
        match &self.shared {
            None => {
                if key_tpm > 0 {
                    w.key.tokens.add(now.window, tokens);
                }
                if tenant_tpm > 0 {
                    w.tenant.tokens.add(now.window, tokens);
                }
            }
            Some(shared) => {
                if key_tpm > 0 {
                    shared.consumed(&w.key, key_tpm, &now, tokens);
                }
                if tenant_tpm > 0 {
                    shared.consumed(&w.tenant, tenant_tpm, &now, tokens);
                }
            }
        }
    }

    /// Gives back to the store the slices this replica holds and has not used (at shutdown,
    /// so the other replicas can use them this window). Best effort, bounded by `timeout`.
    pub async fn give_back(
        &self,
        store: &(impl LeaseStore + ?Sized),
        timeout: std::time::Duration,
    ) {
        if let Some(shared) = &self.shared {
            sync::give_back(shared, store, timeout).await;
        }
    }
}

#[cfg(test)]
mod tests;
