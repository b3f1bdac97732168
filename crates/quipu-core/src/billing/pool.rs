//! Pools of money a request reserves against: a tenant's balance, and each spend cap that
//! applies to it (its key's cap for the current period, its tenant's monthly cap).
//!
//! A cap is a pool like a balance: what is left of it is `limit − spent this period`, and
//! gateway replicas lease parts of it, so a request's worst case is reserved against every
//! pool that applies before it runs, exactly as against the balance — one [`super::book::Book`]
//! per pool, the same proven bookkeeping — and no cap is ever exceeded, however many replicas
//! spend it at once. A new period is a new pool (its id carries the period), so a cap resets
//! by itself at the period's end in the cap's time zone.

use crate::governance::periods::PeriodKey;
use std::fmt;

/// A tenant's id, as the store numbers tenants.
pub type TenantId = i64;

/// Whose cap a cap pool is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CapOwner {
    /// A key's own cap (its public id, `key_…`).
    Key(String),
    /// The tenant's monthly cap.
    Tenant,
}

/// One cap for one period.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CapPool {
    pub tenant: TenantId,
    pub owner: CapOwner,
    pub period: PeriodKey,
}

/// A pool of money a request reserves against.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    Balance(TenantId),
    Cap(CapPool),
}

impl Pool {
    /// The tenant whose money it is.
    pub fn tenant(&self) -> TenantId {
        match self {
            Pool::Balance(t) => *t,
            Pool::Cap(c) => c.tenant,
        }
    }
}

impl fmt::Display for CapPool {
    /// The store's id of the pool: `key:key_8f2c…:day:2026-11-27`, `tenant:7:month:2026-11`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            CapOwner::Key(id) => write!(f, "key:{id}:{}", self.period),
            CapOwner::Tenant => write!(f, "tenant:{}:{}", self.tenant, self.period),
        }
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pool::Balance(t) => write!(f, "balance:{t}"),
            Pool::Cap(c) => c.fmt(f),
        }
    }
}

impl CapPool {
    /// Reads a pool id written by [`fmt::Display`] back (`tenant` from the store's row).
    pub fn parse(text: &str, tenant: TenantId) -> Option<CapPool> {
        let (owner, rest) = if let Some(rest) = text.strip_prefix("key:") {
            let (id, period) = rest.split_once(':')?;
            (CapOwner::Key(id.to_owned()), period)
        } else {
            let rest = text.strip_prefix("tenant:")?;
            let (t, period) = rest.split_once(':')?;
            if t.parse::<TenantId>().ok()? != tenant {
                return None;
            }
            (CapOwner::Tenant, period)
        };
        Some(CapPool {
            tenant,
            owner,
            period: PeriodKey::parse(rest).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_ids_round_trip() {
        for (owner, period) in [
            (CapOwner::Key("key_8f2c00aa11bb".into()), "day:2026-11-27"),
            (CapOwner::Key("key_8f2c00aa11bb".into()), "total"),
            (CapOwner::Tenant, "month:2026-11"),
            (CapOwner::Key("key_1".into()), "week:2026-W48"),
        ] {
            let pool = CapPool {
                tenant: 7,
                owner,
                period: PeriodKey::parse(period).unwrap(),
            };
            let text = pool.to_string();
            assert_eq!(CapPool::parse(&text, 7), Some(pool), "{text}");
        }
        assert_eq!(CapPool::parse("tenant:8:month:2026-11", 7), None);
        assert_eq!(CapPool::parse("balance:7", 7), None);
        assert_eq!(Pool::Balance(3).to_string(), "balance:3");
    }
}
