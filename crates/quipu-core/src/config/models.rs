//! `[[models]]`: each model's upstream name, replicas, prices, timeouts, health checks,
//! routing, server kind and per-model switches (reasoning on/off, continuous usage, prefill),
//! validated.
//! Replica URLs are parsed in [`super::replica`].

use super::raw::{RawModel, RawUpstreamTls};
use super::replica::{parse_replica, Replica};
use super::scheduling::{validate_capacity, Capacity};
use super::secrets::secret;
use super::ModelId;
use crate::billing::Prices;
use crate::money::Rate;
use crate::upstream_profile::ServerChoice;
use std::path::PathBuf;
use std::time::Duration;

/// How a replica is picked among a model's healthy replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    LeastLoaded,
    RoundRobin,
    PrefixAffinity,
}

#[derive(Debug, Clone)]
pub struct Model {
    pub id: ModelId,
    pub slug: String,
    pub display_name: String,
    pub description: String,
    pub vision: bool,
    pub in_plans: bool,
    pub in_free: bool,
    pub upstream_model: String,
    pub replicas: Vec<Replica>,
    pub upstream_api_key: Option<String>,
    /// TLS to its `https://` replicas.
    pub upstream_tls: UpstreamTls,
    pub prices: Prices,
    pub context_window: u64,
    /// JSON object merged into the upstream request to turn reasoning on / off.
    pub thinking_on: Option<serde_json::Map<String, serde_json::Value>>,
    pub thinking_off: Option<serde_json::Map<String, serde_json::Value>>,
    pub timeouts: Timeouts,
    pub health: Health,
    pub continuous_usage: bool,
    /// Continue a final assistant message (see [`RawModel::prefill`]).
    pub prefill: bool,
    /// A configured count endpoint (vLLM's chat form), else the server's own.
    pub tokenize_path: Option<String>,
    /// Which server the replicas run (see `upstream_profile`).
    pub server: ServerChoice,
    pub routing: Routing,
    /// Requests running at once per replica (see `config::scheduling`).
    pub capacity: Capacity,
}

/// How a model's `https://` replicas are reached (the files are read by the binary at start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// CA bundle; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate chain and key (mTLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// `false`: any certificate is accepted (logged at start).
    pub verify: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub first_byte: Duration,
    pub idle: Duration,
    pub request: Duration,
}

#[derive(Debug, Clone)]
pub struct Health {
    pub path: String,
    pub interval: Duration,
    pub max_failures: u32,
}

fn is_slug(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn toml_table_to_json(t: toml::Table) -> serde_json::Map<String, serde_json::Value> {
    fn conv(v: toml::Value) -> serde_json::Value {
        match v {
            toml::Value::String(s) => serde_json::Value::String(s),
            toml::Value::Integer(i) => serde_json::Value::from(i),
            toml::Value::Float(f) => serde_json::Value::from(f),
            toml::Value::Boolean(b) => serde_json::Value::Bool(b),
            toml::Value::Datetime(d) => serde_json::Value::String(d.to_string()),
            toml::Value::Array(a) => serde_json::Value::Array(a.into_iter().map(conv).collect()),
            toml::Value::Table(t) => serde_json::Value::Object(toml_table_to_json(t)),
        }
    }
    t.into_iter().map(|(k, v)| (k, conv(v))).collect()
}

/// Upstream request fields Quipu sets itself; a thinking switch may not override them.
const RESERVED_UPSTREAM_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "reasoning_effort",
    "continue_final_message",
    "add_generation_prompt",
];

pub(super) fn validate_models(
    models: Vec<RawModel>,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> Vec<Model> {
    if models.is_empty() {
        errs.push(
            "no [[models]] configured; add at least one with slug, display_name, upstream_model, upstreams and prices".into(),
        );
    }
    let mut out = Vec::with_capacity(models.len());
    for (i, mut m) in models.into_iter().enumerate() {
        let key = format!("models[{i}]");
        if !is_slug(&m.slug) {
            errs.push(format!(
                "{key}.slug must be lowercase letters, digits, '-' or '_' (at most 64), got \"{}\"",
                m.slug
            ));
        }
        if out.iter().any(|o: &Model| o.slug == m.slug) {
            errs.push(format!("{key}.slug \"{}\" is used twice", m.slug));
        }
        if m.display_name.trim().is_empty() {
            errs.push(format!("{key}.display_name must not be empty"));
        }
        if m.upstream_model.trim().is_empty() {
            errs.push(format!("{key}.upstream_model must not be empty"));
        }
        if m.upstreams.is_empty() {
            errs.push(format!(
                "{key} (\"{}\") has no upstream; add upstreams = [\"http://host:8000/v1\"]",
                m.slug
            ));
        }
        let mut replicas = Vec::new();
        for (j, u) in m.upstreams.iter().enumerate() {
            match parse_replica(u) {
                Ok(r) => {
                    if replicas
                        .iter()
                        .any(|o: &Replica| o.port == r.port && o.host.eq_ignore_ascii_case(&r.host))
                    {
                        errs.push(format!("{key}.upstreams[{j}] repeats {}", r.authority));
                    }
                    replicas.push(r)
                }
                Err(e) => errs.push(format!("{key}.upstreams[{j}]: {e}")),
            }
        }
        let rate = |field: &str, v: &str, errs: &mut Vec<String>| {
            Rate::parse(v).unwrap_or_else(|e| {
                errs.push(format!("{key}.prices.{field}: {e}"));
                Rate::default()
            })
        };
        let prices = Prices {
            input: rate("input", &m.prices.input, errs),
            cached: rate("cached", &m.prices.cached, errs),
            output: rate("output", &m.prices.output, errs),
        };
        if m.context_window < 16 {
            errs.push(format!(
                "{key}.context_window must be at least 16 tokens, got {}",
                m.context_window
            ));
        }
        let mut switch = |name: &str, t: Option<toml::Table>| {
            t.map(|t| {
                let j = toml_table_to_json(t);
                for f in RESERVED_UPSTREAM_FIELDS {
                    if j.contains_key(*f) {
                        errs.push(format!(
                            "{key}.{name} may not set \"{f}\": Quipu sets it itself"
                        ));
                    }
                }
                j
            })
        };
        let thinking_on = switch("thinking_on", m.thinking_on);
        let thinking_off = switch("thinking_off", m.thinking_off);
        let t = &m.timeouts;
        for (name, v) in [
            ("connect_ms", t.connect_ms),
            ("first_byte_ms", t.first_byte_ms),
            ("idle_ms", t.idle_ms),
            ("request_ms", t.request_ms),
        ] {
            if v == 0 {
                errs.push(format!("{key}.timeouts.{name} must be more than 0"));
            }
        }
        if !m.health.path.starts_with('/') {
            errs.push(format!(
                "{key}.health.path must start with '/', got \"{}\"",
                m.health.path
            ));
        }
        if let Some(path) = m.tokenize_path.as_deref().filter(|p| !p.starts_with('/')) {
            errs.push(format!(
                "{key}.tokenize_path must start with '/', got \"{path}\""
            ));
        }
        let server = ServerChoice::parse(&m.server).unwrap_or_else(|| {
            errs.push(format!(
                "{key}.server must be \"auto\", \"vllm\", \"sglang\" or \"llama.cpp\", got \"{}\"",
                m.server
            ));
            ServerChoice::Auto
        });
        let routing = match m.routing.as_str() {
            "least_loaded" => Routing::LeastLoaded,
            "round_robin" => Routing::RoundRobin,
            "prefix_affinity" => Routing::PrefixAffinity,
            other => {
                errs.push(format!(
                    "{key}.routing must be \"least_loaded\", \"round_robin\" or \"prefix_affinity\", got \"{other}\""
                ));
                Routing::LeastLoaded
            }
        };
        let capacity = validate_capacity(m.max_concurrency, &m.engine_load, &key, errs);
        let upstream_tls = upstream_tls(m.upstream_tls.take(), &key, errs);
        if !upstream_tls.verify && !replicas.iter().any(|r| r.tls) {
            errs.push(format!(
                "{key}.upstream_tls.verify = false but no upstream is https://; remove it"
            ));
        }
        let upstream_api_key = m
            .upstream_api_key
            .as_deref()
            .map(|k| secret(k, &format!("{key}.upstream_api_key"), env, errs))
            .filter(|k| !k.is_empty());
        out.push(Model {
            id: i,
            slug: m.slug,
            display_name: m.display_name,
            description: m.description,
            vision: m.vision,
            in_plans: m.in_plans,
            in_free: m.in_free,
            upstream_model: m.upstream_model,
            replicas,
            upstream_api_key,
            upstream_tls,
            prices,
            context_window: m.context_window,
            thinking_on,
            thinking_off,
            timeouts: Timeouts {
                connect: Duration::from_millis(t.connect_ms),
                first_byte: Duration::from_millis(t.first_byte_ms),
                idle: Duration::from_millis(t.idle_ms),
                request: Duration::from_millis(t.request_ms),
            },
            health: Health {
                path: m.health.path,
                interval: Duration::from_millis(m.health.interval_ms.max(100)),
                max_failures: m.health.max_failures.max(1),
            },
            continuous_usage: m.continuous_usage,
            prefill: m.prefill,
            tokenize_path: m.tokenize_path,
            server,
            routing,
            capacity,
        });
    }
    out
}

/// Validates `upstream_tls` (verification on and the system roots when absent).
fn upstream_tls(raw: Option<RawUpstreamTls>, key: &str, errs: &mut Vec<String>) -> UpstreamTls {
    let Some(raw) = raw else {
        return UpstreamTls {
            verify: true,
            ..UpstreamTls::default()
        };
    };
    let client_cert = match (raw.client_cert, raw.client_key) {
        (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
        (None, None) => None,
        _ => {
            errs.push(format!(
                "{key}.upstream_tls needs both client_cert and client_key, or neither"
            ));
            None
        }
    };
    UpstreamTls {
        ca: raw.ca.map(PathBuf::from),
        client_cert,
        verify: raw.verify,
    }
}
