//! Money on the request path: admission by reservation ([`accounts`]) and the ledger writer
//! ([`ledger`]), which at a shutdown with the store unreachable writes what it could not store to
//! a spill file ([`spill`]). Prices and the exact money type live in [`crate::money`]; durable state in
//! [`crate::store`].

pub mod accounts;
pub mod ledger;
pub mod spill;

pub use accounts::{Accounts, Refusal, Reservation};
pub use ledger::{LedgerHandle, LedgerWriter};
