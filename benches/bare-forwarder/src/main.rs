//! `bare-forwarder --listen ADDR --upstream ADDR [--threads N]`: pingora-proxy with nothing but
//! `upstream_peer`, the same pingora build as Quipu. The benchmark's floor for anything built on
//! this framework (docs/benchmarks.md).

use async_trait::async_trait;
use clap::Parser;
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
    svc.add_tcp(&cli.listen);
    server.add_service(svc);
    server.run_forever();
}
