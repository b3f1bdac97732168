//! `bare-forwarder --listen ADDR --upstream ADDR [--threads N] [--h2c] [--tls-cert PEM --tls-key PEM]`:
//! pingora-proxy with nothing but `upstream_peer`, the same pingora build as Quipu. The
//! benchmark's floor for anything built on this framework (docs/benchmarks.md).
//!
//! With `--tls-cert`/`--tls-key` the listener is TLS (pingora's rustls `TlsSettings::intermediate`,
//! TLS 1.2 and 1.3, ALPN h2 and http/1.1); with `--h2c` a plain listener also takes HTTP/2 with
//! prior knowledge. Either way the proxy logic is still `upstream_peer` alone, to a plain
//! HTTP/1.1 upstream.

use async_trait::async_trait;
use clap::Parser;
use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::proxy::{ProxyHttp, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;
use std::net::SocketAddr;

#[derive(Parser)]
struct Cli {
    #[arg(long)]
    listen: String,
    #[arg(long)]
    upstream: SocketAddr,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Accept HTTP/2 with prior knowledge (h2c) on the plain listener.
    #[arg(long, conflicts_with = "tls_cert")]
    h2c: bool,
    /// Serve TLS with this PEM certificate chain (and `--tls-key`); ALPN offers h2 and http/1.1.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<String>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<String>,
}

struct Forward(SocketAddr);

#[async_trait]
impl ProxyHttp for Forward {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn upstream_peer(&self, _s: &mut Session, _c: &mut ()) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.0, false, String::new())))
    }
}

fn main() {
    let cli = Cli::parse();
    let conf = ServerConf {
        threads: cli.threads,
        upstream_keepalive_pool_size: 1024,
        pid_file: format!("/tmp/bare-forwarder-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/bare-forwarder-{}.sock", std::process::id()),
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut svc = pingora::proxy::http_proxy_service(&server.configuration, Forward(cli.upstream));
    if cli.h2c {
        if let Some(proxy) = svc.app_logic_mut() {
            let mut options = HttpServerOptions::default();
            options.h2c = true;
            proxy.server_options = Some(options);
        }
    }
    match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => {
            pingora::tls::install_default_crypto_provider();
            let Ok(mut tls) = TlsSettings::intermediate(cert, key) else {
                eprintln!("bare-forwarder: cannot use {cert} / {key}");
                std::process::exit(2);
            };
            tls.enable_h2();
            svc.add_tls_with_settings(&cli.listen, None, tls);
        }
        _ => svc.add_tcp(&cli.listen),
    }
    server.add_service(svc);
    server.run_forever();
}
