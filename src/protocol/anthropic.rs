//! Wire types of the Anthropic messages format, request direction (what clients send to
//! `POST /v1/messages` and `/v1/messages/count_tokens`).
//!
//! Every field is a borrowed `&RawValue`: the translator checks each one itself so that a bad
//! value gets an error naming its exact path (`messages[2].content[0].source.data`), and so
//! that text is copied to the upstream as the client escaped it, never decoded and re-encoded.
//! Fields not declared here (`cache_control`, `citations`, `output_config`, `effort`,
//! `context_management`, `safeguards`, `defer_loading`, …) are skipped by serde and so dropped.
//! A JSON `null` reads as `None`, like an absent field.
//!
//! Responses and stream events are written directly as bytes by
//! [`crate::translate::messages`]; they have no types here.
//!
//! Vendor reference: <https://docs.anthropic.com/en/api/messages>.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The top level of a create-message (or count-tokens) request.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicRequest<'a> {
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub temperature: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub top_p: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub top_k: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub stop_sequences: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub metadata: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub thinking: Option<&'a RawValue>,
}

/// One entry of `messages`.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicMessage<'a> {
    #[serde(borrow, default)]
    pub role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
}

/// A content block of any type: the fields of every request-side block type, so one parse
/// serves them all (`type` decides which are read).
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicBlock<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    /// `text`.
    #[serde(borrow, default)]
    pub text: Option<&'a RawValue>,
    /// `image`, `document`.
    #[serde(borrow, default)]
    pub source: Option<&'a RawValue>,
    /// `tool_use`.
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    /// `tool_use`; `tool_reference` uses `tool_name`.
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tool_name: Option<&'a RawValue>,
    /// `tool_use`.
    #[serde(borrow, default)]
    pub input: Option<&'a RawValue>,
    /// `tool_result`.
    #[serde(borrow, default)]
    pub tool_use_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub is_error: Option<&'a RawValue>,
    /// `thinking`.
    #[serde(borrow, default)]
    pub thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub signature: Option<&'a RawValue>,
    /// `redacted_thinking`.
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
}

/// `image.source` / `document.source`: `{type:"base64",media_type,data}`, `{type:"url",url}`
/// or (documents) `{type:"text",media_type,data}`.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicSource<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub media_type: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub url: Option<&'a RawValue>,
}

/// One entry of `tools`. Tool-level extras (`cache_control`, `defer_loading`, `strict`,
/// `input_examples`, `eager_input_streaming`, `allowed_callers`) are not declared: dropped.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicTool<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub description: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub input_schema: Option<&'a RawValue>,
}

/// `tool_choice`: `{type:"auto"|"any"|"tool"|"none", name?, disable_parallel_tool_use?}`.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicToolChoice<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub disable_parallel_tool_use: Option<&'a RawValue>,
}

/// `thinking`: `{type:"enabled",budget_tokens}`, `{type:"disabled"}`, `{type:"adaptive"}`.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicThinking<'a> {
    #[serde(borrow, default, rename = "type")]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub budget_tokens: Option<&'a RawValue>,
}

/// `metadata`: `{user_id?: string|null}`.
#[derive(Debug, Default, Deserialize)]
pub struct AnthropicMetadata<'a> {
    #[serde(borrow, default)]
    pub user_id: Option<&'a RawValue>,
}
