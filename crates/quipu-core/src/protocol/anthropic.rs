//! Wire types of the Anthropic messages format, request direction (what clients send to
//! `POST /v1/messages` and `/v1/messages/count_tokens`).
//!
//! Fields are borrowed `&RawValue`s: the translator checks each one itself so that a bad
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

use serde_json::value::RawValue;

raw_object! {
    /// The top level of a create-message (or count-tokens) request.
    pub struct AnthropicRequest {
        model: &'a RawValue = "model",
        messages: &'a RawValue = "messages",
        system: &'a RawValue = "system",
        max_tokens: &'a RawValue = "max_tokens",
        temperature: &'a RawValue = "temperature",
        top_p: &'a RawValue = "top_p",
        top_k: &'a RawValue = "top_k",
        stop_sequences: &'a RawValue = "stop_sequences",
        stream: &'a RawValue = "stream",
        metadata: &'a RawValue = "metadata",
        tools: &'a RawValue = "tools",
        tool_choice: &'a RawValue = "tool_choice",
        thinking: &'a RawValue = "thinking",
    }
}

raw_object! {
    /// The same top level with `messages` and `tools` parsed in the same pass: the fast path.
    /// Any error in it sends the translator back to [`AnthropicRequest`], whose raw fields give
    /// every error its exact path.
    pub struct AnthropicRequestTyped {
        model: &'a RawValue = "model",
        messages: Vec<AnthropicMessage<'a>> = "messages",
        system: &'a RawValue = "system",
        max_tokens: &'a RawValue = "max_tokens",
        temperature: &'a RawValue = "temperature",
        top_p: &'a RawValue = "top_p",
        top_k: &'a RawValue = "top_k",
        stop_sequences: &'a RawValue = "stop_sequences",
        stream: &'a RawValue = "stream",
        metadata: &'a RawValue = "metadata",
        tools: Vec<AnthropicTool<'a>> = "tools",
        tool_choice: &'a RawValue = "tool_choice",
        thinking: &'a RawValue = "thinking",
    }
}

raw_object! {
    /// One entry of `messages`.
    pub struct AnthropicMessage {
        role: &'a RawValue = "role",
        content: &'a RawValue = "content",
    }
}

raw_object! {
    /// A content block of any type: the fields of every request-side block type, so one parse
    /// serves them all (`type` decides which are read).
    pub struct AnthropicBlock {
        kind: &'a RawValue = "type",
        /// `text`.
        text: &'a RawValue = "text",
        /// `image`, `document`.
        source: &'a RawValue = "source",
        /// `tool_use`.
        id: &'a RawValue = "id",
        /// `tool_use`; `tool_reference` uses `tool_name`.
        name: &'a RawValue = "name",
        tool_name: &'a RawValue = "tool_name",
        /// `tool_use`.
        input: &'a RawValue = "input",
        /// `tool_result`.
        tool_use_id: &'a RawValue = "tool_use_id",
        content: &'a RawValue = "content",
        is_error: &'a RawValue = "is_error",
        /// `thinking`.
        thinking: &'a RawValue = "thinking",
        signature: &'a RawValue = "signature",
        /// `redacted_thinking`.
        data: &'a RawValue = "data",
    }
}

raw_object! {
    /// `image.source` / `document.source`: `{type:"base64",media_type,data}`, `{type:"url",url}`
    /// or (documents) `{type:"text",media_type,data}`.
    pub struct AnthropicSource {
        kind: &'a RawValue = "type",
        media_type: &'a RawValue = "media_type",
        data: &'a RawValue = "data",
        url: &'a RawValue = "url",
    }
}

raw_object! {
    /// One entry of `tools`. Tool-level extras (`cache_control`, `defer_loading`, `strict`,
    /// `input_examples`, `eager_input_streaming`, `allowed_callers`) are not declared: dropped.
    pub struct AnthropicTool {
        kind: &'a RawValue = "type",
        name: &'a RawValue = "name",
        description: &'a RawValue = "description",
        input_schema: &'a RawValue = "input_schema",
    }
}

raw_object! {
    /// `tool_choice`: `{type:"auto"|"any"|"tool"|"none", name?, disable_parallel_tool_use?}`.
    pub struct AnthropicToolChoice {
        kind: &'a RawValue = "type",
        name: &'a RawValue = "name",
        disable_parallel_tool_use: &'a RawValue = "disable_parallel_tool_use",
    }
}

raw_object! {
    /// `thinking`: `{type:"enabled",budget_tokens}`, `{type:"disabled"}`, `{type:"adaptive"}`.
    pub struct AnthropicThinking {
        kind: &'a RawValue = "type",
        budget_tokens: &'a RawValue = "budget_tokens",
    }
}

raw_object! {
    /// `metadata`: `{user_id?: string|null}`.
    pub struct AnthropicMetadata {
        user_id: &'a RawValue = "user_id",
    }
}
