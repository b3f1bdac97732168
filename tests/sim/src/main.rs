//! `quipu-sim`: a vLLM-faithful upstream for Quipu's tests and benchmarks (dev only).
//!
//! Serves `/v1/chat/completions` (non-stream and SSE, exactly vLLM's chunk sequence and
//! envelopes, or SGLang's / llama.cpp's with `--flavor`), `/health`, `/v1/models` and
//! `/tokenize`. Usage is real arithmetic over a deterministic tokenizer, with
//! `prompt_tokens_details.cached_tokens` from a block prefix cache that remembers earlier
//! requests. Faults and pacing are driven by directives in the final user message
//! (`[[sim: tokens=5 delay_ms=100 fail_after=3]]`, see `directives.rs`), so tests drive them
//! through the gateway without extra headers. `/sim/*` routes expose what it saw.
//!
//! With `--max-num-seqs N` at most N requests generate at once and the rest wait FIFO, as in
//! the engine (`engine.rs`); `GET /metrics` shows the flavor's running/waiting gauges
//! (llama.cpp also `GET /slots`), and `GET /sim/engine` the slot utilization.

mod app;
mod cache;
mod directives;
mod engine;
mod generate;
mod render;
mod tokenizer;

use clap::Parser;
use parking_lot::Mutex;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use render::{Flavor, Shape};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "quipu-sim",
    about = "A vLLM-faithful upstream simulator for Quipu's tests"
)]
struct Cli {
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// When set, other model names get vLLM's 404.
    #[arg(long)]
    served_model_name: Option<String>,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, default_value_t = 100_000)]
    cache_blocks: usize,
    #[arg(long, default_value_t = 32_768)]
    max_model_len: usize,
    /// `reasoning` (vLLM) or `reasoning_content` (SGLang, llama.cpp).
    #[arg(long)]
    reasoning_field: Option<String>,
    /// Sequences generated at once (vLLM's `--max-num-seqs`, llama.cpp's `--parallel`); the
    /// rest wait first come, first served. Default: unlimited.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_num_seqs: Option<u32>,
    /// Delay between stream chunks (and per token for non-stream answers).
    #[arg(long, default_value_t = 0)]
    token_delay_ms: u64,
    /// Omit prompt_tokens_details (vLLM without --enable-prompt-tokens-details).
    #[arg(long)]
    no_cached_details: bool,
    #[arg(long, value_enum, default_value = "vllm")]
    flavor: Flavor,
    #[arg(long)]
    start_unhealthy: bool,
    /// Serve HTTPS with this PEM certificate chain (and `--tls-key`), like a replica behind a
    /// TLS load balancer.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    #[arg(long)]
    tls_key: Option<String>,
    /// With `--tls-cert`: require a client certificate signed by this PEM CA (mTLS).
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<String>,
}

fn main() {
    let cli = Cli::parse();
    let reasoning_field = cli.reasoning_field.unwrap_or_else(|| {
        if cli.flavor == Flavor::Vllm {
            "reasoning".into()
        } else {
            "reasoning_content".into()
        }
    });
    let sim = app::Sim {
        shape: Shape {
            flavor: cli.flavor,
            reasoning_field,
            cached_details: !cli.no_cached_details,
        },
        served_model: cli.served_model_name,
        max_model_len: cli.max_model_len,
        token_delay: Duration::from_millis(cli.token_delay_ms),
        healthy: AtomicBool::new(!cli.start_unhealthy),
        fault_status: AtomicU64::new(0),
        cache: Mutex::new(cache::PrefixCache::new(cli.block_size, cli.cache_blocks)),
        records: Mutex::new(VecDeque::new()),
        last_body: Mutex::new(bytes::Bytes::new()),
        seq: AtomicU64::new(0),
        logged: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        cancelled: AtomicU64::new(0),
        engine: engine::Engine::new(cli.max_num_seqs.map(|n| n as usize)),
    };
    let conf = ServerConf {
        threads: cli.threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        pid_file: format!("/tmp/quipu-sim-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/quipu-sim-{}.sock", std::process::id()),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut svc =
        pingora::proxy::http_proxy_service_with_name(&server.configuration, sim, "quipu-sim");
    match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => {
            pingora::tls::install_default_crypto_provider();
            let Ok(mut settings) = pingora::listeners::tls::TlsSettings::intermediate(cert, key)
            else {
                eprintln!("quipu-sim: cannot use {cert} / {key}");
                std::process::exit(2);
            };
            if let Some(ca) = &cli.tls_client_ca {
                let mut roots = pingora::tls::RootCertStore::empty();
                let verifier = pingora::tls::load_ca_file_into_store(ca, &mut roots)
                    .ok()
                    .and_then(|()| {
                        pingora::tls::WebPkiClientVerifier::builder(std::sync::Arc::new(roots))
                            .build()
                            .ok()
                    });
                let Some(verifier) = verifier else {
                    eprintln!("quipu-sim: cannot use {ca} as a client CA");
                    std::process::exit(2);
                };
                settings.set_client_cert_verifier(verifier);
            }
            svc.add_tls_with_settings(&cli.listen, None, settings);
        }
        _ => svc.add_tcp(&cli.listen),
    }
    server.add_service(svc);
    server.run_forever();
}
