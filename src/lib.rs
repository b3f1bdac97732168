//! Quipu: an LLM API gateway on Pingora.
//!
//! Clients speak the OpenAI chat-completions format or the Anthropic messages format; Quipu
//! authenticates their keys, rewrites both into one upstream protocol (OpenAI chat completions
//! as vLLM serves it), meters tokens on the response stream and bills tenants in soles.
//!
//! Data flows one way: route → auth → admission → translate → pick a replica → stream
//! translate + meter → settle + record. Protocol work is pure (`sse`, `usage`, `translate`);
//! I/O lives at the edges (`proxy`, `store`).

pub mod config;
pub mod error;
pub mod keys;
pub mod money;
pub mod ops;
pub mod protocol;
pub mod sse;
pub mod store;
pub mod translate;
pub mod usage;
