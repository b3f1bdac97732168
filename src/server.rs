//! `quipu serve`: builds the pingora server and its services from a validated config.
//!
//! Services (each on its own runtime, as pingora does it): the API proxy, the metrics listener,
//! the admin listener (when an admin token is set), and one health-check service per model.
//! Money and keys live on a separate runtime thread that pingora does not own, so the ledger
//! can still be flushed after pingora has stopped its services.
//!
//! Shutdown: on SIGTERM (and at the end of a graceful upgrade, SIGQUIT) pingora stops
//! accepting; connections waiting for a request are closed and started requests — every route,
//! even one whose head is still arriving — are served with `Connection: close` (see
//! [`crate::http::server`]). Once no connection has been open for a short quiet period (at most
//! the configured grace period), every request has settled and queued its ledger row: Quipu then
//! stops the ledger writer, which writes what is queued (with the store unreachable, it retries
//! for `store.shutdown_flush_timeout_s`, then writes the rest to a spill file for `quipu ledger
//! import`), returns its balance leases and unused rate-window slices (best effort) and exits — without sleeping out the rest
//! of the grace period. At start, spill files not yet imported are named in a warning.
//!
//! Quipu runs in the foreground only (systemd, a container). There is no `--daemon`: pingora
//! forks inside `run`, after the billing runtime, the drain watcher and the log writer have
//! started, and a fork keeps only the calling thread. A daemon therefore served requests that
//! no ledger writer recorded.

use crate::auth::KeySnapshot;
use crate::billing::{ledger, Accounts};
use crate::catalog::Catalog;
use crate::config::{redact_url, Config};
use crate::http::tls::CertStore;
use crate::http::upstream_tls::UpstreamTlsMaterial;
use crate::http::{ConnLimits, Frontend, Lifecycle};
use crate::metrics::m;
use crate::metrics::Meters;
use crate::proxy::Gateway;
use crate::ratelimit::RateLimiter;
use crate::store::Store;
use crate::upstream::resolve::{check_names, Dns};
use crate::upstream::ModelPool;
use pingora::apps::http_app::{HttpServer, ServeHttp};
use pingora::connectors::ConnectorOptions;
use pingora::connectors::TransportConnector;
use pingora::listeners::{L4BufferSettings, ListenerConfig, DEFAULT_L4_WRITE_BUFFER_SIZE};
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{ExecutionPhase, RunArgs, Server};
use pingora::services::listening::Service;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flags of `quipu serve` that pingora handles.
#[derive(Debug, Clone, Default)]
pub struct ServeFlags {
    /// Take the listening sockets over from a running Quipu (graceful upgrade).
    pub upgrade: bool,
}

/// The drain ends once no client connection has been open for this long.
const DRAIN_QUIET: Duration = Duration::from_millis(250);

/// How long a lease may go without a heartbeat before another replica reclaims it.
const LEASE_STALE_MS: i64 = 30_000;
const LEASE_HEARTBEAT: Duration = Duration::from_secs(5);
/// A replica silent this long is gone: its lease rows (zeroed long before) are deleted. A
/// replica that was only cut off this long finds its rows gone and must restart (its books
/// could no longer line up with the store's).
const LEASE_FORGET_MS: i64 = 24 * 3_600_000;
const LEASE_FORGET_EVERY: Duration = Duration::from_secs(3_600);
const LEASE_IDLE_RETURN: Duration = Duration::from_secs(3);
/// How often `quipu_ledger_spill_files` is re-counted (one directory listing).
const SPILL_RECOUNT: Duration = Duration::from_secs(5);
/// A replica stops admitting against a lease the store has not confirmed for this long: half
/// the stale threshold, so it stops well before another replica may reclaim the lease.
const LEASE_FENCE: Duration = Duration::from_millis(LEASE_STALE_MS as u64 / 2);

/// `<configured id or hostname:pid>~<random>`: the readable part says where it runs, the random
/// part makes every process start a distinct lease owner (two containers with pid 1 on one
/// host network, a fixed configured id, the old and new process of a graceful upgrade), so a
/// newcomer's startup `drop_leases` can never wipe another live process's leases.
fn replica_id(config: &Config) -> String {
    let prefix = config.server.replica_id.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "quipu".into());
        format!("{host}:{}", std::process::id())
    });
    format!("{prefix}~{:016x}", rand::random::<u64>())
}

struct MetricsApp {
    accounts: Arc<Accounts>,
    life: Arc<Lifecycle>,
}

#[async_trait::async_trait]
impl ServeHttp for MetricsApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let path = session.req_header().uri.path();
        let (status, ctype, body) = if path == "/metrics" || path == "/" {
            // Reservations as the accounts hold them, read at every scrape.
            let totals = self.accounts.totals();
            m().reservations_open
                .set(i64::try_from(totals.open).unwrap_or(i64::MAX));
            m().reserved_pen.set(totals.reserved.picos() as f64 / 1e12);
            m().client_connections
                .set(i64::try_from(self.life.connections()).unwrap_or(i64::MAX));
            (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                m().render(),
            )
        } else {
            (
                404,
                "text/plain",
                b"not found; metrics are at /metrics\n".to_vec(),
            )
        };
        http::Response::builder()
            .status(status)
            .header("content-type", ctype)
            .header("content-length", body.len())
            .body(body)
            .unwrap_or_default()
    }
}

/// Runs the gateway until it is told to stop. Returns an error only for startup failures.
pub fn serve(config: Config, flags: ServeFlags) -> Result<(), String> {
    crate::logger::write_in_batches().map_err(|e| format!("cannot start the log writer: {e}"))?;
    let config = Arc::new(config);
    let replica = replica_id(&config);
    let billing_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("quipu-billing")
        .on_thread_start(crate::threads::run_behind_requests)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the billing runtime: {e}"))?;
    let store: Arc<dyn Store> = billing_rt
        .block_on(crate::store::open(&config.store.url))
        .map_err(|e| {
            format!(
                "cannot open the store {}: {e}",
                redact_url(&config.store.url)
            )
        })?;
    warn_about_spill_files(&config.store.spill_dir);
    let keys = Arc::new(KeySnapshot::for_config(&config));
    billing_rt
        .block_on(keys.refresh(store.as_ref()))
        .map_err(|e| format!("cannot load API keys: {e}"))?;
    billing_rt
        .block_on(store.drop_leases(&replica))
        .map_err(|e| format!("cannot reset this replica's leases: {e}"))?;
    let accounts = Accounts::new(
        store.clone(),
        replica.clone(),
        config.billing.lease_chunk,
        LEASE_FENCE,
    );
    let (ledger_handle, writer) = ledger::channel(
        store.clone(),
        accounts.clone(),
        config.store.ledger_flush,
        config.store.ledger_batch_rows,
        config.store.max_unstored_rows,
        ledger::ShutdownPolicy::of(&config.store),
    );
    // Rate windows: in-process, or shared through the store with a task keeping them in step.
    let (limiter, limit_sync) = RateLimiter::for_store(config.limits, store.clone());
    let limiter = Arc::new(limiter);
    if let Some(task) = limit_sync {
        billing_rt.spawn(task);
    }
    // Signals from the other replicas (PostgreSQL LISTEN): idle leases called home.
    match billing_rt.block_on(store.listen_replicas()) {
        Ok(Some(signals)) => {
            billing_rt.spawn(accounts.clone().follow_signals(signals));
        }
        Ok(None) => {}
        Err(e) => log::warn!(
            "cannot listen for other replicas' signals ({e}): a request short of balance cannot \
             call idle leases home; they still return after a few idle seconds"
        ),
    }
    let (writer_stop_tx, writer_stop_rx) = tokio::sync::watch::channel(false);
    let writer_task = billing_rt.spawn(writer.run(writer_stop_rx));
    // Alerts as webhooks: one sender across the replicas sharing the store (see `webhooks`).
    billing_rt.spawn(
        crate::webhooks::Sender::new(
            store.clone(),
            replica.clone(),
            config.webhooks.clone(),
            config.webhook_delivery,
        )
        .run(writer_stop_tx.subscribe()),
    );
    billing_rt.spawn(crate::proxy::responses::cleanup(
        store.clone(),
        config.clone(),
    ));
    spawn_background(
        &billing_rt,
        &config,
        store.clone(),
        keys.clone(),
        accounts.clone(),
    );
    m().build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION"), store.kind().as_str()])
        .set(1);
    // Exported at 0 from the start, so an alert can fire on the first increase.
    for reason in ["error", "timeout"] {
        m().tls_handshake_failures.with_label_values(&[reason]);
    }
    for kind in <crate::http::h2::Abuse as strum::IntoEnumIterator>::iter() {
        let kind: &str = kind.into();
        m().h2_abuse.with_label_values(&[kind]);
    }
    for side in ["sent", "returned"] {
        m().lease_recalls.with_label_values(&[side]);
    }
    for result in ["ok", "error"] {
        m().rate_window_calls.with_label_values(&[result]);
    }
    for model in &config.models {
        m().unbilled_pen.with_label_values(&[model.slug.as_str()]);
        m().input_estimated
            .with_label_values(&[model.slug.as_str()]);
    }

    let mut conf = ServerConf {
        threads: config.server.threads,
        grace_period_seconds: Some(config.server.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(config.server.graceful_shutdown_timeout_seconds),
        pid_file: config.server.pid_file.clone(),
        upgrade_sock: config.server.upgrade_sock.clone(),
        upstream_keepalive_pool_size: 1024,
        ..ServerConf::default()
    };
    conf.work_stealing = true;
    let opt = Opt {
        upgrade: flags.upgrade,
        ..Opt::default()
    };
    let responses = crate::proxy::responses::StoredResponses::start(
        store.clone(),
        billing_rt.handle(),
        config.responses.max_queued_bytes,
    );
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let mut pools = Vec::with_capacity(config.models.len());
    for model in &config.models {
        pools.push(ModelPool::new(
            model,
            upstream_tls(model)?,
            &config.scheduling,
        )?);
    }
    let pools = Arc::new(pools);
    let dns =
        Dns::new(&config.server.dns_servers).map_err(|e| format!("server.dns_servers: {e}"))?;
    billing_rt.spawn(crate::upstream::health::run(
        pools.clone(),
        config.models.clone(),
    ));
    billing_rt.spawn(crate::upstream::load::run(
        pools.clone(),
        config.models.clone(),
        config.scheduling,
    ));
    for dispatcher in pools.iter().filter_map(|p| p.dispatcher.clone()) {
        billing_rt.spawn(dispatcher.run_timer());
    }
    billing_rt.spawn(crate::upstream::resolve::follow(
        pools.clone(),
        dns,
        config.server.dns_refresh,
    ));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let life = Arc::new(Lifecycle::default());
    let catalog = Catalog::new(&config).map_err(|e| format!("cannot render the catalog: {e}"))?;
    let mut connector_opts = ConnectorOptions::from_server_conf(&server.configuration);
    connector_opts.keepalive_pool_size = 1024;
    let gateway = Gateway {
        config: config.clone(),
        catalog,
        keys: keys.clone(),
        pools,
        connector: TransportConnector::new(Some(connector_opts)),
        accounts: accounts.clone(),
        ledger: ledger_handle,
        limits: limiter.clone(),
        in_flight: in_flight.clone(),
        life: life.clone(),
        meters: Meters::new(config.models.iter().map(|m| m.slug.as_str())),
        account_reads: crate::proxy::account::AccountReads::new(store.clone()),
        responses: responses.clone(),
    };
    let certs = match &config.server.tls {
        Some(files) => Some(CertStore::open(&files.cert, &files.key).map_err(|e| {
            format!("server.tls: {e}; fix the files or remove [server.tls] to serve plain HTTP")
        })?),
        None => None,
    };
    reload_certificates_on_change(&billing_rt, certs.clone())?;
    let acceptor = certs.as_ref().map(|c| c.acceptor(config.server.http2));
    let frontend = Frontend::new(
        Arc::new(gateway),
        life.clone(),
        ConnLimits {
            max_connections: config.server.max_connections,
            header_timeout: config.server.header_timeout,
            keepalive_s: config.server.keepalive_timeout_s,
            tls_handshake_timeout: config.server.tls_handshake_timeout,
            http2: config.server.http2,
            h2c: config.server.h2c,
            h2_max_streams: config.server.h2_max_streams,
            max_header_bytes: u32::try_from(config.server.max_header_bytes).unwrap_or(u32::MAX),
        },
        acceptor,
    );
    let mut proxy = Service::new("quipu api".into(), frontend);
    // No L4 read buffer on plain TCP: pingora reads headers into its own 4 KiB buffer and bodies
    // into the body reader's, so the default 64 KiB `BufReader` per connection only copied bytes
    // twice and cost 64 KiB of heap for every open stream.
    proxy.add_listener(
        ListenerConfig::tcp(config.server.listen.to_string())
            .l4_buffer(L4BufferSettings::new(0, DEFAULT_L4_WRITE_BUFFER_SIZE)),
    );
    server.add_service(proxy);

    let mut metrics = Service::new(
        "quipu metrics".into(),
        HttpServer::new_app(MetricsApp {
            accounts: accounts.clone(),
            life: life.clone(),
        }),
    );
    metrics.add_tcp(&config.server.metrics_listen.to_string());
    metrics.threads = Some(1);
    server.add_service(metrics);

    if let Some(token) = &config.server.admin_token {
        let admin = crate::admin::AdminApp::new(
            store.clone(),
            config.clone(),
            token.clone(),
            accounts.clone(),
        );
        let mut svc = Service::new("quipu admin".into(), HttpServer::new_app(admin));
        let addr = config.server.admin_listen.to_string();
        match (&certs, config.server.admin_tls) {
            (Some(certs), true) => {
                let settings = certs
                    .listener_settings()
                    .map_err(|e| format!("server.admin_tls: {e}"))?;
                svc.add_tls_with_settings(&addr, None, settings);
            }
            _ => svc.add_tcp(&addr),
        }
        svc.threads = Some(1);
        server.add_service(svc);
    }

    log::info!(
        "quipu {} listening on {} ({}; metrics {}, admin {}), store {}, rate limits {}, replica {replica}",
        env!("CARGO_PKG_VERSION"),
        config.server.listen,
        match (&config.server.tls, config.server.http2, config.server.h2c) {
            (Some(_), true, _) => "TLS, HTTP/2 and HTTP/1.1",
            (Some(_), false, _) => "TLS, HTTP/1.1",
            (None, _, true) => "plain HTTP/1.1 and h2c",
            (None, _, false) => "plain HTTP/1.1",
        },
        config.server.metrics_listen,
        if config.server.admin_token.is_some() {
            let tls = if config.server.admin_tls { ", TLS" } else { "" };
            format!("{}{tls}", config.server.admin_listen)
        } else {
            "off".into()
        },
        redact_url(&config.store.url),
        limiter.engine(),
    );

    // Exit as soon as a graceful shutdown has drained, instead of sleeping out the grace period.
    let mut phases = server.watch_execution_phase();
    let finish = Arc::new(Finisher {
        rt: billing_rt,
        store,
        limiter,
        accounts,
        replica,
        writer_stop: writer_stop_tx,
        writer_task: parking_lot::Mutex::new(Some(writer_task)),
        responses: responses.clone(),
    });
    let drain_finish = finish.clone();
    let grace = Duration::from_secs(config.server.grace_period_seconds);
    std::thread::Builder::new()
        .name("quipu-drain".into())
        .spawn(move || loop {
            match phases.blocking_recv() {
                Ok(ExecutionPhase::GracefulTerminate | ExecutionPhase::ShutdownStarted) => {
                    life.start_draining();
                }
                Ok(ExecutionPhase::ShutdownGracePeriod) => {
                    life.start_draining();
                    let started = Instant::now();
                    let drained = wait_for_drain(&life, &in_flight, grace);
                    if drained {
                        log::info!("drained in {:?}; flushing the ledger", started.elapsed());
                    } else {
                        log::warn!(
                            "grace period over with {} connections still open; flushing the ledger",
                            life.connections()
                        );
                    }
                    // Every finished request queued its row in `finish`, before its connection
                    // closed: the writer's last pass writes them all.
                    drain_finish.finish();
                    log::logger().flush();
                    std::process::exit(0);
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        })
        .map_err(|e| format!("cannot start the drain watcher: {e}"))?;

    server.run(RunArgs::default());
    finish.finish();
    Ok(())
}

/// A model's upstream TLS, loaded when one of its replicas is `https://`.
fn upstream_tls(model: &crate::config::Model) -> Result<Option<Arc<UpstreamTlsMaterial>>, String> {
    if !model.replicas.iter().any(|r| r.tls) {
        return Ok(None);
    }
    let tls = UpstreamTlsMaterial::load(&model.upstream_tls)
        .map_err(|e| format!("model `{}`: upstream_tls: {e}", model.slug))?;
    if !tls.verify {
        log::warn!(
            "model `{}`: upstream_tls.verify = false — its https:// replicas' certificates are NOT verified",
            model.slug
        );
    }
    Ok(Some(Arc::new(tls)))
}

/// What `quipu serve --check` verifies beyond the configuration's syntax: the certificate and
/// key files load, and every upstream host name resolves now. Returns the problems found.
pub fn check(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(files) = &config.server.tls {
        if let Err(e) = CertStore::open(&files.cert, &files.key) {
            problems.push(format!("server.tls: {e}"));
        }
    }
    for model in &config.models {
        if let Err(e) = upstream_tls(model) {
            problems.push(e);
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            problems.push(format!("cannot start a runtime to resolve names: {e}"));
            return problems;
        }
    };
    match Dns::new(&config.server.dns_servers) {
        Ok(dns) => problems.extend(rt.block_on(check_names(config, &dns))),
        Err(e) => problems.push(format!("server.dns_servers: {e}")),
    }
    problems
}

/// How often the certificate files are looked at for a replacement.
const CERT_POLL: Duration = Duration::from_secs(5);

/// Reloads the API listener's certificate on `SIGHUP` and when its files change. `SIGHUP` is
/// handled even without TLS: pingora leaves it at its default action, which would kill the
/// process, and operators send it after renewing certificates.
fn reload_certificates_on_change(
    rt: &tokio::runtime::Runtime,
    certs: Option<Arc<CertStore>>,
) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = rt
        .block_on(async { signal(SignalKind::hangup()) })
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    rt.spawn(async move {
        let mut poll = tokio::time::interval(CERT_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let hangup = tokio::select! {
                h = hangups.recv() => match h {
                    Some(()) => true,
                    None => return,
                },
                _ = poll.tick() => false,
            };
            let Some(certs) = &certs else {
                if hangup {
                    log::info!("SIGHUP: no TLS certificate to reload");
                }
                continue;
            };
            let (cert, key) = certs.paths();
            let result = if hangup {
                certs.reload().map(|()| true)
            } else {
                certs.reload_if_changed()
            };
            match result {
                Ok(true) => log::info!(
                    "TLS certificate reloaded from {} and {}; new connections get it",
                    cert.display(),
                    key.display()
                ),
                Ok(false) => {}
                Err(e) => log::warn!("TLS certificate not reloaded, the old one stays: {e}"),
            }
        }
    });
    Ok(())
}

/// Logs a warning naming the ledger spill files of an earlier shutdown that are still to be
/// imported, and exports their number. Importing is the operator's decision
/// (`quipu ledger import`), never automatic.
fn warn_about_spill_files(dir: &std::path::Path) {
    let names = |files: &[std::path::PathBuf]| {
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    match crate::billing::spill::pending(dir) {
        Ok((complete, incomplete)) => {
            export_spill_files(complete.len(), incomplete.len());
            if !complete.is_empty() {
                log::warn!(
                    "{} ledger spill file(s) from an earlier shutdown with the store unreachable \
                     are not imported: their charges are not in the tenants' balances. Import them \
                     (idempotent: a row already in the ledger is skipped) with: quipu ledger import {}",
                    complete.len(),
                    names(&complete)
                );
            }
            if !incomplete.is_empty() {
                log::warn!(
                    "incomplete ledger spill file(s) (a process died while writing them): {}; \
                     check their lines and import the complete ones with quipu ledger import \
                     (rename the file first)",
                    names(&incomplete)
                );
            }
        }
        Err(e) => log::warn!(
            "cannot look for ledger spill files in store.spill_dir {}: {e}",
            dir.display()
        ),
    }
}

/// Re-counts the spill files (an import by `quipu ledger import` renames them), so the gauge
/// an alert watches falls back to zero without a restart.
async fn recount_spill_files(dir: std::path::PathBuf) {
    let counted = tokio::task::spawn_blocking(move || crate::billing::spill::pending(&dir)).await;
    if let Ok(Ok((complete, incomplete))) = counted {
        export_spill_files(complete.len(), incomplete.len());
    }
}

fn export_spill_files(complete: usize, incomplete: usize) {
    let gauge = &m().ledger_spill_files;
    gauge.with_label_values(&["complete"]).set(complete as i64);
    gauge
        .with_label_values(&["incomplete"])
        .set(incomplete as i64);
}

/// Waits until no client connection (and so no request of any route) has been open for
/// [`DRAIN_QUIET`], or the grace period is over; returns whether it drained.
fn wait_for_drain(life: &Lifecycle, in_flight: &AtomicUsize, grace: Duration) -> bool {
    let started = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    loop {
        let idle = life.connections() == 0 && in_flight.load(Ordering::SeqCst) == 0;
        if idle {
            if quiet_since.get_or_insert_with(Instant::now).elapsed() >= DRAIN_QUIET {
                return true;
            }
        } else {
            quiet_since = None;
        }
        if started.elapsed() >= grace {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes what is left of the ledger and returns this replica's leases. Idempotent.
struct Finisher {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn Store>,
    limiter: Arc<RateLimiter>,
    accounts: Arc<Accounts>,
    replica: String,
    writer_stop: tokio::sync::watch::Sender<bool>,
    writer_task: parking_lot::Mutex<Option<tokio::task::JoinHandle<usize>>>,
    /// Stored responses (Responses API) still queued for the store are written before exit.
    responses: Arc<crate::proxy::responses::StoredResponses>,
}

/// Most time a shutdown spends returning this replica's leases (best effort: a lease not
/// returned is reclaimed by another replica, or at this replica's next start).
const LEASE_RETURN_TIMEOUT: Duration = Duration::from_secs(5);

impl Finisher {
    fn finish(&self) {
        let Some(task) = self.writer_task.lock().take() else {
            return;
        };
        let _ = self.writer_stop.send(true);
        let totals = self.accounts.totals();
        let unstored = self.rt.block_on(async {
            let unstored = match task.await {
                Ok(n) => n,
                Err(e) => {
                    log::error!("the ledger writer failed: {e}");
                    0
                }
            };
            let unwritten = self.responses.flush(LEASE_RETURN_TIMEOUT).await;
            if unwritten > 0 {
                log::error!("{unwritten} stored responses not written before exit");
            }
            // Another replica may send the webhooks at once.
            let resigned = tokio::time::timeout(
                LEASE_RETURN_TIMEOUT,
                self.store.resign_sender(&self.replica),
            );
            if let Ok(Err(e)) = resigned.await {
                log::warn!("could not give up the webhook sender's lease: {e}");
            }
            // Slices of shared rate windows this replica did not use: the others may.
            self.limiter
                .give_back(self.store.as_ref(), LEASE_RETURN_TIMEOUT)
                .await;
            if totals.open == 0 {
                let returned = tokio::time::timeout(
                    LEASE_RETURN_TIMEOUT,
                    self.store.drop_leases(&self.replica),
                )
                .await;
                match returned {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => log::warn!("could not return this replica's leases: {e}"),
                    Err(_) => log::warn!(
                        "could not return this replica's leases within {LEASE_RETURN_TIMEOUT:?}"
                    ),
                }
            }
            unstored
        });
        if unstored == 0 {
            log::info!(
                "ledger flushed; {} reservations were still open",
                totals.open
            );
        } else {
            log::error!(
                "ledger NOT fully flushed: {unstored} rows were spilled (see above); {} \
                 reservations were still open",
                totals.open
            );
        }
    }
}

fn spawn_background(
    rt: &tokio::runtime::Runtime,
    config: &Arc<Config>,
    store: Arc<dyn Store>,
    keys: Arc<KeySnapshot>,
    accounts: Arc<Accounts>,
) {
    let refresh = config.store.key_refresh;
    let spill_dir = config.store.spill_dir.clone();
    let key_store = store.clone();
    rt.spawn(async move {
        let mut tick = tokio::time::interval(refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match keys.refresh(key_store.as_ref()).await {
                Ok(true) => log::info!("API keys reloaded: {} active", keys.len()),
                Ok(false) => {}
                Err(e) => log::warn!("API key refresh failed (serving the last snapshot): {e}"),
            }
            m().keys_active.set(keys.len() as i64);
        }
    });
    rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            let totals = accounts.totals();
            m().reserved_pen.set(totals.reserved.picos() as f64 / 1e12);
            accounts.return_idle_leases(LEASE_IDLE_RETURN).await;
            if n % SPILL_RECOUNT.as_secs() == 0 {
                recount_spill_files(spill_dir.clone()).await;
            }
            if n % LEASE_HEARTBEAT.as_secs() == 0 {
                if let Err(e) = accounts.heartbeat().await {
                    log::warn!("lease heartbeat failed: {e}");
                }
                if let Err(e) = store.reclaim_stale_leases(LEASE_STALE_MS).await {
                    log::warn!("reclaiming stale leases failed: {e}");
                }
            }
            if n % LEASE_FORGET_EVERY.as_secs() == 0 {
                if let Err(e) = store.forget_silent_leases(LEASE_FORGET_MS).await {
                    log::warn!("forgetting the leases of replicas long gone failed: {e}");
                }
            }
        }
    });
}
