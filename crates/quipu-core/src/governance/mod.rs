//! What a key or a tenant may do, as pure policy.
//!
//! - [`models`]: a key's model list (slugs, aliases, globs), checked against the catalog and
//!   compiled into the set of models it allows.
//! - [`periods`]: a cap's period (`day`, `week`, `month` in the tenant's IANA zone, or
//!   `total`) around an instant, its end for `retry-after`, and its storage key.
//! - [`caps`]: spend caps and the rule of admission: a request's worst case must fit what is
//!   left of every cap that applies.
//! - [`key_policy`]: a key's and a tenant's limits and the admission checks in order (usable,
//!   model, caps), each refusal typed with its HTTP answer.
//! - [`self_service`]: what a manage key may give the keys it creates or limits.

pub mod caps;
pub mod key_policy;
pub mod models;
pub mod periods;
pub mod self_service;
pub mod webhooks;
