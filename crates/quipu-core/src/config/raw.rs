//! The file's shape: `conf/quipu.toml` as written, read by serde and nothing else.
//!
//! Every section and table refuses unknown keys (`deny_unknown_fields`), and optional fields
//! carry their defaults here, so the file documents itself. Only
//! [`Config::from_raw`](super::Config::from_raw) reads these types; the rest of the gateway
//! reads the validated [`Config`](super::Config).

use serde::Deserialize;
use std::collections::BTreeMap;

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
    pub responses: RawResponses,
    #[serde(default)]
    pub scheduling: RawScheduling,
    #[serde(default)]
    pub models: Vec<RawModel>,
    /// Other model names (glob patterns with `*` and `?`) → slug.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    #[serde(default)]
    pub plans: Vec<RawPlan>,
    /// The operator's alert endpoints (see `config::webhooks`).
    #[serde(default)]
    pub webhooks: Vec<RawWebhook>,
    #[serde(default)]
    pub webhook_delivery: RawWebhookDelivery,
}

/// `[[webhooks]]`: one operator endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWebhook {
    pub url: String,
    pub secret: String,
    /// Event types, or `["*"]`; none: every event.
    #[serde(default)]
    pub events: Vec<String>,
}

/// `[webhook_delivery]` (see `config::webhooks`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawWebhookDelivery {
    pub timeout_ms: u64,
    pub first_retry_ms: u64,
    pub max_retry_delay_s: u64,
    pub max_attempts: u32,
    pub poll_ms: u64,
    pub key_scan_s: u64,
    pub tenant_private_urls: bool,
}

impl Default for RawWebhookDelivery {
    fn default() -> Self {
        // The schedule of `governance::webhooks::backoff`'s default.
        RawWebhookDelivery {
            timeout_ms: 10_000,
            first_retry_ms: 30_000,
            max_retry_delay_s: 6 * 3600,
            max_attempts: 20,
            poll_ms: 1000,
            key_scan_s: 300,
            tenant_private_urls: false,
        }
    }
}

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
    /// Default: `/tmp/quipu-<port>.pid` (`/tmp/quipu-<ip>-<port>.pid` for a listener on one
    /// address), so processes on one host with different listeners never share it.
    pub pid_file: Option<String>,
    /// The graceful-upgrade hand-over socket; default derived from the listener like
    /// `pid_file` (`/tmp/quipu-<port>_upgrade.sock`): the new process of an upgrade has the same
    /// listener, so it finds the old one's.
    pub upgrade_sock: Option<String>,
    pub replica_id: Option<String>,
    pub access_log: bool,
    /// TLS on the API listener: `{ cert = "…pem", key = "…pem" }` (PEM chain and key).
    pub tls: Option<RawTls>,
    /// Serve the admin listener over TLS too, with the same certificate (needs `tls`).
    pub admin_tls: bool,
    /// A TLS handshake must finish within this long (and within `header_timeout_ms`).
    pub tls_handshake_timeout_ms: u64,
    /// Offer HTTP/2 (ALPN `h2`) on the TLS listener.
    pub http2: bool,
    /// Take HTTP/2 with prior knowledge (h2c) on a plain listener.
    pub h2c: bool,
    /// Concurrent streams per HTTP/2 connection.
    pub h2_max_streams: u32,
    /// Upstream host names are resolved again at least this often (sooner when their DNS
    /// record's TTL says so, and at once after a connect failure).
    pub dns_refresh_s: u64,
    /// Name servers for upstream host names (`"10.0.0.2:53"`); empty: the system's
    /// (`/etc/resolv.conf`, `/etc/hosts`).
    pub dns_servers: Vec<String>,
}

/// TLS to a model's `https://` replicas.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    /// PEM bundle of the CAs that sign the replicas' certificates (default: the system's).
    #[serde(default)]
    pub ca: Option<String>,
    /// PEM certificate chain and key presented to replicas that require one (mTLS).
    #[serde(default)]
    pub client_cert: Option<String>,
    #[serde(default)]
    pub client_key: Option<String>,
    /// `false` accepts any certificate: an explicit, logged choice for test clusters.
    #[serde(default = "default_true")]
    pub verify: bool,
}

/// A listener's certificate chain and private key, PEM files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: String,
    pub key: String,
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
            pid_file: None,
            upgrade_sock: None,
            replica_id: None,
            access_log: true,
            tls: None,
            admin_tls: false,
            tls_handshake_timeout_ms: 10_000,
            http2: true,
            h2c: true,
            h2_max_streams: 256,
            dns_refresh_s: 30,
            dns_servers: Vec::new(),
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    pub key_requests_per_minute: u64,
    pub key_tokens_per_minute: u64,
    pub tenant_requests_per_minute: u64,
    pub tenant_tokens_per_minute: u64,
    /// Where windows are counted: `auto` (the store's shared windows on PostgreSQL, exact
    /// in-process counts on SQLite), `local` (in-process: each replica counts alone) or
    /// `store` (shared windows on either store).
    pub engine: String,
    /// Length of a rate window in seconds; windows are aligned to the wall clock (UTC), so
    /// every replica counts the same one. The limits are counts per window: keep 60 for
    /// per-minute limits (a shorter window, for tests, counts the same numbers in less time).
    pub window_s: u64,
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            key_requests_per_minute: 0,
            key_tokens_per_minute: 0,
            tenant_requests_per_minute: 0,
            tenant_tokens_per_minute: 0,
            engine: "auto".into(),
            window_s: 60,
        }
    }
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

/// `[responses]`: stored responses of the Responses API (see `config::responses`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawResponses {
    pub retention_days: u64,
    pub max_mib_per_tenant: u64,
    pub cleanup_interval_s: u64,
    pub max_queued_mib: u64,
}

impl Default for RawResponses {
    fn default() -> Self {
        RawResponses {
            retention_days: 30,
            max_mib_per_tenant: 256,
            cleanup_interval_s: 300,
            max_queued_mib: 64,
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
    /// How `https://` replicas are verified, and the client certificate they may require.
    #[serde(default)]
    pub upstream_tls: Option<RawUpstreamTls>,
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
    /// An endpoint that counts vLLM's chat form (`/v1/messages/count_tokens`), replacing the
    /// server's own (see `upstream_profile`).
    #[serde(default)]
    pub tokenize_path: Option<String>,
    /// `"vllm"`, `"sglang"`, `"llama.cpp"`, or `"auto"` to detect each replica's server.
    #[serde(default = "default_server")]
    pub server: String,
    /// `least_loaded`, `round_robin` or `prefix_affinity`.
    #[serde(default = "default_routing")]
    pub routing: String,
    /// Requests Quipu has running at once on each replica (the engine's `--max-num-seqs`,
    /// llama.cpp's `--parallel`); absent: every admitted request is forwarded at once (see
    /// `config::scheduling`).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// `"auto"` (read the engines' own load where the model is scheduled) or `"off"`.
    #[serde(default = "default_engine_load")]
    pub engine_load: String,
}

fn default_engine_load() -> String {
    "auto".into()
}

/// `[scheduling]`: the queue of every scheduled model (see `config::scheduling`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawScheduling {
    pub queue_timeout_ms: u64,
    pub tenant_queue_cap: u32,
    pub max_queued: u32,
    pub batch_age_limit_ms: u64,
    pub affinity_wait_ms: u64,
    pub engine_queue_allowance: u32,
    pub return_hold_ms: u64,
    pub load_interval_ms: u64,
    pub gateways: u32,
    pub stream_head_after_ms: u64,
}

impl Default for RawScheduling {
    fn default() -> Self {
        let d = crate::schedule::SchedulerConfig::default();
        RawScheduling {
            queue_timeout_ms: d.queue_timeout.0,
            tenant_queue_cap: d.tenant_queue_cap,
            max_queued: d.max_queued,
            batch_age_limit_ms: d.batch_age_limit.0,
            affinity_wait_ms: d.affinity_wait.0,
            engine_queue_allowance: d.engine_queue_allowance,
            return_hold_ms: d.return_hold.0,
            load_interval_ms: 500,
            gateways: 1,
            stream_head_after_ms: 1_000,
        }
    }
}

fn default_context_window() -> u64 {
    131_072
}
fn default_true() -> bool {
    true
}
fn default_server() -> String {
    "auto".into()
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
