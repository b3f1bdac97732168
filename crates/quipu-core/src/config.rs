//! The gateway's configuration: `conf/quipu.toml`, parsed once and validated once.
//!
//! Two types, as in TensorZero and River: [`RawConfig`] is the file's shape (serde,
//! `deny_unknown_fields`, optional fields with defaults), and [`Config`] is what the rest of
//! the gateway reads: every value resolved, every secret fetched from the environment, every
//! address parsed, no `Option` standing for "not yet known". [`Config::from_raw`] collects
//! *every* problem and names the full key of each ("models[1].prices.input: …"), so one run of
//! `quipu serve --check` shows them all.
//!
//! Secrets may come from the environment: a string value `"env:NAME"` is replaced by the
//! variable `NAME` (an error names it if it is unset).
//!
//! Parsing does no I/O besides reading those variables: upstream URLs are checked for syntax
//! only, and a replica named by a host name gets its socket address from
//! [`Config::resolve_upstreams`], which `quipu serve` calls once at start (the gateway never
//! resolves names on the request path). So `--check`, the CLI's store commands, tests and the
//! `config_parse` fuzz target never touch DNS.

use crate::billing::Prices;
use crate::money::{Pen, Rate, AMOUNT_DECIMALS};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// The file's shape.
// ---------------------------------------------------------------------------------------------

/// `conf/quipu.toml` as written. Only [`Config::from_raw`] reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub billing: RawBilling,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub streaming: RawStreaming,
    #[serde(default)]
    pub security: RawSecurity,
    #[serde(default)]
    pub models: Vec<RawModel>,
    /// Other model names (glob patterns with `*` and `?`) → slug.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    #[serde(default)]
    pub plans: Vec<RawPlan>,
}

/// The largest request head pingora 0.9 reads (`MAX_HEADER_SIZE`); above it, a bare 400.
pub const PINGORA_MAX_HEAD_BYTES: usize = 1_048_575;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawServer {
    pub listen: String,
    pub metrics_listen: String,
    pub admin_listen: String,
    pub admin_token: Option<String>,
    pub threads: usize,
    pub max_body_bytes: usize,
    /// A request's head (request line and headers) over this gets a 431 in the endpoint's
    /// error shape. Pingora itself refuses heads over 1 MiB or with over 256 headers (a bare 400).
    pub max_header_bytes: usize,
    /// API requests handled at once; beyond it new ones are refused as overloaded.
    pub max_in_flight: usize,
    /// Open client connections (idle keep-alive ones included); further ones are closed at once.
    pub max_connections: usize,
    /// A request head must arrive whole within this long: from the connection's opening for
    /// its first request, from the first byte for later ones.
    pub header_timeout_ms: u64,
    pub client_read_timeout_ms: u64,
    pub client_write_timeout_ms: u64,
    pub keepalive_timeout_s: u64,
    pub grace_period_seconds: u64,
    pub graceful_shutdown_timeout_seconds: u64,
    pub pid_file: String,
    pub upgrade_sock: String,
    pub replica_id: Option<String>,
    pub access_log: bool,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: "0.0.0.0:8080".into(),
            metrics_listen: "127.0.0.1:9091".into(),
            admin_listen: "127.0.0.1:9092".into(),
            admin_token: None,
            threads: 2,
            max_body_bytes: 32 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            max_in_flight: 10_000,
            max_connections: 10_000,
            header_timeout_ms: 15_000,
            client_read_timeout_ms: 60_000,
            client_write_timeout_ms: 60_000,
            keepalive_timeout_s: 75,
            grace_period_seconds: 900,
            graceful_shutdown_timeout_seconds: 5,
            pid_file: "/tmp/quipu.pid".into(),
            upgrade_sock: "/tmp/quipu_upgrade.sock".into(),
            replica_id: None,
            access_log: true,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub url: String,
    pub ledger_flush_ms: u64,
    pub ledger_batch_rows: usize,
    /// Ledger rows owed to the store (queued, not yet written) at which new billable requests
    /// are refused as overloaded until the store catches up: bounds what a crash during a
    /// store outage could lose, and the memory the queue holds.
    pub max_unstored_rows: usize,
    pub key_refresh_ms: u64,
    /// At shutdown, how long the ledger writer keeps retrying an unreachable store before it
    /// writes the rows it could not store to a spill file.
    pub shutdown_flush_timeout_s: u64,
    /// Where spill files go; default: `ledger-spill` beside the SQLite file, else
    /// `data/ledger-spill`.
    pub spill_dir: Option<String>,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            url: "sqlite://data/quipu.db".into(),
            ledger_flush_ms: 10,
            ledger_batch_rows: 1000,
            max_unstored_rows: 200_000,
            key_refresh_ms: 500,
            shutdown_flush_timeout_s: 30,
            spill_dir: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawBilling {
    pub min_top_up: String,
    /// How much of a tenant's balance one gateway replica leases at a time (see billing docs).
    pub lease_chunk: String,
}

impl Default for RawBilling {
    fn default() -> Self {
        RawBilling {
            min_top_up: "10.00".into(),
            lease_chunk: "5.00".into(),
        }
    }
}

/// Defaults for keys and tenants; 0 means unlimited.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    pub key_requests_per_minute: u64,
    pub key_tokens_per_minute: u64,
    pub tenant_requests_per_minute: u64,
    pub tenant_tokens_per_minute: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStreaming {
    /// While the upstream is silent (a long prefill), a messages stream gets a `ping` this often.
    pub ping_interval_ms: u64,
    /// Which field a chat-format client sees reasoning in: `reasoning`, `reasoning_content` or
    /// `both`.
    pub chat_reasoning_field: String,
}

impl Default for RawStreaming {
    fn default() -> Self {
        RawStreaming {
            ping_interval_ms: 5_000,
            chat_reasoning_field: "both".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSecurity {
    /// Image URLs in requests, which the upstream fetches (the gateway itself never fetches a
    /// URL): `forward` (default) passes http(s) URLs that name a public host and refuses
    /// internal ones (loopback, private, link-local, metadata names, …; see
    /// `translate::image_url`); `forward_any` passes any http(s) URL, for upstreams that
    /// restrict fetching themselves (`vllm serve --allowed-media-domains`); `reject` accepts
    /// only inline (base64) images.
    pub image_urls: String,
}

impl Default for RawSecurity {
    fn default() -> Self {
        RawSecurity {
            image_urls: "forward".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub slug: String,
    pub display_name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub vision: bool,
    #[serde(default)]
    pub in_plans: bool,
    #[serde(default)]
    pub in_free: bool,
    /// The model's name on the upstream server (vLLM `--served-model-name`).
    pub upstream_model: String,
    /// Base URLs of the replicas serving this model, e.g. `http://10.0.0.5:8000/v1`.
    pub upstreams: Vec<String>,
    /// Sent to the upstream as `Authorization: Bearer …` (vLLM `--api-key`).
    #[serde(default)]
    pub upstream_api_key: Option<String>,
    pub prices: RawPrices,
    #[serde(default = "default_context_window")]
    pub context_window: u64,
    /// Merged into the upstream request when a client turns reasoning on / off.
    #[serde(default)]
    pub thinking_on: Option<toml::Table>,
    #[serde(default)]
    pub thinking_off: Option<toml::Table>,
    #[serde(default)]
    pub timeouts: RawTimeouts,
    #[serde(default)]
    pub health: RawHealth,
    /// Ask the upstream for usage on every chunk (vLLM `continuous_usage_stats`), so a stream
    /// cut off midway is metered exactly. Turn off for upstreams that reject the field.
    #[serde(default = "default_true")]
    pub continuous_usage: bool,
    /// Messages format: when the last message is a non-empty assistant turn (a prefill), ask
    /// the upstream to continue it (`continue_final_message: true, add_generation_prompt:
    /// false`, which vLLM and SGLang understand) instead of starting a new turn after it.
    /// Turn off for upstreams that reject the fields.
    #[serde(default = "default_true")]
    pub prefill: bool,
    #[serde(default = "default_tokenize_path")]
    pub tokenize_path: String,
    /// `least_loaded`, `round_robin` or `prefix_affinity`.
    #[serde(default = "default_routing")]
    pub routing: String,
}

fn default_context_window() -> u64 {
    131_072
}
fn default_true() -> bool {
    true
}
fn default_tokenize_path() -> String {
    "/tokenize".into()
}
fn default_routing() -> String {
    "prefix_affinity".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrices {
    pub input: String,
    pub cached: String,
    pub output: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTimeouts {
    pub connect_ms: u64,
    /// Stream: time from sending the request to the first byte of the response.
    pub first_byte_ms: u64,
    /// Stream: longest silence between two chunks once the stream started.
    pub idle_ms: u64,
    /// Non-stream: the whole generation.
    pub request_ms: u64,
}

impl Default for RawTimeouts {
    fn default() -> Self {
        RawTimeouts {
            connect_ms: 2_000,
            first_byte_ms: 120_000,
            idle_ms: 120_000,
            request_ms: 900_000,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHealth {
    pub path: String,
    pub interval_ms: u64,
    /// Consecutive failed requests after which a replica is ejected until healthy again.
    pub max_failures: u32,
}

impl Default for RawHealth {
    fn default() -> Self {
        RawHealth {
            path: "/health".into(),
            interval_ms: 2_000,
            max_failures: 3,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlan {
    pub id: String,
    pub display_name: String,
    pub price: String,
    pub usage_label: String,
    #[serde(default)]
    pub web_search: bool,
}

// ---------------------------------------------------------------------------------------------
// The validated configuration.
// ---------------------------------------------------------------------------------------------

/// Index of a model in [`Config::models`]; cheap to copy into request contexts.
pub type ModelId = usize;

/// The validated configuration. Built only by [`Config::from_raw`].
#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub store: Store,
    pub billing: Billing,
    pub limits: Limits,
    pub streaming: Streaming,
    pub security: Security,
    pub models: Vec<Model>,
    pub aliases: Vec<Alias>,
    pub plans: Vec<Plan>,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// `None` disables the admin listener.
    pub admin_token: Option<String>,
    pub threads: usize,
    pub max_body_bytes: usize,
    pub max_header_bytes: usize,
    pub max_in_flight: usize,
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub client_read_timeout: Duration,
    pub client_write_timeout: Duration,
    pub keepalive_timeout_s: u64,
    pub grace_period_seconds: u64,
    pub graceful_shutdown_timeout_seconds: u64,
    pub pid_file: String,
    pub upgrade_sock: String,
    pub replica_id: Option<String>,
    pub access_log: bool,
}

#[derive(Debug, Clone)]
pub struct Store {
    pub url: String,
    pub ledger_flush: Duration,
    pub ledger_batch_rows: usize,
    /// See [`RawStore::max_unstored_rows`].
    pub max_unstored_rows: usize,
    pub key_refresh: Duration,
    /// See [`RawStore::shutdown_flush_timeout_s`].
    pub shutdown_flush_timeout: Duration,
    /// The directory of ledger spill files (see `billing::spill`), resolved.
    pub spill_dir: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Billing {
    pub min_top_up: Pen,
    pub lease_chunk: Pen,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub key_requests_per_minute: u64,
    pub key_tokens_per_minute: u64,
    pub tenant_requests_per_minute: u64,
    pub tenant_tokens_per_minute: u64,
}

/// Where a chat-format client reads reasoning text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningField {
    Reasoning,
    ReasoningContent,
    Both,
}

#[derive(Debug, Clone)]
pub struct Streaming {
    pub ping_interval: Duration,
    pub chat_reasoning_field: ReasoningField,
}

/// What happens to image URLs in requests (see [`RawSecurity::image_urls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageUrlPolicy {
    /// Forward URLs of public hosts only.
    Forward,
    /// Forward any http(s) URL: the upstream restricts what it fetches.
    ForwardAny,
    /// Inline images only.
    Reject,
}

#[derive(Debug, Clone)]
pub struct Security {
    pub image_urls: ImageUrlPolicy,
}

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
    pub tokenize_path: String,
    pub routing: Routing,
}

/// One upstream server of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The URL as configured (for logs and metrics labels).
    pub url: String,
    /// `host:port` as written, sent as the `Host` header.
    pub authority: String,
    /// The host as written (an IP literal without brackets, or a name).
    pub host: String,
    pub port: u16,
    /// Where to connect. Set by parsing when the host is an IP literal; for a name, by
    /// [`Config::resolve_upstreams`] at start (until then the unroutable `0.0.0.0:0`, see
    /// [`Replica::is_resolved`]). The gateway never resolves names on the request path.
    pub addr: SocketAddr,
    /// Path of the OpenAI API root, `/v1` unless the URL says otherwise.
    pub api_base: String,
    /// `{api_base}/chat/completions`, built once rather than per request.
    chat_path: String,
}

impl Replica {
    pub fn chat_path(&self) -> &str {
        &self.chat_path
    }

    /// Whether [`Replica::addr`] is known: an IP literal, or a name already resolved.
    pub fn is_resolved(&self) -> bool {
        self.addr != UNRESOLVED
    }
}

/// [`Replica::addr`] of a named replica before [`Config::resolve_upstreams`]: port 0 of the
/// unspecified address, which a connect attempt can never reach.
const UNRESOLVED: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

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

#[derive(Debug, Clone)]
pub struct Alias {
    pub pattern: String,
    pub model: ModelId,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub id: String,
    pub display_name: String,
    pub price: Pen,
    pub usage_label: String,
    pub web_search: bool,
}

/// Every problem found in a configuration, each naming its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The configuration Quipu runs on when no file is given: three models on a local upstream.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../conf/quipu.toml");

impl Config {
    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![format!(
                "cannot read {}: {e}; pass --config with the path of a quipu.toml",
                path.display()
            )])
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `origin` names it in messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigErrors(vec![format!("{origin}: {}", e.to_string().trim())]))?;
        Config::from_raw(raw, &|name| std::env::var(name).ok())
    }

    /// Validates a parsed file. `env` looks up `env:NAME` secrets (injected for tests).
    pub fn from_raw(
        raw: RawConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        let RawConfig {
            server,
            store,
            billing,
            limits,
            streaming,
            security,
            models,
            aliases,
            plans,
        } = raw;
        let mut errs = Vec::new();
        let server = validate_server(server, env, &mut errs);
        let store = validate_store(store, env, &mut errs);
        let billing = validate_billing(billing, &mut errs);
        let limits = Limits {
            key_requests_per_minute: limits.key_requests_per_minute,
            key_tokens_per_minute: limits.key_tokens_per_minute,
            tenant_requests_per_minute: limits.tenant_requests_per_minute,
            tenant_tokens_per_minute: limits.tenant_tokens_per_minute,
        };
        let streaming = validate_streaming(streaming, &mut errs);
        let security = Security {
            image_urls: match security.image_urls.as_str() {
                "forward" => ImageUrlPolicy::Forward,
                "forward_any" => ImageUrlPolicy::ForwardAny,
                "reject" => ImageUrlPolicy::Reject,
                other => {
                    errs.push(format!(
                        "security.image_urls must be \"forward\", \"forward_any\" or \"reject\", got \"{other}\""
                    ));
                    ImageUrlPolicy::Reject
                }
            },
        };
        let models = validate_models(models, env, &mut errs);
        let aliases = validate_aliases(aliases, &models, &mut errs);
        let plans = validate_plans(plans, &mut errs);
        if errs.is_empty() {
            Ok(Config {
                server,
                store,
                billing,
                limits,
                streaming,
                security,
                models,
                aliases,
                plans,
            })
        } else {
            Err(ConfigErrors(errs))
        }
    }

    /// The model a client's name refers to: a slug, else the first matching alias.
    pub fn resolve_model(&self, name: &str) -> Option<&Model> {
        if let Some(m) = self.models.iter().find(|m| m.slug == name) {
            return Some(m);
        }
        self.aliases
            .iter()
            .find(|a| glob_match(&a.pattern, name))
            .map(|a| &self.models[a.model])
    }

    /// `colibri, aguila, apu`: for "unknown model" messages.
    pub fn slug_list(&self) -> String {
        self.models
            .iter()
            .map(|m| format!("`{}`", m.slug))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Resolves the host names of upstream replicas (system resolver, first address), once,
    /// when the server starts. Every failure is reported with its key; two replicas of a model
    /// that turn out to be the same address are an error too.
    pub fn resolve_upstreams(self) -> Result<Config, ConfigErrors> {
        self.resolve_upstreams_with(&|host, port| {
            (host, port).to_socket_addrs().map(|a| a.collect())
        })
    }

    /// [`Config::resolve_upstreams`] with an injected resolver (for tests).
    pub fn resolve_upstreams_with(
        mut self,
        resolve: &dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    ) -> Result<Config, ConfigErrors> {
        let mut errs = Vec::new();
        for (i, m) in self.models.iter_mut().enumerate() {
            for (j, r) in m.replicas.iter_mut().enumerate() {
                if r.is_resolved() {
                    continue;
                }
                match resolve(&r.host, r.port) {
                    Ok(addrs) => match addrs.first() {
                        Some(a) => r.addr = *a,
                        None => errs.push(format!(
                            "models[{i}].upstreams[{j}]: \"{}\" resolves to no address",
                            r.host
                        )),
                    },
                    Err(e) => errs.push(format!(
                        "models[{i}].upstreams[{j}]: cannot resolve \"{}\": {e}",
                        r.host
                    )),
                }
            }
            for (j, r) in m.replicas.iter().enumerate() {
                if let Some(k) = m.replicas[..j]
                    .iter()
                    .position(|o| o.is_resolved() && o.addr == r.addr)
                {
                    errs.push(format!(
                        "models[{i}].upstreams[{j}] (\"{}\") is the same server as upstreams[{k}] ({})",
                        r.url, r.addr
                    ));
                }
            }
        }
        if errs.is_empty() {
            Ok(self)
        } else {
            Err(ConfigErrors(errs))
        }
    }
}

fn secret(
    value: &str,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> String {
    match value.strip_prefix("env:") {
        Some(name) => env(name).unwrap_or_else(|| {
            errs.push(format!(
                "{key} says \"env:{name}\" but the environment variable {name} is not set"
            ));
            String::new()
        }),
        None => value.to_owned(),
    }
}

fn socket_addr(value: &str, key: &str, errs: &mut Vec<String>) -> SocketAddr {
    value.parse().unwrap_or_else(|_| {
        errs.push(format!(
            "{key} must be an address like \"127.0.0.1:8080\", got \"{value}\""
        ));
        SocketAddr::from(([127, 0, 0, 1], 0))
    })
}

fn validate_server(
    s: RawServer,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> Server {
    if s.threads == 0 || s.threads > 256 {
        errs.push(format!(
            "server.threads must be between 1 and 256, got {}",
            s.threads
        ));
    }
    if s.max_body_bytes < 1024 {
        errs.push(format!(
            "server.max_body_bytes must be at least 1024, got {}",
            s.max_body_bytes
        ));
    }
    if !(1024..=PINGORA_MAX_HEAD_BYTES).contains(&s.max_header_bytes) {
        errs.push(format!(
            "server.max_header_bytes must be between 1024 and {PINGORA_MAX_HEAD_BYTES} \
             (pingora refuses larger heads itself), got {}",
            s.max_header_bytes
        ));
    }
    if s.max_connections == 0 {
        errs.push("server.max_connections must be at least 1".into());
    }
    if s.header_timeout_ms == 0 {
        errs.push("server.header_timeout_ms must be at least 1".into());
    }
    let admin_token = s
        .admin_token
        .as_deref()
        .map(|t| secret(t, "server.admin_token", env, errs))
        .filter(|t| !t.is_empty());
    if let Some(t) = &admin_token {
        if t.len() < 16 {
            errs.push("server.admin_token must be at least 16 characters long".into());
        }
    }
    Server {
        listen: socket_addr(&s.listen, "server.listen", errs),
        metrics_listen: socket_addr(&s.metrics_listen, "server.metrics_listen", errs),
        admin_listen: socket_addr(&s.admin_listen, "server.admin_listen", errs),
        admin_token,
        threads: s.threads,
        max_body_bytes: s.max_body_bytes,
        max_header_bytes: s.max_header_bytes,
        max_in_flight: s.max_in_flight.max(1),
        max_connections: s.max_connections,
        header_timeout: Duration::from_millis(s.header_timeout_ms),
        client_read_timeout: Duration::from_millis(s.client_read_timeout_ms),
        client_write_timeout: Duration::from_millis(s.client_write_timeout_ms),
        keepalive_timeout_s: s.keepalive_timeout_s,
        grace_period_seconds: s.grace_period_seconds,
        graceful_shutdown_timeout_seconds: s.graceful_shutdown_timeout_seconds,
        pid_file: s.pid_file,
        upgrade_sock: s.upgrade_sock,
        replica_id: s.replica_id.filter(|r| !r.is_empty()),
        access_log: s.access_log,
    }
}

fn validate_store(
    s: RawStore,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> Store {
    let url = secret(&s.url, "store.url", env, errs);
    if !(url.starts_with("sqlite://")
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://"))
    {
        errs.push(format!(
            "store.url must start with sqlite:// (a file) or postgres:// (a server), got \"{}\"",
            redact_url(&url)
        ));
    }
    if s.ledger_flush_ms == 0 || s.ledger_flush_ms > 10_000 {
        errs.push(format!(
            "store.ledger_flush_ms must be between 1 and 10000, got {}",
            s.ledger_flush_ms
        ));
    }
    if s.max_unstored_rows < s.ledger_batch_rows.max(1) {
        errs.push(format!(
            "store.max_unstored_rows must be at least store.ledger_batch_rows ({}), got {}",
            s.ledger_batch_rows.max(1),
            s.max_unstored_rows
        ));
    }
    if s.key_refresh_ms == 0 || s.key_refresh_ms > 1_500 {
        errs.push(format!(
            "store.key_refresh_ms must be between 1 and 1500 (a revocation must apply within 2 s, the reload query included), got {}",
            s.key_refresh_ms
        ));
    }
    if s.shutdown_flush_timeout_s == 0 || s.shutdown_flush_timeout_s > 3_600 {
        errs.push(format!(
            "store.shutdown_flush_timeout_s must be between 1 and 3600 (seconds a shutdown keeps \
             retrying an unreachable store before it writes the unstored ledger rows to a spill \
             file in store.spill_dir), got {}",
            s.shutdown_flush_timeout_s
        ));
    }
    let spill_dir = match s.spill_dir.as_deref().map(str::trim) {
        Some("") => {
            errs.push(
                "store.spill_dir must name a directory, got \"\"; leave it out for the default \
                 (ledger-spill beside the SQLite file, else data/ledger-spill)"
                    .into(),
            );
            PathBuf::new()
        }
        Some(dir) => PathBuf::from(dir),
        None => default_spill_dir(&url),
    };
    Store {
        url,
        ledger_flush: Duration::from_millis(s.ledger_flush_ms),
        ledger_batch_rows: s.ledger_batch_rows.max(1),
        max_unstored_rows: s.max_unstored_rows,
        key_refresh: Duration::from_millis(s.key_refresh_ms),
        shutdown_flush_timeout: Duration::from_secs(s.shutdown_flush_timeout_s),
        spill_dir,
    }
}

/// `ledger-spill` beside the SQLite file of `url`; `data/ledger-spill` for PostgreSQL or an
/// in-memory database.
fn default_spill_dir(url: &str) -> PathBuf {
    match url.strip_prefix("sqlite://") {
        Some(path) if !path.is_empty() && path != ":memory:" => Path::new(path)
            .parent()
            .map(|p| p.join("ledger-spill"))
            .unwrap_or_else(|| PathBuf::from("ledger-spill")),
        _ => PathBuf::from("data/ledger-spill"),
    }
}

/// A store URL with its password replaced, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn validate_billing(b: RawBilling, errs: &mut Vec<String>) -> Billing {
    let min_top_up = Pen::parse(&b.min_top_up, AMOUNT_DECIMALS).unwrap_or_else(|e| {
        errs.push(format!("billing.min_top_up: {e}"));
        Pen::ZERO
    });
    let lease_chunk = Pen::parse(&b.lease_chunk, AMOUNT_DECIMALS).unwrap_or_else(|e| {
        errs.push(format!("billing.lease_chunk: {e}"));
        Pen::ZERO
    });
    if lease_chunk == Pen::ZERO {
        errs.push("billing.lease_chunk must be more than 0".into());
    }
    Billing {
        min_top_up,
        lease_chunk,
    }
}

fn validate_streaming(s: RawStreaming, errs: &mut Vec<String>) -> Streaming {
    if s.ping_interval_ms < 100 {
        errs.push(format!(
            "streaming.ping_interval_ms must be at least 100, got {}",
            s.ping_interval_ms
        ));
    }
    let chat_reasoning_field = match s.chat_reasoning_field.as_str() {
        "reasoning" => ReasoningField::Reasoning,
        "reasoning_content" => ReasoningField::ReasoningContent,
        "both" => ReasoningField::Both,
        other => {
            errs.push(format!(
                "streaming.chat_reasoning_field must be \"reasoning\", \"reasoning_content\" or \"both\", got \"{other}\""
            ));
            ReasoningField::Both
        }
    };
    Streaming {
        ping_interval: Duration::from_millis(s.ping_interval_ms),
        chat_reasoning_field,
    }
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

fn validate_models(
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
    for (i, m) in models.into_iter().enumerate() {
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
        if !m.tokenize_path.starts_with('/') {
            errs.push(format!(
                "{key}.tokenize_path must start with '/', got \"{}\"",
                m.tokenize_path
            ));
        }
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
            routing,
        });
    }
    out
}

/// Parses `http://host:port[/path]`, by syntax alone: the host is an IPv4 literal, a bracketed
/// IPv6 literal or a host name (letters, digits, `-`, `_`, dot-separated labels); the port
/// defaults to 80. Names are resolved later, by [`Config::resolve_upstreams`].
pub fn parse_replica(url: &str) -> Result<Replica, String> {
    let rest = if let Some(r) = url.strip_prefix("http://") {
        r
    } else if url.starts_with("https://") {
        return Err(format!(
            "\"{url}\": https upstreams are not supported by this build; reach the upstream over http inside its network"
        ));
    } else {
        return Err(format!(
            "\"{url}\" must start with http:// (e.g. \"http://10.0.0.5:8000/v1\")"
        ));
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if path.contains(['?', '#']) {
        return Err(format!(
            "\"{url}\": an upstream URL is a base path; remove the query or fragment"
        ));
    }
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("\"{url}\" has no host"));
    }
    let (host, port_text) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("\"{url}\": an IPv6 host needs its closing `]`"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("\"{url}\": expected `:port` after the IPv6 host"))?,
            ),
        };
        (inside, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port_text {
        None => 80,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("\"{url}\": the port must be a number from 1 to 65535"))?,
    };
    let ip: Option<IpAddr> = if authority.starts_with('[') {
        Some(IpAddr::V6(host.parse::<Ipv6Addr>().map_err(|_| {
            format!("\"{url}\": \"{host}\" is not an IPv6 address")
        })?))
    } else if let Ok(v4) = host.parse::<Ipv4Addr>() {
        Some(IpAddr::V4(v4))
    } else if is_host_name(host) {
        None
    } else {
        return Err(format!(
            "\"{url}\": \"{host}\" is neither an IP address nor a host name"
        ));
    };
    let path = path.trim_end_matches('/');
    let api_base = if path.is_empty() {
        "/v1".to_owned()
    } else {
        path.to_owned()
    };
    Ok(Replica {
        url: url.to_owned(),
        authority: authority.to_owned(),
        host: host.to_owned(),
        port,
        addr: ip.map_or(UNRESOLVED, |ip| SocketAddr::new(ip, port)),
        chat_path: format!("{api_base}/chat/completions"),
        api_base,
    })
}

/// A DNS name as resolvers take it: dot-separated labels of letters, digits, `-` and `_`
/// (1–63 bytes each, at most 253 in all, one trailing dot allowed), whose last label is not
/// all digits (that would be a malformed IPv4 address).
fn is_host_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let labels_ok = name.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    let last_numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && !last_numeric
}

fn validate_aliases(
    aliases: BTreeMap<String, String>,
    models: &[Model],
    errs: &mut Vec<String>,
) -> Vec<Alias> {
    let mut out = Vec::new();
    for (pattern, slug) in aliases {
        match models.iter().find(|m| m.slug == slug) {
            Some(m) => out.push(Alias {
                pattern,
                model: m.id,
            }),
            None => errs.push(format!(
                "aliases.\"{pattern}\" points to \"{slug}\", which is not a configured slug"
            )),
        }
    }
    // Most specific first: fewer wildcards, then longer patterns.
    out.sort_by_key(|a| {
        let wild = a.pattern.matches(['*', '?']).count();
        (wild, std::cmp::Reverse(a.pattern.len()))
    });
    out
}

fn validate_plans(plans: Vec<RawPlan>, errs: &mut Vec<String>) -> Vec<Plan> {
    let mut out: Vec<Plan> = Vec::new();
    for (i, p) in plans.into_iter().enumerate() {
        if p.id.trim().is_empty() {
            errs.push(format!("plans[{i}].id must not be empty"));
        }
        if out.iter().any(|o| o.id == p.id) {
            errs.push(format!("plans[{i}].id \"{}\" is used twice", p.id));
        }
        let price = Pen::parse(&p.price, AMOUNT_DECIMALS).unwrap_or_else(|e| {
            errs.push(format!("plans[{i}].price: {e}"));
            Pen::ZERO
        });
        out.push(Plan {
            id: p.id,
            display_name: p.display_name,
            price,
            usage_label: p.usage_label,
            web_search: p.web_search,
        });
    }
    out
}

/// Glob match with `*` (any run) and `?` (one char). Iterative, linear in practice.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse(text: &str) -> Result<Config, ConfigErrors> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigErrors(vec![e.to_string()]))?;
        Config::from_raw(raw, &no_env)
    }

    const MINIMAL: &str = r#"
[[models]]
slug = "colibri"
display_name = "Colibrí"
upstream_model = "qwen"
upstreams = ["http://127.0.0.1:8000"]
prices = { input = "0.20", cached = "0.05", output = "0.80" }
"#;

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::parse(EMBEDDED_DEFAULT, "embedded").unwrap();
        let slugs: Vec<_> = c.models.iter().map(|m| m.slug.as_str()).collect();
        assert_eq!(slugs, ["colibri", "aguila", "apu"]);
        assert!(!c.plans.is_empty());
        assert_eq!(
            c.resolve_model("claude-opus-5-5").map(|m| m.slug.as_str()),
            Some("apu")
        );
        assert_eq!(
            c.resolve_model("claude-haiku-4-5").map(|m| m.slug.as_str()),
            Some("colibri")
        );
    }

    #[test]
    fn minimal_gets_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.server.max_body_bytes, 32 * 1024 * 1024);
        let m = &c.models[0];
        assert_eq!(m.replicas[0].api_base, "/v1");
        assert_eq!(m.replicas[0].chat_path(), "/v1/chat/completions");
        assert_eq!(m.prices.output, Rate::parse("0.8").unwrap());
        assert_eq!(c.billing.min_top_up, Pen::from_centimos(1000));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = r#"
[server]
threads = 0
listen = "nowhere"
[store]
url = "mysql://x"
[billing]
min_top_up = "ten"
[[models]]
slug = "Bad Slug"
display_name = ""
upstream_model = "q"
upstreams = ["ftp://x"]
prices = { input = "0.1234567", cached = "-1", output = "1" }
routing = "random"
[aliases]
"gpt-*" = "nope"
"#;
        let e = parse(text).unwrap_err().0;
        let joined = e.join("\n");
        for needle in [
            "server.threads",
            "server.listen",
            "store.url",
            "billing.min_top_up",
            "models[0].slug",
            "models[0].display_name",
            "models[0].upstreams[0]",
            "models[0].prices.input",
            "models[0].prices.cached",
            "models[0].routing",
            "aliases.\"gpt-*\"",
        ] {
            assert!(joined.contains(needle), "missing {needle} in:\n{joined}");
        }
    }

    #[test]
    fn shutdown_flush_and_spill_dir() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.store.shutdown_flush_timeout, Duration::from_secs(30));
        assert_eq!(c.store.spill_dir, PathBuf::from("data/ledger-spill"));
        let with_store = |store: &str| parse(&format!("[store]\n{store}\n{MINIMAL}"));
        let c = with_store("url = \"sqlite:///var/lib/quipu/quipu.db\"").unwrap();
        assert_eq!(
            c.store.spill_dir,
            PathBuf::from("/var/lib/quipu/ledger-spill")
        );
        let c = with_store("url = \"sqlite://quipu.db\"").unwrap();
        assert_eq!(c.store.spill_dir, PathBuf::from("ledger-spill"));
        for url in ["postgres://q@db/quipu", "sqlite://:memory:"] {
            let c = with_store(&format!("url = \"{url}\"")).unwrap();
            assert_eq!(
                c.store.spill_dir,
                PathBuf::from("data/ledger-spill"),
                "{url}"
            );
        }
        let c = with_store("spill_dir = \"/srv/spill\"\nshutdown_flush_timeout_s = 5").unwrap();
        assert_eq!(c.store.spill_dir, PathBuf::from("/srv/spill"));
        assert_eq!(c.store.shutdown_flush_timeout, Duration::from_secs(5));
        for bad in ["0", "3601"] {
            let e = with_store(&format!("shutdown_flush_timeout_s = {bad}")).unwrap_err();
            assert!(
                e.to_string()
                    .contains("store.shutdown_flush_timeout_s must be between 1 and 3600"),
                "{e}"
            );
            assert!(e.to_string().contains(&format!("got {bad}")), "{e}");
        }
        let e = with_store("spill_dir = \" \"").unwrap_err();
        assert!(
            e.to_string()
                .contains("store.spill_dir must name a directory"),
            "{e}"
        );
    }

    #[test]
    fn head_and_key_poll_limits_are_bounded() {
        for (server, store, needle) in [
            (
                "max_header_bytes = 100",
                "",
                "server.max_header_bytes must be between 1024 and 1048575",
            ),
            ("max_header_bytes = 2000000", "", "server.max_header_bytes"),
            (
                "",
                "key_refresh_ms = 2000",
                "store.key_refresh_ms must be between 1 and 1500",
            ),
        ] {
            let text = format!("{MINIMAL}\n[server]\n{server}\n[store]\n{store}\n");
            let e = parse(&text).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
        let c = parse(&format!("{MINIMAL}\n[server]\nmax_header_bytes = 8192\n")).unwrap();
        assert_eq!(c.server.max_header_bytes, 8192);
        assert_eq!(parse(MINIMAL).unwrap().server.max_header_bytes, 64 * 1024);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = parse(&format!("{MINIMAL}\n[server]\nlisten_port = 1\n")).unwrap_err();
        assert!(e.to_string().contains("listen_port"), "{e}");
    }

    #[test]
    fn secrets_from_environment() {
        let text = format!("{MINIMAL}\n[server]\nadmin_token = \"env:QUIPU_TEST_TOKEN\"\n");
        let raw: RawConfig = toml::from_str(&text).unwrap();
        let e = Config::from_raw(raw, &no_env).unwrap_err();
        assert!(e.0[0].contains("QUIPU_TEST_TOKEN"));
        let raw: RawConfig = toml::from_str(&text).unwrap();
        let c = Config::from_raw(raw, &|n| {
            (n == "QUIPU_TEST_TOKEN").then(|| "0123456789abcdef-token".to_owned())
        })
        .unwrap();
        assert_eq!(
            c.server.admin_token.as_deref(),
            Some("0123456789abcdef-token")
        );
    }

    #[test]
    fn thinking_switch_may_not_override_reserved_fields() {
        let text = format!("{MINIMAL}thinking_on = {{ stream = false }}\n");
        let e = parse(&text).unwrap_err();
        assert!(e.0[0].contains("models[0].thinking_on may not set \"stream\""));
        let text = format!("{MINIMAL}thinking_off = {{ add_generation_prompt = false }}\n");
        let e = parse(&text).unwrap_err();
        assert!(
            e.0[0].contains("may not set \"add_generation_prompt\""),
            "{e}"
        );
    }

    #[test]
    fn absurd_rates_are_refused_at_validation() {
        let text = MINIMAL.replace("output = \"0.80\"", "output = \"80000000\"");
        let e = parse(&text).unwrap_err();
        assert!(e.0[0].starts_with("models[0].prices.output:"), "{e}");
        assert!(e.0[0].contains("S/ 1 per token"), "{e}");
    }

    #[test]
    fn image_url_policies() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.security.image_urls, ImageUrlPolicy::Forward);
        for (v, want) in [
            ("forward", ImageUrlPolicy::Forward),
            ("forward_any", ImageUrlPolicy::ForwardAny),
            ("reject", ImageUrlPolicy::Reject),
        ] {
            let c = parse(&format!("[security]\nimage_urls = \"{v}\"\n{MINIMAL}")).unwrap();
            assert_eq!(c.security.image_urls, want);
        }
        let e = parse(&format!("[security]\nimage_urls = \"any\"\n{MINIMAL}")).unwrap_err();
        assert!(e.0[0].contains("forward_any"), "{e}");
    }

    #[test]
    fn prefill_switch_defaults_on() {
        assert!(parse(MINIMAL).unwrap().models[0].prefill);
        let c = parse(&format!("{MINIMAL}prefill = false\n")).unwrap();
        assert!(!c.models[0].prefill);
        let e = parse(&format!("{MINIMAL}prefill = \"yes\"\n")).unwrap_err();
        assert!(e.to_string().contains("prefill"), "{e}");
    }

    #[test]
    fn replica_urls() {
        let r = parse_replica("http://127.0.0.1:9000/openai/v1/").unwrap();
        assert_eq!(r.api_base, "/openai/v1");
        assert_eq!(r.authority, "127.0.0.1:9000");
        assert_eq!(r.addr, "127.0.0.1:9000".parse().unwrap());
        assert!(r.is_resolved());
        let r = parse_replica("http://[::1]:8000/v1").unwrap();
        assert_eq!(r.addr, "[::1]:8000".parse().unwrap());
        assert_eq!(r.authority, "[::1]:8000");
        let r = parse_replica("http://[fd00::5]").unwrap();
        assert_eq!(r.addr, "[fd00::5]:80".parse().unwrap());
        // A name is checked for syntax only; its address comes at start.
        let r = parse_replica("http://localhost").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("localhost", 80));
        assert!(!r.is_resolved());
        let r = parse_replica("http://vllm-0.vllm.svc.cluster.local:8000/v1").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port),
            ("vllm-0.vllm.svc.cluster.local", 8000)
        );
        assert!(parse_replica("https://x:1").unwrap_err().contains("https"));
        for bad in [
            "10.0.0.1:80",
            "http://",
            "http://user@host:80",
            "http://host:0",
            "http://host:65536",
            "http://host:http",
            "http://[::1",
            "http://[::1]x",
            "http://[not-v6]:80",
            "http://10.0.0.256",
            "http://bad host",
            "http://-lead.example",
            "http://a..b",
            "http://host/v1?x=1",
            "http://ñ.example",
        ] {
            assert!(parse_replica(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parsing_never_resolves_names_and_start_does() {
        // A name that no resolver knows parses fine: no DNS at parse time.
        let text = MINIMAL.replace(
            "http://127.0.0.1:8000",
            "http://vllm-a.invalid:8000\", \"http://10.0.0.9:8001",
        );
        let c = parse(&text).unwrap();
        let rs = &c.models[0].replicas;
        assert!(!rs[0].is_resolved());
        assert_eq!(rs[1].addr, "10.0.0.9:8001".parse().unwrap());
        // At start: names resolve through the resolver, literals are left alone.
        let asked = std::cell::RefCell::new(Vec::new());
        let resolved = c
            .clone()
            .resolve_upstreams_with(&|h, p| {
                asked.borrow_mut().push((h.to_owned(), p));
                Ok(vec![SocketAddr::from(([10, 0, 0, 7], p))])
            })
            .unwrap();
        assert_eq!(
            asked.into_inner(),
            vec![("vllm-a.invalid".to_owned(), 8000)]
        );
        assert_eq!(
            resolved.models[0].replicas[0].addr,
            "10.0.0.7:8000".parse().unwrap()
        );
        // Failures name the key; two entries that are one server are refused.
        let e = c
            .clone()
            .resolve_upstreams_with(&|_, _| Err(std::io::Error::other("NXDOMAIN")))
            .unwrap_err();
        assert!(e.0[0].contains("models[0].upstreams[0]") && e.0[0].contains("NXDOMAIN"));
        let e = c
            .clone()
            .resolve_upstreams_with(&|_, _| Ok(Vec::new()))
            .unwrap_err();
        assert!(e.0[0].contains("resolves to no address"), "{e}");
        let e = c
            .resolve_upstreams_with(&|_, p| Ok(vec![SocketAddr::from(([10, 0, 0, 9], p + 1))]))
            .unwrap_err();
        assert!(e.0[0].contains("same server"), "{e}");
        // Syntactic duplicates are caught at parse time.
        let text = MINIMAL.replace(
            "http://127.0.0.1:8000",
            "http://Host.example:8000\", \"http://host.example:8000/v1",
        );
        assert!(parse(&text).unwrap_err().0[0].contains("repeats"));
    }

    #[test]
    fn globs() {
        assert!(glob_match("claude-opus-*", "claude-opus-5-5"));
        assert!(glob_match("*sonnet*", "claude-sonnet-4"));
        assert!(glob_match("gpt-?o", "gpt-4o"));
        assert!(!glob_match("claude-opus-*", "claude-haiku-4"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }

    #[test]
    fn url_redaction() {
        assert_eq!(
            redact_url("postgres://quipu:secret@db:5432/quipu"),
            "postgres://quipu:***@db:5432/quipu"
        );
        assert_eq!(redact_url("sqlite://data/q.db"), "sqlite://data/q.db");
    }
}
