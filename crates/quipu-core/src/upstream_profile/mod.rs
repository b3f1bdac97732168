//! What differs between the inference servers Quipu fronts — one module per server, each the
//! one home of that server's quirks: [`vllm`], [`sglang`], [`llamacpp`].
//!
//! All three speak OpenAI chat completions, and Quipu sends them the same body; they differ in
//! how they report usage and reasoning, what stream options they honour, how they count a
//! prompt's tokens (for `/v1/messages/count_tokens`) and how their errors look. Response
//! parsing stays tolerant of all three at once (a model's replicas may even run different
//! servers); what must be chosen per server is chosen through [`Server`]:
//!
//! | quirk | where it is decided |
//! |---|---|
//! | stream usage options sent | [`Server::stream_options`] (per model, from the config) |
//! | counting a prompt's tokens | [`count::PromptCount`] (per replica, detected or configured) |
//! | usage and cached-token fields | each module's docs; read in [`crate::usage`] (llama.cpp's `timings` from [`llamacpp`]) |
//! | reasoning field names | each module's docs; read in `translate` (`reasoning` and `reasoning_content` both) |
//! | error bodies | each module's docs and tests; mapped in [`crate::translate::upstream_error`] |
//! | its own load (running, waiting) | each module's gauge names; read in [`load`] |
//!
//! **Which server.** A model's `server` option says it (`"vllm"`, `"sglang"`, `"llama.cpp"`);
//! the default, `"auto"`, detects each replica's server from `GET {api}/models`
//! (`data[].owned_by`: [`Server::from_owned_by`]) the first time it is needed. Until then, and
//! if detection fails, the replica is treated as vLLM — the protocol Quipu speaks natively —
//! which is safe for the request body: SGLang and llama.cpp ignore the fields they do not know.

pub mod count;
pub mod llamacpp;
pub mod load;
pub mod sglang;
pub mod vllm;

use std::fmt;

/// An inference server Quipu knows the quirks of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumIter)]
pub enum Server {
    #[strum(serialize = "vllm")]
    Vllm,
    #[strum(serialize = "sglang")]
    Sglang,
    #[strum(serialize = "llama.cpp")]
    LlamaCpp,
}

/// A model's `server` option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServerChoice {
    /// Detect each replica's server (see the module docs).
    #[default]
    Auto,
    Known(Server),
}

impl Server {
    /// The config's and the logs' name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Reads a `server` option value.
    pub fn parse(name: &str) -> Option<Server> {
        match name {
            "vllm" => Some(Server::Vllm),
            "sglang" => Some(Server::Sglang),
            "llama.cpp" | "llamacpp" | "llama-server" => Some(Server::LlamaCpp),
            _ => None,
        }
    }

    /// The server a `GET /v1/models` answer comes from, by its cards' `owned_by`.
    pub fn from_owned_by(owned_by: &str) -> Option<Server> {
        match owned_by {
            vllm::OWNED_BY => Some(Server::Vllm),
            sglang::OWNED_BY => Some(Server::Sglang),
            llamacpp::OWNED_BY => Some(Server::LlamaCpp),
            _ => None,
        }
    }

    /// Detects the server from a `GET {api}/models` body; `None` if it names none of them.
    pub fn detect(models_body: &[u8]) -> Option<Server> {
        #[derive(serde::Deserialize)]
        struct Card<'a> {
            #[serde(borrow, default)]
            owned_by: Option<std::borrow::Cow<'a, str>>,
        }
        #[derive(serde::Deserialize)]
        struct List<'a> {
            #[serde(borrow, default)]
            data: Vec<Card<'a>>,
        }
        let list: List<'_> = serde_json::from_slice(models_body).ok()?;
        list.data
            .iter()
            .find_map(|c| c.owned_by.as_deref().and_then(Server::from_owned_by))
    }

    /// The `stream_options` object a stream asks this server for: usage always (the final
    /// chunk's report is what a stream is billed on), and usage on every chunk where the server
    /// can send it, so a stream cut off midway is metered exactly. `continuous` is the model's
    /// `continuous_usage` option (off for a server that rejects the field).
    pub fn stream_options(self, continuous: bool) -> &'static [u8] {
        let continuous = continuous
            && match self {
                Server::Vllm => vllm::CONTINUOUS_USAGE,
                Server::Sglang => sglang::CONTINUOUS_USAGE,
                Server::LlamaCpp => llamacpp::CONTINUOUS_USAGE,
            };
        if continuous {
            br#"{"include_usage":true,"continuous_usage_stats":true}"#
        } else {
            br#"{"include_usage":true}"#
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ServerChoice {
    /// Reads a model's `server` option: `"auto"` or a server's name.
    pub fn parse(value: &str) -> Option<ServerChoice> {
        match value {
            "auto" => Some(ServerChoice::Auto),
            name => Server::parse(name).map(ServerChoice::Known),
        }
    }

    /// What the request side assumes before any replica is detected.
    pub fn assumed(self) -> Server {
        match self {
            ServerChoice::Auto => Server::Vllm,
            ServerChoice::Known(s) => s,
        }
    }
}

/// The root of a replica's server, for endpoints outside the OpenAI API root (`/tokenize`,
/// `/apply-template`): the API base without its `/v1`.
pub(crate) fn server_root(api_base: &str) -> &str {
    api_base.strip_suffix("/v1").unwrap_or(api_base)
}

/// What a client sees of a server's error body, for the profiles' tests.
#[cfg(test)]
pub(crate) fn mapped(
    status: u16,
    body: &str,
    format: crate::error::ClientFormat,
) -> crate::error::ApiError {
    crate::translate::upstream_error::map_upstream_error(
        &crate::translate::upstream_error::UpstreamFailure {
            status,
            body: body.as_bytes(),
            retry_after: None,
            upstream_model: "Qwen/Qwen3-4B",
            slug: "colibri",
        },
        format,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    #[test]
    fn names_round_trip_and_detection_reads_owned_by() {
        for s in Server::iter() {
            assert_eq!(Server::parse(s.as_str()), Some(s));
        }
        assert_eq!(ServerChoice::parse("auto"), Some(ServerChoice::Auto));
        assert_eq!(ServerChoice::parse("tgi"), None);
        let models = |owner: &str| {
            format!(
                r#"{{"object":"list","data":[{{"id":"m","object":"model","owned_by":"{owner}"}}]}}"#
            )
        };
        assert_eq!(
            Server::detect(models("vllm").as_bytes()),
            Some(Server::Vllm)
        );
        assert_eq!(
            Server::detect(models("sglang").as_bytes()),
            Some(Server::Sglang)
        );
        assert_eq!(
            Server::detect(models("llamacpp").as_bytes()),
            Some(Server::LlamaCpp)
        );
        assert_eq!(Server::detect(models("openai").as_bytes()), None);
        assert_eq!(Server::detect(b"not json"), None);
    }

    #[test]
    fn stream_options_per_server() {
        assert_eq!(
            Server::Vllm.stream_options(true),
            br#"{"include_usage":true,"continuous_usage_stats":true}"#
        );
        assert_eq!(
            Server::Vllm.stream_options(false),
            br#"{"include_usage":true}"#
        );
        assert_eq!(
            Server::LlamaCpp.stream_options(true),
            br#"{"include_usage":true}"#
        );
    }

    #[test]
    fn the_root_is_the_api_base_without_v1() {
        assert_eq!(server_root("/v1"), "");
        assert_eq!(server_root("/llm/v1"), "/llm");
        assert_eq!(server_root("/openai"), "/openai");
    }
}
