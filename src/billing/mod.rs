//! Money on the request path: admission by reservation ([`accounts`]) and the ledger writer
//! ([`ledger`]). Prices and the exact money type live in [`crate::money`]; durable state in
//! [`crate::store`].

pub mod accounts;
pub mod ledger;

pub use accounts::{Accounts, Refusal, Reservation};
pub use ledger::{LedgerHandle, LedgerWriter};
