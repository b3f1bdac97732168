//! Alerts as webhooks, as far as they are pure: the events and their JSON ([`event`]), the
//! signature on each delivery and its verification ([`signature`]), the retry schedule
//! ([`backoff`]), which events a change fires ([`crossing`]), and an endpoint's URL, its
//! subscriptions and the bytes of one delivery ([`endpoint`]).
//!
//! The binary owns the rest: the outbox rows written with the change that caused them, the
//! one sender across replicas, the HTTP deliveries and the failure metric.

pub mod backoff;
pub mod crossing;
pub mod endpoint;
pub mod event;
pub mod signature;

#[cfg(test)]
mod tests;
