//! Counting a chat prompt's tokens on one replica (`/v1/messages/count_tokens`): a short
//! exchange of one or two calls, planned here without I/O and driven by the proxy, which sends
//! each [`Call`] and feeds the answer back to [`PromptCount::answer`].
//!
//! The prompt is the chat body the gateway would send (`model`, `messages`, `tools`, the
//! thinking switch, `add_generation_prompt` / `continue_final_message`), so the count is what a
//! create request with that prompt is billed as input. Each server counts it its own way (see
//! its module): vLLM `POST /tokenize` and SGLang `POST /v1/tokenize` take the chat form and
//! answer a `count`; llama.cpp answers `POST /v1/chat/completions/input_tokens`, or on older
//! builds renders with `/apply-template` and counts with `/tokenize`.

use super::{llamacpp, server_root, sglang, vllm, Server};
use crate::error::write_json_str;
use serde::de::IgnoredAny;
use serde::Deserialize;

/// One request of the exchange: `POST path` with a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub path: String,
    pub body: Vec<u8>,
}

/// What to do after an answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Send(Call),
    Counted(u64),
    Failed(CountError),
}

/// Why a count failed.
#[derive(Debug, PartialEq, Eq)]
pub enum CountError {
    /// The server offers no way to count a chat prompt (the endpoint is missing): why, for
    /// the client.
    Unsupported(String),
    /// The server refused the call: its status and body, for the error mapper.
    Upstream { status: u16, body: Vec<u8> },
    /// A 200 whose body is not what the endpoint answers.
    Malformed(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// vLLM / SGLang: the chat form, answered with a `count`.
    ChatTokenize,
    /// llama.cpp: `/chat/completions/input_tokens`.
    InputTokens,
    /// llama.cpp, older builds: `/apply-template`, then [`Step::TextTokenize`].
    ApplyTemplate,
    TextTokenize,
}

/// The state of one count.
#[derive(Debug)]
pub struct PromptCount {
    server: Server,
    root: String,
    /// The path of the call in flight.
    path: String,
    chat_body: Vec<u8>,
    step: Step,
}

impl PromptCount {
    /// Plans the count of `chat_body` on a `server` whose OpenAI API root is `api_base`
    /// (`/v1`); returns the first call. `tokenize_path` (a model's `tokenize_path` option)
    /// names an endpoint that takes vLLM's chat form, whatever the server.
    pub fn start(
        server: Server,
        api_base: &str,
        tokenize_path: Option<&str>,
        chat_body: Vec<u8>,
    ) -> (PromptCount, Call) {
        let root = server_root(api_base).to_owned();
        let (step, path) = match (tokenize_path, server) {
            (Some(path), _) => (Step::ChatTokenize, path.to_owned()),
            (None, Server::Vllm) => (Step::ChatTokenize, format!("{root}{}", vllm::TOKENIZE_PATH)),
            (None, Server::Sglang) => (
                Step::ChatTokenize,
                format!("{api_base}{}", sglang::TOKENIZE_PATH),
            ),
            (None, Server::LlamaCpp) => (
                Step::InputTokens,
                format!("{api_base}{}", llamacpp::INPUT_TOKENS_PATH),
            ),
        };
        let call = Call {
            path: path.clone(),
            body: chat_body.clone(),
        };
        let count = PromptCount {
            server,
            root,
            path,
            chat_body,
            step,
        };
        (count, call)
    }

    /// The server answered the last call with `status` and `body`.
    pub fn answer(&mut self, status: u16, body: &[u8]) -> Next {
        let missing = matches!(status, 404 | 405 | 501);
        if missing && self.step == Step::InputTokens {
            // An older llama.cpp: render, then tokenize.
            self.step = Step::ApplyTemplate;
            self.path = format!("{}{}", self.root, llamacpp::APPLY_TEMPLATE_PATH);
            return Next::Send(Call {
                path: self.path.clone(),
                body: std::mem::take(&mut self.chat_body),
            });
        }
        if missing {
            let hint = match self.server {
                Server::Sglang => " (SGLang counts chat prompts from version 0.5.12)",
                Server::Vllm | Server::LlamaCpp => "",
            };
            return Next::Failed(CountError::Unsupported(format!(
                "its {} server offers no tokenizer at {}{hint}",
                self.server, self.path
            )));
        }
        if status != 200 {
            return Next::Failed(CountError::Upstream {
                status,
                body: body.to_vec(),
            });
        }
        match self.step {
            Step::ChatTokenize => {
                #[derive(Deserialize)]
                struct Counted {
                    count: u64,
                }
                parse(body).map_or(Next::Failed(malformed()), |c: Counted| {
                    Next::Counted(c.count)
                })
            }
            Step::InputTokens => {
                #[derive(Deserialize)]
                struct Counted {
                    input_tokens: u64,
                }
                parse(body).map_or(Next::Failed(malformed()), |c: Counted| {
                    Next::Counted(c.input_tokens)
                })
            }
            Step::ApplyTemplate => {
                #[derive(Deserialize)]
                struct Rendered<'a> {
                    #[serde(borrow)]
                    prompt: std::borrow::Cow<'a, str>,
                }
                let Some(r) = parse::<Rendered<'_>>(body) else {
                    return Next::Failed(malformed());
                };
                // The rendered prompt has no BOS: `add_special` adds it, as a completion does;
                // `parse_special` reads the template's markers as the special tokens they are.
                let mut text = Vec::with_capacity(r.prompt.len() + 64);
                text.extend_from_slice(b"{\"content\":");
                write_json_str(&mut text, &r.prompt);
                text.extend_from_slice(b",\"add_special\":true,\"parse_special\":true}");
                self.step = Step::TextTokenize;
                self.path = format!("{}{}", self.root, llamacpp::TOKENIZE_PATH);
                Next::Send(Call {
                    path: self.path.clone(),
                    body: text,
                })
            }
            Step::TextTokenize => {
                #[derive(Deserialize)]
                struct Tokens {
                    tokens: Vec<IgnoredAny>,
                }
                parse(body).map_or(Next::Failed(malformed()), |t: Tokens| {
                    Next::Counted(t.tokens.len() as u64)
                })
            }
        }
    }
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Option<T> {
    serde_json::from_slice(body).ok()
}

fn malformed() -> CountError {
    CountError::Malformed("the tokenizer's answer is not the expected shape")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hola"}],"add_generation_prompt":true}"#;

    fn send(next: Next) -> Call {
        match next {
            Next::Send(c) => c,
            other => panic!("expected a call, got {other:?}"),
        }
    }

    #[test]
    fn vllm_counts_with_one_tokenize_call_at_the_server_root() {
        let (mut c, call) = PromptCount::start(Server::Vllm, "/v1", None, BODY.to_vec());
        assert_eq!(call.path, "/tokenize");
        assert_eq!(call.body, BODY);
        let n = c.answer(200, br#"{"count":17,"max_model_len":32768,"tokens":[1]}"#);
        assert_eq!(n, Next::Counted(17));
    }

    #[test]
    fn sglang_counts_under_the_api_root() {
        let (mut c, call) = PromptCount::start(Server::Sglang, "/v1", None, BODY.to_vec());
        assert_eq!(call.path, "/v1/tokenize");
        assert_eq!(
            c.answer(200, br#"{"tokens":[1,2],"count":2}"#),
            Next::Counted(2)
        );
        let (mut old, _) = PromptCount::start(Server::Sglang, "/v1", None, BODY.to_vec());
        let Next::Failed(CountError::Unsupported(why)) =
            old.answer(404, br#"{"detail":"Not Found"}"#)
        else {
            panic!("a missing endpoint is unsupported")
        };
        assert!(
            why.contains("no tokenizer at /v1/tokenize") && why.contains("0.5.12"),
            "{why}"
        );
    }

    #[test]
    fn llamacpp_counts_input_tokens_or_renders_then_tokenizes() {
        let (mut c, call) = PromptCount::start(Server::LlamaCpp, "/v1", None, BODY.to_vec());
        assert_eq!(call.path, "/v1/chat/completions/input_tokens");
        assert_eq!(
            c.answer(
                200,
                br#"{"input_tokens":9,"object":"response.input_tokens"}"#
            ),
            Next::Counted(9)
        );

        let (mut old, _) = PromptCount::start(Server::LlamaCpp, "/llm/v1", None, BODY.to_vec());
        let render = send(old.answer(404, br#"{"error":{"code":404,"message":"File Not Found"}}"#));
        assert_eq!(render.path, "/llm/apply-template");
        assert_eq!(render.body, BODY);
        let tokenize = send(old.answer(
            200,
            br#"{"prompt":"<|im_start|>user\nhola \"t\"<|im_end|>\n"}"#,
        ));
        assert_eq!(tokenize.path, "/llm/tokenize");
        let sent: serde_json::Value = serde_json::from_slice(&tokenize.body).unwrap();
        assert_eq!(sent["content"], "<|im_start|>user\nhola \"t\"<|im_end|>\n");
        assert_eq!(
            (
                sent["add_special"].as_bool(),
                sent["parse_special"].as_bool()
            ),
            (Some(true), Some(true))
        );
        assert_eq!(
            old.answer(200, br#"{"tokens":[1,2,3,4]}"#),
            Next::Counted(4)
        );
    }

    #[test]
    fn a_configured_tokenize_path_takes_the_chat_form_on_any_server() {
        let (mut c, call) = PromptCount::start(
            Server::LlamaCpp,
            "/v1",
            Some("/custom/tokenize"),
            BODY.to_vec(),
        );
        assert_eq!(call.path, "/custom/tokenize");
        assert_eq!(c.answer(200, br#"{"count":3}"#), Next::Counted(3));
    }

    #[test]
    fn errors_and_garbage_are_failures_not_counts() {
        let (mut c, _) = PromptCount::start(Server::Vllm, "/v1", None, BODY.to_vec());
        assert_eq!(
            c.answer(400, b"{\"error\":{}}"),
            Next::Failed(CountError::Upstream {
                status: 400,
                body: b"{\"error\":{}}".to_vec()
            })
        );
        let (mut c, _) = PromptCount::start(Server::Vllm, "/v1", None, BODY.to_vec());
        assert!(matches!(
            c.answer(200, b"{\"tokens\":[]}"),
            Next::Failed(CountError::Malformed(_))
        ));
        let (mut c, _) = PromptCount::start(Server::LlamaCpp, "/v1", None, BODY.to_vec());
        assert!(matches!(
            c.answer(200, b"[]"),
            Next::Failed(CountError::Malformed(_))
        ));
    }
}
