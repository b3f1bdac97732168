//! The embedded store: one SQLite file (`sqlite://data/quipu.db`), created on first open.
//!
//! One connection behind a mutex, used only from `tokio::task::spawn_blocking`, so the async
//! [`Store`] methods never block a runtime thread. Other processes may open the same file at
//! the same time (the CLI beside a running gateway, or the old and new gateway during a
//! graceful upgrade): the file is in WAL mode (readers never wait for the writer), every write
//! runs in a `BEGIN IMMEDIATE` transaction (it takes the write lock up front, so a transaction
//! never has to upgrade a read lock and fail with `SQLITE_BUSY`), and a busy timeout makes a
//! writer wait for another process's transaction instead of failing.
//!
//! **Durability.** `synchronous = FULL`: every commit is fsynced before it returns. With WAL,
//! `NORMAL` would still never corrupt the file, but a power cut could lose the last commits —
//! a top-up the operator was told succeeded, or ledger rows whose balance effect the gateway
//! already dropped from memory. Ledger rows arrive in batches from a background writer, so the
//! fsync is paid per batch, not per request, and the request path never waits on it.
//!
//! **Permissions.** A new database file is created readable and writable by its owner only
//! (0600), and so are the `-wal` and `-shm` files SQLite makes beside it: they hold every
//! balance, the ledger and the keys' hashes. An existing file is left as it is.
//!
//! Money follows `sql_money`: ledger deltas are INTEGER pico-soles; balances and leases are
//! TEXT decimal integers, read, changed in Rust (i128) and written back inside the transaction;
//! sums use split halves so they can neither overflow nor become floats.
//!
//! The account API's reads, and the roll-ups `record` keeps for them, are in `usage`.

use super::columns::{names, sqlite_placeholders, LEDGER_COLUMNS, REJECT_COLUMNS};
use super::rows::{
    check_row, conflict_if_unique, limits_from_sql, limits_to_sql, period_bounds, rejected,
    replayed_top_up, secret_hash, tenant_missing, top_up_entry, DbError, EarlierTopUp,
    RawLedgerRow, Taken,
};
use super::sql_money::{
    i128_to_u64, i64_to_u64, pen_from_text, pen_to_text, recombine, sqlite_split_sum,
};
use super::usage::{rollup, RollupRow};
use super::{
    check_quota_asks, now_ms, responses, schema, ActiveKey, Balance, KeyInfo, KeyLimits, LeaseAsk,
    LeaseGrant, LedgerRow, ModelTotals, NewKey, QuotaAsk, QuotaGrant, RejectedRow, Statement,
    Store, StoreError, StoreResult, StoredResponse, Tenant, TenantId, TenantSummary, TopUp,
    TopUpOutcome, UnixMs,
};
use crate::money::Pen;
use crate::threads::{ledger_yields, let_requests_run, ROWS_PER_YIELD};
use async_trait::async_trait;
use quipu_core::billing::lease::lease_grant;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

mod replicas;
pub mod usage;

/// How long a writer waits for another process's write transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQLite [`Store`]. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: Arc<str>,
}

impl SqliteStore {
    /// Opens (creating if missing, with its parent directory) the database at `path` and
    /// migrates it. `:memory:` opens a private in-memory database (tests).
    pub async fn open(path: &str) -> StoreResult<SqliteStore> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || SqliteStore::open_blocking(&path))
            .await
            .map_err(|e| StoreError::Backend(format!("sqlite open task failed: {e}")))?
    }

    /// [`SqliteStore::open`] for synchronous callers.
    pub fn open_blocking(path: &str) -> StoreResult<SqliteStore> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Backend(format!("sqlite database {path}: {what}: {e}"))
        };
        if path != ":memory:" {
            if let Some(dir) = Path::new(path).parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        fail(
                            &format!("cannot create directory {}", PathBuf::from(dir).display()),
                            &e,
                        )
                    })?;
                }
            }
            create_private(Path::new(path)).map_err(|e| fail("cannot create the file", &e))?;
        }
        let mut conn = Connection::open(path).map_err(|e| fail("cannot open", &e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| fail("cannot set busy_timeout", &e))?;
        enable_wal(&conn).map_err(|e| fail("cannot enable WAL", &e))?;
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(|e| fail("cannot set pragmas", &e))?;
        migrate(&mut conn).map_err(|e| match e {
            StoreError::Backend(m) => StoreError::Backend(format!("sqlite database {path}: {m}")),
            other => other,
        })?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::from(path),
        })
    }

    /// Runs `f` on the connection in a blocking thread.
    async fn run<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        let path = Arc::clone(&self.path);
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock left no transaction open (rusqlite rolls back on
            // drop), so a poisoned connection is still consistent.
            let mut guard = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("sqlite database {path}: task failed: {e}")))?
    }
}

/// Creates the database file, empty and readable by its owner only (mode 0600), unless it
/// exists: it holds every tenant's balance and ledger and the keys' hashes. SQLite opens an
/// existing empty file as a new database, and gives the `-wal` and `-shm` files it creates
/// beside it the main file's permissions, so they are 0600 too. An existing file keeps the
/// permissions it has (an operator may have chosen them).
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// `PRAGMA journal_mode = WAL`, waiting out another connection that holds the database.
///
/// `busy_timeout` is not enough here: switching the journal mode needs an exclusive lock on
/// top of the read lock the pragma takes first, and while another connection holds a write
/// lock (a second process opening the same new database and running its migrations) SQLite
/// reports `SQLITE_BUSY` at once instead of calling the busy handler, since waiting could
/// deadlock. Nothing is held between attempts, so retrying cannot.
fn enable_wal(conn: &Connection) -> rusqlite::Result<()> {
    let started = std::time::Instant::now();
    loop {
        // The pragma answers with the mode in force (`memory` for `:memory:`).
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Err(e)
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                    && started.elapsed() < BUSY_TIMEOUT =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other.map(drop),
        }
    }
}

fn sql_err(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("sqlite: {e}"))
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        sql_err(e)
    }
}

impl DbError for rusqlite::Error {
    type Failure = StoreError;

    fn is_unique_violation(&self) -> bool {
        matches!(
            self.sqlite_extended_error_code(),
            Some(
                rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            )
        )
    }
}

fn write_tx(conn: &mut Connection) -> StoreResult<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_err)
}

/// A read transaction: every query in it sees one snapshot.
fn read_tx(conn: &mut Connection) -> StoreResult<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Deferred)
        .map_err(sql_err)
}

fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    tx.execute_batch(schema::SQLITE_BOOTSTRAP)
        .map_err(sql_err)?;
    let current: i64 = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql_err)?
        .unwrap_or(0);
    if current > schema::latest_version() {
        return Err(schema::too_new(current, "sqlite"));
    }
    for (version, sql) in schema::SQLITE_MIGRATIONS {
        if *version <= current {
            continue;
        }
        tx.execute_batch(sql)
            .map_err(|e| StoreError::Backend(format!("migration {version} failed: {e}")))?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![version],
        )
        .map_err(sql_err)?;
    }
    tx.commit().map_err(sql_err)
}

fn bump_keys_version(tx: &Transaction<'_>) -> StoreResult<()> {
    tx.execute(
        "UPDATE meta SET value = value + 1 WHERE key = 'keys_version'",
        [],
    )
    .map_err(sql_err)?;
    Ok(())
}

/// The tenant's balance, or `NotFound`.
fn read_balance(tx: &Transaction<'_>, tenant: TenantId) -> StoreResult<Pen> {
    let text: Option<String> = tx
        .prepare_cached("SELECT balance FROM tenants WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![tenant], |r| r.get(0)).optional())
        .map_err(sql_err)?;
    match text {
        Some(t) => pen_from_text(&t, "tenants.balance"),
        None => Err(tenant_missing(tenant)),
    }
}

fn write_balance(tx: &Transaction<'_>, tenant: TenantId, balance: Pen) -> StoreResult<()> {
    tx.prepare_cached("UPDATE tenants SET balance = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![tenant, pen_to_text(balance)]))
        .map_err(sql_err)?;
    Ok(())
}

/// Every lease on the tenant: replica → amount.
fn read_leases(tx: &Transaction<'_>, tenant: TenantId) -> StoreResult<Vec<(String, Pen)>> {
    let mut stmt = tx
        .prepare_cached("SELECT replica, amount FROM leases WHERE tenant_id = ?1")
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(params![tenant], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(sql_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (replica, amount) = row.map_err(sql_err)?;
        out.push((replica, pen_from_text(&amount, "leases.amount")?));
    }
    Ok(out)
}

fn write_lease(
    tx: &Transaction<'_>,
    tenant: TenantId,
    replica: &str,
    amount: Pen,
    heartbeat: Option<UnixMs>,
) -> StoreResult<()> {
    let r = match heartbeat {
        Some(at) => tx
            .prepare_cached(
                "INSERT INTO leases (tenant_id, replica, amount, heartbeat_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (tenant_id, replica)
                 DO UPDATE SET amount = excluded.amount, heartbeat_at = excluded.heartbeat_at",
            )
            .and_then(|mut s| s.execute(params![tenant, replica, pen_to_text(amount), at])),
        None => tx
            .prepare_cached("UPDATE leases SET amount = ?3 WHERE tenant_id = ?1 AND replica = ?2")
            .and_then(|mut s| s.execute(params![tenant, replica, pen_to_text(amount)])),
    };
    r.map_err(sql_err)?;
    Ok(())
}

/// A request row, as `record` inserts it (see `columns`).
static INSERT_LEDGER_ROW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO ledger (kind, {}) VALUES ('request', {}) ON CONFLICT (entry_id) DO NOTHING",
        names(LEDGER_COLUMNS),
        sqlite_placeholders(LEDGER_COLUMNS)
    )
});

#[async_trait]
impl Store for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        let name = name.to_owned();
        self.run(move |conn| {
            let now = now_ms();
            let tx = write_tx(conn)?;
            tx.execute(
                "INSERT INTO tenants (name, created_at, balance) VALUES (?1, ?2, '0')",
                params![name, now],
            )
            .map_err(conflict_if_unique(Taken::TenantName(&name)))?;
            let id = tx.last_insert_rowid();
            bump_keys_version(&tx)?;
            tx.commit().map_err(sql_err)?;
            Ok(Tenant {
                id,
                name,
                created_at: now,
            })
        })
        .await
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        let name = name.to_owned();
        self.run(move |conn| {
            conn.query_row(
                "SELECT id, name, created_at FROM tenants WHERE name = ?1",
                params![name],
                |r| {
                    Ok(Tenant {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        created_at: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(sql_err)
        })
        .await
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        self.run(move |conn| {
            let tx = read_tx(conn)?;
            let mut leased: HashMap<TenantId, Pen> = HashMap::new();
            {
                let mut stmt = tx
                    .prepare("SELECT tenant_id, amount FROM leases")
                    .map_err(sql_err)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                    .map_err(sql_err)?;
                for row in rows {
                    let (tenant, amount) = row.map_err(sql_err)?;
                    *leased.entry(tenant).or_default() += pen_from_text(&amount, "leases.amount")?;
                }
            }
            let mut stmt = tx
                .prepare(
                    "SELECT t.id, t.name, t.created_at, t.balance,
                            (SELECT COUNT(*) FROM api_keys k
                              WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)
                       FROM tenants t ORDER BY t.name",
                )
                .map_err(sql_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        Tenant {
                            id: r.get(0)?,
                            name: r.get(1)?,
                            created_at: r.get(2)?,
                        },
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                    ))
                })
                .map_err(sql_err)?;
            let mut out = Vec::new();
            for row in rows {
                let (tenant, balance, keys) = row.map_err(sql_err)?;
                out.push(TenantSummary {
                    balance: pen_from_text(&balance, "tenants.balance")?,
                    leased: leased.get(&tenant.id).copied().unwrap_or_default(),
                    active_keys: i64_to_u64(keys, "active key count")?,
                    tenant,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        self.run(move |conn| {
            let now = now_ms();
            let (rpm, tpm) = limits_to_sql(key.limits)?;
            let tx = write_tx(conn)?;
            let tenant_name: String = tx
                .query_row(
                    "SELECT name FROM tenants WHERE id = ?1",
                    params![key.tenant],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql_err)?
                .ok_or_else(|| tenant_missing(key.tenant))?;
            tx.execute(
                "INSERT INTO api_keys (id, tenant_id, label, secret_sha256, secret_prefix,
                                       created_at, revoked_at, rpm_limit, tpm_limit)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8)",
                params![
                    key.id,
                    key.tenant,
                    key.label,
                    &key.secret_hash[..],
                    key.secret_prefix,
                    now,
                    rpm,
                    tpm
                ],
            )
            .map_err(conflict_if_unique(Taken::Key(&key.id)))?;
            bump_keys_version(&tx)?;
            tx.commit().map_err(sql_err)?;
            Ok(KeyInfo {
                id: key.id,
                tenant_id: key.tenant,
                tenant_name,
                label: key.label,
                secret_prefix: key.secret_prefix,
                created_at: now,
                revoked_at: None,
                limits: key.limits,
            })
        })
        .await
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        let key_id = key_id.to_owned();
        self.run(move |conn| {
            let tx = write_tx(conn)?;
            let revoked: Option<Option<i64>> = tx
                .query_row(
                    "SELECT revoked_at FROM api_keys WHERE id = ?1",
                    params![key_id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql_err)?;
            match revoked {
                None => Err(StoreError::NotFound(format!("key {key_id} does not exist"))),
                Some(Some(_)) => Ok(false),
                Some(None) => {
                    tx.execute(
                        "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1",
                        params![key_id, now_ms()],
                    )
                    .map_err(sql_err)?;
                    bump_keys_version(&tx)?;
                    tx.commit().map_err(sql_err)?;
                    Ok(true)
                }
            }
        })
        .await
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        self.run(move |conn| {
            let tx = read_tx(conn)?;
            if let Some(t) = tenant {
                read_balance(&tx, t)?;
            }
            let mut stmt = tx
                .prepare(
                    "SELECT k.id, k.tenant_id, t.name, k.label, k.secret_prefix, k.created_at,
                            k.revoked_at, k.rpm_limit, k.tpm_limit
                       FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
                      WHERE ?1 IS NULL OR k.tenant_id = ?1
                      ORDER BY k.created_at, k.id",
                )
                .map_err(sql_err)?;
            let rows = stmt
                .query_map(params![tenant], |r| {
                    Ok((
                        KeyInfo {
                            id: r.get(0)?,
                            tenant_id: r.get(1)?,
                            tenant_name: r.get(2)?,
                            label: r.get(3)?,
                            secret_prefix: r.get(4)?,
                            created_at: r.get(5)?,
                            revoked_at: r.get(6)?,
                            limits: KeyLimits::default(),
                        },
                        r.get::<_, Option<i64>>(7)?,
                        r.get::<_, Option<i64>>(8)?,
                    ))
                })
                .map_err(sql_err)?;
            let mut out = Vec::new();
            for row in rows {
                let (mut info, rpm, tpm) = row.map_err(sql_err)?;
                info.limits = limits_from_sql(rpm, tpm)?;
                out.push(info);
            }
            Ok(out)
        })
        .await
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        self.run(move |conn| {
            conn.prepare_cached("SELECT value FROM meta WHERE key = 'keys_version'")
                .and_then(|mut s| s.query_row([], |r| r.get(0)))
                .map_err(sql_err)
        })
        .await
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        self.run(move |conn| {
            let tx = read_tx(conn)?;
            let version: i64 = tx
                .query_row(
                    "SELECT value FROM meta WHERE key = 'keys_version'",
                    [],
                    |r| r.get(0),
                )
                .map_err(sql_err)?;
            let mut stmt = tx
                .prepare(
                    "SELECT k.secret_sha256, k.id, k.tenant_id, t.name, k.rpm_limit, k.tpm_limit
                       FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
                      WHERE k.revoked_at IS NULL
                      ORDER BY k.id",
                )
                .map_err(sql_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, Vec<u8>>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<i64>>(4)?,
                        r.get::<_, Option<i64>>(5)?,
                    ))
                })
                .map_err(sql_err)?;
            let mut keys = Vec::new();
            for row in rows {
                let (hash, key_id, tenant_id, tenant_name, rpm, tpm) = row.map_err(sql_err)?;
                keys.push(ActiveKey {
                    secret_hash: secret_hash(&hash)?,
                    key_id,
                    tenant_id,
                    tenant_name,
                    limits: limits_from_sql(rpm, tpm)?,
                });
            }
            Ok((version, keys))
        })
        .await
    }

    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        idempotency_key: Option<&str>,
    ) -> StoreResult<TopUpOutcome> {
        let (delta, id) = top_up_entry(amount, idempotency_key)?;
        let note = note.to_owned();
        self.run(move |conn| {
            let now = now_ms();
            let tx = write_tx(conn)?;
            let balance = read_balance(&tx, tenant)?;
            let earlier = tx
                .query_row(
                    "SELECT tenant_id, delta, at, note FROM ledger WHERE entry_id = ?1",
                    params![id],
                    |r| {
                        Ok(EarlierTopUp {
                            tenant_id: r.get(0)?,
                            delta: r.get(1)?,
                            at: r.get(2)?,
                            note: r.get(3)?,
                        })
                    },
                )
                .optional()
                .map_err(sql_err)?;
            if let Some(earlier) = earlier {
                return replayed_top_up(id, tenant, amount, delta, earlier, balance);
            }
            tx.execute(
                "INSERT INTO ledger (entry_id, kind, tenant_id, at, delta, note)
                 VALUES (?1, 'topup', ?2, ?3, ?4, ?5)",
                params![id, tenant, now, delta, note],
            )
            .map_err(sql_err)?;
            write_balance(&tx, tenant, balance + amount)?;
            tx.commit().map_err(sql_err)?;
            Ok(TopUpOutcome {
                top_up: TopUp {
                    id,
                    tenant_id: tenant,
                    amount,
                    at: now,
                    note,
                },
                balance: balance + amount,
                replayed: false,
            })
        })
        .await
    }

    async fn balance(&self, tenant: TenantId) -> StoreResult<Balance> {
        self.run(move |conn| {
            let tx = read_tx(conn)?;
            let balance = read_balance(&tx, tenant)?;
            let leased = read_leases(&tx, tenant)?.into_iter().map(|l| l.1).sum();
            Ok(Balance { balance, leased })
        })
        .await
    }

    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> StoreResult<u64> {
        if rows.is_empty() {
            return Ok(0);
        }
        let rows = rows
            .iter()
            .map(check_row)
            .collect::<StoreResult<Vec<_>>>()?;
        let replica = replica.to_owned();
        self.run(move |conn| {
            let tx = write_tx(conn)?;
            // Per tenant: its balance before, and what the new rows charge.
            let mut tenants: BTreeMap<TenantId, (Pen, Pen)> = BTreeMap::new();
            for row in &rows {
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    tenants.entry(row.tenant_id)
                {
                    slot.insert((read_balance(&tx, row.tenant_id)?, Pen::ZERO));
                }
            }
            let mut inserted = 0u64;
            let mut new_rows = Vec::with_capacity(rows.len());
            {
                let mut stmt = tx.prepare_cached(&INSERT_LEDGER_ROW).map_err(sql_err)?;
                // A batch holds a write transaction for milliseconds of CPU on a thread that
                // may share a core with the workers: let requests through (see `threads`).
                let yields = ledger_yields();
                for (i, row) in rows.iter().enumerate() {
                    if yields && i % ROWS_PER_YIELD == ROWS_PER_YIELD - 1 {
                        let_requests_run();
                    }
                    let n = stmt
                        .execute(row.sqlite_params().as_slice())
                        .map_err(sql_err)?;
                    if n == 1 {
                        inserted += 1;
                        new_rows.push(RollupRow::from(row));
                        if let Some(t) = tenants.get_mut(&row.tenant_id) {
                            t.1 += row.charge();
                        }
                    }
                }
            }
            usage::add_rollup(&tx, &rollup(new_rows))?;
            for (tenant, (balance, charged)) in &tenants {
                if *charged == Pen::ZERO {
                    continue;
                }
                write_balance(&tx, *tenant, *balance - *charged)?;
                let own = read_leases(&tx, *tenant)?
                    .into_iter()
                    .find(|l| l.0 == replica);
                if let Some((_, lease)) = own {
                    write_lease(
                        &tx,
                        *tenant,
                        &replica,
                        (lease - *charged).max(Pen::ZERO),
                        None,
                    )?;
                }
            }
            tx.commit().map_err(sql_err)?;
            Ok(inserted)
        })
        .await
    }

    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        let replica = replica.to_owned();
        self.run(move |conn| {
            let now = now_ms();
            let tx = write_tx(conn)?;
            let balance = read_balance(&tx, tenant)?;
            let leases = read_leases(&tx, tenant)?;
            let leased: Pen = leases.iter().map(|l| l.1).sum();
            let own = leases.iter().find(|l| l.0 == replica).map(|l| l.1);
            let grant = lease_grant(ask.need, ask.want, balance - leased);
            let current = own.unwrap_or_default();
            if grant > Pen::ZERO || own.is_some() {
                write_lease(&tx, tenant, &replica, current + grant, Some(now))?;
            }
            tx.commit().map_err(sql_err)?;
            Ok(LeaseGrant {
                granted: grant,
                held: current + grant,
                elsewhere: leased - current,
            })
        })
        .await
    }

    async fn release_lease(&self, replica: &str, tenant: TenantId, amount: Pen) -> StoreResult<()> {
        if amount <= Pen::ZERO {
            return Ok(());
        }
        let replica = replica.to_owned();
        self.run(move |conn| {
            let tx = write_tx(conn)?;
            let own = read_leases(&tx, tenant)?
                .into_iter()
                .find(|l| l.0 == replica);
            if let Some((_, lease)) = own {
                write_lease(&tx, tenant, &replica, (lease - amount).max(Pen::ZERO), None)?;
            }
            tx.commit().map_err(sql_err)
        })
        .await
    }

    async fn heartbeat(&self, replica: &str) -> StoreResult<Vec<(TenantId, Pen)>> {
        let replica = replica.to_owned();
        self.run(move |conn| {
            let tx = write_tx(conn)?;
            tx.prepare_cached("UPDATE leases SET heartbeat_at = ?2 WHERE replica = ?1")
                .and_then(|mut s| s.execute(params![replica, now_ms()]))
                .map_err(sql_err)?;
            let mut out = Vec::new();
            {
                let mut stmt = tx
                    .prepare_cached("SELECT tenant_id, amount FROM leases WHERE replica = ?1")
                    .map_err(sql_err)?;
                let rows = stmt
                    .query_map(params![replica], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                    })
                    .map_err(sql_err)?;
                for row in rows {
                    let (tenant, amount) = row.map_err(sql_err)?;
                    out.push((tenant, pen_from_text(&amount, "leases.amount")?));
                }
            }
            tx.commit().map_err(sql_err)?;
            Ok(out)
        })
        .await
    }

    async fn reject(&self, row: &LedgerRow, reason: &str) -> StoreResult<()> {
        let rejected = rejected(row, reason);
        self.run(move |conn| {
            conn.execute(
                &format!(
                    "INSERT INTO ledger_rejects ({}) VALUES ({})
                     ON CONFLICT (request_id) DO NOTHING",
                    names(REJECT_COLUMNS),
                    sqlite_placeholders(REJECT_COLUMNS)
                ),
                rejected.sqlite_params().as_slice(),
            )
            .map_err(sql_err)?;
            Ok(())
        })
        .await
    }

    async fn rejected_rows(&self) -> StoreResult<Vec<RejectedRow>> {
        self.run(move |conn| {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {} FROM ledger_rejects ORDER BY rejected_at, request_id",
                    names(REJECT_COLUMNS)
                ))
                .map_err(sql_err)?;
            let rows = stmt
                .query_map([], RejectedRow::from_sqlite)
                .map_err(sql_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql_err)
        })
        .await
    }

    async fn reclaim_stale_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        self.run(move |conn| {
            let cutoff = now_ms().saturating_sub(max_age_ms);
            let n = conn
                .execute(
                    "DELETE FROM leases WHERE heartbeat_at < ?1",
                    params![cutoff],
                )
                .map_err(sql_err)?;
            Ok(n as u64)
        })
        .await
    }

    async fn drop_leases(&self, replica: &str) -> StoreResult<()> {
        let replica = replica.to_owned();
        self.run(move |conn| {
            conn.execute("DELETE FROM leases WHERE replica = ?1", params![replica])
                .map_err(sql_err)?;
            Ok(())
        })
        .await
    }

    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<UnixMs>,
        to: Option<UnixMs>,
    ) -> StoreResult<Statement> {
        self.run(move |conn| {
            let (lo, hi) = period_bounds(from, to);
            let tx = read_tx(conn)?;
            let (t, balance): (Tenant, String) = tx
                .query_row(
                    "SELECT id, name, created_at, balance FROM tenants WHERE id = ?1",
                    params![tenant],
                    |r| {
                        Ok((
                            Tenant {
                                id: r.get(0)?,
                                name: r.get(1)?,
                                created_at: r.get(2)?,
                            },
                            r.get(3)?,
                        ))
                    },
                )
                .optional()
                .map_err(sql_err)?
                .ok_or_else(|| tenant_missing(tenant))?;
            let mut per_model = Vec::new();
            {
                let mut stmt = tx
                    .prepare(concat!(
                        "SELECT model, COUNT(*), ",
                        sqlite_split_sum!("input_tokens"),
                        ", ",
                        sqlite_split_sum!("cached_tokens"),
                        ", ",
                        sqlite_split_sum!("output_tokens"),
                        ", ",
                        sqlite_split_sum!("-delta"),
                        " FROM ledger
                          WHERE tenant_id = ?1 AND kind = 'request' AND at >= ?2 AND at < ?3
                          GROUP BY model ORDER BY model"
                    ))
                    .map_err(sql_err)?;
                let rows = stmt
                    .query_map(params![tenant, lo, hi], |r| {
                        let mut v = [0i64; 9];
                        for (i, slot) in v.iter_mut().enumerate() {
                            *slot = r.get(i + 1)?;
                        }
                        Ok((r.get::<_, Option<String>>(0)?.unwrap_or_default(), v))
                    })
                    .map_err(sql_err)?;
                for row in rows {
                    let (model, v) = row.map_err(sql_err)?;
                    let count = |hi: i64, lo: i64, what: &str| i128_to_u64(recombine(hi, lo), what);
                    per_model.push(ModelTotals {
                        model,
                        requests: i64_to_u64(v[0], "request count")?,
                        input_tokens: count(v[1], v[2], "input tokens")?,
                        cached_tokens: count(v[3], v[4], "cached tokens")?,
                        output_tokens: count(v[5], v[6], "output tokens")?,
                        charge: Pen::from_picos(recombine(v[7], v[8])),
                    });
                }
            }
            let mut top_ups = Vec::new();
            {
                let mut stmt = tx
                    .prepare(
                        "SELECT entry_id, at, delta, note FROM ledger
                          WHERE tenant_id = ?1 AND kind = 'topup' AND at >= ?2 AND at < ?3
                          ORDER BY at, entry_id",
                    )
                    .map_err(sql_err)?;
                let rows = stmt
                    .query_map(params![tenant, lo, hi], |r| {
                        Ok(TopUp {
                            id: r.get(0)?,
                            tenant_id: tenant,
                            at: r.get(1)?,
                            amount: Pen::from_picos(i128::from(r.get::<_, i64>(2)?)),
                            note: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                        })
                    })
                    .map_err(sql_err)?;
                for row in rows {
                    top_ups.push(row.map_err(sql_err)?);
                }
            }
            Ok(Statement {
                total_charges: per_model.iter().map(|m| m.charge).sum(),
                total_top_ups: top_ups.iter().map(|t| t.amount).sum(),
                balance: pen_from_text(&balance, "tenants.balance")?,
                tenant: t,
                from,
                to,
                per_model,
                top_ups,
            })
        })
        .await
    }

    async fn ledger_rows(&self, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>> {
        self.run(move |conn| {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {} FROM ledger
                      WHERE kind = 'request' AND (?1 IS NULL OR tenant_id = ?1)
                      ORDER BY at, entry_id",
                    names(LEDGER_COLUMNS)
                ))
                .map_err(sql_err)?;
            let rows = stmt
                .query_map(params![tenant], RawLedgerRow::from_sqlite)
                .map_err(sql_err)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row.map_err(sql_err)?.into_row()?);
            }
            Ok(out)
        })
        .await
    }

    async fn put_responses(&self, rows: &[StoredResponse]) -> StoreResult<u64> {
        let rows = rows.to_vec();
        self.run(move |conn| responses::sqlite_put(conn, &rows))
            .await
    }

    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        let id = id.to_owned();
        self.run(move |conn| responses::sqlite_get(conn, tenant, &id))
            .await
    }

    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.run(move |conn| responses::sqlite_delete(conn, tenant, &id))
            .await
    }

    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64> {
        self.run(move |conn| responses::sqlite_prune(conn, before, max_bytes_per_tenant))
            .await
    }

    async fn take_quota(&self, asks: &[QuotaAsk]) -> StoreResult<(Vec<QuotaGrant>, UnixMs)> {
        check_quota_asks(asks)?;
        let asks = asks.to_vec();
        self.run(move |conn| replicas::take_quota(conn, &asks))
            .await
    }

    async fn expire_quota(&self, age_ms: i64) -> StoreResult<u64> {
        self.run(move |conn| replicas::expire_quota(conn, age_ms))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn a_new_database_and_its_wal_files_are_private_to_the_owner() {
        let dir = std::env::temp_dir().join(format!(
            "quipu-sqlite-mode-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let file = dir.join("quipu.db");
        let s = SqliteStore::open(&file.display().to_string())
            .await
            .unwrap();
        // A write, so that SQLite has created the -wal and -shm files.
        s.create_tenant("acme").await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let path = PathBuf::from(format!("{}{suffix}", file.display()));
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
        drop(s);

        // An existing file keeps the permissions the operator gave it.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let s = SqliteStore::open(&file.display().to_string())
            .await
            .unwrap();
        assert_eq!(s.list_tenants().await.unwrap().len(), 1);
        assert_eq!(mode(&file), 0o640);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
