//! Billing policy: what a request reserves, what it is charged when it ends, what is left
//! unbilled, and how amounts are shown to people. Pure: no clock, no store, no I/O.
//!
//! The money of one request goes through three steps, each a function here:
//!
//! 1. **Quote** ([`quote::quote`]), at admission: the most the request can cost — its prompt's
//!    upper bound in tokens plus `max_tokens` of output — and the input estimate billed if the
//!    upstream never reports its prompt tokens. The proxy reserves `quote.worst` against the
//!    tenant's balance (`src/billing/accounts.rs` holds reservations and leases).
//! 2. **Price** ([`price::Prices::charge`]): tokens × the model's rates. Every price rule (a
//!    discount, a minimum charge, a price per image) belongs there, with its unit tests.
//! 3. **Settle** ([`settle::settle`]), when the request ends on any path: what the upstream
//!    reported (or the estimate), the full price, the charge (never above the reservation) and
//!    the excess left `unbilled` (in the ledger row and `quipu_unbilled_pen_total`).
//!
//! [`lease`] decides how much of a balance one gateway replica leases at a time (smaller
//! shares when the balance is low); [`book`] is one tenant's money on one replica as a state
//! machine — reservations, charges not yet written, the lease as the store last read it — that
//! the I/O layer drives, with its invariants proven over every interleaving (`book_model`).
//!
//! [`display`] writes amounts for people (`S/ 1,234.56`; under a céntimo the exact figure, or
//! its significant digits).
//! The exact unit itself ([`crate::money::Pen`], [`crate::money::Rate`]) lives in
//! [`crate::money`].

pub mod book;
#[cfg(test)]
mod book_model;
pub mod display;
pub mod lease;
pub mod pool;
pub mod price;
pub mod quote;
pub mod settle;

pub use price::Prices;
pub use quote::{quote, PromptSize, Quote};
pub use settle::{settle, Charging, Settlement};

/// Prices and usages for the policy's tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::Prices;
    use crate::money::Rate;
    use crate::usage::Usage;

    pub fn prices(input: &str, cached: &str, output: &str) -> Prices {
        Prices {
            input: Rate::parse(input).unwrap(),
            cached: Rate::parse(cached).unwrap(),
            output: Rate::parse(output).unwrap(),
        }
    }

    /// colibri's prices in the embedded configuration.
    pub fn colibri() -> Prices {
        prices("0.20", "0.05", "0.80")
    }

    pub fn usage(prompt: u64, cached: u64, completion: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
        }
    }
}
