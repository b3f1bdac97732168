//! Wire types of the OpenAI Responses API, request direction (what clients send to
//! `POST /v1/responses`), and the items the gateway stores and reads back.
//!
//! As in [`super::anthropic`], fields are borrowed `&RawValue`s checked one by one by the
//! translator ([`crate::translate::responses`]), so a bad value gets an error naming its exact
//! path (`input[3].content[0].image_url`) and text is copied to the upstream as the client
//! escaped it. Fields not declared here are skipped by serde: the API's many optional fields
//! the gateway has no use for (`service_tier`, `prompt_cache_key`, `safety_identifier`,
//! `background`, `stream_options`, `max_tool_calls`, `context_management`, per-item `phase`,
//! annotations, logprobs, …) are accepted and ignored. A JSON `null` reads as `None`.
//!
//! One struct per object kind, with the fields of every variant of that kind (`type` decides
//! which are read), like [`super::anthropic::AnthropicBlock`]: one parse serves all item types.
//!
//! Responses and stream events are written directly as bytes by the translator; they have no
//! types here.
//!
//! Vendor reference: <https://platform.openai.com/docs/api-reference/responses> and the
//! `openai` SDKs' `types/responses/` (generated from the vendor's OpenAPI spec).

use serde_json::value::RawValue;

raw_object! {
    /// The top level of a create-response request.
    pub struct ResponsesRequest {
        model: &'a RawValue = "model",
        input: &'a RawValue = "input",
        instructions: &'a RawValue = "instructions",
        tools: &'a RawValue = "tools",
        tool_choice: &'a RawValue = "tool_choice",
        parallel_tool_calls: &'a RawValue = "parallel_tool_calls",
        max_output_tokens: &'a RawValue = "max_output_tokens",
        temperature: &'a RawValue = "temperature",
        top_p: &'a RawValue = "top_p",
        text: &'a RawValue = "text",
        reasoning: &'a RawValue = "reasoning",
        stream: &'a RawValue = "stream",
        store: &'a RawValue = "store",
        previous_response_id: &'a RawValue = "previous_response_id",
        metadata: &'a RawValue = "metadata",
        user: &'a RawValue = "user",
        truncation: &'a RawValue = "truncation",
        include: &'a RawValue = "include",
        /// Conversations (server-side threads) and prompt templates are not offered: a 400
        /// rather than a silent answer without the context the client relies on.
        conversation: &'a RawValue = "conversation",
        prompt: &'a RawValue = "prompt",
    }
}

raw_object! {
    /// One input (or stored) item of any type: `message` (also without `type`, the "easy"
    /// form `{role, content}`), `function_call`, `function_call_output`, `reasoning`, and the
    /// types the gateway refuses by name.
    pub struct ResponsesItem {
        kind: &'a RawValue = "type",
        id: &'a RawValue = "id",
        status: &'a RawValue = "status",
        /// `message`.
        role: &'a RawValue = "role",
        content: &'a RawValue = "content",
        /// `function_call` and `function_call_output`.
        call_id: &'a RawValue = "call_id",
        /// `function_call` (and the API's optional echo on `function_call_output`).
        name: &'a RawValue = "name",
        namespace: &'a RawValue = "namespace",
        arguments: &'a RawValue = "arguments",
        /// `function_call_output`: a string or a list of `input_text` / `input_image` /
        /// `input_file` parts.
        output: &'a RawValue = "output",
        /// `reasoning`.
        summary: &'a RawValue = "summary",
        encrypted_content: &'a RawValue = "encrypted_content",
    }
}

raw_object! {
    /// A content part of any type: `input_text`, `input_image`, `input_file` (user-side),
    /// `output_text`, `refusal` (assistant-side), `reasoning_text`, `summary_text` (reasoning).
    pub struct ResponsesPart {
        kind: &'a RawValue = "type",
        text: &'a RawValue = "text",
        /// `input_image`: a URL or a `data:` URL; `file_id` is refused (no Files API here).
        image_url: &'a RawValue = "image_url",
        file_id: &'a RawValue = "file_id",
        /// `refusal`.
        refusal: &'a RawValue = "refusal",
    }
}

raw_object! {
    /// One entry of `tools`: a `function`, a `namespace` of functions, or a hosted tool
    /// (`web_search`, `file_search`, `computer_use_preview`, …) that the upstream cannot run.
    pub struct ResponsesTool {
        kind: &'a RawValue = "type",
        name: &'a RawValue = "name",
        description: &'a RawValue = "description",
        parameters: &'a RawValue = "parameters",
        strict: &'a RawValue = "strict",
        /// `namespace`: its function tools.
        tools: &'a RawValue = "tools",
    }
}

raw_object! {
    /// `tool_choice` as an object: `{type:"function",name,namespace?}`,
    /// `{type:"allowed_tools",mode,tools}`, or `{type:<hosted tool>}` (which the gateway cannot
    /// honour). The string forms (`none`, `auto`, `required`) are read separately.
    pub struct ResponsesToolChoice {
        kind: &'a RawValue = "type",
        name: &'a RawValue = "name",
        namespace: &'a RawValue = "namespace",
        mode: &'a RawValue = "mode",
        tools: &'a RawValue = "tools",
    }
}

raw_object! {
    /// `text`: `{format, verbosity}`.
    pub struct ResponsesText {
        format: &'a RawValue = "format",
        verbosity: &'a RawValue = "verbosity",
    }
}

raw_object! {
    /// `text.format`: `{type:"text"}`, `{type:"json_object"}` or
    /// `{type:"json_schema",name,schema,strict?,description?}` (flat, unlike the chat format's
    /// `response_format.json_schema`).
    pub struct ResponsesFormat {
        kind: &'a RawValue = "type",
        name: &'a RawValue = "name",
        schema: &'a RawValue = "schema",
        strict: &'a RawValue = "strict",
        description: &'a RawValue = "description",
    }
}

raw_object! {
    /// `reasoning`: `{effort, summary, generate_summary}`.
    pub struct ResponsesReasoning {
        effort: &'a RawValue = "effort",
        summary: &'a RawValue = "summary",
        generate_summary: &'a RawValue = "generate_summary",
    }
}

raw_object! {
    /// What the gateway reads of a stored response object: its `output` items, to rebuild a
    /// conversation (`previous_response_id`).
    pub struct StoredResponseObject {
        output: &'a RawValue = "output",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_objects_only_and_skips_unknown_fields() {
        let r: ResponsesRequest = serde_json::from_str(
            r#"{"model":"aguila","input":"hola","service_tier":"auto","store":null}"#,
        )
        .unwrap();
        assert_eq!(r.model.unwrap().get(), "\"aguila\"");
        assert!(r.store.is_none());
        assert!(serde_json::from_str::<ResponsesItem>(r#"["message","user"]"#).is_err());
        assert!(serde_json::from_str::<ResponsesItem>(r#"{"type":"a","type":"b"}"#).is_err());
    }
}
