//! Quipu: an LLM API gateway on Pingora.
//!
//! Clients speak the OpenAI chat-completions format or the Anthropic messages format; Quipu
//! authenticates their keys, rewrites both into one upstream protocol (OpenAI chat completions
//! as vLLM serves it), meters tokens on the response stream and bills tenants in soles.
//!
//! Data flows one way: route → auth → admission → translate → pick a replica → stream
//! translate + meter → settle + record. Protocol work is pure (`sse`, `usage`, `translate`);
//! I/O lives at the edges (`proxy`, `store`).

pub use quipu_core::{
    account, ascii, config, error, h1, money, protocol, route, sse, translate, upstream_profile,
    usage,
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
