//! Requests-per-minute and tokens-per-minute limits, per key and per tenant.
//!
//! Built on `pingora-limits`' [`Rate`]: lock-free count-min sketches shared by every worker
//! thread. Windows are fixed 60-second periods (a window starts when the previous one expired);
//! at most `limit` requests are admitted per window, and a refused request is told, in
//! `retry-after`, when the window ends. Token limits count the tokens of finished requests
//! (usage is only known at the end): once a window's tokens reach the limit, further requests
//! are refused until it ends.
//!
//! The sketch may over-count when thousands of keys collide in one window (never under-count),
//! so a limit can bite slightly early under extreme key cardinality, never late.

use crate::auth::Principal;
use crate::config::Limits;
use pingora_limits::rate::Rate;
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(60);

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// `key` or `tenant`.
    pub scope: &'static str,
    /// `requests` or `tokens`.
    pub limit: &'static str,
    /// Seconds until the window ends (at least 1).
    pub retry_after: u64,
}

pub struct RateLimiter {
    defaults: Limits,
    key_requests: Rate,
    key_tokens: Rate,
    tenant_requests: Rate,
    tenant_tokens: Rate,
}

fn seconds_left(rate: &Rate, key: &impl std::hash::Hash) -> u64 {
    let frac = rate.rate_with(key, |c| c.current_interval_fraction);
    ((1.0 - frac) * WINDOW.as_secs_f64()).ceil().max(1.0) as u64
}

fn key_hash(p: &Principal) -> (u8, &str) {
    (0, p.key_id.as_str())
}

impl RateLimiter {
    pub fn new(defaults: Limits) -> RateLimiter {
        RateLimiter {
            defaults,
            key_requests: Rate::new(WINDOW),
            key_tokens: Rate::new(WINDOW),
            tenant_requests: Rate::new(WINDOW),
            tenant_tokens: Rate::new(WINDOW),
        }
    }

    fn key_limits(&self, p: &Principal) -> (u64, u64) {
        (
            p.limits
                .requests_per_minute
                .unwrap_or(self.defaults.key_requests_per_minute),
            p.limits
                .tokens_per_minute
                .unwrap_or(self.defaults.key_tokens_per_minute),
        )
    }

    /// Counts a request against its key and tenant; refuses it if a limit is reached.
    pub fn admit(&self, p: &Principal) -> Result<(), Limited> {
        let (key_rpm, key_tpm) = self.key_limits(p);
        let tenant_rpm = self.defaults.tenant_requests_per_minute;
        let tenant_tpm = self.defaults.tenant_tokens_per_minute;
        let key = key_hash(p);
        let tenant = (1u8, p.tenant_id);
        // Token windows first: they do not count this request.
        if key_tpm > 0 && self.key_tokens.rate_with(&key, |c| c.curr_samples) as u64 >= key_tpm {
            return Err(Limited {
                scope: "key",
                limit: "tokens",
                retry_after: seconds_left(&self.key_tokens, &key),
            });
        }
        if tenant_tpm > 0
            && self.tenant_tokens.rate_with(&tenant, |c| c.curr_samples) as u64 >= tenant_tpm
        {
            return Err(Limited {
                scope: "tenant",
                limit: "tokens",
                retry_after: seconds_left(&self.tenant_tokens, &tenant),
            });
        }
        if key_rpm > 0 && self.key_requests.observe(&key, 1) as u64 > key_rpm {
            return Err(Limited {
                scope: "key",
                limit: "requests",
                retry_after: seconds_left(&self.key_requests, &key),
            });
        }
        if tenant_rpm > 0 && self.tenant_requests.observe(&tenant, 1) as u64 > tenant_rpm {
            return Err(Limited {
                scope: "tenant",
                limit: "requests",
                retry_after: seconds_left(&self.tenant_requests, &tenant),
            });
        }
        Ok(())
    }

    /// Adds a finished request's tokens to its key's and tenant's windows.
    pub fn consumed(&self, p: &Principal, tokens: u64) {
        let tokens = tokens.min(isize::MAX as u64) as isize;
        let (_, key_tpm) = self.key_limits(p);
        if key_tpm > 0 {
            self.key_tokens.observe(&key_hash(p), tokens);
        }
        if self.defaults.tenant_tokens_per_minute > 0 {
            self.tenant_tokens.observe(&(1u8, p.tenant_id), tokens);
        }
    }
}
