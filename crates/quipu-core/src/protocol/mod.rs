//! Serde wire types, by protocol. No I/O, no translation logic.
//!
//! - [`upstream`]: OpenAI chat completions as vLLM / SGLang / llama.cpp serve it.
//! - [`anthropic`]: the Anthropic messages format, request direction.
//! - [`anthropic_out`]: the Anthropic messages format, response direction (stream events).

pub mod anthropic;
pub mod anthropic_out;
pub mod upstream;
