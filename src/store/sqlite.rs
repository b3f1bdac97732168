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
//! This file opens the database, migrates it and runs closures on its connection; each trait
//! of [`Store`] is implemented with its concern: `tenants` ([`TenantStore`](super::TenantStore):
//! tenants and keys), `ledger` ([`LedgerStore`](super::LedgerStore): top-ups, balances, request
//! rows, rejects, statements), `leases` ([`LeaseStore`](super::LeaseStore): leases and shared
//! rate windows; no [`ReplicaChannel`](super::ReplicaChannel) between processes), `responses`
//! ([`ResponseStore`](super::ResponseStore)) and `usage` ([`UsageStore`](super::UsageStore):
//! the account API's reads, and the roll-ups `record` keeps for them) and `webhooks`
//! ([`WebhookStore`](super::webhooks::WebhookStore): the outbox, and the events other
//! transactions write in it).

use super::rows::DbError;
use super::sql::{Cols, Sql, SqlValue};
use super::{schema, Backend, Store, StoreError, StoreResult};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

mod caps;
mod leases;
mod ledger;
mod responses;
mod tenants;
mod usage;
pub mod webhooks;

/// How long a writer waits for another process's write transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Prepared statements kept per connection: every statement the store sends, so none is
/// prepared twice (rusqlite keeps 16 by default).
const STATEMENT_CACHE: usize = 64;

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
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
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

/// What a shared statement can fail with: the database (maybe a unique key a caller turns into
/// a `Conflict`), or reading its rows.
enum SqliteErr {
    Db(rusqlite::Error),
    Store(StoreError),
}

impl From<SqliteErr> for StoreError {
    fn from(e: SqliteErr) -> Self {
        match e {
            SqliteErr::Db(e) => sql_err(e),
            SqliteErr::Store(e) => e,
        }
    }
}

impl DbError for SqliteErr {
    type Failure = StoreError;

    fn is_unique_violation(&self) -> bool {
        matches!(self, SqliteErr::Db(e) if e.is_unique_violation())
    }
}

type SqliteResult<T> = Result<T, SqliteErr>;

/// Runs a shared statement (see `sql`), reading each row with `read`.
fn query<T>(
    conn: &Connection,
    sql: &Sql,
    values: &[SqlValue<'_>],
    mut read: impl FnMut(&mut Cols<'_>) -> StoreResult<T>,
) -> SqliteResult<Vec<T>> {
    let mut stmt = conn
        .prepare_cached(sql.get(Backend::Sqlite))
        .map_err(SqliteErr::Db)?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(values))
        .map_err(SqliteErr::Db)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(SqliteErr::Db)? {
        out.push(read(&mut Cols::new(row)).map_err(SqliteErr::Store)?);
    }
    Ok(out)
}

/// [`query`]'s only row, if any (the statements it runs select by key, or aggregate).
fn query_opt<T>(
    conn: &Connection,
    sql: &Sql,
    values: &[SqlValue<'_>],
    read: impl FnMut(&mut Cols<'_>) -> StoreResult<T>,
) -> SqliteResult<Option<T>> {
    Ok(query(conn, sql, values, read)?.into_iter().next())
}

/// Runs a shared statement that returns no rows; how many rows it changed.
fn execute(conn: &Connection, sql: &Sql, values: &[SqlValue<'_>]) -> SqliteResult<usize> {
    conn.prepare_cached(sql.get(Backend::Sqlite))
        .and_then(|mut s| s.execute(rusqlite::params_from_iter(values)))
        .map_err(SqliteErr::Db)
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

impl Store for SqliteStore {
    fn kind(&self) -> Backend {
        Backend::Sqlite
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TenantStore;
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
