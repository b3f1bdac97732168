//! Money on the request path. The policy — what a request reserves, what it is charged, price
//! rules — is pure and lives in the core ([`policy`], re-exported here); this module holds the
//! state: admission by reservation against leased balance ([`accounts`]) and the ledger writer
//! ([`ledger`]), which at a shutdown with the store unreachable writes what it could not store
//! to a spill file ([`spill`]); which caps a request reserves against, and what a refusal by one
//! says ([`caps`]). The exact money type is [`crate::money`]; durable state is in
//! [`crate::store`].

pub mod accounts;
pub mod caps;
pub mod ledger;
pub mod spill;

pub use accounts::{Accounts, CapClaim, Refusal, Reservation};
pub use ledger::{LedgerHandle, LedgerWriter};
pub use quipu_core::billing as policy;
