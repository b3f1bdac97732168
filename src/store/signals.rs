//! The messages replicas sharing a store send each other (PostgreSQL `LISTEN`/`NOTIFY`, see
//! [`super::ReplicaChannel`]): calls for idle leases, and word that one came home.

use super::{CapPool, Pool, TenantId};

/// A message from one replica to the others sharing the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaSignal {
    /// `by` refused a request for money of `pool` other replicas hold: return idle leases.
    RecallLeases { pool: Pool, by: String },
    /// A replica returned (some of) its lease on `pool`.
    LeasesReturned { pool: Pool },
}

impl ReplicaSignal {
    /// The text sent: `recall 7 gw-1:42~…`, `returned 7` for a balance (as replicas without
    /// caps sent it), `recall-cap 7 key:key_8f…:day:2026-11-27 gw-1:42~…` and `returned-cap 7
    /// …` for a cap pool (which a replica that does not know caps ignores).
    pub fn to_payload(&self) -> String {
        match self {
            ReplicaSignal::RecallLeases {
                pool: Pool::Balance(t),
                by,
            } => format!("recall {t} {by}"),
            ReplicaSignal::RecallLeases {
                pool: Pool::Cap(c),
                by,
            } => format!("recall-cap {} {c} {by}", c.tenant),
            ReplicaSignal::LeasesReturned {
                pool: Pool::Balance(t),
            } => format!("returned {t}"),
            ReplicaSignal::LeasesReturned { pool: Pool::Cap(c) } => {
                format!("returned-cap {} {c}", c.tenant)
            }
        }
    }

    /// [`ReplicaSignal::to_payload`] backwards; `None` for text it does not know (a newer
    /// replica's message), which is ignored.
    pub fn from_payload(text: &str) -> Option<ReplicaSignal> {
        let (kind, rest) = text.split_once(' ')?;
        let (tenant, rest) = rest
            .split_once(' ')
            .map_or((rest, None), |(t, r)| (t, Some(r)));
        let tenant: TenantId = tenant.parse().ok()?;
        let (pool, rest) = match kind {
            "recall" | "returned" => (Pool::Balance(tenant), rest),
            "recall-cap" | "returned-cap" => {
                let (id, rest) = rest?
                    .split_once(' ')
                    .map_or((rest?, None), |(p, r)| (p, Some(r)));
                (Pool::Cap(CapPool::parse(id, tenant)?), rest)
            }
            _ => return None,
        };
        match (kind, rest) {
            ("recall" | "recall-cap", Some(by)) if !by.is_empty() => {
                Some(ReplicaSignal::RecallLeases {
                    pool,
                    by: by.to_owned(),
                })
            }
            ("returned" | "returned-cap", None) => Some(ReplicaSignal::LeasesReturned { pool }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_signals_round_trip_and_unknown_text_is_ignored() {
        let cap = Pool::Cap(CapPool::parse("key:key_8f2c:day:2026-11-27", 7).unwrap());
        assert_eq!(
            ReplicaSignal::from_payload("recall 7 gw-1:42~00ff"),
            Some(ReplicaSignal::RecallLeases {
                pool: Pool::Balance(7),
                by: "gw-1:42~00ff".into()
            }),
            "the text replicas without caps send"
        );
        for s in [
            ReplicaSignal::RecallLeases {
                pool: Pool::Balance(7),
                by: "gw-1:42~00ff".into(),
            },
            ReplicaSignal::LeasesReturned {
                pool: Pool::Balance(12),
            },
            ReplicaSignal::RecallLeases {
                pool: cap.clone(),
                by: "gw-2:1~ab".into(),
            },
            ReplicaSignal::LeasesReturned { pool: cap },
        ] {
            assert_eq!(ReplicaSignal::from_payload(&s.to_payload()), Some(s));
        }
        for bad in [
            "",
            "recall",
            "recall x r",
            "recall 7",
            "returned 7 extra",
            "later 7",
            "recall-cap 7 balance:7 r",
            "returned-cap 8 tenant:7:month:2026-11",
            "returned-cap 7",
        ] {
            assert_eq!(ReplicaSignal::from_payload(bad), None, "{bad}");
        }
    }
}
