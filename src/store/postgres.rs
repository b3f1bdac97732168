//! The shared store: PostgreSQL (`postgres://…`), for several gateway replicas.
//!
//! **Connections.** A small pool ([`POOL_SIZE`] connections, opened on demand, `NoTls`). A
//! connection that broke is noticed (`is_closed`) and replaced by a fresh one on the next call,
//! so a database restart costs the calls made while it is down, not a gateway restart. Every
//! query is sent with its parameter types (`query_typed`): one round trip, no
//! prepared-statement bookkeeping. Messages name the server as `postgres://user@host:port/db`,
//! rebuilt from the parsed configuration, so they never carry the password (whether the URL
//! had it in the userinfo or in the query string).
//!
//! **Clock.** Lease heartbeats use the database's clock, not the replica's, so reclaiming stale
//! leases does not depend on replicas' clocks agreeing. Ledger `at` and created/revoked times
//! are the caller's clock, as in SQLite.
//!
//! **Between replicas** ([`replicas`]): shared rate windows (one upsert per batch of asks) and
//! `LISTEN`/`NOTIFY` on the channel `quipu_replicas`, on a connection of its own.
//!
//! This file connects, migrates and runs the [`Store`] calls with retries; each call's body
//! lives with its concern: `tenants`, `keys` (API keys), `balances` (money held: top-ups,
//! balances, leases, and how transactions that move money lock), `ledger` (request rows,
//! rejects, statements). The account API's reads, and the roll-ups `record` keeps for them, are
//! in `usage`.

use super::rows::{top_up_entry, DbError};
use super::{
    check_quota_asks, responses, schema, ActiveKey, Balance, KeyInfo, LeaseAsk, LeaseGrant,
    LeaseReading, LedgerRow, NewKey, QuotaAsk, QuotaGrant, Recorded, RejectedRow, ReplicaSignal,
    Statement, Store, StoreError, StoreResult, StoredResponse, Tenant, TenantId, TenantSummary,
    TopUpOutcome, UnixMs,
};
use crate::config::redact_url;
use crate::money::Pen;
use async_trait::async_trait;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

/// Most connections one store (one replica) keeps open.
pub const POOL_SIZE: usize = 4;
/// How often a transaction that hit a deadlock or serialisation failure is retried.
const MAX_RETRIES: u32 = 5;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Milliseconds since the epoch by the database's clock (see the module docs).
macro_rules! db_now_ms {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"
    };
}

// After `db_now_ms!`, which `balances` and `replicas` use.
mod balances;
mod keys;
mod ledger;
mod replicas;
mod tenants;

/// The PostgreSQL [`Store`].
pub struct PgStore {
    pool: Pool,
}

struct Pool {
    config: tokio_postgres::Config,
    /// The URL with its password replaced, for messages.
    name: String,
    idle: Mutex<Vec<Client>>,
    permits: Semaphore,
}

/// A pooled connection; goes back to the pool when dropped, unless it broke.
struct Conn<'a> {
    client: Option<Client>,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl Conn<'_> {
    fn client(&mut self) -> StoreResult<&mut Client> {
        self.client
            .as_mut()
            .ok_or_else(|| StoreError::Backend("postgres connection already returned".into()))
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if !client.is_closed() {
                let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
                idle.push(client);
            }
        }
    }
}

impl Pool {
    async fn get(&self) -> StoreResult<Conn<'_>> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Backend(format!("postgres {}: pool closed", self.name)))?;
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let mut found = None;
            while let Some(c) = idle.pop() {
                if !c.is_closed() {
                    found = Some(c);
                    break;
                }
            }
            found
        };
        let client = match reused {
            Some(c) => c,
            None => self.connect().await?,
        };
        Ok(Conn {
            client: Some(client),
            pool: self,
            _permit: permit,
        })
    }

    async fn connect(&self) -> StoreResult<Client> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(|e| {
            StoreError::Backend(format!(
                "cannot connect to {}: {}; check store.url and that the server accepts connections",
                self.name,
                error_text(&e)
            ))
        })?;
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                log::warn!(
                    "postgres {name}: connection closed: {}; the next call reconnects",
                    error_text(&e)
                );
            }
        });
        Ok(client)
    }
}

/// `postgres://user@host:port/db` from the parsed config: names the server in messages and
/// logs, and cannot contain the password whatever form the URL had.
fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    format!(
        "postgres://{}{}/{}",
        config
            .get_user()
            .map(|u| format!("{u}@"))
            .unwrap_or_default(),
        hosts.join(","),
        config.get_dbname().unwrap_or_default()
    )
}

/// The error and its causes, `: `-separated (tokio-postgres puts the server's message in the
/// source).
fn error_text(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// What a transaction body can fail with: the database (maybe retryable) or a store-level
/// answer (not found, conflict, a value out of range).
pub(crate) enum PgErr {
    Db(tokio_postgres::Error),
    Store(StoreError),
}

impl From<responses::PgFailure> for PgErr {
    fn from(e: responses::PgFailure) -> Self {
        match e {
            responses::PgFailure::Db(e) => PgErr::Db(e),
            responses::PgFailure::Store(e) => PgErr::Store(e),
        }
    }
}

impl From<tokio_postgres::Error> for PgErr {
    fn from(e: tokio_postgres::Error) -> Self {
        PgErr::Db(e)
    }
}

impl From<StoreError> for PgErr {
    fn from(e: StoreError) -> Self {
        PgErr::Store(e)
    }
}

type PgResult<T> = Result<T, PgErr>;

/// A read-only snapshot: every query in it sees the same committed state (a statement, an
/// account view, a list).
async fn snapshot(client: &mut Client) -> PgResult<tokio_postgres::Transaction<'_>> {
    Ok(client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}

fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

impl DbError for tokio_postgres::Error {
    type Failure = PgErr;

    fn is_unique_violation(&self) -> bool {
        self.code() == Some(&SqlState::UNIQUE_VIOLATION)
    }
}

/// Runs `$body` (an expression using `$client: &mut Client`) on a pooled connection, retrying
/// it whole on a deadlock or serialisation failure.
macro_rules! with_retry {
    ($self:ident, $client:ident => $body:expr) => {{
        let mut attempt = 0u32;
        loop {
            let mut conn = $self.pool.get().await?;
            let $client = conn.client()?;
            let res: PgResult<_> = $body.await;
            match res {
                Ok(v) => break Ok(v),
                Err(PgErr::Db(e)) if is_retryable(&e) && attempt < MAX_RETRIES => {
                    attempt += 1;
                    drop(conn);
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                }
                Err(PgErr::Db(e)) => break Err($self.db_error(&e)),
                Err(PgErr::Store(e)) => break Err(e),
            }
        }
    }};
}

/// The account API's reads and the roll-ups `record` keeps (after `with_retry!`, which it uses).
pub mod usage;

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host:port/db`, or any form
    /// tokio-postgres accepts) and migrates the database.
    pub async fn connect(url: &str) -> StoreResult<PgStore> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            // The query string may hold a password too (`?password=…`): leave it out.
            let shown = redact_url(url.split('?').next().unwrap_or_default());
            StoreError::Backend(format!(
                "store.url \"{shown}\" is not a valid postgres URL: {}",
                error_text(&e)
            ))
        })?;
        let name = describe(&config);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("quipu");
        }
        let store = PgStore {
            pool: Pool {
                config,
                name,
                idle: Mutex::new(Vec::new()),
                permits: Semaphore::new(POOL_SIZE),
            },
        };
        store.migrate().await?;
        Ok(store)
    }

    /// A data exception (SQLSTATE class 22) or constraint violation (class 23) is the input's
    /// fault and would fail again (`Invalid`); anything else may be transient (`Backend`).
    fn db_error(&self, e: &tokio_postgres::Error) -> StoreError {
        let text = format!("postgres {}: {}", self.pool.name, error_text(e));
        match e.code().map(|c| c.code()) {
            Some(c) if c.starts_with("22") || c.starts_with("23") => StoreError::Invalid(text),
            _ => StoreError::Backend(text),
        }
    }

    async fn migrate(&self) -> StoreResult<()> {
        with_retry!(self, client => migrate_tx(client))
    }
}

async fn migrate_tx(client: &mut Client) -> PgResult<()> {
    let tx = client.transaction().await?;
    tx.query_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &[(&schema::PG_MIGRATION_LOCK, Type::INT8)],
    )
    .await?;
    tx.batch_execute(schema::PG_BOOTSTRAP).await?;
    let current: i64 = tx
        .query_typed_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?
        .unwrap_or(0);
    if current > schema::latest_version() {
        return Err(schema::too_new(current, "postgres").into());
    }
    for (version, sql) in schema::PG_MIGRATIONS {
        if *version <= current {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute_typed(
            "INSERT INTO meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[(version, Type::INT8)],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

#[async_trait]
impl Store for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        with_retry!(self, c => tenants::create_tenant_tx(c, name))
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        with_retry!(self, c => tenants::tenant_by_name_q(c, name))
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        with_retry!(self, c => tenants::list_tenants_q(c))
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        with_retry!(self, c => keys::create_key_tx(c, &key))
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        with_retry!(self, c => keys::revoke_key_tx(c, key_id))
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        with_retry!(self, c => keys::list_keys_q(c, tenant))
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        with_retry!(self, c => keys::keys_version_q(c))
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        with_retry!(self, c => keys::active_keys_q(c))
    }

    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        idempotency_key: Option<&str>,
    ) -> StoreResult<TopUpOutcome> {
        let (delta, id) = top_up_entry(amount, idempotency_key)?;
        with_retry!(self, c => balances::top_up_tx(c, tenant, amount, delta, note, &id))
    }

    async fn balance(&self, tenant: TenantId) -> StoreResult<Balance> {
        with_retry!(self, c => balances::balance_q(c, tenant))
    }

    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> StoreResult<Recorded> {
        if rows.is_empty() {
            return Ok(Recorded::default());
        }
        let batch = ledger::batch_of(rows)?;
        with_retry!(self, c => ledger::record_tx(c, replica, &batch))
    }

    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        with_retry!(self, c => balances::acquire_lease_tx(c, replica, tenant, ask))
    }

    async fn release_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>> {
        let amount = amount.max(Pen::ZERO);
        with_retry!(self, c => balances::release_lease_q(c, replica, tenant, amount))
    }

    async fn heartbeat(&self, replica: &str) -> StoreResult<Vec<(TenantId, LeaseReading)>> {
        with_retry!(self, c => balances::heartbeat_q(c, replica))
    }

    async fn reject(&self, row: &LedgerRow, reason: &str) -> StoreResult<()> {
        with_retry!(self, c => ledger::reject_q(c, row, reason))
    }

    async fn rejected_rows(&self) -> StoreResult<Vec<RejectedRow>> {
        with_retry!(self, c => ledger::rejected_rows_q(c))
    }

    async fn reclaim_stale_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        with_retry!(self, c => balances::reclaim_q(c, max_age_ms))
    }

    async fn forget_silent_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        with_retry!(self, c => balances::forget_q(c, max_age_ms))
    }

    async fn drop_leases(&self, replica: &str) -> StoreResult<()> {
        with_retry!(self, c => balances::drop_leases_q(c, replica))
    }

    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<UnixMs>,
        to: Option<UnixMs>,
    ) -> StoreResult<Statement> {
        with_retry!(self, c => ledger::statement_q(c, tenant, from, to))
    }

    async fn ledger_rows(&self, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>> {
        with_retry!(self, c => ledger::ledger_rows_q(c, tenant))
    }

    async fn put_responses(&self, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
        with_retry!(self, c => async { responses::pg_put(c, rows).await.map_err(PgErr::from) })
    }

    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        with_retry!(self, c => async {
            responses::pg_get(c, tenant, id).await.map_err(PgErr::from)
        })
    }

    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool> {
        with_retry!(self, c => async {
            responses::pg_delete(c, tenant, id).await.map_err(PgErr::from)
        })
    }

    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64> {
        with_retry!(self, c => async {
            responses::pg_prune(c, before, max_bytes_per_tenant)
                .await
                .map_err(PgErr::from)
        })
    }

    async fn take_quota(&self, asks: &[QuotaAsk]) -> StoreResult<(Vec<QuotaGrant>, UnixMs)> {
        check_quota_asks(asks)?;
        if asks.is_empty() {
            return with_retry!(self, c => replicas::store_now(c)).map(|now| (Vec::new(), now));
        }
        with_retry!(self, c => replicas::take_quota(c, asks))
    }

    async fn expire_quota(&self, age_ms: i64) -> StoreResult<u64> {
        with_retry!(self, c => replicas::expire_quota(c, age_ms))
    }

    async fn notify_replicas(&self, signal: &ReplicaSignal) -> StoreResult<bool> {
        let payload = signal.to_payload();
        with_retry!(self, c => replicas::notify(c, &payload)).map(|()| true)
    }

    async fn listen_replicas(
        &self,
    ) -> StoreResult<Option<tokio::sync::mpsc::Receiver<ReplicaSignal>>> {
        replicas::listen(self.pool.config.clone(), self.pool.name.clone())
            .await
            .map(Some)
            .map_err(|e| match e {
                PgErr::Db(e) => self.db_error(&e),
                PgErr::Store(e) => e,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_never_carry_the_password() {
        for url in [
            "postgres://quipu:hunter2@db.internal:6432/billing",
            "postgresql://quipu@db.internal:6432/billing?password=hunter2",
        ] {
            let config: tokio_postgres::Config = url.parse().unwrap();
            assert_eq!(
                describe(&config),
                "postgres://quipu@db.internal:6432/billing"
            );
        }
    }

    #[tokio::test]
    async fn connection_errors_never_show_the_password() {
        for url in [
            // Nothing listens on port 1: refused at once.
            "postgres://quipu:hunter2@127.0.0.1:1/quipu",
            "postgres://quipu@127.0.0.1:1/quipu?password=hunter2",
            // Not a valid URL at all.
            "postgres://quipu:hunter2@127.0.0.1:notaport/quipu",
            "postgres://quipu@127.0.0.1/quipu?password=hunter2&port=notaport",
        ] {
            let Err(StoreError::Backend(msg)) = PgStore::connect(url).await.map(|_| ()) else {
                panic!("{url} should fail");
            };
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.contains("127.0.0.1"), "{msg}");
        }
    }
}
