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
//! This file connects, migrates and runs calls with retries (`with_retry!`); each trait of
//! [`Store`] is implemented with its concern: `tenants` ([`TenantStore`](super::TenantStore):
//! tenants and keys), `ledger` ([`LedgerStore`](super::LedgerStore): top-ups, balances, request
//! rows, rejects, statements, and how transactions that move money lock), `leases`
//! ([`LeaseStore`](super::LeaseStore): leases and the shared rate windows), `replicas`
//! ([`ReplicaChannel`](super::ReplicaChannel): `LISTEN`/`NOTIFY` on the channel
//! `quipu_replicas`, on a connection of its own), `responses`
//! ([`ResponseStore`](super::ResponseStore)) and `usage` ([`UsageStore`](super::UsageStore):
//! the account API's reads, and the roll-ups `record` keeps for them) and `webhooks`
//! ([`WebhookStore`](super::webhooks::WebhookStore): the outbox, and the events other
//! transactions write in it).

use super::rows::DbError;
use super::sql::{pg_params, Cols, Sql, SqlValue};
use super::{schema, Backend, Store, StoreError, StoreResult};
use crate::config::redact_url;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, NoTls};

/// Most connections one store (one replica) keeps open.
pub const POOL_SIZE: usize = 4;
/// How often a transaction that hit a deadlock or serialisation failure is retried.
pub(crate) const MAX_RETRIES: u32 = 5;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Milliseconds since the epoch by the database's clock (see the module docs).
macro_rules! db_now_ms {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint"
    };
}

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

pub(crate) type PgResult<T> = Result<T, PgErr>;

impl DbError for PgErr {
    type Failure = PgErr;

    fn is_unique_violation(&self) -> bool {
        matches!(self, PgErr::Db(e) if e.is_unique_violation())
    }
}

/// Runs a shared statement (see `sql`) with its parameter types, reading each row with `read`.
async fn query<T>(
    client: &impl GenericClient,
    sql: &Sql,
    values: &[SqlValue<'_>],
    mut read: impl FnMut(&mut Cols<'_>) -> StoreResult<T>,
) -> PgResult<Vec<T>> {
    let rows = client
        .query_typed(sql.get(Backend::Postgres), &pg_params(values))
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(read(&mut Cols::new(row))?);
    }
    Ok(out)
}

/// [`query`]'s only row, if any.
async fn query_opt<T>(
    client: &impl GenericClient,
    sql: &Sql,
    values: &[SqlValue<'_>],
    read: impl FnOnce(&mut Cols<'_>) -> StoreResult<T>,
) -> PgResult<Option<T>> {
    let row = client
        .query_typed_opt(sql.get(Backend::Postgres), &pg_params(values))
        .await?;
    Ok(row.map(|r| read(&mut Cols::new(&r))).transpose()?)
}

/// Runs a shared statement that returns no rows; how many rows it changed.
async fn execute(client: &impl GenericClient, sql: &Sql, values: &[SqlValue<'_>]) -> PgResult<u64> {
    Ok(client
        .execute_typed(sql.get(Backend::Postgres), &pg_params(values))
        .await?)
}

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

pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
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
        use $crate::store::postgres::{is_retryable, PgErr, PgResult, MAX_RETRIES};
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
                    ::tokio::time::sleep(::std::time::Duration::from_millis(
                        5 * u64::from(attempt),
                    ))
                    .await;
                }
                Err(PgErr::Db(e)) => break Err($self.db_error(&e)),
                Err(PgErr::Store(e)) => break Err(e),
            }
        }
    }};
}

// After `db_now_ms!` and `with_retry!`, which they use.
mod caps;
mod leases;
mod ledger;
mod replicas;
mod responses;
mod tenants;
mod usage;
pub mod webhooks;

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

impl Store for PgStore {
    fn kind(&self) -> Backend {
        Backend::Postgres
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
