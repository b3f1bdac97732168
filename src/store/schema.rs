//! The store's schema and its migrations, for both backends.
//!
//! Both backends hold the same logical schema; only column types differ (see
//! `sql_money` for money):
//!
//! | table | holds |
//! |---|---|
//! | `meta` | `schema_version` (the last migration applied) and `keys_version` (bumped in the same transaction as every tenant/key create or revoke; polled by every replica) |
//! | `tenants` | id, unique name, created_at, the materialised `balance` (exact pico-soles) |
//! | `api_keys` | public id, tenant, label, `secret_sha256` (unique; never the secret), the secret's display prefix, created/revoked times, per-key rpm/tpm limits (NULL = configured default) |
//! | `ledger` | the one money journal: `entry_id` (primary key: request id or top-up id), `kind` (`request` \| `topup`), tenant, `at`, signed `delta` in i64 pico-soles; request entries also carry key id, model, format, tokens, status, HTTP status; top-ups a note. Indexed by (tenant, at) for statements. |
//! | `leases` | (tenant, replica) → leased `amount` and recorded `spent` (exact pico-soles), `version`, `heartbeat_at` |
//! | `responses` | stored responses of the Responses API: id, tenant, key id, model, created_at, the response object, its conversation's input items, size (migration 4) |
//! | `ledger_rejects` | the dead-letter table: request rows `record` refused as invalid (request id, tenant, the row as JSON, why, when), so one bad row cannot stop the rows behind it |
//! | `rate_windows` | shared rate-limit windows: (`subject`, `window_ms`, `window_start`) → `taken` (what the replicas took of the window's quota), `granted` (what the last take granted: PostgreSQL before 18 cannot return a row's old value), `ends_at`; `UNLOGGED` on PostgreSQL (a crash may forget the current window's counts, nothing else) |
//!
//! Migration 2 added to `ledger` `unbilled` (i64 pico-soles a request's tokens cost beyond its
//! reservation, which caps the charge; not in `delta`) and `input_estimated` (1 when
//! `input_tokens` is the gateway's estimate because the upstream reported none), and the
//! `ledger_rejects` table.
//!
//! Migration 3 added what the account API reads (see `usage`): `usage_hourly`, the ledger's
//! request rows summed per (tenant, UTC hour, key, model), and `key_usage`, summed per (tenant,
//! key) with the last request's time. Both are written in the same transaction as the rows they
//! sum (`record`), and were filled from the ledger by the migration. The ledger's
//! `(tenant_id, at)` index became `(tenant_id, kind, at, entry_id)`: a tenant's requests or
//! top-ups in time order, newest first as cheaply, and the partial hours at a period's ends.
//! `api_keys` gained `(tenant_id, created_at, id)` for the tenant's keys in order. Sums of
//! tokens and money may pass i64: PostgreSQL keeps them in `NUMERIC`; SQLite in two integer
//! columns, `x_hi * 2^32 + x_lo` with `0 <= x_lo < 2^32` (each addition carries, see
//! `usage`), which no real total can overflow.
//!
//! Migration 4 added `responses`: the Responses API's stored responses (`store: true`) — id
//! (`resp_…`, primary key), tenant, key id, model slug, `created_at`, the response object and
//! the conversation's input items (JSON text, exactly as served), and their `size` in bytes;
//! indexed by (tenant, created_at) for the per-tenant cap and by created_at for the retention
//! (see `responses`; migration 6 dropped the latter).
//!
//! Migration 5 added `rate_windows`: the shared rate windows of several replicas (see
//! `replicas`).
//!
//! Migration 6 dropped `responses_by_age`: every stored response paid for its entry (about a
//! sixth of the row's cost on SQLite), for a cleanup that runs once a minute; the retention
//! now walks each tenant's rows by `responses_by_tenant`.
//!
//! Migration 7 added to `leases` `spent` (the charges of the replica's requests recorded
//! against the lease, ever: `record` lowers `amount` and raises `spent` by each charge) and
//! `version` (raised by every change of the row), so every answer about a lease is one
//! consistent reading a replica can line its own books up with (`quipu_core::billing::book`).
//! A stale lease is no longer deleted but zeroed (`reclaim_stale_leases`); the row of a replica
//! silent for a day goes (`forget_silent_leases`).
//!
//! Migration 8 added what governs keys and tenants. `api_keys`: `models` (the list of models
//! a key may use, as the operator or tenant wrote it; `NULL` every model), `cap_amount` and
//! `cap_period` (a spend cap per `day`, `week`, `month` in the tenant's time zone, or `total`),
//! `expires_at`, `disabled`, `manage` (it may manage its tenant's keys), `priority`
//! (`interactive` or `batch`: see `schedule`) and `rotated_to` (the key that replaced it).
//! `tenants`: `weight` (its share of a saturated model), `monthly_cap`, `time_zone` (which
//! bounds its cap periods and its account's days) and `low_balance` (the threshold of its
//! balance alert). Amounts there are text pico-soles on both backends: compared, never summed
//! in SQL. `ledger.caps`: the cap pools a request reserved against (comma-separated ids, see
//! `quipu_core::billing::pool`), which its charge is recorded against. `cap_pools` (one cap
//! for one period: its limit and what was spent in it) and `cap_leases` (the replicas' leases
//! on them, as `leases` are on balances).
//!
//! Migration 9 added alerts as webhooks (see `webhooks`): `webhook_endpoints` (the endpoints
//! tenants registered: id, tenant, URL, signing secret, subscribed events as `*` or a comma
//! list, created and deleted times), `webhook_outbox` (one row per event, unique by its
//! `event_id`, written in the transaction of the change that caused it: tenant, type, the JSON
//! body, and `fanned` once the sender has made its deliveries), `webhook_deliveries` (one row
//! per event and endpoint: `pending`, `delivered` or `dead`, attempts so far, when the next is
//! due, the last answer) and `webhook_sender` (one row: which replica sends, and until when).
//!
//! Every timestamp is milliseconds since the Unix epoch (UTC) in a 64-bit integer column.
//!
//! Migrations are numbered from 1 and applied in order at open, each in the same transaction
//! as the `schema_version` bump, under a lock (SQLite `BEGIN IMMEDIATE`, PostgreSQL an advisory
//! transaction lock) so several processes starting together apply each exactly once. A
//! database whose `schema_version` is newer than this build knows is refused: an older binary
//! must not write to a schema it does not understand.
//!
//! To change the schema, append a migration to **both** lists with the same number; never
//! edit one that has shipped. A column added to `ledger` or `ledger_rejects` also needs its
//! entry in the column list the stores bind from (see `columns`); the store suite fails until
//! the list and the migrated table agree.

/// `meta` exists before any migration: it records which migrations ran.
pub const SQLITE_BOOTSTRAP: &str =
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT";

/// See [`SQLITE_BOOTSTRAP`].
pub const PG_BOOTSTRAP: &str =
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)";

/// Key of the PostgreSQL advisory lock that serialises migrations (`"quipu"` in ASCII).
pub const PG_MIGRATION_LOCK: i64 = 0x71_75_69_70_75;

/// SQLite migrations, `(version, SQL)`. Tables are `STRICT`, so a value of the wrong type (a
/// float in a money column) is an error instead of a silent conversion. Amount columns are
/// `TEXT` decimal integers of pico-soles (see `sql_money`).
pub const SQLITE_MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
CREATE TABLE tenants (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL,
    balance     TEXT    NOT NULL DEFAULT '0'
) STRICT;

CREATE TABLE api_keys (
    id             TEXT    PRIMARY KEY,
    tenant_id      INTEGER NOT NULL REFERENCES tenants(id),
    label          TEXT    NOT NULL,
    secret_sha256  BLOB    NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    secret_prefix  TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    revoked_at     INTEGER,
    rpm_limit      INTEGER CHECK (rpm_limit >= 0),
    tpm_limit      INTEGER CHECK (tpm_limit >= 0)
) STRICT;
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id);

CREATE TABLE ledger (
    entry_id       TEXT    PRIMARY KEY,
    kind           TEXT    NOT NULL CHECK (kind IN ('request', 'topup')),
    tenant_id      INTEGER NOT NULL REFERENCES tenants(id),
    at             INTEGER NOT NULL,
    delta          INTEGER NOT NULL,
    key_id         TEXT,
    model          TEXT,
    format         TEXT,
    input_tokens   INTEGER CHECK (input_tokens >= 0),
    cached_tokens  INTEGER CHECK (cached_tokens >= 0),
    output_tokens  INTEGER CHECK (output_tokens >= 0),
    status         TEXT,
    http_status    INTEGER,
    note           TEXT,
    CHECK ((kind = 'request' AND delta <= 0) OR (kind = 'topup' AND delta > 0))
) STRICT;
CREATE INDEX ledger_by_tenant_at ON ledger (tenant_id, at);

CREATE TABLE leases (
    tenant_id     INTEGER NOT NULL REFERENCES tenants(id),
    replica       TEXT    NOT NULL,
    amount        TEXT    NOT NULL CHECK (amount NOT LIKE '-%'),
    heartbeat_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, replica)
) STRICT;
CREATE INDEX leases_by_replica ON leases (replica);

INSERT INTO meta (key, value) VALUES ('keys_version', 0);
"#,
    ),
    (
        2,
        r#"
ALTER TABLE ledger ADD COLUMN unbilled INTEGER NOT NULL DEFAULT 0 CHECK (unbilled >= 0);
ALTER TABLE ledger ADD COLUMN input_estimated INTEGER NOT NULL DEFAULT 0
    CHECK (input_estimated IN (0, 1));

CREATE TABLE ledger_rejects (
    request_id   TEXT    PRIMARY KEY,
    tenant_id    INTEGER NOT NULL,
    row_json     TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    rejected_at  INTEGER NOT NULL
) STRICT;
"#,
    ),
    (
        3,
        r#"
DROP INDEX ledger_by_tenant_at;
CREATE INDEX ledger_by_tenant_kind_at ON ledger (tenant_id, kind, at, entry_id);
CREATE INDEX api_keys_by_tenant_created ON api_keys (tenant_id, created_at, id);

CREATE TABLE usage_hourly (
    tenant_id  INTEGER NOT NULL,
    hour       INTEGER NOT NULL,
    key_id     TEXT    NOT NULL,
    model      TEXT    NOT NULL,
    requests   INTEGER NOT NULL CHECK (requests >= 0),
    input_hi   INTEGER NOT NULL CHECK (input_hi >= 0),
    input_lo   INTEGER NOT NULL CHECK (input_lo BETWEEN 0 AND 4294967295),
    cached_hi  INTEGER NOT NULL CHECK (cached_hi >= 0),
    cached_lo  INTEGER NOT NULL CHECK (cached_lo BETWEEN 0 AND 4294967295),
    output_hi  INTEGER NOT NULL CHECK (output_hi >= 0),
    output_lo  INTEGER NOT NULL CHECK (output_lo BETWEEN 0 AND 4294967295),
    charge_hi  INTEGER NOT NULL CHECK (charge_hi >= 0),
    charge_lo  INTEGER NOT NULL CHECK (charge_lo BETWEEN 0 AND 4294967295),
    PRIMARY KEY (tenant_id, hour, key_id, model)
) STRICT, WITHOUT ROWID;

CREATE TABLE key_usage (
    tenant_id  INTEGER NOT NULL,
    key_id     TEXT    NOT NULL,
    requests   INTEGER NOT NULL CHECK (requests >= 0),
    input_hi   INTEGER NOT NULL CHECK (input_hi >= 0),
    input_lo   INTEGER NOT NULL CHECK (input_lo BETWEEN 0 AND 4294967295),
    cached_hi  INTEGER NOT NULL CHECK (cached_hi >= 0),
    cached_lo  INTEGER NOT NULL CHECK (cached_lo BETWEEN 0 AND 4294967295),
    output_hi  INTEGER NOT NULL CHECK (output_hi >= 0),
    output_lo  INTEGER NOT NULL CHECK (output_lo BETWEEN 0 AND 4294967295),
    charge_hi  INTEGER NOT NULL CHECK (charge_hi >= 0),
    charge_lo  INTEGER NOT NULL CHECK (charge_lo BETWEEN 0 AND 4294967295),
    last_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key_id)
) STRICT, WITHOUT ROWID;

INSERT INTO usage_hourly
SELECT tenant_id, hour, key_id, model, n,
       ih + il / 4294967296, il % 4294967296, ch + cl / 4294967296, cl % 4294967296,
       oh + ol / 4294967296, ol % 4294967296, mh + ml / 4294967296, ml % 4294967296
  FROM (SELECT tenant_id, at - ((at % 3600000) + 3600000) % 3600000 AS hour,
               COALESCE(key_id, '') AS key_id, COALESCE(model, '') AS model, COUNT(*) AS n,
               SUM(COALESCE(input_tokens, 0) / 4294967296) AS ih,
               SUM(COALESCE(input_tokens, 0) % 4294967296) AS il,
               SUM(COALESCE(cached_tokens, 0) / 4294967296) AS ch,
               SUM(COALESCE(cached_tokens, 0) % 4294967296) AS cl,
               SUM(COALESCE(output_tokens, 0) / 4294967296) AS oh,
               SUM(COALESCE(output_tokens, 0) % 4294967296) AS ol,
               SUM((-delta) / 4294967296) AS mh, SUM((-delta) % 4294967296) AS ml
          FROM ledger WHERE kind = 'request' GROUP BY 1, 2, 3, 4);

INSERT INTO key_usage
SELECT tenant_id, key_id, n,
       ih + il / 4294967296, il % 4294967296, ch + cl / 4294967296, cl % 4294967296,
       oh + ol / 4294967296, ol % 4294967296, mh + ml / 4294967296, ml % 4294967296, last_at
  FROM (SELECT tenant_id, COALESCE(key_id, '') AS key_id, COUNT(*) AS n,
               SUM(COALESCE(input_tokens, 0) / 4294967296) AS ih,
               SUM(COALESCE(input_tokens, 0) % 4294967296) AS il,
               SUM(COALESCE(cached_tokens, 0) / 4294967296) AS ch,
               SUM(COALESCE(cached_tokens, 0) % 4294967296) AS cl,
               SUM(COALESCE(output_tokens, 0) / 4294967296) AS oh,
               SUM(COALESCE(output_tokens, 0) % 4294967296) AS ol,
               SUM((-delta) / 4294967296) AS mh, SUM((-delta) % 4294967296) AS ml,
               MAX(at) AS last_at
          FROM ledger WHERE kind = 'request' GROUP BY 1, 2);
"#,
    ),
    (
        4,
        r#"
CREATE TABLE responses (
    id           TEXT    PRIMARY KEY,
    tenant_id    INTEGER NOT NULL REFERENCES tenants(id),
    key_id       TEXT    NOT NULL,
    model        TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    response     TEXT    NOT NULL,
    input_items  TEXT    NOT NULL,
    size         INTEGER NOT NULL CHECK (size >= 0)
) STRICT;
CREATE INDEX responses_by_tenant ON responses (tenant_id, created_at);
CREATE INDEX responses_by_age ON responses (created_at);
"#,
    ),
    (
        5,
        r#"
CREATE TABLE rate_windows (
    subject       TEXT    NOT NULL,
    window_ms     INTEGER NOT NULL CHECK (window_ms > 0),
    window_start  INTEGER NOT NULL,
    taken         INTEGER NOT NULL CHECK (taken >= 0),
    granted       INTEGER NOT NULL DEFAULT 0 CHECK (granted >= 0),
    ends_at       INTEGER NOT NULL,
    PRIMARY KEY (subject, window_ms, window_start)
) STRICT;
CREATE INDEX rate_windows_by_end ON rate_windows (ends_at);
"#,
    ),
    (
        6,
        r#"
DROP INDEX responses_by_age;
"#,
    ),
    (
        7,
        r#"
ALTER TABLE leases ADD COLUMN spent TEXT NOT NULL DEFAULT '0' CHECK (spent NOT LIKE '-%');
ALTER TABLE leases ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
"#,
    ),
    (8, GOVERNANCE_SQLITE),
    (9, WEBHOOKS_SQLITE),
];

/// Migration 8 on SQLite (see the module docs).
const GOVERNANCE_SQLITE: &str = r#"
ALTER TABLE api_keys ADD COLUMN models TEXT;
ALTER TABLE api_keys ADD COLUMN cap_amount TEXT CHECK (cap_amount NOT LIKE '-%');
ALTER TABLE api_keys ADD COLUMN cap_period TEXT CHECK (cap_period IN ('day', 'week', 'month', 'total'));
ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
ALTER TABLE api_keys ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1));
ALTER TABLE api_keys ADD COLUMN manage INTEGER NOT NULL DEFAULT 0 CHECK (manage IN (0, 1));
ALTER TABLE api_keys ADD COLUMN priority TEXT NOT NULL DEFAULT 'interactive' CHECK (priority IN ('interactive', 'batch'));
ALTER TABLE api_keys ADD COLUMN rotated_to TEXT;

ALTER TABLE tenants ADD COLUMN weight INTEGER NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000);
ALTER TABLE tenants ADD COLUMN monthly_cap TEXT CHECK (monthly_cap NOT LIKE '-%');
ALTER TABLE tenants ADD COLUMN time_zone TEXT NOT NULL DEFAULT 'America/Lima';
ALTER TABLE tenants ADD COLUMN low_balance TEXT CHECK (low_balance NOT LIKE '-%');

ALTER TABLE ledger ADD COLUMN caps TEXT NOT NULL DEFAULT '';

CREATE TABLE cap_pools (
    pool          TEXT    PRIMARY KEY,
    tenant_id     INTEGER NOT NULL REFERENCES tenants(id),
    cap_limit     TEXT    NOT NULL CHECK (cap_limit NOT LIKE '-%'),
    spent         TEXT    NOT NULL CHECK (spent NOT LIKE '-%'),
    period_end    INTEGER
) STRICT;

CREATE TABLE cap_leases (
    pool          TEXT    NOT NULL REFERENCES cap_pools(pool),
    replica       TEXT    NOT NULL,
    amount        TEXT    NOT NULL CHECK (amount NOT LIKE '-%'),
    spent         TEXT    NOT NULL DEFAULT '0' CHECK (spent NOT LIKE '-%'),
    version       INTEGER NOT NULL DEFAULT 0,
    heartbeat_at  INTEGER NOT NULL,
    PRIMARY KEY (pool, replica)
) STRICT;
CREATE INDEX cap_leases_by_replica ON cap_leases (replica);
"#;

/// PostgreSQL migrations, `(version, SQL)`; the same logical schema as [`SQLITE_MIGRATIONS`].
/// Running amounts are `NUMERIC(40,0)` pico-soles.
pub const PG_MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
CREATE TABLE tenants (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name        TEXT          NOT NULL UNIQUE,
    created_at  BIGINT        NOT NULL,
    balance     NUMERIC(40,0) NOT NULL DEFAULT 0
);

CREATE TABLE api_keys (
    id             TEXT    PRIMARY KEY,
    tenant_id      BIGINT  NOT NULL REFERENCES tenants(id),
    label          TEXT    NOT NULL,
    secret_sha256  BYTEA   NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
    secret_prefix  TEXT    NOT NULL,
    created_at     BIGINT  NOT NULL,
    revoked_at     BIGINT,
    rpm_limit      BIGINT  CHECK (rpm_limit >= 0),
    tpm_limit      BIGINT  CHECK (tpm_limit >= 0)
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id);

CREATE TABLE ledger (
    entry_id       TEXT    PRIMARY KEY,
    kind           TEXT    NOT NULL CHECK (kind IN ('request', 'topup')),
    tenant_id      BIGINT  NOT NULL REFERENCES tenants(id),
    at             BIGINT  NOT NULL,
    delta          BIGINT  NOT NULL,
    key_id         TEXT,
    model          TEXT,
    format         TEXT,
    input_tokens   BIGINT  CHECK (input_tokens >= 0),
    cached_tokens  BIGINT  CHECK (cached_tokens >= 0),
    output_tokens  BIGINT  CHECK (output_tokens >= 0),
    status         TEXT,
    http_status    INTEGER,
    note           TEXT,
    CHECK ((kind = 'request' AND delta <= 0) OR (kind = 'topup' AND delta > 0))
);
CREATE INDEX ledger_by_tenant_at ON ledger (tenant_id, at);

CREATE TABLE leases (
    tenant_id     BIGINT        NOT NULL REFERENCES tenants(id),
    replica       TEXT          NOT NULL,
    amount        NUMERIC(40,0) NOT NULL CHECK (amount >= 0),
    heartbeat_at  BIGINT        NOT NULL,
    PRIMARY KEY (tenant_id, replica)
);
CREATE INDEX leases_by_replica ON leases (replica);

INSERT INTO meta (key, value) VALUES ('keys_version', 0);
"#,
    ),
    (
        2,
        r#"
ALTER TABLE ledger ADD COLUMN unbilled BIGINT NOT NULL DEFAULT 0 CHECK (unbilled >= 0);
ALTER TABLE ledger ADD COLUMN input_estimated BOOLEAN NOT NULL DEFAULT false;

CREATE TABLE ledger_rejects (
    request_id   TEXT    PRIMARY KEY,
    tenant_id    BIGINT  NOT NULL,
    row_json     TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    rejected_at  BIGINT  NOT NULL
);
"#,
    ),
    (
        3,
        r#"
DROP INDEX ledger_by_tenant_at;
CREATE INDEX ledger_by_tenant_kind_at ON ledger (tenant_id, kind, at, entry_id);
CREATE INDEX api_keys_by_tenant_created ON api_keys (tenant_id, created_at, id);

CREATE TABLE usage_hourly (
    tenant_id      BIGINT        NOT NULL,
    hour           BIGINT        NOT NULL,
    key_id         TEXT          NOT NULL,
    model          TEXT          NOT NULL,
    requests       BIGINT        NOT NULL CHECK (requests >= 0),
    input_tokens   NUMERIC(30,0) NOT NULL CHECK (input_tokens >= 0),
    cached_tokens  NUMERIC(30,0) NOT NULL CHECK (cached_tokens >= 0),
    output_tokens  NUMERIC(30,0) NOT NULL CHECK (output_tokens >= 0),
    charge         NUMERIC(40,0) NOT NULL CHECK (charge >= 0),
    PRIMARY KEY (tenant_id, hour, key_id, model)
);

CREATE TABLE key_usage (
    tenant_id      BIGINT        NOT NULL,
    key_id         TEXT          NOT NULL,
    requests       BIGINT        NOT NULL CHECK (requests >= 0),
    input_tokens   NUMERIC(30,0) NOT NULL CHECK (input_tokens >= 0),
    cached_tokens  NUMERIC(30,0) NOT NULL CHECK (cached_tokens >= 0),
    output_tokens  NUMERIC(30,0) NOT NULL CHECK (output_tokens >= 0),
    charge         NUMERIC(40,0) NOT NULL CHECK (charge >= 0),
    last_at        BIGINT        NOT NULL,
    PRIMARY KEY (tenant_id, key_id)
);

INSERT INTO usage_hourly
SELECT tenant_id, at - ((at % 3600000) + 3600000) % 3600000, COALESCE(key_id, ''),
       COALESCE(model, ''), COUNT(*), COALESCE(SUM(input_tokens), 0),
       COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(output_tokens), 0), -SUM(delta)
  FROM ledger WHERE kind = 'request' GROUP BY 1, 2, 3, 4;

INSERT INTO key_usage
SELECT tenant_id, COALESCE(key_id, ''), COUNT(*), COALESCE(SUM(input_tokens), 0),
       COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(output_tokens), 0), -SUM(delta), MAX(at)
  FROM ledger WHERE kind = 'request' GROUP BY 1, 2;
"#,
    ),
    (
        4,
        r#"
CREATE TABLE responses (
    id           TEXT    PRIMARY KEY,
    tenant_id    BIGINT  NOT NULL REFERENCES tenants(id),
    key_id       TEXT    NOT NULL,
    model        TEXT    NOT NULL,
    created_at   BIGINT  NOT NULL,
    response     TEXT    NOT NULL,
    input_items  TEXT    NOT NULL,
    size         BIGINT  NOT NULL CHECK (size >= 0)
);
CREATE INDEX responses_by_tenant ON responses (tenant_id, created_at);
CREATE INDEX responses_by_age ON responses (created_at);
"#,
    ),
    (
        5,
        r#"
CREATE UNLOGGED TABLE rate_windows (
    subject       TEXT    NOT NULL,
    window_ms     BIGINT  NOT NULL CHECK (window_ms > 0),
    window_start  BIGINT  NOT NULL,
    taken         BIGINT  NOT NULL CHECK (taken >= 0),
    granted       BIGINT  NOT NULL DEFAULT 0 CHECK (granted >= 0),
    ends_at       BIGINT  NOT NULL,
    PRIMARY KEY (subject, window_ms, window_start)
);
CREATE INDEX rate_windows_by_end ON rate_windows (ends_at);
"#,
    ),
    (
        6,
        r#"
DROP INDEX responses_by_age;
"#,
    ),
    (
        7,
        r#"
ALTER TABLE leases
    ADD COLUMN spent   NUMERIC(40,0) NOT NULL DEFAULT 0 CHECK (spent >= 0),
    ADD COLUMN version BIGINT        NOT NULL DEFAULT 0;
"#,
    ),
    (8, GOVERNANCE_PG),
    (9, WEBHOOKS_PG),
];

/// Migration 8 on PostgreSQL (see the module docs).
const GOVERNANCE_PG: &str = r#"
ALTER TABLE api_keys
    ADD COLUMN models      TEXT,
    ADD COLUMN cap_amount  TEXT CHECK (cap_amount NOT LIKE '-%'),
    ADD COLUMN cap_period  TEXT CHECK (cap_period IN ('day', 'week', 'month', 'total')),
    ADD COLUMN expires_at  BIGINT,
    ADD COLUMN disabled    BIGINT NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1)),
    ADD COLUMN manage      BIGINT NOT NULL DEFAULT 0 CHECK (manage IN (0, 1)),
    ADD COLUMN priority    TEXT   NOT NULL DEFAULT 'interactive' CHECK (priority IN ('interactive', 'batch')),
    ADD COLUMN rotated_to  TEXT;

ALTER TABLE tenants
    ADD COLUMN weight      BIGINT NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    ADD COLUMN monthly_cap TEXT CHECK (monthly_cap NOT LIKE '-%'),
    ADD COLUMN time_zone   TEXT   NOT NULL DEFAULT 'America/Lima',
    ADD COLUMN low_balance TEXT CHECK (low_balance NOT LIKE '-%');

ALTER TABLE ledger ADD COLUMN caps TEXT NOT NULL DEFAULT '';

CREATE TABLE cap_pools (
    pool          TEXT          PRIMARY KEY,
    tenant_id     BIGINT        NOT NULL REFERENCES tenants(id),
    cap_limit     NUMERIC(40,0) NOT NULL CHECK (cap_limit >= 0),
    spent         NUMERIC(40,0) NOT NULL CHECK (spent >= 0),
    period_end    BIGINT
);

CREATE TABLE cap_leases (
    pool          TEXT          NOT NULL REFERENCES cap_pools(pool),
    replica       TEXT          NOT NULL,
    amount        NUMERIC(40,0) NOT NULL CHECK (amount >= 0),
    spent         NUMERIC(40,0) NOT NULL DEFAULT 0 CHECK (spent >= 0),
    version       BIGINT        NOT NULL DEFAULT 0,
    heartbeat_at  BIGINT        NOT NULL,
    PRIMARY KEY (pool, replica)
);
CREATE INDEX cap_leases_by_replica ON cap_leases (replica);
"#;

/// Migration 9 on SQLite (see the module docs).
const WEBHOOKS_SQLITE: &str = r#"
CREATE TABLE webhook_endpoints (
    id          TEXT    PRIMARY KEY,
    tenant_id   INTEGER NOT NULL REFERENCES tenants(id),
    url         TEXT    NOT NULL,
    secret      TEXT    NOT NULL,
    events      TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    deleted_at  INTEGER
) STRICT;
CREATE INDEX webhook_endpoints_by_tenant ON webhook_endpoints (tenant_id, created_at);

CREATE TABLE webhook_outbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT    NOT NULL UNIQUE,
    tenant_id   INTEGER NOT NULL REFERENCES tenants(id),
    kind        TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    fanned      INTEGER NOT NULL DEFAULT 0 CHECK (fanned IN (0, 1))
) STRICT;
CREATE INDEX webhook_outbox_unfanned ON webhook_outbox (seq) WHERE fanned = 0;

CREATE TABLE webhook_deliveries (
    event_id     TEXT    NOT NULL REFERENCES webhook_outbox(event_id),
    endpoint     TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      INTEGER NOT NULL,
    last_status  INTEGER,
    last_error   TEXT,
    done_at      INTEGER,
    PRIMARY KEY (event_id, endpoint)
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at) WHERE state = 'pending';

CREATE TABLE webhook_sender (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    holder  TEXT    NOT NULL,
    until   INTEGER NOT NULL
) STRICT;
"#;

/// Migration 9 on PostgreSQL (see the module docs).
const WEBHOOKS_PG: &str = r#"
CREATE TABLE webhook_endpoints (
    id          TEXT    PRIMARY KEY,
    tenant_id   BIGINT  NOT NULL REFERENCES tenants(id),
    url         TEXT    NOT NULL,
    secret      TEXT    NOT NULL,
    events      TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    deleted_at  BIGINT
);
CREATE INDEX webhook_endpoints_by_tenant ON webhook_endpoints (tenant_id, created_at);

CREATE TABLE webhook_outbox (
    seq         BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    TEXT    NOT NULL UNIQUE,
    tenant_id   BIGINT  NOT NULL REFERENCES tenants(id),
    kind        TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    fanned      BIGINT  NOT NULL DEFAULT 0 CHECK (fanned IN (0, 1))
);
CREATE INDEX webhook_outbox_unfanned ON webhook_outbox (seq) WHERE fanned = 0;

CREATE TABLE webhook_deliveries (
    event_id     TEXT    NOT NULL REFERENCES webhook_outbox(event_id),
    endpoint     TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts     BIGINT  NOT NULL DEFAULT 0,
    next_at      BIGINT  NOT NULL,
    last_status  BIGINT,
    last_error   TEXT,
    done_at      BIGINT,
    PRIMARY KEY (event_id, endpoint)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at) WHERE state = 'pending';

CREATE TABLE webhook_sender (
    id      BIGINT  PRIMARY KEY CHECK (id = 1),
    holder  TEXT    NOT NULL,
    until   BIGINT  NOT NULL
);
"#;

/// The schema version this build migrates to.
pub fn latest_version() -> i64 {
    SQLITE_MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

/// The error for a database migrated by a newer Quipu.
pub fn too_new(found: i64, backend: &str) -> super::StoreError {
    super::StoreError::Backend(format!(
        "the {backend} database is at schema version {found}, newer than this quipu knows ({}); \
         run the newer quipu binary that migrated it",
        latest_version()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_backends_have_the_same_numbered_migrations() {
        let s: Vec<i64> = SQLITE_MIGRATIONS.iter().map(|m| m.0).collect();
        let p: Vec<i64> = PG_MIGRATIONS.iter().map(|m| m.0).collect();
        assert_eq!(s, p);
        assert_eq!(s.first(), Some(&1), "migrations are numbered from 1");
        assert!(
            s.windows(2).all(|w| w[0] < w[1]),
            "migrations are numbered in increasing order: {s:?}"
        );
    }

    #[test]
    fn no_float_columns() {
        for (_, sql) in SQLITE_MIGRATIONS.iter().chain(PG_MIGRATIONS) {
            let upper = sql.to_uppercase();
            for bad in ["REAL", "FLOAT", "DOUBLE", "MONEY"] {
                assert!(!upper.contains(bad), "{bad} in a migration");
            }
        }
    }
}
