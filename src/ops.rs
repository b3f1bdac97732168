//! Operator operations, shared by the CLI (`quipu tenant …`, `quipu key …`, `quipu topup`,
//! `quipu statement`, `quipu ledger import`) and the admin HTTP API, so both apply the same rules and say the same
//! things.
//!
//! Each operation validates its input, calls the [`Store`] and returns a result that is both
//! [`Serialize`] (the admin API's JSON, and `--json` in the CLI) and [`Render`] (the text a
//! person reads). Money in JSON is always an exact decimal string of soles (`"12.50"`,
//! `"0.00000105"`), never a number; text shows `S/ 1,234.56` and, where rounding to céntimos
//! would hide something, the exact decimal beside it. Times are RFC 3339 in UTC in JSON.
//!
//! Failures are [`OpsError`]s whose messages tell the operator what to do; this module owns
//! no I/O besides the store and the ledger spill files that `quipu ledger import` reads and
//! renames, and no policy that the config does not pass in (the minimum top-up).

use crate::billing::spill;
use crate::keys;
use crate::money::{self, Pen};
use crate::store::{KeyInfo, KeyLimits, NewKey, Store, StoreError, TenantId, UnixMs};
use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The largest single top-up: S/ 1,000,000.00. Keeps every ledger entry far inside i64
/// pico-soles and catches a mistyped amount.
pub const MAX_TOP_UP: Pen = Pen::from_centimos(100_000_000);
/// Longest tenant name (names are also metric labels and CLI arguments).
pub const MAX_TENANT_NAME: usize = 64;
/// Longest key label.
pub const MAX_LABEL: usize = 200;

/// Why an operation was refused or failed. The message is for the operator and says what to
/// do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpsError {
    /// The input is not acceptable (bad name, amount, date).
    Invalid(String),
    /// The tenant or key does not exist.
    NotFound(String),
    /// The name or id is taken.
    Conflict(String),
    /// The store failed or could not be reached.
    Store(String),
}

impl OpsError {
    /// The status the admin API answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            OpsError::Invalid(_) => 400,
            OpsError::NotFound(_) => 404,
            OpsError::Conflict(_) => 409,
            OpsError::Store(_) => 503,
        }
    }

    /// The message alone.
    pub fn message(&self) -> &str {
        match self {
            OpsError::Invalid(m)
            | OpsError::NotFound(m)
            | OpsError::Conflict(m)
            | OpsError::Store(m) => m,
        }
    }
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for OpsError {}

impl From<StoreError> for OpsError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(m) => OpsError::Conflict(m),
            StoreError::NotFound(m) => OpsError::NotFound(m),
            StoreError::Invalid(m) => OpsError::Invalid(m),
            StoreError::Backend(m) => OpsError::Store(format!(
                "store error: {m}; check that the database in store.url is reachable and retry"
            )),
        }
    }
}

pub type OpsResult<T> = Result<T, OpsError>;

/// A result's human rendering (its JSON rendering is its `Serialize`).
pub trait Render: Serialize {
    /// Text for a terminal, ending with a newline.
    fn text(&self) -> String;
}

/// A rendered result, as the CLI prints it (text, or JSON with `--json`) and the admin API
/// answers it (JSON).
#[derive(Debug, Clone)]
pub struct Output {
    pub text: String,
    pub json: serde_json::Value,
}

impl Output {
    pub fn of<T: Render>(result: &T) -> Output {
        Output {
            text: result.text(),
            json: serde_json::to_value(result).unwrap_or(serde_json::Value::Null),
        }
    }

    /// The JSON rendering as the text to print.
    pub fn into_json(self) -> Output {
        let text = serde_json::to_string_pretty(&self.json).unwrap_or_default();
        Output { text, ..self }
    }
}

// ---------------------------------------------------------------------------------------------
// Tenants

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantCreated {
    pub id: TenantId,
    pub name: String,
    pub created_at: String,
}

impl Render for TenantCreated {
    fn text(&self) -> String {
        format!(
            "Created tenant {} (id {}). Next: quipu key create --tenant {} and quipu topup --tenant {} --amount …\n",
            self.name, self.id, self.name, self.name
        )
    }
}

/// Checks a tenant name: 1–64 characters of `a-z`, `0-9`, `-`, `_`, `.`, starting with a
/// letter or digit.
pub fn validate_tenant_name(name: &str) -> OpsResult<()> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c);
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > MAX_TENANT_NAME || !first_ok || !name.chars().all(ok_char) {
        return Err(OpsError::Invalid(format!(
            "\"{name}\" is not a valid tenant name: use 1 to {MAX_TENANT_NAME} lowercase letters, \
             digits, '-', '_' or '.', starting with a letter or digit (e.g. acme-peru)"
        )));
    }
    Ok(())
}

pub async fn create_tenant(store: &dyn Store, name: &str) -> OpsResult<TenantCreated> {
    validate_tenant_name(name)?;
    let t = store.create_tenant(name).await.map_err(|e| match e {
        StoreError::Conflict(_) => OpsError::Conflict(format!(
            "a tenant named \"{name}\" already exists; pick another name or use the existing one"
        )),
        other => other.into(),
    })?;
    Ok(TenantCreated {
        id: t.id,
        name: t.name,
        created_at: rfc3339(t.created_at),
    })
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantLine {
    pub id: TenantId,
    pub name: String,
    pub created_at: String,
    /// Exact soles.
    pub balance: String,
    /// Part of the balance leased to running replicas (exact soles).
    pub leased: String,
    pub active_keys: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantList {
    pub tenants: Vec<TenantLine>,
}

impl Render for TenantList {
    fn text(&self) -> String {
        if self.tenants.is_empty() {
            return "No tenants yet. Create one with: quipu tenant create NAME\n".into();
        }
        let mut t = Table::new(&[
            ("NAME", false),
            ("ID", true),
            ("BALANCE", true),
            ("LEASED", true),
            ("KEYS", true),
            ("CREATED", false),
        ]);
        for l in &self.tenants {
            t.row(vec![
                l.name.clone(),
                l.id.to_string(),
                soles_text(&l.balance),
                soles_text(&l.leased),
                l.active_keys.to_string(),
                human_time_text(&l.created_at),
            ]);
        }
        t.render()
    }
}

pub async fn list_tenants(store: &dyn Store) -> OpsResult<TenantList> {
    let tenants = store
        .list_tenants()
        .await?
        .into_iter()
        .map(|s| TenantLine {
            id: s.tenant.id,
            name: s.tenant.name,
            created_at: rfc3339(s.tenant.created_at),
            balance: s.balance.to_decimal(),
            leased: s.leased.to_decimal(),
            active_keys: s.active_keys,
        })
        .collect();
    Ok(TenantList { tenants })
}

async fn tenant_id(store: &dyn Store, name: &str) -> OpsResult<TenantId> {
    match store.tenant_by_name(name).await? {
        Some(t) => Ok(t.id),
        None => Err(OpsError::NotFound(format!(
            "no tenant named \"{name}\"; see the names with quipu tenant list, or create it with quipu tenant create {name}"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Keys

/// Limits as JSON shows them: `null` = the configured default.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct LimitsView {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

impl From<KeyLimits> for LimitsView {
    fn from(l: KeyLimits) -> Self {
        LimitsView {
            requests_per_minute: l.requests_per_minute,
            tokens_per_minute: l.tokens_per_minute,
        }
    }
}

fn limit_text(l: Option<u64>) -> String {
    l.map_or_else(|| "default".to_owned(), group_digits)
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyCreated {
    pub key_id: String,
    pub tenant: String,
    pub label: String,
    /// The secret. Shown once: only its SHA-256 is stored.
    pub secret: String,
    pub secret_prefix: String,
    pub created_at: String,
    pub limits: LimitsView,
}

impl Render for KeyCreated {
    fn text(&self) -> String {
        format!(
            "Created key {} for tenant {}{}.\n\n    {}\n\n\
             This is the only time the secret is shown: store it now. Quipu keeps only its hash;\n\
             a lost secret cannot be recovered (revoke the key and create another).\n",
            self.key_id,
            self.tenant,
            if self.label.is_empty() {
                String::new()
            } else {
                format!(" (label \"{}\")", self.label)
            },
            self.secret
        )
    }
}

pub async fn create_key(
    store: &dyn Store,
    tenant_name: &str,
    label: &str,
    limits: KeyLimits,
) -> OpsResult<KeyCreated> {
    if label.chars().count() > MAX_LABEL || label.chars().any(char::is_control) {
        return Err(OpsError::Invalid(format!(
            "the label must be at most {MAX_LABEL} characters with no control characters"
        )));
    }
    let tenant = tenant_id(store, tenant_name).await?;
    // A key id is 48 random bits; a clash is astronomically rare but costs only a redraw.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (secret, id, secret_hash, secret_prefix) = keys::generate_key();
        let key = NewKey {
            id,
            tenant,
            label: label.to_owned(),
            secret_hash,
            secret_prefix,
            limits,
        };
        match store.create_key(key).await {
            Ok(info) => {
                return Ok(KeyCreated {
                    key_id: info.id,
                    tenant: info.tenant_name,
                    label: info.label,
                    secret,
                    secret_prefix: info.secret_prefix,
                    created_at: rfc3339(info.created_at),
                    limits: info.limits.into(),
                })
            }
            Err(StoreError::Conflict(_)) if attempts < 3 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyRevoked {
    pub key_id: String,
    /// `false` if the key had already been revoked (nothing changed).
    pub revoked_now: bool,
}

impl Render for KeyRevoked {
    fn text(&self) -> String {
        if self.revoked_now {
            format!(
                "Revoked key {}. Gateways refuse it within seconds.\n",
                self.key_id
            )
        } else {
            format!(
                "Key {} was already revoked; nothing changed.\n",
                self.key_id
            )
        }
    }
}

pub async fn revoke_key(store: &dyn Store, key_id: &str) -> OpsResult<KeyRevoked> {
    let revoked_now = store.revoke_key(key_id).await.map_err(|e| match e {
        StoreError::NotFound(_) => OpsError::NotFound(format!(
            "no key with id \"{key_id}\"; key ids look like key_0123456789ab, see quipu key list"
        )),
        other => other.into(),
    })?;
    Ok(KeyRevoked {
        key_id: key_id.to_owned(),
        revoked_now,
    })
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyLine {
    pub key_id: String,
    pub tenant: String,
    pub label: String,
    pub secret_prefix: String,
    pub created_at: String,
    /// `null` while the key is active.
    pub revoked_at: Option<String>,
    pub limits: LimitsView,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyList {
    pub keys: Vec<KeyLine>,
}

impl Render for KeyList {
    fn text(&self) -> String {
        if self.keys.is_empty() {
            return "No keys. Create one with: quipu key create --tenant NAME\n".into();
        }
        let mut t = Table::new(&[
            ("ID", false),
            ("TENANT", false),
            ("LABEL", false),
            ("PREFIX", false),
            ("CREATED", false),
            ("STATUS", false),
            ("RPM", true),
            ("TPM", true),
        ]);
        for k in &self.keys {
            t.row(vec![
                k.key_id.clone(),
                k.tenant.clone(),
                k.label.clone(),
                format!("{}…", k.secret_prefix),
                human_time_text(&k.created_at),
                match &k.revoked_at {
                    None => "active".into(),
                    Some(at) => format!("revoked {}", human_time_text(at)),
                },
                limit_text(k.limits.requests_per_minute),
                limit_text(k.limits.tokens_per_minute),
            ]);
        }
        t.render()
    }
}

fn key_line(k: KeyInfo) -> KeyLine {
    KeyLine {
        key_id: k.id,
        tenant: k.tenant_name,
        label: k.label,
        secret_prefix: k.secret_prefix,
        created_at: rfc3339(k.created_at),
        revoked_at: k.revoked_at.map(rfc3339),
        limits: k.limits.into(),
    }
}

pub async fn list_keys(store: &dyn Store, tenant_name: Option<&str>) -> OpsResult<KeyList> {
    let tenant = match tenant_name {
        Some(name) => Some(tenant_id(store, name).await?),
        None => None,
    };
    let keys = store
        .list_keys(tenant)
        .await?
        .into_iter()
        .map(key_line)
        .collect();
    Ok(KeyList { keys })
}

// ---------------------------------------------------------------------------------------------
// Money

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopUpDone {
    pub top_up_id: String,
    pub tenant: String,
    /// Exact soles.
    pub amount: String,
    pub at: String,
    /// The balance right after (exact soles).
    pub balance: String,
    /// The idempotency key had been used before: nothing was added now, and this is the
    /// original top-up (with the balance as it is now).
    pub replayed: bool,
}

impl Render for TopUpDone {
    fn text(&self) -> String {
        if self.replayed {
            return format!(
                "Top-up {} of {} to {} was already made (same idempotency key); nothing added. Balance now {}.\n",
                self.top_up_id,
                soles_text(&self.amount),
                self.tenant,
                soles_text(&self.balance)
            );
        }
        format!(
            "Added {} to {} (top-up {}). Balance now {}.\n",
            soles_text(&self.amount),
            self.tenant,
            self.top_up_id,
            soles_text(&self.balance)
        )
    }
}

/// Parses and checks a top-up amount typed by an operator: at most two decimals, at least
/// `min_top_up`, at most [`MAX_TOP_UP`].
pub fn parse_top_up(amount_text: &str, min_top_up: Pen) -> OpsResult<Pen> {
    let amount = Pen::parse(amount_text, money::AMOUNT_DECIMALS).map_err(|e| {
        OpsError::Invalid(format!(
            "{e}; a top-up is an amount in soles with at most {} decimals, like 50.00",
            money::AMOUNT_DECIMALS
        ))
    })?;
    if amount <= Pen::ZERO {
        return Err(OpsError::Invalid(format!(
            "a top-up must be more than S/ 0.00; the minimum top-up is {}",
            min_top_up.format_soles()
        )));
    }
    if amount < min_top_up {
        return Err(OpsError::Invalid(format!(
            "{} is below the minimum top-up of {}; top up at least that much",
            amount.format_soles(),
            min_top_up.format_soles()
        )));
    }
    if amount > MAX_TOP_UP {
        return Err(OpsError::Invalid(format!(
            "{} is more than a single top-up may be ({}); split it into several top-ups",
            amount.format_soles(),
            MAX_TOP_UP.format_soles()
        )));
    }
    Ok(amount)
}

/// Tops a tenant up. With an `idempotency_key`, retrying the same top-up (a lost reply, a
/// re-sent POST) adds nothing the second time.
pub async fn top_up(
    store: &dyn Store,
    tenant_name: &str,
    amount_text: &str,
    note: &str,
    min_top_up: Pen,
    idempotency_key: Option<&str>,
) -> OpsResult<TopUpDone> {
    let amount = parse_top_up(amount_text, min_top_up)?;
    let tenant = tenant_id(store, tenant_name).await?;
    let key = idempotency_key.map(str::trim).filter(|k| !k.is_empty());
    let done = store.top_up_once(tenant, amount, note, key).await?;
    Ok(TopUpDone {
        top_up_id: done.top_up.id,
        tenant: tenant_name.to_owned(),
        amount: done.top_up.amount.to_decimal(),
        at: rfc3339(done.top_up.at),
        balance: done.balance.to_decimal(),
        replayed: done.replayed,
    })
}

// ---------------------------------------------------------------------------------------------
// Statements

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ModelLine {
    pub model: String,
    pub requests: u64,
    /// All prompt tokens, cached ones included.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Exact soles.
    pub charge: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopUpLine {
    pub id: String,
    pub at: String,
    /// Exact soles.
    pub amount: String,
    pub note: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Exact soles.
    pub charges: String,
    /// Exact soles.
    pub top_ups: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StatementReport {
    pub tenant: String,
    pub tenant_id: TenantId,
    /// Start of the period (inclusive), RFC 3339; `null` = since the beginning.
    pub from: Option<String>,
    /// End of the period (exclusive), RFC 3339; `null` = up to now.
    pub to: Option<String>,
    pub models: Vec<ModelLine>,
    pub top_ups: Vec<TopUpLine>,
    pub totals: Totals,
    /// The balance now (not at `to`), exact soles.
    pub balance: String,
}

impl Render for StatementReport {
    fn text(&self) -> String {
        let mut out = format!(
            "Statement for {} (tenant {})\nPeriod: {} to {} (end exclusive)\n\n",
            self.tenant,
            self.tenant_id,
            self.from
                .as_deref()
                .map_or_else(|| "the beginning".into(), human_time_text),
            self.to
                .as_deref()
                .map_or_else(|| "now".into(), human_time_text),
        );
        if self.models.is_empty() {
            out.push_str("No requests in this period.\n");
        } else {
            let mut t = Table::new(&[
                ("MODEL", false),
                ("REQUESTS", true),
                ("INPUT TOKENS", true),
                ("CACHED", true),
                ("OUTPUT TOKENS", true),
                ("CHARGE", true),
                ("EXACT (S/)", true),
            ]);
            let tt = &self.totals;
            let mut exact: Vec<String> = self.models.iter().map(|m| m.charge.clone()).collect();
            exact.push(tt.charges.clone());
            let exact = align_decimals(&exact);
            for (m, exact) in self.models.iter().zip(&exact) {
                t.row(vec![
                    m.model.clone(),
                    group_digits(m.requests),
                    group_digits(m.input_tokens),
                    group_digits(m.cached_tokens),
                    group_digits(m.output_tokens),
                    soles_text(&m.charge),
                    exact.clone(),
                ]);
            }
            t.row(vec![
                "TOTAL".into(),
                group_digits(tt.requests),
                group_digits(tt.input_tokens),
                group_digits(tt.cached_tokens),
                group_digits(tt.output_tokens),
                soles_text(&tt.charges),
                exact.last().cloned().unwrap_or_default(),
            ]);
            out.push_str(&t.render());
        }
        out.push('\n');
        if self.top_ups.is_empty() {
            out.push_str("No top-ups in this period.\n");
        } else {
            let mut t = Table::new(&[
                ("TOP-UP", false),
                ("DATE", false),
                ("AMOUNT", true),
                ("NOTE", false),
            ]);
            for u in &self.top_ups {
                t.row(vec![
                    u.id.clone(),
                    human_time_text(&u.at),
                    soles_text(&u.amount),
                    u.note.clone(),
                ]);
            }
            out.push_str(&t.render());
        }
        out.push('\n');
        let mut t = Table::new(&[("", false), ("", true), ("", false)]);
        t.row(vec![
            "Charges:".into(),
            soles_text(&self.totals.charges),
            format!("(exact {})", self.totals.charges),
        ]);
        t.row(vec![
            "Top-ups:".into(),
            soles_text(&self.totals.top_ups),
            format!("(exact {})", self.totals.top_ups),
        ]);
        t.row(vec![
            "Balance now:".into(),
            soles_text(&self.balance),
            format!("(exact {})", self.balance),
        ]);
        out.push_str(&t.render_body());
        out
    }
}

/// Parses a statement bound: `YYYY-MM-DD` (a day in UTC) or an RFC 3339 time (exact, any
/// offset). As `from` a day means its first instant; as `to` it means the **end** of that day,
/// so `--from 2026-11-01 --to 2026-11-30` covers all of November.
pub fn parse_bound(text: &str, is_end: bool) -> OpsResult<UnixMs> {
    let t = text.trim();
    if let Ok(day) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        let day = if is_end { day.succ_opt() } else { Some(day) };
        if let Some(start) = day.and_then(|d| d.and_hms_opt(0, 0, 0)) {
            return Ok(start.and_utc().timestamp_millis());
        }
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(t) {
        return Ok(at.timestamp_millis());
    }
    Err(OpsError::Invalid(format!(
        "\"{text}\" is not a date; write YYYY-MM-DD (a day in UTC) or an RFC 3339 time such as 2026-11-01T00:00:00-05:00"
    )))
}

/// A tenant's statement over `[from, to)`; see [`parse_bound`] for the accepted dates.
pub async fn statement(
    store: &dyn Store,
    tenant_name: &str,
    from: Option<&str>,
    to: Option<&str>,
) -> OpsResult<StatementReport> {
    let from_ms = from.map(|f| parse_bound(f, false)).transpose()?;
    let to_ms = to.map(|t| parse_bound(t, true)).transpose()?;
    if let (Some(f), Some(t)) = (from_ms, to_ms) {
        if f >= t {
            return Err(OpsError::Invalid(format!(
                "the period is empty: it starts at {} and ends at {}; the start must come first",
                rfc3339(f),
                rfc3339(t)
            )));
        }
    }
    let tenant = tenant_id(store, tenant_name).await?;
    let s = store.statement(tenant, from_ms, to_ms).await?;
    let totals = Totals {
        requests: s.per_model.iter().map(|m| m.requests).sum(),
        input_tokens: s.per_model.iter().map(|m| m.input_tokens).sum(),
        cached_tokens: s.per_model.iter().map(|m| m.cached_tokens).sum(),
        output_tokens: s.per_model.iter().map(|m| m.output_tokens).sum(),
        charges: s.total_charges.to_decimal(),
        top_ups: s.total_top_ups.to_decimal(),
    };
    Ok(StatementReport {
        tenant: s.tenant.name,
        tenant_id: s.tenant.id,
        from: s.from.map(rfc3339),
        to: s.to.map(rfc3339),
        models: s
            .per_model
            .into_iter()
            .map(|m| ModelLine {
                model: m.model,
                requests: m.requests,
                input_tokens: m.input_tokens,
                cached_tokens: m.cached_tokens,
                output_tokens: m.output_tokens,
                charge: m.charge.to_decimal(),
            })
            .collect(),
        top_ups: s
            .top_ups
            .into_iter()
            .map(|u| TopUpLine {
                id: u.id,
                at: rfc3339(u.at),
                amount: u.amount.to_decimal(),
                note: u.note,
            })
            .collect(),
        totals,
        balance: s.balance.to_decimal(),
    })
}

// ---------------------------------------------------------------------------------------------
// Ledger spill files

/// A spilled row the store refused for good (see `billing::ledger`): now in the dead-letter
/// table `ledger_rejects`, its charge not applied, for the operator to settle by hand.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImportRejected {
    pub request_id: String,
    pub tenant_id: TenantId,
    /// Exact soles.
    pub charge: String,
    pub reason: String,
}

/// What the new rows of an import charged one tenant.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantCharged {
    pub tenant_id: TenantId,
    pub new_rows: u64,
    /// Exact soles.
    pub charged: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImportedFile {
    pub file: String,
    /// Its name now (`….imported`).
    pub renamed_to: String,
    pub rows: u64,
    /// Request ids of the rows written now: their charges were applied now.
    pub new: Vec<String>,
    /// Request ids already in the ledger (an earlier import, or the store got them before the
    /// shutdown gave up): nothing was charged for them now.
    pub duplicate: Vec<String>,
    pub rejected: Vec<ImportRejected>,
    /// Exact soles charged by the new rows, in all.
    pub charged: String,
    pub per_tenant: Vec<TenantCharged>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImportTotals {
    pub rows: u64,
    pub new: u64,
    pub duplicate: u64,
    pub rejected: u64,
    /// Exact soles.
    pub charged: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LedgerImport {
    pub files: Vec<ImportedFile>,
    pub totals: ImportTotals,
}

impl Render for LedgerImport {
    fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            let renamed = if f.renamed_to == f.file {
                String::new()
            } else {
                format!(" Renamed to {}.", f.renamed_to)
            };
            out.push_str(&format!(
                "{}: {} rows. {} new, charged {} (exact {}); {} already in the ledger, nothing \
                 charged for them; {} rejected.{renamed}\n",
                f.file,
                f.rows,
                f.new.len(),
                soles_text(&f.charged),
                f.charged,
                f.duplicate.len(),
                f.rejected.len(),
            ));
            for t in &f.per_tenant {
                out.push_str(&format!(
                    "  tenant {}: {} new rows, charged {} (exact {})\n",
                    t.tenant_id,
                    t.new_rows,
                    soles_text(&t.charged),
                    t.charged
                ));
            }
            for r in &f.rejected {
                out.push_str(&format!(
                    "  rejected {} of tenant {} (charge {}, NOT applied): {}; it is in the \
                     ledger_rejects table for you to settle by hand\n",
                    r.request_id, r.tenant_id, r.charge, r.reason
                ));
            }
        }
        if self.files.len() > 1 {
            out.push_str(&format!(
                "In all: {} rows, {} new (charged {}, exact {}), {} duplicate, {} rejected.\n",
                self.totals.rows,
                self.totals.new,
                soles_text(&self.totals.charged),
                self.totals.charged,
                self.totals.duplicate,
                self.totals.rejected
            ));
        }
        out
    }
}

/// `quipu ledger import FILE…`: writes the rows of ledger spill files (see `billing::spill`)
/// through the store's normal ledger write, exactly as the gateway's writer would have:
/// idempotent by request id (a row already in the ledger is skipped, so importing twice, or
/// importing rows the store got after all, never charges twice); each new row lowers its
/// tenant's balance by its charge once, and the lease of the replica that admitted it if that
/// lease still exists (it held the money the request spent; a lease gone since, dropped at the
/// replica's restart or reclaimed as stale, has nothing left to lower, and no other replica's
/// lease is touched). A row the store refuses for good goes to the dead-letter table, as in the
/// gateway. Each fully imported file is renamed to `FILE.imported`.
///
/// Every file is read and checked before anything is written: a damaged file fails the
/// command with its name and line, and nothing is imported.
pub async fn import_ledger(store: &dyn Store, files: &[PathBuf]) -> OpsResult<LedgerImport> {
    if files.is_empty() {
        return Err(OpsError::Invalid(
            "name the spill files to import, e.g. quipu ledger import data/ledger-spill/*.jsonl"
                .into(),
        ));
    }
    let mut parsed = Vec::with_capacity(files.len());
    for path in files {
        parsed.push((path, spill::read(path).map_err(OpsError::Invalid)?));
    }
    let mut out = Vec::with_capacity(parsed.len());
    for (path, rows) in parsed {
        out.push(import_file(store, path, rows).await?);
    }
    let mut totals = ImportTotals {
        rows: 0,
        new: 0,
        duplicate: 0,
        rejected: 0,
        charged: String::new(),
    };
    let mut charged = Pen::ZERO;
    for f in &out {
        totals.rows += f.rows;
        totals.new += f.new.len() as u64;
        totals.duplicate += f.duplicate.len() as u64;
        totals.rejected += f.rejected.len() as u64;
        charged += pen_of(&f.charged);
    }
    totals.charged = charged.to_decimal();
    Ok(LedgerImport { files: out, totals })
}

/// An exact decimal from [`Pen::to_decimal`] back to a [`Pen`] (non-negative here).
fn pen_of(decimal: &str) -> Pen {
    Pen::parse(decimal, money::SCALE_DIGITS).unwrap_or(Pen::ZERO)
}

async fn import_file(
    store: &dyn Store,
    path: &Path,
    rows: Vec<spill::Spilled>,
) -> OpsResult<ImportedFile> {
    let n = rows.len();
    let interrupted = |i: usize, e: StoreError| {
        OpsError::Store(format!(
            "{e} while importing row {} of {n} of {}; nothing is lost and nothing was charged \
             twice: rows imported so far are recognised by their request id, so run the same \
             command again once the store in store.url is reachable",
            i + 1,
            path.display()
        ))
    };
    let (mut new, mut duplicate, mut rejected) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_tenant: BTreeMap<TenantId, (u64, Pen)> = BTreeMap::new();
    for (i, s) in rows.into_iter().enumerate() {
        match store.record(&s.replica, std::slice::from_ref(&s.row)).await {
            Ok(0) => duplicate.push(s.row.request_id),
            Ok(_) => {
                let t = per_tenant.entry(s.row.tenant_id).or_default();
                t.0 += 1;
                t.1 += s.row.charge;
                new.push(s.row.request_id);
            }
            Err(e) if e.is_transient() => return Err(interrupted(i, e)),
            Err(e) => {
                let reason = e.to_string();
                store
                    .reject(&s.row, &reason)
                    .await
                    .map_err(|e| interrupted(i, e))?;
                rejected.push(ImportRejected {
                    request_id: s.row.request_id,
                    tenant_id: s.row.tenant_id,
                    charge: s.row.charge.to_decimal(),
                    reason,
                });
            }
        }
    }
    let renamed = spill::imported_name(path);
    if renamed != path {
        std::fs::rename(path, &renamed).map_err(|e| {
            OpsError::Invalid(format!(
                "every row of {} is in the store now, but renaming the file to {} failed: {e}; \
                 rename it by hand (importing it again is harmless: it adds nothing)",
                path.display(),
                renamed.display()
            ))
        })?;
    }
    let charged: Pen = per_tenant.values().map(|t| t.1).sum();
    Ok(ImportedFile {
        file: path.display().to_string(),
        renamed_to: renamed.display().to_string(),
        rows: n as u64,
        new,
        duplicate,
        rejected,
        charged: charged.to_decimal(),
        per_tenant: per_tenant
            .into_iter()
            .map(|(tenant_id, (new_rows, charged))| TenantCharged {
                tenant_id,
                new_rows,
                charged: charged.to_decimal(),
            })
            .collect(),
    })
}

// ---------------------------------------------------------------------------------------------
// Rendering helpers

/// `2026-11-22T10:54:55.123Z` (milliseconds only when non-zero).
fn rfc3339(ms: UnixMs) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        None => ms.to_string(),
    }
}

/// An RFC 3339 string from this module back to `2026-11-22 10:54 UTC` for text.
fn human_time_text(rfc: &str) -> String {
    match DateTime::parse_from_rfc3339(rfc) {
        Ok(t) => t
            .with_timezone(&Utc)
            .format("%Y-%m-%d %H:%M UTC")
            .to_string(),
        Err(_) => rfc.to_owned(),
    }
}

/// An exact decimal string from this module as `S/ 1,234.56`.
fn soles_text(decimal: &str) -> String {
    // Every decimal here came from `Pen::to_decimal`, which `Pen::parse` reads back exactly
    // (a negative balance carries a sign that `parse` does not take: strip and restore it).
    let (neg, digits) = match decimal.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, decimal),
    };
    match Pen::parse(digits, money::SCALE_DIGITS) {
        Ok(p) => (if neg { -p } else { p }).format_soles(),
        Err(_) => decimal.to_owned(),
    }
}

/// Exact decimals padded with trailing zeros to the same number of decimals, so that
/// right-aligned they line up on the point (`0.00000105` → `0.000001050000` beside
/// `12.345678901234`). The values are unchanged.
fn align_decimals(values: &[String]) -> Vec<String> {
    let decimals = |v: &str| v.split_once('.').map_or(0, |(_, f)| f.len());
    let most = values.iter().map(|v| decimals(v)).max().unwrap_or(0);
    values
        .iter()
        .map(|v| {
            let mut v = v.clone();
            if most > 0 && !v.contains('.') {
                v.push('.');
            }
            let pad = most - decimals(&v);
            v.push_str(&"0".repeat(pad));
            v
        })
        .collect()
}

/// `1234567` → `1,234,567`.
fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A plain aligned text table: a header row, two spaces between columns, numbers right-aligned.
struct Table {
    headers: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            headers: columns.iter().map(|c| c.0).collect(),
            right: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(slot) = w.get_mut(i) {
                    *slot = (*slot).max(cell.chars().count());
                }
            }
        }
        w
    }

    fn line(&self, cells: &[String], widths: &[usize]) -> String {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if self.right.get(i).copied().unwrap_or(false) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        let mut line = line.trim_end().to_owned();
        line.push('\n');
        line
    }

    /// Header and rows.
    fn render(&self) -> String {
        let widths = self.widths();
        let headers: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        let mut out = self.line(&headers, &widths);
        for row in &self.rows {
            out.push_str(&self.line(row, &widths));
        }
        out
    }

    /// Rows only (for label/value blocks).
    fn render_body(&self) -> String {
        let widths = self.widths();
        self.rows.iter().map(|r| self.line(r, &widths)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{self, LedgerRow};
    use std::sync::Arc;

    async fn mem() -> Arc<dyn Store> {
        store::open("sqlite://:memory:").await.unwrap()
    }

    fn min() -> Pen {
        Pen::from_centimos(1000)
    }

    #[test]
    fn minimum_top_up_is_refused_with_the_minimum_in_soles() {
        let e = parse_top_up("5.00", min()).unwrap_err();
        assert_eq!(e.http_status(), 400);
        assert!(e.message().contains("minimum top-up of S/ 10.00"), "{e}");
        assert!(e.message().contains("S/ 5.00"), "{e}");
        let e = parse_top_up("9.99", min()).unwrap_err();
        assert!(e.message().contains("S/ 10.00"), "{e}");
        assert_eq!(parse_top_up("10", min()).unwrap(), min());
        let e = parse_top_up("0", Pen::ZERO).unwrap_err();
        assert!(e.message().contains("more than S/ 0.00"), "{e}");
    }

    #[test]
    fn top_up_limits_and_syntax() {
        assert_eq!(
            parse_top_up("1000000.00", min()).unwrap(),
            Pen::from_centimos(100_000_000)
        );
        let e = parse_top_up("1000000.01", min()).unwrap_err();
        assert!(e.message().contains("S/ 1,000,000.00"), "{e}");
        assert!(e.message().contains("split it"), "{e}");
        let e = parse_top_up("12.345", min()).unwrap_err();
        assert!(e.message().contains("at most 2 decimals"), "{e}");
        let e = parse_top_up("1,000", min()).unwrap_err();
        assert!(e.message().contains("like 50.00"), "{e}");
        assert!(parse_top_up("-50", min()).is_err());
    }

    #[test]
    fn tenant_names() {
        for ok in ["acme", "acme-peru", "a", "t1.prod_x"] {
            validate_tenant_name(ok).unwrap();
        }
        for bad in ["", "Acme", "-acme", "a b", "ñandú", &"x".repeat(65)] {
            let e = validate_tenant_name(bad).unwrap_err();
            assert!(e.message().contains("lowercase letters"), "{bad}: {e}");
        }
    }

    #[test]
    fn bounds() {
        assert_eq!(
            parse_bound("2026-11-01", false).unwrap(),
            1_793_491_200_000 // 2026-11-01T00:00:00Z
        );
        // As an end, a day includes itself.
        assert_eq!(
            parse_bound("2026-11-30", true).unwrap(),
            1_796_083_200_000 // 2026-12-01T00:00:00Z
        );
        assert_eq!(
            parse_bound("2026-11-01T00:00:00-05:00", false).unwrap(),
            1_793_491_200_000 + 5 * 3_600_000
        );
        let e = parse_bound("2026-13-01", false).unwrap_err();
        assert!(e.message().contains("YYYY-MM-DD"), "{e}");
    }

    #[test]
    fn digits_and_soles() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_234_567), "1,234,567");
        assert_eq!(soles_text("1234.56"), "S/ 1,234.56");
        assert_eq!(soles_text("0.00000105"), "S/ 0.00");
        assert_eq!(soles_text("-3.50"), "-S/ 3.50");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_500), "1970-01-01T00:00:01.500Z");
        assert_eq!(
            human_time_text("1970-01-01T00:00:01.500Z"),
            "1970-01-01 00:00 UTC"
        );
        assert_eq!(
            align_decimals(&["12.345678901234".into(), "0.00000105".into(), "3".into()]),
            ["12.345678901234", "0.000001050000", "3.000000000000"]
        );
    }

    #[tokio::test]
    async fn operations_end_to_end() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap();
        assert_eq!(t.name, "acme");
        let e = create_tenant(&*s, "acme").await.unwrap_err();
        assert_eq!(e.http_status(), 409);
        assert!(e.message().contains("already exists"));

        let k = create_key(&*s, "acme", "laptop", KeyLimits::default())
            .await
            .unwrap();
        assert!(k.secret.starts_with("sk-qp-"));
        assert!(k.text().contains(&k.secret));
        assert!(k.text().contains("only time"));
        let (_, active) = s.active_keys().await.unwrap();
        assert_eq!(active[0].secret_hash, keys::hash_secret(&k.secret));

        let e = create_key(&*s, "nobody", "", KeyLimits::default())
            .await
            .unwrap_err();
        assert_eq!(e.http_status(), 404);
        assert!(e.message().contains("quipu tenant list"), "{e}");

        let listed = list_keys(&*s, Some("acme")).await.unwrap();
        assert_eq!(listed.keys.len(), 1);
        assert!(listed.text().contains("active"));
        assert!(!listed.text().contains(&k.secret));
        assert!(!serde_json::to_string(&listed).unwrap().contains(&k.secret));

        let r = revoke_key(&*s, &k.key_id).await.unwrap();
        assert!(r.revoked_now);
        assert!(!revoke_key(&*s, &k.key_id).await.unwrap().revoked_now);
        assert_eq!(
            revoke_key(&*s, "key_000000000000")
                .await
                .unwrap_err()
                .http_status(),
            404
        );

        let e = top_up(&*s, "acme", "5.00", "", min(), None)
            .await
            .unwrap_err();
        assert!(e.message().contains("S/ 10.00"), "{e}");
        let done = top_up(&*s, "acme", "1234.56", "", min(), None)
            .await
            .unwrap();
        assert_eq!(done.amount, "1234.56");
        assert_eq!(done.balance, "1234.56");
        assert!(done.text().contains("S/ 1,234.56"), "{}", done.text());

        let list = list_tenants(&*s).await.unwrap();
        assert_eq!(list.tenants[0].balance, "1234.56");
        assert_eq!(list.tenants[0].active_keys, 0);
        assert!(list.text().contains("S/ 1,234.56"));
    }

    #[tokio::test]
    async fn ledger_import_checks_every_file_first_and_sets_refused_rows_aside() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap().id;
        top_up(&*s, "acme", "10.00", "", min(), None).await.unwrap();
        let dir = std::env::temp_dir().join(format!(
            "quipu-ops-import-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let row = |id: &str, tenant: TenantId, picos: i128| LedgerRow {
            request_id: id.into(),
            at: store::now_ms(),
            tenant_id: tenant,
            key_id: "key_x".into(),
            model: "apu".into(),
            format: "chat".into(),
            input_tokens: 3,
            cached_tokens: 0,
            output_tokens: 4,
            charge: Pen::from_picos(picos),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
        };
        let good = spill::write(&dir, "r~1", &[row("a", t, 1_000), row("orphan", 404, 5)]).unwrap();
        let damaged = dir.join("ledger-spill-damaged.jsonl");
        std::fs::write(&damaged, "{\"replica\":\"r\"}\n").unwrap();

        // A damaged file fails the command before anything of any file is written.
        let e = import_ledger(&*s, &[good.clone(), damaged.clone()])
            .await
            .unwrap_err();
        assert!(e.message().contains("ledger-spill-damaged.jsonl:1"), "{e}");
        assert!(s.ledger_rows(None).await.unwrap().is_empty());
        assert!(good.exists());

        let done = import_ledger(&*s, std::slice::from_ref(&good))
            .await
            .unwrap();
        assert_eq!(done.files[0].new, vec!["a".to_owned()]);
        assert_eq!(done.files[0].rejected[0].request_id, "orphan");
        assert_eq!(done.totals.charged, "0.000000001");
        let text = done.text();
        assert!(
            text.contains("1 new") && text.contains("1 rejected"),
            "{text}"
        );
        assert!(
            text.contains("ledger_rejects") && text.contains("Renamed to"),
            "{text}"
        );
        assert_eq!(s.rejected_rows().await.unwrap()[0].request_id, "orphan");
        assert_eq!(
            s.balance(t).await.unwrap().balance,
            Pen::from_centimos(1000) - Pen::from_picos(1_000)
        );
        let json = serde_json::to_value(&done).unwrap();
        assert_eq!(json["files"][0]["per_tenant"][0]["charged"], "0.000000001");
        let e = import_ledger(&*s, &[]).await.unwrap_err();
        assert!(e.message().contains("quipu ledger import"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn statement_rendering() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap();
        top_up(&*s, "acme", "50.00", "", min(), None).await.unwrap();
        let now = store::now_ms();
        let row = |id: &str, model: &str, picos: i128, input: u64| LedgerRow {
            request_id: id.into(),
            at: now,
            tenant_id: t.id,
            key_id: "key_x".into(),
            model: model.into(),
            format: "chat".into(),
            input_tokens: input,
            cached_tokens: 10,
            output_tokens: 2_000,
            charge: Pen::from_picos(picos),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
        };
        s.record(
            "r1",
            &[
                row("a", "colibri", 1_050_000, 1_234_567),
                row("b", "colibri", 2_000_000_000_000, 3),
                row("c", "aguila", 1, 5),
            ],
        )
        .await
        .unwrap();
        let st = statement(&*s, "acme", None, None).await.unwrap();
        assert_eq!(st.models.len(), 2);
        assert_eq!(st.models[0].model, "aguila");
        assert_eq!(st.models[1].charge, "2.00000105");
        assert_eq!(st.totals.charges, "2.000001050001");
        assert_eq!(st.totals.top_ups, "50.00");
        assert_eq!(st.balance, "47.999998949999");
        assert_eq!(st.totals.requests, 3);
        assert_eq!(st.totals.input_tokens, 1_234_575);

        let text = st.text();
        assert!(text.contains("Statement for acme"), "{text}");
        assert!(text.contains("1,234,570"), "{text}");
        assert!(text.contains("2.000001050001"), "{text}");
        // Exact charges line up on the decimal point.
        assert!(text.contains(" 0.000000000001\n"), "{text}");
        assert!(text.contains(" 2.000001050000\n"), "{text}");
        assert!(text.contains("S/ 48.00"), "{text}");
        assert!(text.contains("S/ 50.00"), "{text}");
        // The table is aligned: every row of the model table has the same width up to CHARGE.
        let lines: Vec<&str> = text.lines().skip(3).take(4).collect();
        let col = lines[0].find("CHARGE").unwrap() + "CHARGE".len();
        for l in &lines[1..] {
            assert_eq!(&l[col - 1..col], "0", "{l}");
        }

        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["totals"]["charges"], "2.000001050001");
        assert_eq!(json["balance"], "47.999998949999");
        assert!(json["models"][0]["charge"].is_string());

        // A period with nothing in it.
        let empty = statement(&*s, "acme", Some("2000-01-01"), Some("2000-01-31"))
            .await
            .unwrap();
        assert!(empty.models.is_empty());
        assert_eq!(empty.totals.charges, "0.00");
        assert!(empty.text().contains("No requests in this period."));
        assert_eq!(empty.to.as_deref(), Some("2000-02-01T00:00:00Z"));

        let e = statement(&*s, "acme", Some("2026-02-01"), Some("2026-01-01"))
            .await
            .unwrap_err();
        assert!(e.message().contains("start must come first"), "{e}");
    }
}
