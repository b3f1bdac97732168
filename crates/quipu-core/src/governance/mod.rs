//! What a key or a tenant may do, as pure policy.
//!
//! - [`models`]: a key's model list (slugs, aliases, globs), checked against the catalog and
//!   compiled into the set of models it allows.
//! - [`periods`]: a cap's period (`day`, `week`, `month` in the tenant's IANA zone, or
//!   `total`) around an instant, its end for `retry-after`, and its storage key.

pub mod models;
pub mod periods;
