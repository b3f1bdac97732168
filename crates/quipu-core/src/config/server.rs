//! `[server]`, `[limits]`, `[streaming]` and `[security]`: how the gateway faces its clients
//! (listeners, sizes, timeouts, rate-limit defaults, the reasoning field name, the image URL
//! policy), validated.

use super::raw::{RawLimits, RawSecurity, RawServer, RawStreaming, RawTls};
use super::secrets::secret;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The largest request head pingora 0.9 reads (`MAX_HEADER_SIZE`); above it, a bare 400.
pub const PINGORA_MAX_HEAD_BYTES: usize = 1_048_575;

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
    /// TLS on the API listener (the files are read, and reread on reload, by `quipu serve`).
    pub tls: Option<TlsFiles>,
    /// The admin listener serves TLS with the same certificate.
    pub admin_tls: bool,
    pub tls_handshake_timeout: Duration,
    pub http2: bool,
    pub h2c: bool,
    pub h2_max_streams: u32,
    /// Longest time an upstream name's address is kept before it is resolved again.
    pub dns_refresh: Duration,
    /// Name servers for upstream names; empty: the system's.
    pub dns_servers: Vec<SocketAddr>,
}

/// A listener's certificate chain and private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Rate-limit defaults for keys and tenants (0 = unlimited), counted per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub key_requests_per_minute: u64,
    pub key_tokens_per_minute: u64,
    pub tenant_requests_per_minute: u64,
    pub tenant_tokens_per_minute: u64,
    pub engine: LimitEngine,
    /// Length of a window, aligned to the wall clock (60 s unless configured for tests).
    pub window: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            key_requests_per_minute: 0,
            key_tokens_per_minute: 0,
            tenant_requests_per_minute: 0,
            tenant_tokens_per_minute: 0,
            engine: LimitEngine::Auto,
            window: Duration::from_secs(60),
        }
    }
}

/// Where rate windows are counted (`[limits] engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitEngine {
    /// The store's shared windows on PostgreSQL (several replicas), in-process on SQLite.
    Auto,
    /// In-process counts: exact for one replica; each replica counts alone.
    Local,
    /// The store's shared windows, whatever the store.
    Store,
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

fn socket_addr(value: &str, key: &str, errs: &mut Vec<String>) -> SocketAddr {
    value.parse().unwrap_or_else(|_| {
        errs.push(format!(
            "{key} must be an address like \"127.0.0.1:8080\", got \"{value}\""
        ));
        SocketAddr::from(([127, 0, 0, 1], 0))
    })
}

pub(super) fn validate_server(
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
    if s.tls_handshake_timeout_ms == 0 {
        errs.push("server.tls_handshake_timeout_ms must be at least 1".into());
    }
    if !(1..=10_000).contains(&s.h2_max_streams) {
        errs.push(format!(
            "server.h2_max_streams must be between 1 and 10000, got {}",
            s.h2_max_streams
        ));
    }
    if s.dns_refresh_s == 0 {
        errs.push("server.dns_refresh_s must be at least 1".into());
    }
    let dns_servers = s
        .dns_servers
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let key = format!("server.dns_servers[{i}]");
            match v.parse::<std::net::IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, 53),
                Err(_) => socket_addr(v, &key, errs),
            }
        })
        .collect();
    let tls = s.tls.map(|RawTls { cert, key }| {
        if cert.is_empty() || key.is_empty() {
            errs.push("server.tls needs both `cert` and `key` (PEM files)".into());
        }
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
        }
    });
    if s.admin_tls && tls.is_none() {
        errs.push(
            "server.admin_tls serves the admin listener with the API listener's certificate: \
             set server.tls = { cert = \"…\", key = \"…\" } too"
                .into(),
        );
    }
    let listen = socket_addr(&s.listen, "server.listen", errs);
    let stem = runtime_file_stem(&listen);
    let file = |value: Option<String>, key: &str, suffix: &str, errs: &mut Vec<String>| match value
    {
        Some(v) if v.trim().is_empty() => {
            errs.push(format!(
                "server.{key} must name a file, got \"\"; leave it out for the default ({stem}{suffix})"
            ));
            format!("{stem}{suffix}")
        }
        Some(v) => v,
        None => format!("{stem}{suffix}"),
    };
    let pid_file = file(s.pid_file, "pid_file", ".pid", errs);
    let upgrade_sock = file(s.upgrade_sock, "upgrade_sock", "_upgrade.sock", errs);
    Server {
        listen,
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
        pid_file,
        upgrade_sock,
        replica_id: s.replica_id.filter(|r| !r.is_empty()),
        access_log: s.access_log,
        tls,
        admin_tls: s.admin_tls,
        tls_handshake_timeout: Duration::from_millis(s.tls_handshake_timeout_ms),
        http2: s.http2,
        h2c: s.h2c,
        h2_max_streams: s.h2_max_streams,
        dns_refresh: Duration::from_secs(s.dns_refresh_s),
        dns_servers,
    }
}

pub(super) fn limits(l: RawLimits, errs: &mut Vec<String>) -> Limits {
    let RawLimits {
        key_requests_per_minute,
        key_tokens_per_minute,
        tenant_requests_per_minute,
        tenant_tokens_per_minute,
        engine,
        window_s,
    } = l;
    let engine = match engine.as_str() {
        "auto" => LimitEngine::Auto,
        "local" => LimitEngine::Local,
        "store" => LimitEngine::Store,
        other => {
            errs.push(format!(
                "limits.engine must be \"auto\", \"local\" or \"store\", got \"{other}\""
            ));
            LimitEngine::Auto
        }
    };
    if !(1..=3_600).contains(&window_s) {
        errs.push(format!(
            "limits.window_s must be between 1 and 3600 seconds (60 for per-minute limits), got {window_s}"
        ));
    }
    Limits {
        key_requests_per_minute,
        key_tokens_per_minute,
        tenant_requests_per_minute,
        tenant_tokens_per_minute,
        engine,
        window: Duration::from_secs(window_s.clamp(1, 3_600)),
    }
}

/// The default `pid_file` and `upgrade_sock` of a listener: `/tmp/quipu-<port>` for a listener
/// on every address, `/tmp/quipu-<ip>-<port>` for one address (IPv6 colons as `_`). Two
/// processes with different listeners never share them; the new process of a graceful upgrade,
/// which has the same listener, finds the old one's socket.
pub fn runtime_file_stem(listen: &SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        format!("/tmp/quipu-{}", listen.port())
    } else {
        let ip = listen.ip().to_string().replace(':', "_");
        format!("/tmp/quipu-{ip}-{}", listen.port())
    }
}

pub(super) fn validate_streaming(s: RawStreaming, errs: &mut Vec<String>) -> Streaming {
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

pub(super) fn validate_security(s: RawSecurity, errs: &mut Vec<String>) -> Security {
    Security {
        image_urls: match s.image_urls.as_str() {
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
    }
}
