//! Durable state: tenants, API keys, the money ledger and balance leases, and the stored
//! responses of the Responses API.
//!
//! The store is a few traits with one job each, and [`Store`], all of them together:
//!
//! | trait | owns |
//! |---|---|
//! | [`TenantStore`] | tenants, API keys, the keys version and the active keys |
//! | [`LedgerStore`] | top-ups, balances, request rows and the ones refused, statements |
//! | [`LeaseStore`] | replicas' leases on balances, and the shared rate windows |
//! | [`ResponseStore`] | stored responses |
//! | [`ReplicaChannel`] | signals between replicas (PostgreSQL `LISTEN`/`NOTIFY`) |
//! | [`UsageStore`] | the account API's reads (see [`usage`]) |
//! | [`WebhookStore`] | alert endpoints, the outbox of events and their deliveries (see [`webhooks`]) |
//!
//! Two implementations: SQLite (the embedded default, one file) and PostgreSQL (several
//! gateway replicas sharing tenants, keys, balances and the ledger). Each implements each
//! trait in the file of its concern (`sqlite/tenants.rs`, `postgres/leases.rs`, …);
//! `sqlite.rs` and `postgres.rs` only open, connect and migrate. Both run the same schema
//! migrations at start and pass the same test suite (`tests/store_suite.rs`).
//!
//! The request path never waits on a store: keys are served from an in-memory snapshot that a
//! background task refreshes from [`TenantStore::active_keys`] when
//! [`TenantStore::keys_version`] moves, and ledger rows are written in batches by a background
//! writer ([`batch`]). The only store call that a request can wait on is
//! [`LeaseStore::grant_lease`], when its replica's lease on the tenant's balance runs short
//! (see `billing`).
//!
//! ## One SQL text for both dialects
//!
//! Where SQLite and PostgreSQL agree, a statement is written once, in [`sql`]: a small dialect
//! layer of our own (PostgreSQL's `$N` placeholders rewritten to SQLite's `?N` once per
//! statement, a handful of fragments where the dialects differ — the parts of an exact sum,
//! bytewise collation, row locks) and a column cursor that reads a row of either driver, so
//! a sum that is two split integer columns on SQLite and one `NUMERIC` on PostgreSQL decodes
//! through one function. Each statement's text is built on first use and kept; the request
//! path (the ledger writer's `record`, lease calls) pays nothing it did not pay before. What
//! stays per backend differs by design: transactions and locking, the money-moving writes
//! (SQLite computes running amounts in Rust on TEXT columns; PostgreSQL in `NUMERIC` under
//! row locks, batched through `UNNEST`), the roll-up upserts, rate windows and clocks, and the
//! migrations (each dialect's DDL, frozen once released).
//!
//! Why not a library:
//! - **`sqlx`** would replace both drivers (rusqlite, tokio-postgres) and the pool, and still
//!   not write the SQL once: its `Any` driver neither rewrites placeholders nor carries
//!   `NUMERIC` beyond i64 or typed parameters (`query_typed`, one round trip), and its
//!   compile-time checking needs a live database or checked-in query data for both dialects.
//!   A rewrite of every store call, for none of the sharing.
//! - **`sea-query`** builds SQL from a Rust AST on every call (allocations and formatting per
//!   query, on the ledger writer and lease paths too unless cached by hand, which is what
//!   [`sql::Sql`] already is), brings its own value and binder crates for each driver, and
//!   expresses none of what differs here — split-integer sums, `NUMERIC` arithmetic,
//!   `UNNEST` batches, `FOR NO KEY UPDATE`, `COLLATE "C"` — without raw fragments, so the
//!   per-dialect text would remain, inside a builder.
//!
//! The column lists of whole rows (the ledger's request rows, the dead-letter table) are
//! [`columns`]'s, with their binding and reading generated per driver.
//!
//! ## Money in the ledger
//!
//! The ledger is one journal of money movements per tenant: a top-up is an entry with a
//! positive delta, a request is an entry with a negative delta (its charge) and its tokens. The
//! balance is the sum of the deltas; the store keeps it materialised on the tenant row and
//! updates it in the same transaction as each entry, so it never drifts from the journal.
//!
//! ## Leases
//!
//! A replica may only admit requests against money it holds a **lease** on. A lease moves part
//! of a tenant's balance to one replica: `Σ leases ≤ balance` always holds in the store, so
//! two replicas can never spend the same sol. Recording a request's charge reduces both the
//! balance and the recording replica's lease. Leases carry a heartbeat; a replica that died
//! holding one loses it after a timeout. A replica that refuses a request for balance that
//! sits in other replicas' leases tells them to return what they hold idle
//! ([`ReplicaChannel::notify_replicas`], PostgreSQL `NOTIFY`; see `billing::accounts`).
//!
//! ## Shared rate windows
//!
//! With several replicas, a key's requests and tokens per window are counted in the store
//! ([`LeaseStore::take_quota`]): each replica takes a slice of a window's quota in one statement,
//! admits against it in memory and gives back what it did not use (see `ratelimit`).
//!
//! ## Usage
//!
//! What tenants read of their own money (usage by day, model or key; their keys' spend; their
//! requests and top-ups) comes from roll-ups that `record` keeps in the same transaction as the
//! ledger rows: see [`usage`].

pub mod batch;
pub mod columns;
pub mod postgres;
mod rows;
pub mod schema;
mod signals;
pub mod sql;
mod sql_money;
pub mod sqlite;
pub mod usage;
pub mod webhooks;

pub use signals::ReplicaSignal;
pub use usage::UsageStore;
pub use webhooks::WebhookStore;

use crate::config::redact_url;
use crate::money::Pen;
use async_trait::async_trait;
pub use quipu_core::billing::pool::{CapPool, Pool};
pub use quipu_core::governance::caps::Cap;
pub use quipu_core::governance::periods::{CapPeriod, Zone};
use std::fmt;
use std::sync::Arc;

pub type TenantId = i64;

/// Milliseconds since the Unix epoch (UTC). Every timestamp in the store is one.
pub type UnixMs = i64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub created_at: UnixMs,
}

/// A tenant with its money, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSummary {
    pub tenant: Tenant,
    pub balance: Pen,
    /// Part of the balance currently leased to running replicas.
    pub leased: Pen,
    pub active_keys: u64,
}

/// Per-key request and token limits (`None` = the configured default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyLimits {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

/// What governs a key beyond its rate limits (the policy is `quipu_core::governance`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRules {
    /// The models it may use, as written (`colibri, claude-*`); `None`: every model.
    pub models: Option<String>,
    /// Its spend cap per period.
    pub cap: Option<Cap>,
    /// It stops working at this time.
    pub expires_at: Option<UnixMs>,
    /// Switched off (it can be switched back on, unlike a revocation).
    pub disabled: bool,
    /// It may manage its tenant's keys (`/v1/keys`).
    pub manage: bool,
    /// Its requests run only on capacity interactive traffic leaves free (see `schedule`).
    pub batch: bool,
}

/// What governs a tenant's money and share of a saturated model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRules {
    /// Its share of a saturated model (1 to 1000).
    pub weight: u32,
    /// Its spend cap per calendar month (in its time zone).
    pub monthly_cap: Option<Pen>,
    /// Bounds its cap periods and its account's days.
    pub zone: Zone,
    /// Its `balance.low` alert fires when the balance falls below this.
    pub low_balance: Option<Pen>,
}

impl Default for TenantRules {
    fn default() -> Self {
        TenantRules {
            weight: 1,
            monthly_cap: None,
            zone: Zone::default(),
            low_balance: None,
        }
    }
}

/// A key to insert. The secret itself never reaches the store: only its SHA-256.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// Public identifier, e.g. `key_8f2c…`; shown in listings and the ledger.
    pub id: String,
    pub tenant: TenantId,
    pub label: String,
    pub secret_hash: [u8; 32],
    /// The first characters of the secret (e.g. `sk-qp-AbC1`), to recognise a key in listings.
    pub secret_prefix: String,
    pub limits: KeyLimits,
    pub rules: KeyRules,
}

/// A key as listed to an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub id: String,
    pub tenant_id: TenantId,
    pub tenant_name: String,
    pub label: String,
    pub secret_prefix: String,
    pub created_at: UnixMs,
    pub revoked_at: Option<UnixMs>,
    pub limits: KeyLimits,
    pub rules: KeyRules,
    /// The key that replaced it (`quipu key rotate`).
    pub rotated_to: Option<String>,
}

/// What an operator or a managing key changes of a key: every field as it is to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySettings {
    pub label: String,
    pub limits: KeyLimits,
    pub rules: KeyRules,
}

/// A usable key, as the gateway's in-memory snapshot holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveKey {
    pub secret_hash: [u8; 32],
    pub key_id: String,
    pub tenant_id: TenantId,
    pub tenant_name: String,
    pub limits: KeyLimits,
    pub rules: KeyRules,
    pub tenant_rules: TenantRules,
}

/// One request's ledger entry. `request_id` is the idempotency key: recording the same id twice
/// changes nothing the second time.
///
/// Its JSON (the dead-letter table's `row_json`, the lines of a ledger spill file; see
/// [`LedgerRow::to_json`]) is these fields under these names, money and token counts as decimal
/// strings. Spill files written by older versions (the same fields, in alphabetical order)
/// read back as they are: keep the names and formats.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerRow {
    pub request_id: String,
    pub at: UnixMs,
    pub tenant_id: TenantId,
    pub key_id: String,
    /// Model slug.
    pub model: String,
    /// `chat` or `messages`.
    pub format: String,
    /// All prompt tokens, cached ones included (upstream semantics, see `usage`).
    #[serde(with = "rows::count_text")]
    pub input_tokens: u64,
    #[serde(with = "rows::count_text")]
    pub cached_tokens: u64,
    #[serde(with = "rows::count_text")]
    pub output_tokens: u64,
    /// The exact charge (≥ 0).
    #[serde(rename = "charge_picos", with = "rows::picos_text")]
    pub charge: Pen,
    /// `ok`, `client_disconnected`, `upstream_error`, `timeout`, …
    pub status: String,
    pub http_status: u16,
    /// What the tokens would have cost beyond the request's reservation, which caps every
    /// charge (see `billing`): not charged, recorded so the operator sees it. Usually zero.
    #[serde(rename = "unbilled_picos", with = "rows::picos_text")]
    pub unbilled: Pen,
    /// `input_tokens` is the gateway's estimate, because the upstream reported none (a cut
    /// stream, or an upstream that sends usage only at the end).
    pub input_estimated: bool,
    /// The cap pools it reserved against (`quipu_core::billing::pool::CapPool` ids): its
    /// charge is recorded against each. Absent from rows older versions wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caps: Vec<String>,
}

/// A request row the store refused as invalid, kept aside (the dead-letter table) so that the
/// rows behind it can still be written. The operator settles these by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRow {
    pub request_id: String,
    pub tenant_id: TenantId,
    /// The row as JSON, every number as written by the gateway (the charge in pico-soles).
    pub row_json: String,
    pub reason: String,
    pub rejected_at: UnixMs,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopUp {
    pub id: String,
    pub tenant_id: TenantId,
    pub amount: Pen,
    pub at: UnixMs,
    pub note: String,
}

/// What [`LedgerStore::top_up_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopUpOutcome {
    pub top_up: TopUp,
    /// The balance right after the top-up, read in the same transaction.
    pub balance: Pen,
    /// The idempotency key had already been used: nothing was added this time and `top_up`
    /// is the original one.
    pub replayed: bool,
}

/// What a replica asks of [`LeaseStore::grant_lease`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// What the request at hand needs beyond the replica's lease.
    pub need: Pen,
    /// What the replica would like to hold (its `lease_chunk`); the grant follows
    /// [`quipu_core::billing::lease::lease_grant`].
    pub want: Pen,
}

impl LeaseAsk {
    /// Exactly `amount` (or what is left, if less).
    pub fn exactly(amount: Pen) -> LeaseAsk {
        LeaseAsk {
            need: amount,
            want: amount,
        }
    }
}

/// One replica's lease row on a tenant as one transaction saw it: `amount` leased and not yet
/// charged, `spent` (the charges recorded against it, ever) and the row's `version`.
pub use quipu_core::billing::book::Reading as LeaseReading;

/// What [`LeaseStore::grant_lease`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The replica's lease row after the grant.
    pub reading: LeaseReading,
    /// Added to the lease now (possibly zero).
    pub granted: Pen,
    /// What other replicas hold on the tenant: money a refused request could get if they
    /// returned what they hold idle.
    pub elsewhere: Pen,
}

impl From<LeaseGrant> for quipu_core::billing::book::GrantReply {
    fn from(g: LeaseGrant) -> Self {
        quipu_core::billing::book::GrantReply {
            reading: g.reading,
            granted: g.granted,
            elsewhere: g.elsewhere,
        }
    }
}

/// What [`LedgerStore::record`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Rows that were new (the others were in the ledger already).
    pub new: u64,
    /// The recording replica's lease rows that the new rows charged, after the charge.
    pub leases: Vec<(TenantId, LeaseReading)>,
    /// The same for the cap pools the new rows were reserved against (their `caps`).
    pub cap_leases: Vec<(CapPool, LeaseReading)>,
}

/// What a cap pool holds at most, as the replica asking for a lease on it knows the cap now:
/// written to the pool's row on every grant, so an operator's change of the cap applies to
/// the rest of the period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapTerms {
    pub limit: Pen,
    /// When the period ends (`None`: a `total` cap).
    pub period_end: Option<UnixMs>,
}

/// One change to a shared rate window (see `ratelimit`). `add` is applied first, whatever the
/// limit (a replica's usage beyond what it took, or, negative, what it gives back; the count
/// never goes below zero); then up to `want` more is taken, never past `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaAsk {
    /// Whose window: `key:<key id>:requests`, `tenant:<id>:tokens`, …
    pub subject: String,
    pub window_ms: i64,
    /// Start of the window, milliseconds since the epoch (a multiple of `window_ms`).
    pub window_start: UnixMs,
    pub add: i64,
    pub want: u64,
    pub limit: u64,
}

/// What [`LeaseStore::take_quota`] did for one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaGrant {
    /// Taken for the asking replica now (at most `want`).
    pub granted: u64,
    /// Everything taken in the window, by every replica, after this ask.
    pub taken: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    pub balance: Pen,
    pub leased: Pen,
}

/// Tokens and soles of one model over a statement's period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTotals {
    pub model: String,
    pub requests: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub charge: Pen,
}

/// A tenant's statement for `[from, to)` (open ends when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub tenant: Tenant,
    pub from: Option<UnixMs>,
    pub to: Option<UnixMs>,
    pub per_model: Vec<ModelTotals>,
    pub top_ups: Vec<TopUp>,
    pub total_charges: Pen,
    pub total_top_ups: Pen,
    /// The balance now (not at `to`).
    pub balance: Pen,
}

/// A stored response of the Responses API (`store: true`): owned by its tenant, written after
/// the response is complete (see `stored_responses`), read back by `previous_response_id` and
/// `GET /v1/responses/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// `resp_…`.
    pub id: String,
    pub tenant_id: TenantId,
    /// The key that created it (by public id).
    pub key_id: String,
    /// Model slug.
    pub model: String,
    pub created_at: UnixMs,
    /// The response object, JSON.
    pub response: String,
    /// The conversation it answered: a JSON array of input items (earlier turns included).
    pub input_items: String,
}

impl StoredResponse {
    /// Bytes it keeps in the store: what the per-tenant cap counts.
    pub fn size(&self) -> u64 {
        (self.response.len() + self.input_items.len()) as u64
    }
}

/// Store failures. Messages are for operators (they may name tables, never secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// A tenant or key name/id that must be unique already exists.
    Conflict(String),
    /// The tenant or key does not exist.
    NotFound(String),
    /// The database could not be reached or failed (transient: worth retrying).
    Backend(String),
    /// The input can never be written as it is (a negative charge, a count that does not fit
    /// its column): retrying cannot help.
    Invalid(String),
}

impl StoreError {
    /// Whether retrying the same call can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Backend(_))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Conflict(m) | StoreError::NotFound(m) | StoreError::Invalid(m) => {
                f.write_str(m)
            }
            StoreError::Backend(m) => write!(f, "store error: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

pub type StoreResult<T> = Result<T, StoreError>;

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One file, one process writing at a time (the embedded default).
    Sqlite,
    /// A server shared by several gateway replicas.
    Postgres,
}

impl Backend {
    /// `sqlite` or `postgres` (the `build_info` metric's label).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole store: every concern's trait, each backend implementing each one in the file of
/// its concern (`sqlite/tenants.rs`, `postgres/leases.rs`, …). `Arc<dyn Store>` is what the
/// gateway passes around; a caller that needs one concern takes that trait (generic over
/// `S: LedgerStore + ?Sized`, which `dyn Store` satisfies).
pub trait Store:
    TenantStore + LedgerStore + LeaseStore + ResponseStore + ReplicaChannel + UsageStore + WebhookStore
{
    fn kind(&self) -> Backend;
}

/// Tenants and their API keys, and what the gateway's key table polls and loads.
#[async_trait]
pub trait TenantStore: Send + Sync {
    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant>;
    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>>;
    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>>;
    /// What governs the tenant (`NotFound` for an unknown one).
    async fn tenant_rules(&self, tenant: TenantId) -> StoreResult<TenantRules>;
    /// Sets what governs the tenant. Bumps the keys version (the key snapshot carries it).
    async fn set_tenant_rules(&self, tenant: TenantId, rules: &TenantRules) -> StoreResult<()>;

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo>;
    /// Revokes a key; `Ok(false)` if it was already revoked. Bumps the keys version.
    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool>;
    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>>;
    /// One key, revoked or not.
    async fn key(&self, key_id: &str) -> StoreResult<Option<KeyInfo>>;
    /// Sets a key's label, limits and rules (`NotFound` for an unknown or revoked key). Bumps
    /// the keys version.
    async fn set_key(&self, key_id: &str, settings: &KeySettings) -> StoreResult<KeyInfo>;
    /// Inserts `new` (the same settings as `old_id`, a new secret) and has `old_id` expire at
    /// `old_expires_at` (or earlier, if it expired sooner), in one transaction. Bumps the keys
    /// version.
    async fn rotate_key(
        &self,
        old_id: &str,
        new: NewKey,
        old_expires_at: UnixMs,
    ) -> StoreResult<KeyInfo>;
    /// A number that changes whenever a key or tenant is created or revoked (by any replica).
    async fn keys_version(&self) -> StoreResult<i64>;
    /// Every unrevoked key, with the keys version it corresponds to.
    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)>;
}

/// The money journal: top-ups, balances, request rows (and the ones refused), statements.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Adds money to a tenant's balance (a positive ledger entry). Policy (minimum amount)
    /// belongs to the caller.
    async fn top_up(&self, tenant: TenantId, amount: Pen, note: &str) -> StoreResult<TopUp> {
        Ok(self.top_up_once(tenant, amount, note, None).await?.top_up)
    }
    /// [`LedgerStore::top_up`], returning the balance after it (same transaction). With an
    /// `idempotency_key`, a second call with the same key adds nothing and returns the first
    /// top-up (`replayed`); the same key with another tenant or amount is a `Conflict`.
    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        idempotency_key: Option<&str>,
    ) -> StoreResult<TopUpOutcome>;
    async fn balance(&self, tenant: TenantId) -> StoreResult<Balance>;

    /// Records request rows atomically and idempotently: a row whose `request_id` is already in
    /// the ledger is skipped. For each new row the tenant's balance drops by the charge, and
    /// `replica`'s lease row on the tenant, if it has one, moves the charge from `amount` (not
    /// below zero) to `spent`. Returns how many rows were new and the lease rows it changed. A
    /// row that can never be written fails the whole call with `Invalid` (or `NotFound` for an
    /// unknown tenant), nothing written.
    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> StoreResult<Recorded>;
    /// Puts a row that `record` refused into the dead-letter table (idempotent by request id).
    async fn reject(&self, row: &LedgerRow, reason: &str) -> StoreResult<()>;
    /// The dead-letter table, oldest first.
    async fn rejected_rows(&self) -> StoreResult<Vec<RejectedRow>>;

    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<UnixMs>,
        to: Option<UnixMs>,
    ) -> StoreResult<Statement>;

    /// The request rows of a tenant (all tenants if `None`), oldest first; for audits and tests.
    async fn ledger_rows(&self, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>>;
}

/// What replicas hold of the store's shared state: leases on balances, and slices of the shared
/// rate windows.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Leases up to `want` of the tenant's unleased balance to `replica` and returns what was
    /// granted (possibly zero). Refreshes the replica's heartbeat.
    async fn acquire_lease(&self, replica: &str, tenant: TenantId, want: Pen) -> StoreResult<Pen> {
        Ok(self
            .grant_lease(replica, tenant, LeaseAsk::exactly(want))
            .await?
            .granted)
    }
    /// Leases part of the tenant's unleased balance to `replica`, as much as
    /// [`lease_grant`](quipu_core::billing::lease::lease_grant) says for `ask` (creating the
    /// replica's row, at zero if nothing is granted), and returns the row after the grant and
    /// what the other replicas hold. Refreshes the replica's heartbeat.
    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant>;
    /// Gives back up to `amount` of `replica`'s lease on the tenant; the row after it (`None`:
    /// the replica has none).
    async fn release_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>>;
    /// Marks every lease row of `replica` as alive now and returns them as they stand, so the
    /// replica can line its books up with them.
    async fn heartbeat(&self, replica: &str) -> StoreResult<Vec<(TenantId, LeaseReading)>>;
    /// [`LeaseStore::grant_lease`] on a cap pool: leases part of what is left of it (`limit −
    /// spent − Σ leases`), creating the pool's row on first use and writing `terms`' limit to
    /// it.
    async fn grant_cap_lease(
        &self,
        replica: &str,
        pool: &CapPool,
        terms: CapTerms,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant>;
    /// [`LeaseStore::release_lease`] on a cap pool.
    async fn release_cap_lease(
        &self,
        replica: &str,
        pool: &CapPool,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>>;
    /// [`LeaseStore::heartbeat`] for `replica`'s leases on cap pools.
    async fn cap_heartbeat(&self, replica: &str) -> StoreResult<Vec<(CapPool, LeaseReading)>>;
    /// What each of a tenant's cap pools has spent: `(pool id, limit, spent)`, for the account
    /// views (pools with ids in `pools` only).
    async fn cap_spent(&self, pools: &[String]) -> StoreResult<Vec<(String, Pen, Pen)>>;
    /// Zeroes the leases whose heartbeat is older than `now - max_age_ms` (their replica is
    /// presumed dead: the money goes back to its tenant) and returns how many. The rows stay,
    /// with what they recorded, so a replica that was only cut off lines up again.
    async fn reclaim_stale_leases(&self, max_age_ms: i64) -> StoreResult<u64>;
    /// Deletes the lease rows whose heartbeat is older than `now - max_age_ms` (replicas long
    /// gone; zeroed by [`LeaseStore::reclaim_stale_leases`] long before); returns how many.
    async fn forget_silent_leases(&self, max_age_ms: i64) -> StoreResult<u64>;
    /// Deletes every lease of `replica` (at start and at clean shutdown).
    async fn drop_leases(&self, replica: &str) -> StoreResult<()>;

    /// Applies every ask to its shared rate window (created at zero if new), each atomically
    /// against concurrent asks of other replicas; returns one grant per ask, in order, and the
    /// store's clock (milliseconds since the epoch), by which replicas align their windows. At
    /// most one ask per (subject, window) in a call (`Invalid` otherwise).
    async fn take_quota(&self, asks: &[QuotaAsk]) -> StoreResult<(Vec<QuotaGrant>, UnixMs)>;
    /// Deletes rate windows that ended more than `age_ms` ago by the store's clock; returns
    /// how many.
    async fn expire_quota(&self, age_ms: i64) -> StoreResult<u64>;
}

/// The stored responses of the Responses API.
#[async_trait]
pub trait ResponseStore: Send + Sync {
    /// Stores responses, in one transaction; an id already stored is left as it is. Returns
    /// how many were new. Shared rows: the caller keeps serving them from memory meanwhile,
    /// and a backend that moves them to another thread copies pointers, not responses.
    async fn put_responses(&self, rows: &[Arc<StoredResponse>]) -> StoreResult<u64>;
    /// The stored response `id` of `tenant`: `None` when there is none, or it is another
    /// tenant's (the caller cannot tell the two apart, by design).
    async fn get_response(&self, tenant: TenantId, id: &str)
        -> StoreResult<Option<StoredResponse>>;
    /// Deletes the stored response `id` of `tenant`; whether there was one.
    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool>;
    /// Deletes the responses created before `before`, then each tenant's oldest beyond
    /// `max_bytes_per_tenant` (by [`StoredResponse::size`]); returns how many were deleted.
    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64>;
}

/// Signals between the replicas sharing a store. The defaults are a store with no channel
/// between processes (SQLite: one replica).
#[async_trait]
pub trait ReplicaChannel: Send + Sync {
    /// Sends `signal` to every replica listening on this store (PostgreSQL `NOTIFY`) and
    /// returns `true`; a store with no channel between processes sends nothing and returns
    /// `false`.
    async fn notify_replicas(&self, _signal: &ReplicaSignal) -> StoreResult<bool> {
        Ok(false)
    }
    /// Starts receiving the signals replicas send (a connection of its own, re-established
    /// after a failure; signals sent while it was down are lost, and idle leases still come
    /// home after a few seconds). `None` for a store with no such channel.
    async fn listen_replicas(
        &self,
    ) -> StoreResult<Option<tokio::sync::mpsc::Receiver<ReplicaSignal>>> {
        Ok(None)
    }
}

/// Checks that a request row can be written by every backend (the charge and the counts fit
/// their columns): a row failing this is refused by [`LedgerStore::record`] with `Invalid`.
pub fn validate_row(row: &LedgerRow) -> StoreResult<()> {
    rows::check_row(row).map(|_| ())
}

/// Checks that `asks` name each (subject, window) once (see [`LeaseStore::take_quota`]).
pub fn check_quota_asks(asks: &[QuotaAsk]) -> StoreResult<()> {
    let mut seen = std::collections::HashSet::with_capacity(asks.len());
    for a in asks {
        if a.window_ms <= 0 {
            return Err(StoreError::Invalid(format!(
                "rate window of {} must be longer than 0 ms",
                a.subject
            )));
        }
        if !seen.insert((a.subject.as_str(), a.window_ms, a.window_start)) {
            return Err(StoreError::Invalid(format!(
                "rate window {} at {} asked for twice in one call",
                a.subject, a.window_start
            )));
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> UnixMs {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Opens the store that `url` names and migrates it: `sqlite://PATH` (a file, created with its
/// directory if missing; `sqlite://:memory:` for a private in-memory database) or
/// `postgres://…` / `postgresql://…` (a server shared by replicas).
pub async fn open(url: &str) -> StoreResult<Arc<dyn Store>> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::Backend(
                "store.url \"sqlite://\" names no file; write sqlite://data/quipu.db".into(),
            ));
        }
        Ok(Arc::new(sqlite::SqliteStore::open(path).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(postgres::PgStore::connect(url).await?))
    } else {
        Err(StoreError::Backend(format!(
            "store.url \"{}\" is not supported; use sqlite://PATH or postgres://USER:PASSWORD@HOST/DB",
            redact_url(url)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_asks_name_each_window_once() {
        let ask = |subject: &str, start| QuotaAsk {
            subject: subject.into(),
            window_ms: 60_000,
            window_start: start,
            add: 0,
            want: 1,
            limit: 10,
        };
        assert!(check_quota_asks(&[ask("a", 0), ask("a", 60_000), ask("b", 0)]).is_ok());
        assert!(matches!(
            check_quota_asks(&[ask("a", 0), ask("a", 0)]),
            Err(StoreError::Invalid(_))
        ));
    }
}
