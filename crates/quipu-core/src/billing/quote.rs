//! What a request reserves at admission, and the input it is billed when the upstream never
//! says.
//!
//! **Worst case.** The upstream refuses `prompt + max_tokens > context window` (vLLM, SGLang,
//! llama.cpp), so the input is at most `context_window − max_tokens`. Below that, a text prompt
//! is bounded by its bytes (every token covers at least one byte) plus [`TEMPLATE_ALLOWANCE`];
//! an image costs hundreds to thousands of tokens whatever its URL's length, so a prompt with
//! one is given the whole bound. Should an upstream still report more, the charge is capped at
//! the reservation and the excess recorded as unbilled ([`super::settle`]).
//!
//! **Estimate.** `prompt bytes / PROMPT_BYTES_PER_TOKEN` (at least 1, at most the worst case):
//! what is billed when the upstream reports no input tokens (a stream cut before its usage
//! report, a request cancelled by the client).

use super::Prices;
use crate::money::Pen;

/// Tokens a chat template may add around the messages (role markers, a default system prompt,
/// tool-use instructions) beyond what their JSON bytes already bound.
pub const TEMPLATE_ALLOWANCE: u64 = 512;
/// Bytes of prompt JSON per token for the input estimate. Real tokenizers average 3–4.5 bytes
/// per token on text and JSON overhead adds bytes that are not tokens, so 4 rarely overstates
/// and never exceeds the reservation.
pub const PROMPT_BYTES_PER_TOKEN: u64 = 4;

/// What admission knows of a request's prompt (see `UpstreamRequest::prompt_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptSize {
    /// Bytes of prompt material (messages, system, tools) in the upstream body.
    pub bytes: u64,
    /// The prompt carries an image part.
    pub has_images: bool,
    /// After defaulting and clamping.
    pub max_tokens: u32,
}

/// What a request may cost, decided at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quote {
    /// Input tokens the reservation covers.
    pub worst_input: u64,
    /// Input tokens billed if the upstream reports none.
    pub input_estimate: u64,
    /// The amount to reserve: `worst_input` at the higher input rate + `max_tokens` of output.
    pub worst: Pen,
}

/// Quotes a request on a model with `context_window` tokens and `prices`.
pub fn quote(prompt: PromptSize, context_window: u64, prices: &Prices) -> Quote {
    let max_tokens = u64::from(prompt.max_tokens);
    let bound = context_window.saturating_sub(max_tokens);
    let worst_input = if prompt.has_images {
        bound
    } else {
        prompt.bytes.saturating_add(TEMPLATE_ALLOWANCE).min(bound)
    };
    let input_estimate = (prompt.bytes / PROMPT_BYTES_PER_TOKEN)
        .max(1)
        .min(worst_input);
    Quote {
        worst_input,
        input_estimate,
        worst: prices.worst_case(worst_input, max_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::test_support::colibri as prices;

    fn text(bytes: u64, max_tokens: u32) -> PromptSize {
        PromptSize {
            bytes,
            has_images: false,
            max_tokens,
        }
    }

    #[test]
    fn text_is_bounded_by_its_bytes() {
        let q = quote(text(1000, 100), 131_072, &prices());
        assert_eq!(q.worst_input, 1000 + TEMPLATE_ALLOWANCE);
        assert_eq!(q.input_estimate, 1000 / PROMPT_BYTES_PER_TOKEN);
        assert_eq!(q.worst, prices().worst_case(1000 + TEMPLATE_ALLOWANCE, 100));
    }

    #[test]
    fn an_image_takes_the_whole_window_bound() {
        let q = quote(
            PromptSize {
                has_images: true,
                ..text(200, 1000)
            },
            131_072,
            &prices(),
        );
        assert_eq!(q.worst_input, 131_072 - 1000);
        assert_eq!(q.input_estimate, 50);
    }

    #[test]
    fn the_window_caps_a_long_prompt_and_its_estimate() {
        // The upstream refuses prompt + max_tokens > window, so that bound caps any estimate.
        let q = quote(text(300_000, 8192), 32_768, &prices());
        assert_eq!(q.worst_input, 32_768 - 8192);
        assert_eq!(q.input_estimate, 32_768 - 8192);
        // max_tokens beyond the window: no input fits, nothing below zero.
        let q = quote(text(10, 9000), 4096, &prices());
        assert_eq!((q.worst_input, q.input_estimate), (0, 0));
    }

    #[test]
    fn an_empty_prompt_is_estimated_at_one_token() {
        assert_eq!(quote(text(0, 10), 4096, &prices()).input_estimate, 1);
    }
}
