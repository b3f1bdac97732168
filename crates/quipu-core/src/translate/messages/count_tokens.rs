//! `POST /v1/messages/count_tokens` → the chat prompt an upstream counts.
//!
//! The request is validated and translated exactly like a create request's prompt (same
//! `model`, `system`, `messages` and `tools` rules, same billing-header stripping, same
//! thinking switch), so the count is what a create call with that prompt would be billed for
//! as input. Other create fields (`max_tokens`, sampling, `stream`, `tool_choice`, …) are
//! ignored, as the vendor's count endpoint ignores them.
//!
//! Upstream body: `{"model":…,"messages":[…],"tools":[…]?,…thinking switch…,
//! "add_generation_prompt":true}` (for a prefill, `"continue_final_message":true,
//! "add_generation_prompt":false`, as the create request sends, so the count matches): vLLM's
//! chat form of `/tokenize`, which each server's plan (`upstream_profile::count`) sends where
//! that server counts it.

use super::prompt::{write_prompt, PromptIn};
use super::request::{parse_request, write_thinking};
use crate::config::{Config, ModelId};
use crate::error::ApiError;
use crate::translate::common::request::resolve_model;
use crate::translate::upstream_body::{self, Endpoint};

/// Validates a count-tokens request; returns the model and the upstream `/tokenize` body.
pub fn count_tokens_to_upstream(
    body: &[u8],
    config: &Config,
) -> Result<(ModelId, Vec<u8>), ApiError> {
    let req = parse_request(body)?;
    let (model_name, model) = resolve_model(req.model, config)?;
    let mut out = Vec::with_capacity(body.len() + 128);
    upstream_body::open(&mut out, model);
    out.push(b',');
    let prompt = write_prompt(
        PromptIn {
            system: req.system,
            messages: req.messages,
            tools: req.tools,
        },
        model,
        config,
        &model_name,
        &mut out,
    )?;
    if let Some(raw) = req.thinking {
        write_thinking(raw, model, &mut out)?;
    }
    upstream_body::close(&mut out, model, Endpoint::Tokenize, prompt.prefill);
    Ok((model.id, out))
}
