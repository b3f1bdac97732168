//! What a key or a tenant may do, as pure policy: the periods spend caps are counted in.
//!
//! - [`periods`]: a cap's period (`day`, `week`, `month` in the tenant's IANA zone, or
//!   `total`) around an instant, its end for `retry-after`, and its storage key.

pub mod periods;
