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
//! **Money under concurrency.** Transactions run at READ COMMITTED with explicit row locks:
//! every transaction that moves money (`record`, `top_up`, `acquire_lease`) first locks the
//! tenant rows it touches with `SELECT … FOR NO KEY UPDATE`, in ascending id order, so they
//! serialise per tenant across all replicas and cannot deadlock with one another. (`NO KEY
//! UPDATE` rather than `UPDATE`: it does not conflict with the `KEY SHARE` locks that foreign
//! keys take when ledger or lease rows are inserted.) Once the tenant row is locked, the balance
//! and the leases it reads are the latest committed ones and stay so until commit; a lease can
//! only shrink behind our back (reclaim, drop, release), which never breaks `Σ leases ≤
//! balance`. Should the server still report a deadlock or serialisation failure, the whole
//! transaction is retried (a few times, with a short pause): nothing was committed.
//!
//! **Clock.** Lease heartbeats use the database's clock, not the replica's, so reclaiming stale
//! leases does not depend on replicas' clocks agreeing. Ledger `at` and created/revoked times
//! are the caller's clock, as in SQLite.
//!
//! **Between replicas** ([`replicas`]): shared rate windows (one upsert per batch of asks) and
//! `LISTEN`/`NOTIFY` on the channel `quipu_replicas`, on a connection of its own.
//!
//! **Cheap polls.** `keys_version` is one primary-key lookup with no parameters, sent as a
//! simple query on a pooled connection: one round trip.
//!
//! The account API's reads, and the roll-ups `record` keeps for them, are in `usage`.

use super::columns::{names, pg_placeholders, unnest, LEDGER_COLUMNS, REJECT_COLUMNS};
use super::rows::{
    check_row, conflict_if_unique, limits_from_sql, limits_to_sql, period_bounds, rejected,
    replayed_top_up, secret_hash, tenant_missing, top_up_entry, DbError, EarlierTopUp, LedgerBatch,
    RawLedgerRow, Taken,
};
use super::sql_money::{count_from_text, i64_to_u64, pen_from_text, pen_to_text};
use super::usage::{rollup, RollupRow};
use super::{
    check_quota_asks, now_ms, responses, schema, ActiveKey, Balance, KeyInfo, LeaseAsk, LeaseGrant,
    LedgerRow, ModelTotals, NewKey, QuotaAsk, QuotaGrant, RejectedRow, ReplicaSignal, Statement,
    Store, StoreError, StoreResult, StoredResponse, Tenant, TenantId, TenantSummary, TopUp,
    TopUpOutcome, UnixMs,
};
use crate::config::redact_url;
use crate::money::Pen;
use async_trait::async_trait;
use quipu_core::billing::lease::lease_grant;
use std::collections::{BTreeMap, HashSet};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, NoTls, SimpleQueryMessage, Transaction};

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

// After `db_now_ms!`, which it uses.
mod replicas;

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

async fn bump_keys_version(tx: &Transaction<'_>) -> PgResult<()> {
    tx.execute_typed(
        "UPDATE meta SET value = value + 1 WHERE key = 'keys_version'",
        &[],
    )
    .await?;
    Ok(())
}

/// Locks the tenant row (see the module docs) and returns its balance, or `NotFound`.
async fn lock_tenant(tx: &Transaction<'_>, tenant: TenantId) -> PgResult<Pen> {
    let row = tx
        .query_typed_opt(
            "SELECT balance::text FROM tenants WHERE id = $1 FOR NO KEY UPDATE",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok(pen_from_text(
        &row.try_get::<_, String>(0)?,
        "tenants.balance",
    )?)
}

async fn create_tenant_tx(client: &mut Client, name: &str) -> PgResult<Tenant> {
    let now = now_ms();
    let tx = client.transaction().await?;
    let row = tx
        .query_typed_one(
            "INSERT INTO tenants (name, created_at) VALUES ($1, $2) RETURNING id",
            &[(&name, Type::TEXT), (&now, Type::INT8)],
        )
        .await
        .map_err(conflict_if_unique(Taken::TenantName(name)))?;
    let id: i64 = row.try_get(0)?;
    bump_keys_version(&tx).await?;
    tx.commit().await?;
    Ok(Tenant {
        id,
        name: name.to_owned(),
        created_at: now,
    })
}

async fn tenant_by_name_q(client: &mut Client, name: &str) -> PgResult<Option<Tenant>> {
    let row = client
        .query_typed_opt(
            "SELECT id, name, created_at FROM tenants WHERE name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(match row {
        Some(r) => Some(Tenant {
            id: r.try_get(0)?,
            name: r.try_get(1)?,
            created_at: r.try_get(2)?,
        }),
        None => None,
    })
}

async fn list_tenants_q(client: &mut Client) -> PgResult<Vec<TenantSummary>> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let rows = tx
        .query_typed(
            "SELECT t.id, t.name, t.created_at, t.balance::text,
                    COALESCE((SELECT SUM(l.amount) FROM leases l WHERE l.tenant_id = t.id), 0)::text,
                    (SELECT COUNT(*) FROM api_keys k
                      WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)
               FROM tenants t ORDER BY t.name",
            &[],
        )
        .await?;
    tx.commit().await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(TenantSummary {
            tenant: Tenant {
                id: r.try_get(0)?,
                name: r.try_get(1)?,
                created_at: r.try_get(2)?,
            },
            balance: pen_from_text(&r.try_get::<_, String>(3)?, "tenants.balance")?,
            leased: pen_from_text(&r.try_get::<_, String>(4)?, "leases.amount")?,
            active_keys: i64_to_u64(r.try_get(5)?, "active key count")?,
        });
    }
    Ok(out)
}

async fn create_key_tx(client: &mut Client, key: &NewKey) -> PgResult<KeyInfo> {
    let now = now_ms();
    let (rpm, tpm) = limits_to_sql(key.limits)?;
    let tx = client.transaction().await?;
    let tenant_name: String = tx
        .query_typed_opt(
            "SELECT name FROM tenants WHERE id = $1",
            &[(&key.tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(key.tenant))?
        .try_get(0)?;
    let hash: &[u8] = &key.secret_hash;
    tx.execute_typed(
        "INSERT INTO api_keys (id, tenant_id, label, secret_sha256, secret_prefix, created_at,
                               revoked_at, rpm_limit, tpm_limit)
         VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8)",
        &[
            (&key.id, Type::TEXT),
            (&key.tenant, Type::INT8),
            (&key.label, Type::TEXT),
            (&hash, Type::BYTEA),
            (&key.secret_prefix, Type::TEXT),
            (&now, Type::INT8),
            (&rpm, Type::INT8),
            (&tpm, Type::INT8),
        ],
    )
    .await
    .map_err(conflict_if_unique(Taken::Key(&key.id)))?;
    bump_keys_version(&tx).await?;
    tx.commit().await?;
    Ok(KeyInfo {
        id: key.id.clone(),
        tenant_id: key.tenant,
        tenant_name,
        label: key.label.clone(),
        secret_prefix: key.secret_prefix.clone(),
        created_at: now,
        revoked_at: None,
        limits: key.limits,
    })
}

async fn revoke_key_tx(client: &mut Client, key_id: &str) -> PgResult<bool> {
    let tx = client.transaction().await?;
    let row = tx
        .query_typed_opt(
            "SELECT revoked_at FROM api_keys WHERE id = $1 FOR UPDATE",
            &[(&key_id, Type::TEXT)],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("key {key_id} does not exist")))?;
    if row.try_get::<_, Option<i64>>(0)?.is_some() {
        return Ok(false);
    }
    let now = now_ms();
    tx.execute_typed(
        "UPDATE api_keys SET revoked_at = $2 WHERE id = $1",
        &[(&key_id, Type::TEXT), (&now, Type::INT8)],
    )
    .await?;
    bump_keys_version(&tx).await?;
    tx.commit().await?;
    Ok(true)
}

async fn list_keys_q(client: &mut Client, tenant: Option<TenantId>) -> PgResult<Vec<KeyInfo>> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    if let Some(t) = tenant {
        tx.query_typed_opt("SELECT 1 FROM tenants WHERE id = $1", &[(&t, Type::INT8)])
            .await?
            .ok_or_else(|| tenant_missing(t))?;
    }
    let rows = tx
        .query_typed(
            "SELECT k.id, k.tenant_id, t.name, k.label, k.secret_prefix, k.created_at,
                    k.revoked_at, k.rpm_limit, k.tpm_limit
               FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
              WHERE $1::bigint IS NULL OR k.tenant_id = $1
              ORDER BY k.created_at, k.id",
            &[(&tenant, Type::INT8)],
        )
        .await?;
    tx.commit().await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(KeyInfo {
            id: r.try_get(0)?,
            tenant_id: r.try_get(1)?,
            tenant_name: r.try_get(2)?,
            label: r.try_get(3)?,
            secret_prefix: r.try_get(4)?,
            created_at: r.try_get(5)?,
            revoked_at: r.try_get(6)?,
            limits: limits_from_sql(r.try_get(7)?, r.try_get(8)?)?,
        });
    }
    Ok(out)
}

async fn keys_version_q(client: &mut Client) -> PgResult<i64> {
    for msg in client
        .simple_query("SELECT value FROM meta WHERE key = 'keys_version'")
        .await?
    {
        if let SimpleQueryMessage::Row(row) = msg {
            let text = row.try_get(0)?.unwrap_or_default();
            return text.parse::<i64>().map_err(|_| {
                PgErr::Store(StoreError::Backend(format!(
                    "meta.keys_version holds \"{text}\", not an integer"
                )))
            });
        }
    }
    Err(StoreError::Backend("meta.keys_version is missing".into()).into())
}

async fn active_keys_q(client: &mut Client) -> PgResult<(i64, Vec<ActiveKey>)> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let version: i64 = tx
        .query_typed_one("SELECT value FROM meta WHERE key = 'keys_version'", &[])
        .await?
        .try_get(0)?;
    let rows = tx
        .query_typed(
            "SELECT k.secret_sha256, k.id, k.tenant_id, t.name, k.rpm_limit, k.tpm_limit
               FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
              WHERE k.revoked_at IS NULL
              ORDER BY k.id",
            &[],
        )
        .await?;
    tx.commit().await?;
    let mut keys = Vec::with_capacity(rows.len());
    for r in rows {
        keys.push(ActiveKey {
            secret_hash: secret_hash(r.try_get(0)?)?,
            key_id: r.try_get(1)?,
            tenant_id: r.try_get(2)?,
            tenant_name: r.try_get(3)?,
            limits: limits_from_sql(r.try_get(4)?, r.try_get(5)?)?,
        });
    }
    Ok((version, keys))
}

async fn top_up_tx(
    client: &mut Client,
    tenant: TenantId,
    amount: Pen,
    delta: i64,
    note: &str,
    id: &str,
) -> PgResult<TopUpOutcome> {
    let now = now_ms();
    let tx = client.transaction().await?;
    let balance = lock_tenant(&tx, tenant).await?;
    // An idempotent top-up's id is derived from its key; the tenant lock serialises two
    // retries of the same top-up of one tenant, and the primary key any others.
    let earlier = tx
        .query_typed_opt(
            "SELECT tenant_id, delta, at, note FROM ledger WHERE entry_id = $1",
            &[(&id, Type::TEXT)],
        )
        .await?;
    if let Some(r) = earlier {
        let earlier = EarlierTopUp {
            tenant_id: r.try_get(0)?,
            delta: r.try_get(1)?,
            at: r.try_get(2)?,
            note: r.try_get(3)?,
        };
        return Ok(replayed_top_up(
            id.to_owned(),
            tenant,
            amount,
            delta,
            earlier,
            balance,
        )?);
    }
    tx.execute_typed(
        "INSERT INTO ledger (entry_id, kind, tenant_id, at, delta, note)
         VALUES ($1, 'topup', $2, $3, $4, $5)",
        &[
            (&id, Type::TEXT),
            (&tenant, Type::INT8),
            (&now, Type::INT8),
            (&delta, Type::INT8),
            (&note, Type::TEXT),
        ],
    )
    .await
    .map_err(conflict_if_unique(Taken::TopUp(id)))?;
    let after = tx
        .query_typed_one(
            "UPDATE tenants SET balance = balance + $2::numeric WHERE id = $1
             RETURNING balance::text",
            &[(&tenant, Type::INT8), (&pen_to_text(amount), Type::TEXT)],
        )
        .await?;
    let balance = pen_from_text(&after.try_get::<_, String>(0)?, "tenants.balance")?;
    tx.commit().await?;
    Ok(TopUpOutcome {
        top_up: TopUp {
            id: id.to_owned(),
            tenant_id: tenant,
            amount,
            at: now,
            note: note.to_owned(),
        },
        balance,
        replayed: false,
    })
}

async fn balance_q(client: &mut Client, tenant: TenantId) -> PgResult<Balance> {
    let row = client
        .query_typed_opt(
            "SELECT t.balance::text,
                    COALESCE((SELECT SUM(l.amount) FROM leases l WHERE l.tenant_id = t.id), 0)::text
               FROM tenants t WHERE t.id = $1",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok(Balance {
        balance: pen_from_text(&row.try_get::<_, String>(0)?, "tenants.balance")?,
        leased: pen_from_text(&row.try_get::<_, String>(1)?, "leases.amount")?,
    })
}

/// Request rows as one array per column (see `columns`), for one multi-row insert.
fn batch_of(rows: &[LedgerRow]) -> StoreResult<LedgerBatch> {
    let mut b = LedgerBatch::default();
    // A batch may repeat an id (a replay appended to new rows); the first occurrence wins,
    // as it would if they came in separate batches.
    let mut seen = HashSet::new();
    for row in rows {
        let raw = check_row(row)?;
        if seen.insert(row.request_id.as_str()) {
            b.push(raw);
        }
    }
    Ok(b)
}

/// A batch's rows, as `record` inserts them; answers each new row's tenant and delta.
static INSERT_LEDGER_ROWS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO ledger (kind, {cols})
         SELECT 'request', {cols} FROM {unnest}
         ON CONFLICT (entry_id) DO NOTHING
         RETURNING tenant_id, delta, at, key_id, model, input_tokens, cached_tokens,
                   output_tokens",
        cols = names(LEDGER_COLUMNS),
        unnest = unnest(LEDGER_COLUMNS, "u"),
    )
});

async fn record_tx(client: &mut Client, replica: &str, b: &LedgerBatch) -> PgResult<u64> {
    let tx = client.transaction().await?;
    let mut tenants: Vec<i64> = b.tenant_id.clone();
    tenants.sort_unstable();
    tenants.dedup();
    let locked = tx
        .query_typed(
            "SELECT id FROM tenants WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE",
            &[(&tenants, Type::INT8_ARRAY)],
        )
        .await?;
    if locked.len() != tenants.len() {
        let found: HashSet<i64> = locked
            .iter()
            .map(|r| r.try_get::<_, i64>(0))
            .collect::<Result<_, _>>()?;
        let missing = tenants.iter().find(|t| !found.contains(t)).copied();
        return Err(tenant_missing(missing.unwrap_or_default()).into());
    }
    let inserted = tx.query_typed(&INSERT_LEDGER_ROWS, &b.pg_params()).await?;
    let mut charged: BTreeMap<i64, Pen> = BTreeMap::new();
    for r in &inserted {
        let tenant: i64 = r.try_get(0)?;
        let delta: i64 = r.try_get(1)?;
        *charged.entry(tenant).or_default() += -Pen::from_picos(i128::from(delta));
    }
    let mut new_rows = Vec::with_capacity(inserted.len());
    for r in &inserted {
        let delta: i64 = r.try_get(1)?;
        new_rows.push(RollupRow {
            tenant_id: r.try_get(0)?,
            at: r.try_get(2)?,
            key_id: r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
            model: r.try_get::<_, Option<String>>(4)?.unwrap_or_default(),
            input: r.try_get::<_, Option<i64>>(5)?.unwrap_or(0),
            cached: r.try_get::<_, Option<i64>>(6)?.unwrap_or(0),
            output: r.try_get::<_, Option<i64>>(7)?.unwrap_or(0),
            charge: -i128::from(delta),
        });
    }
    usage::add_rollup(&tx, &rollup(new_rows)).await?;
    charged.retain(|_, c| *c != Pen::ZERO);
    if !charged.is_empty() {
        let ids: Vec<i64> = charged.keys().copied().collect();
        let amounts: Vec<String> = charged.values().map(|c| pen_to_text(*c)).collect();
        tx.execute_typed(
            "UPDATE tenants AS t SET balance = t.balance - u.c::numeric
               FROM UNNEST($1::int8[], $2::text[]) AS u(id, c)
              WHERE t.id = u.id",
            &[(&ids, Type::INT8_ARRAY), (&amounts, Type::TEXT_ARRAY)],
        )
        .await?;
        tx.execute_typed(
            "UPDATE leases AS l SET amount = GREATEST(l.amount - u.c::numeric, 0)
               FROM UNNEST($1::int8[], $2::text[]) AS u(id, c)
              WHERE l.tenant_id = u.id AND l.replica = $3",
            &[
                (&ids, Type::INT8_ARRAY),
                (&amounts, Type::TEXT_ARRAY),
                (&replica, Type::TEXT),
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(inserted.len() as u64)
}

async fn acquire_lease_tx(
    client: &mut Client,
    replica: &str,
    tenant: TenantId,
    ask: LeaseAsk,
) -> PgResult<LeaseGrant> {
    let tx = client.transaction().await?;
    let balance = lock_tenant(&tx, tenant).await?;
    let leased = tx
        .query_typed_one(
            "SELECT COALESCE(SUM(amount), 0)::text,
                    COALESCE(SUM(amount) FILTER (WHERE replica = $2), 0)::text
               FROM leases WHERE tenant_id = $1",
            &[(&tenant, Type::INT8), (&replica, Type::TEXT)],
        )
        .await?;
    let own = pen_from_text(&leased.try_get::<_, String>(1)?, "leases.amount")?;
    let leased = pen_from_text(&leased.try_get::<_, String>(0)?, "leases.amount")?;
    let grant = lease_grant(ask.need, ask.want, balance - leased);
    if grant > Pen::ZERO {
        tx.execute_typed(
            concat!(
                "INSERT INTO leases (tenant_id, replica, amount, heartbeat_at)
                 VALUES ($1, $2, $3::numeric, ",
                db_now_ms!(),
                ")
                 ON CONFLICT (tenant_id, replica) DO UPDATE
                 SET amount = leases.amount + EXCLUDED.amount,
                     heartbeat_at = EXCLUDED.heartbeat_at"
            ),
            &[
                (&tenant, Type::INT8),
                (&replica, Type::TEXT),
                (&pen_to_text(grant), Type::TEXT),
            ],
        )
        .await?;
    } else {
        tx.execute_typed(
            concat!(
                "UPDATE leases SET heartbeat_at = ",
                db_now_ms!(),
                " WHERE tenant_id = $1 AND replica = $2"
            ),
            &[(&tenant, Type::INT8), (&replica, Type::TEXT)],
        )
        .await?;
    }
    tx.commit().await?;
    // The tenant row lock held the other writers of this lease off until commit (release and
    // record of this replica only shrink it), so `own + grant` is what was committed.
    Ok(LeaseGrant {
        granted: grant,
        held: own + grant,
        elsewhere: leased - own,
    })
}

async fn release_lease_q(
    client: &mut Client,
    replica: &str,
    tenant: TenantId,
    amount: Pen,
) -> PgResult<()> {
    // Shrinking a lease never breaks `Σ leases ≤ balance`, so no tenant lock is needed; the
    // row lock of the UPDATE serialises it with a concurrent `record` of the same replica.
    client
        .execute_typed(
            "UPDATE leases SET amount = GREATEST(amount - $3::numeric, 0)
              WHERE tenant_id = $1 AND replica = $2",
            &[
                (&tenant, Type::INT8),
                (&replica, Type::TEXT),
                (&pen_to_text(amount), Type::TEXT),
            ],
        )
        .await?;
    Ok(())
}

async fn heartbeat_q(client: &mut Client, replica: &str) -> PgResult<Vec<(TenantId, Pen)>> {
    let rows = client
        .query_typed(
            concat!(
                "UPDATE leases SET heartbeat_at = ",
                db_now_ms!(),
                " WHERE replica = $1 RETURNING tenant_id, amount::text"
            ),
            &[(&replica, Type::TEXT)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push((
            r.try_get::<_, i64>(0)?,
            pen_from_text(&r.try_get::<_, String>(1)?, "leases.amount")?,
        ));
    }
    Ok(out)
}

async fn reject_q(client: &mut Client, row: &LedgerRow, reason: &str) -> PgResult<()> {
    let rejected = rejected(row, reason);
    client
        .execute_typed(
            &format!(
                "INSERT INTO ledger_rejects ({}) VALUES ({}) ON CONFLICT (request_id) DO NOTHING",
                names(REJECT_COLUMNS),
                pg_placeholders(REJECT_COLUMNS)
            ),
            &rejected.pg_params(),
        )
        .await?;
    Ok(())
}

async fn rejected_rows_q(client: &mut Client) -> PgResult<Vec<RejectedRow>> {
    let rows = client
        .query_typed(
            &format!(
                "SELECT {} FROM ledger_rejects ORDER BY rejected_at, request_id",
                names(REJECT_COLUMNS)
            ),
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RejectedRow::from_pg(&r)?);
    }
    Ok(out)
}

async fn reclaim_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "DELETE FROM leases WHERE heartbeat_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&max_age_ms, Type::INT8)],
        )
        .await?)
}

async fn drop_leases_q(client: &mut Client, replica: &str) -> PgResult<()> {
    client
        .execute_typed(
            "DELETE FROM leases WHERE replica = $1",
            &[(&replica, Type::TEXT)],
        )
        .await?;
    Ok(())
}

async fn statement_q(
    client: &mut Client,
    tenant: TenantId,
    from: Option<UnixMs>,
    to: Option<UnixMs>,
) -> PgResult<Statement> {
    let (lo, hi) = period_bounds(from, to);
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let t = tx
        .query_typed_opt(
            "SELECT id, name, created_at, balance::text FROM tenants WHERE id = $1",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    // SUM(bigint) is an exact NUMERIC: no overflow, no float.
    let models = tx
        .query_typed(
            "SELECT model, COUNT(*), SUM(input_tokens)::text, SUM(cached_tokens)::text,
                    SUM(output_tokens)::text, (-SUM(delta))::text
               FROM ledger
              WHERE tenant_id = $1 AND kind = 'request' AND at >= $2 AND at < $3
              GROUP BY model ORDER BY model",
            &[(&tenant, Type::INT8), (&lo, Type::INT8), (&hi, Type::INT8)],
        )
        .await?;
    let top_ups = tx
        .query_typed(
            "SELECT entry_id, at, delta, note FROM ledger
              WHERE tenant_id = $1 AND kind = 'topup' AND at >= $2 AND at < $3
              ORDER BY at, entry_id",
            &[(&tenant, Type::INT8), (&lo, Type::INT8), (&hi, Type::INT8)],
        )
        .await?;
    tx.commit().await?;
    let mut per_model = Vec::with_capacity(models.len());
    for r in models {
        per_model.push(ModelTotals {
            model: r.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
            requests: i64_to_u64(r.try_get(1)?, "request count")?,
            input_tokens: count_from_text(&r.try_get::<_, String>(2)?, "input tokens")?,
            cached_tokens: count_from_text(&r.try_get::<_, String>(3)?, "cached tokens")?,
            output_tokens: count_from_text(&r.try_get::<_, String>(4)?, "output tokens")?,
            charge: pen_from_text(&r.try_get::<_, String>(5)?, "ledger charges")?,
        });
    }
    let mut ups = Vec::with_capacity(top_ups.len());
    for r in top_ups {
        ups.push(TopUp {
            id: r.try_get(0)?,
            tenant_id: tenant,
            at: r.try_get(1)?,
            amount: Pen::from_picos(i128::from(r.try_get::<_, i64>(2)?)),
            note: r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
        });
    }
    Ok(Statement {
        tenant: Tenant {
            id: t.try_get(0)?,
            name: t.try_get(1)?,
            created_at: t.try_get(2)?,
        },
        from,
        to,
        total_charges: per_model.iter().map(|m| m.charge).sum(),
        total_top_ups: ups.iter().map(|u| u.amount).sum(),
        balance: pen_from_text(&t.try_get::<_, String>(3)?, "tenants.balance")?,
        per_model,
        top_ups: ups,
    })
}

async fn ledger_rows_q(client: &mut Client, tenant: Option<TenantId>) -> PgResult<Vec<LedgerRow>> {
    let rows = client
        .query_typed(
            &format!(
                "SELECT {} FROM ledger
                  WHERE kind = 'request' AND ($1::bigint IS NULL OR tenant_id = $1)
                  ORDER BY at, entry_id",
                names(LEDGER_COLUMNS)
            ),
            &[(&tenant, Type::INT8)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RawLedgerRow::from_pg(&r)?.into_row()?);
    }
    Ok(out)
}

#[async_trait]
impl Store for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        with_retry!(self, c => create_tenant_tx(c, name))
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        with_retry!(self, c => tenant_by_name_q(c, name))
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        with_retry!(self, c => list_tenants_q(c))
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        with_retry!(self, c => create_key_tx(c, &key))
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        with_retry!(self, c => revoke_key_tx(c, key_id))
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        with_retry!(self, c => list_keys_q(c, tenant))
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        with_retry!(self, c => keys_version_q(c))
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        with_retry!(self, c => active_keys_q(c))
    }

    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        idempotency_key: Option<&str>,
    ) -> StoreResult<TopUpOutcome> {
        let (delta, id) = top_up_entry(amount, idempotency_key)?;
        with_retry!(self, c => top_up_tx(c, tenant, amount, delta, note, &id))
    }

    async fn balance(&self, tenant: TenantId) -> StoreResult<Balance> {
        with_retry!(self, c => balance_q(c, tenant))
    }

    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> StoreResult<u64> {
        if rows.is_empty() {
            return Ok(0);
        }
        let batch = batch_of(rows)?;
        with_retry!(self, c => record_tx(c, replica, &batch))
    }

    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        with_retry!(self, c => acquire_lease_tx(c, replica, tenant, ask))
    }

    async fn release_lease(&self, replica: &str, tenant: TenantId, amount: Pen) -> StoreResult<()> {
        if amount <= Pen::ZERO {
            return Ok(());
        }
        with_retry!(self, c => release_lease_q(c, replica, tenant, amount))
    }

    async fn heartbeat(&self, replica: &str) -> StoreResult<Vec<(TenantId, Pen)>> {
        with_retry!(self, c => heartbeat_q(c, replica))
    }

    async fn reject(&self, row: &LedgerRow, reason: &str) -> StoreResult<()> {
        with_retry!(self, c => reject_q(c, row, reason))
    }

    async fn rejected_rows(&self) -> StoreResult<Vec<RejectedRow>> {
        with_retry!(self, c => rejected_rows_q(c))
    }

    async fn reclaim_stale_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        with_retry!(self, c => reclaim_q(c, max_age_ms))
    }

    async fn drop_leases(&self, replica: &str) -> StoreResult<()> {
        with_retry!(self, c => drop_leases_q(c, replica))
    }

    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<UnixMs>,
        to: Option<UnixMs>,
    ) -> StoreResult<Statement> {
        with_retry!(self, c => statement_q(c, tenant, from, to))
    }

    async fn ledger_rows(&self, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>> {
        with_retry!(self, c => ledger_rows_q(c, tenant))
    }

    async fn put_responses(&self, rows: &[StoredResponse]) -> StoreResult<u64> {
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
