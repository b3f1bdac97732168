//! Quipu: an LLM API gateway on Pingora.
//!
//! Clients speak the OpenAI chat-completions format, the Anthropic messages format or the
//! OpenAI Responses API; Quipu authenticates their keys, rewrites all three into one upstream
//! protocol (OpenAI chat completions as vLLM serves it), meters tokens on the response stream
//! and bills tenants in soles.
//!
//! Data flows one way: route → auth → admission → translate → pick a replica → stream
//! translate + meter → settle + record. Protocol, money and policy are pure, in the
//! `quipu-core` crate re-exported below (`sse`, `usage`, `translate`, …); this crate is the I/O
//! around them (`http`, `proxy`, `store`, …). docs/architecture.md has the layout and where
//! each kind of change goes.

pub use quipu_core::{
    account, ascii, config, error, governance, h1, money, protocol, route, schedule, sse,
    translate, upstream_profile, usage,
};

pub mod admin;
pub mod auth;
pub mod billing;
pub mod catalog;
pub mod config_file;
pub mod http;
pub mod keys;
pub mod logger;
pub mod metrics;
pub mod ops;
pub mod proxy;
pub mod ratelimit;
pub mod server;
pub mod store;
pub mod threads;
pub mod upstream;
pub mod web;
pub mod webhooks;
