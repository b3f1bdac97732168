//! Serde wire types, by protocol. No I/O, no translation logic.
//!
//! - [`upstream`]: OpenAI chat completions as vLLM / SGLang / llama.cpp serve it.
//! - [`anthropic`]: the Anthropic messages format, request direction.

pub mod anthropic;
pub mod upstream;
