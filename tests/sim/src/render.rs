//! The simulator's JSON: chunks, completions, usage and error envelopes, per server flavor.

use crate::generate::{Piece, Plan};
use serde_json::{json, Map, Value};

/// Which server to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    Vllm,
    Sglang,
    Llamacpp,
}

pub struct Shape {
    pub flavor: Flavor,
    /// Field name of reasoning text: `reasoning` (vLLM) or `reasoning_content`.
    pub reasoning_field: String,
    pub cached_details: bool,
}

impl Shape {
    pub fn usage(&self, prompt: usize, cached: usize, completion: usize) -> Value {
        let mut u = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        });
        let report = self.cached_details && !(self.flavor == Flavor::Sglang && cached == 0);
        if report {
            u["prompt_tokens_details"] = json!({ "cached_tokens": cached });
        }
        u
    }

    pub fn timings(&self, prompt: usize, cached: usize, completion: usize) -> Option<Value> {
        (self.flavor == Flavor::Llamacpp).then(|| {
            json!({"cache_n": cached, "prompt_n": prompt - cached, "predicted_n": completion,
                   "prompt_ms": 1.0, "predicted_ms": 1.0})
        })
    }

    /// The delta object of one piece.
    pub fn delta(&self, piece: &Piece) -> Value {
        let mut d = Map::new();
        match piece {
            Piece::Reasoning(t) => {
                d.insert(self.reasoning_field.clone(), Value::String(t.clone()));
            }
            Piece::Content(t) => {
                d.insert("content".into(), Value::String(t.clone()));
            }
            Piece::ToolStart(k, id, name) => {
                d.insert(
                    "tool_calls".into(),
                    json!([{"index": k, "id": id, "type": "function",
                            "function": {"name": name, "arguments": ""}}]),
                );
            }
            Piece::ToolArgs(k, a) => {
                d.insert(
                    "tool_calls".into(),
                    json!([{"index": k, "function": {"arguments": a}}]),
                );
            }
        }
        if self.flavor == Flavor::Sglang && !d.contains_key("reasoning_content") {
            d.insert("reasoning_content".into(), Value::Null);
        }
        Value::Object(d)
    }

    pub fn finish_fields(&self, choice: &mut Value, plan: &Plan) {
        choice["finish_reason"] = json!(plan.finish_reason);
        let key = if self.flavor == Flavor::Sglang {
            "matched_stop"
        } else {
            "stop_reason"
        };
        if self.flavor != Flavor::Llamacpp {
            choice[key] = json!(plan.stop_reason);
        }
    }

    /// The whole non-streaming completion.
    pub fn completion(&self, head: &Head, plan: &Plan, prompt: usize, cached: usize) -> Value {
        let mut content = String::new();
        let mut reasoning = String::new();
        let mut calls: Vec<Value> = Vec::new();
        for p in &plan.pieces {
            match p {
                Piece::Reasoning(t) => reasoning.push_str(t),
                Piece::Content(t) => content.push_str(t),
                Piece::ToolStart(_, id, name) => calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": ""}}),
                ),
                Piece::ToolArgs(k, a) => {
                    if let Some(c) = calls.get_mut(*k) {
                        let prev = c["function"]["arguments"].as_str().unwrap_or("").to_owned();
                        c["function"]["arguments"] = json!(prev + a);
                    }
                }
            }
        }
        let mut message = json!({"role": "assistant", "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) }});
        if !reasoning.is_empty() {
            message[self.reasoning_field.as_str()] = json!(reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls);
        }
        let mut choice = json!({"index": 0, "message": message, "logprobs": null});
        self.finish_fields(&mut choice, plan);
        let mut v = json!({
            "id": head.id, "object": "chat.completion", "created": head.created, "model": head.model,
            "choices": [choice],
            "usage": self.usage(prompt, cached, plan.completion_tokens),
        });
        if let Some(t) = self.timings(prompt, cached, plan.completion_tokens) {
            v["timings"] = t;
        }
        v
    }

    /// An error body in the flavor's envelope.
    pub fn error(&self, status: u16, message: &str) -> Value {
        let vllm_type = match status {
            400 => "BadRequestError",
            404 => "NotFoundError",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        match self.flavor {
            Flavor::Vllm => {
                json!({"error": {"message": message, "type": vllm_type, "param": null, "code": status}})
            }
            Flavor::Sglang => {
                json!({"object": "error", "message": message, "type": vllm_type, "param": null, "code": status})
            }
            Flavor::Llamacpp => {
                let t = match status {
                    400 => "invalid_request_error",
                    401 => "authentication_error",
                    404 => "not_found_error",
                    503 => "unavailable_error",
                    _ => "server_error",
                };
                json!({"error": {"code": status, "message": message, "type": t}})
            }
        }
    }

    pub fn overflow(&self, prompt: usize, completion: usize, max_len: usize) -> Value {
        if self.flavor == Flavor::Llamacpp {
            return json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                                    "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": max_len}});
        }
        self.error(400, &format!(
            "This model's maximum context length is {max_len} tokens. However, you requested {} tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
            prompt + completion
        ))
    }
}

/// Fields shared by every chunk of a response.
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    pub fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}
