//! How much of a tenant's balance one gateway replica leases at a time.
//!
//! A replica admits requests only against money it holds a lease on (`src/billing/accounts.rs`
//! and `src/store`). While the tenant has plenty unleased, a replica takes `lease_chunk` at
//! once, so spending costs one store round trip per chunk. When the unleased balance is small
//! next to the chunk, the first replica to ask would otherwise take all of it and leave the
//! others nothing to admit against (a tenant with S/ 1.00 and the default chunk of S/ 5.00):
//! then a grant is only a share of what is left ([`LOW_BALANCE_SHARE`]), never less than what
//! the request at hand needs, so money stays spread over the replicas that are spending it.
//! Pure: the store applies it inside the transaction that reads the balance and the leases.

use crate::money::Pen;

/// When a chunk is more than this share of the unleased balance, a grant is that share.
pub const LOW_BALANCE_SHARE: i128 = 4;

/// The grant for a replica that needs `need` more to admit its request and would like `chunk`,
/// out of `unleased` (the balance minus every replica's lease): `chunk` while that is at most
/// a quarter of `unleased`, else a quarter of `unleased`, at least `need`; never more than
/// `unleased` nor less than zero.
pub fn lease_grant(need: Pen, chunk: Pen, unleased: Pen) -> Pen {
    if unleased <= Pen::ZERO {
        return Pen::ZERO;
    }
    let share = Pen::from_picos(unleased.picos() / LOW_BALANCE_SHARE);
    let want = chunk.max(need).min(share.max(need));
    want.min(unleased).max(Pen::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Pen {
        Pen::parse(x, 12).unwrap()
    }

    #[test]
    fn a_full_chunk_while_the_balance_is_large() {
        assert_eq!(lease_grant(s("0.05"), s("5.00"), s("100.00")), s("5.00"));
        assert_eq!(lease_grant(s("0.05"), s("5.00"), s("20.00")), s("5.00"));
        // A request larger than the chunk gets what it needs.
        assert_eq!(lease_grant(s("7.00"), s("5.00"), s("100.00")), s("7.00"));
    }

    #[test]
    fn a_share_of_a_small_balance_never_less_than_the_need() {
        // The tenant: S/ 1.00 against a chunk of S/ 5.00.
        assert_eq!(lease_grant(s("0.05"), s("5.00"), s("1.00")), s("0.25"));
        assert_eq!(lease_grant(s("0.05"), s("5.00"), s("0.75")), s("0.1875"));
        assert_eq!(lease_grant(s("0.05"), s("5.00"), s("0.12")), s("0.05"));
        // Less left than the need: all of it (the caller refuses if it is not enough).
        assert_eq!(lease_grant(s("0.05"), s("5.00"), s("0.03")), s("0.03"));
        assert_eq!(lease_grant(s("0.05"), s("5.00"), Pen::ZERO), Pen::ZERO);
        assert_eq!(
            lease_grant(s("0.05"), s("5.00"), Pen::from_picos(-1)),
            Pen::ZERO
        );
    }

    #[test]
    fn a_grant_is_always_within_the_need_and_the_unleased_balance() {
        for need in 0..40i128 {
            for unleased in -3..200i128 {
                let (need, unleased) = (Pen::from_picos(need * 7), Pen::from_picos(unleased * 5));
                let g = lease_grant(need, Pen::from_picos(50), unleased);
                assert!(g >= Pen::ZERO && g <= unleased.max(Pen::ZERO));
                assert!(
                    g >= need.min(unleased.max(Pen::ZERO)),
                    "{need:?} {unleased:?} {g:?}"
                );
            }
        }
    }
}
