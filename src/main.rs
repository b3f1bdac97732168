//! `quipu`: the gateway (`quipu serve`) and its operator commands. Wiring only: the work is in
//! the library (`quipu::server`, `quipu::ops`).

use clap::{Args, Parser, Subcommand};
use quipu::config::{Config, EMBEDDED_DEFAULT};
use quipu::governance::models::Catalog;
use quipu::ops;
use quipu::store::Store;
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "quipu",
    version,
    about = "An LLM API gateway on Pingora that bills tenants in soles"
)]
struct Cli {
    /// Configuration file. Default: $QUIPU_CONFIG, else the embedded default (conf/quipu.toml).
    #[arg(long, short = 'c', global = true, env = "QUIPU_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Add money to a tenant's balance.
    Topup {
        #[arg(long)]
        tenant: String,
        /// Soles, e.g. 50.00
        #[arg(long)]
        amount: String,
        #[arg(long, default_value = "")]
        note: String,
        /// Any unique string (e.g. the payment's id): running the command again with the same
        /// key adds nothing, so a retry after a lost reply cannot credit twice.
        #[arg(long)]
        idempotency_key: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Ledger maintenance.
    #[command(subcommand)]
    Ledger(LedgerCmd),
    /// A tenant's statement: tokens and soles per model, top-ups, balance.
    Statement {
        #[arg(long)]
        tenant: String,
        /// Start: YYYY-MM-DD (from the start of that day, UTC) or an RFC 3339 time (inclusive).
        #[arg(long)]
        from: Option<String>,
        /// End: YYYY-MM-DD includes that whole day (UTC); an RFC 3339 time is exclusive.
        #[arg(long)]
        to: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Take over the listening sockets of a running quipu (graceful upgrade; then send it
    /// SIGQUIT).
    #[arg(long, short = 'u')]
    upgrade: bool,
}

#[derive(Subcommand)]
enum LedgerCmd {
    /// Import ledger spill files (written at a shutdown when the store was unreachable, in
    /// store.spill_dir): their rows are written as the gateway would have written them, each
    /// charge applied once; a row whose request id is already in the ledger is skipped, so
    /// importing a file twice charges nothing twice. Each imported file is renamed to
    /// FILE.imported.
    Import {
        /// Spill files (ledger-spill-*.jsonl).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Create a tenant.
    Create {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List tenants with their balances.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Change what governs a tenant: its share of a saturated model, its monthly cap, its time
    /// zone, its low-balance alert.
    Update {
        name: String,
        /// Its share of a saturated model, 1 to 1000 (default 1).
        #[arg(long)]
        weight: Option<u32>,
        /// Soles it may spend per calendar month (in its time zone), e.g. 100.00.
        #[arg(long)]
        monthly_cap: Option<String>,
        #[arg(long, conflicts_with = "monthly_cap")]
        no_monthly_cap: bool,
        /// An IANA zone (default America/Lima): bounds its cap periods and its account's days.
        #[arg(long)]
        time_zone: Option<String>,
        /// Send a `balance.low` alert when the balance falls below these soles.
        #[arg(long)]
        low_balance: Option<String>,
        #[arg(long, conflicts_with = "low_balance")]
        no_low_balance: bool,
        #[arg(long)]
        json: bool,
    },
}

/// A key's settings on the command line (`quipu key create|update`).
#[derive(Args)]
struct KeyFlags {
    #[arg(long)]
    label: Option<String>,
    /// Requests per minute for this key (default: the configured limit).
    #[arg(long)]
    rpm: Option<u64>,
    /// Tokens per minute for this key (default: the configured limit).
    #[arg(long)]
    tpm: Option<u64>,
    /// The models it may use: slugs, alias names or globs, comma-separated (colibri,claude-*).
    #[arg(long, value_delimiter = ',')]
    models: Option<Vec<String>>,
    /// Every model again.
    #[arg(long, conflicts_with = "models")]
    all_models: bool,
    /// Soles it may spend per --budget-period, e.g. 5.00.
    #[arg(long, requires = "budget_period")]
    budget: Option<String>,
    /// day, week, month (in its tenant's time zone) or total.
    #[arg(long, requires = "budget")]
    budget_period: Option<String>,
    #[arg(long, conflicts_with = "budget")]
    no_budget: bool,
    /// When it stops working, RFC 3339 (2026-12-31T00:00:00Z).
    #[arg(long)]
    expires: Option<String>,
    #[arg(long, conflicts_with = "expires")]
    no_expiry: bool,
    /// Switch it off (it can be switched on again).
    #[arg(long)]
    disable: bool,
    #[arg(long, conflicts_with = "disable")]
    enable: bool,
    /// It may manage its tenant's keys (/v1/keys).
    #[arg(long)]
    manage: bool,
    #[arg(long, conflicts_with = "manage")]
    no_manage: bool,
    /// interactive (default) or batch: batch runs only on capacity others leave free.
    #[arg(long, value_parser = ["interactive", "batch"])]
    priority: Option<String>,
}

/// `Some(None)` when asked to clear, else `Some(v)` when given.
fn clear_or<T>(clear: bool, v: Option<T>) -> Option<Option<T>> {
    if clear {
        Some(None)
    } else {
        v.map(Some)
    }
}

impl KeyFlags {
    fn change(self) -> ops::KeyChange {
        let switch = |on: bool, off: bool| {
            if on {
                Some(true)
            } else if off {
                Some(false)
            } else {
                None
            }
        };
        ops::KeyChange {
            label: self.label,
            rpm: self.rpm.map(Some),
            tpm: self.tpm.map(Some),
            models: clear_or(self.all_models, self.models),
            budget: clear_or(
                self.no_budget,
                self.budget
                    .zip(self.budget_period)
                    .map(|(amount, period)| ops::Budget { amount, period }),
            ),
            expires_at: clear_or(self.no_expiry, self.expires),
            disabled: switch(self.disable, self.enable),
            manage: switch(self.manage, self.no_manage),
            priority: self.priority,
        }
    }
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Create a key for a tenant; its secret is printed once.
    Create {
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        flags: KeyFlags,
        #[arg(long)]
        json: bool,
    },
    /// Change a key's settings (what is not given stays as it is).
    Update {
        id: String,
        #[command(flatten)]
        flags: KeyFlags,
        #[arg(long)]
        json: bool,
    },
    /// A new secret with the same settings; the old one keeps working for --grace.
    Rotate {
        id: String,
        /// How long the old secret keeps working: 24h, 90m, 7d (default: it stops now).
        #[arg(long)]
        grace: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by its id (key_…); effective within about a second.
    Revoke {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// List keys (never their secrets).
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

fn load_config(path: Option<&PathBuf>) -> Result<Config, String> {
    match path {
        Some(p) => quipu::config_file::load(p).map_err(|e| e.to_string()),
        None => quipu::config_file::parse(EMBEDDED_DEFAULT, "embedded default")
            .map_err(|e| e.to_string()),
    }
}

/// Prints a result for an operator: JSON or the text rendering.
fn emit(out: Result<ops::Output, ops::OpsError>) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match out {
        Ok(o) => {
            let _ = write!(stdout, "{}", o.text);
            if !o.text.ends_with('\n') {
                let _ = writeln!(stdout);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs an operator operation on the configured store and prints its result.
fn run_op<F, Fut, T>(config: &Config, json: bool, op: F) -> ExitCode
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = Result<T, ops::OpsError>>,
    T: ops::Render,
{
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let url = config.store.url.clone();
    let result = rt.block_on(async move {
        let store = quipu::store::open(&url)
            .await
            .map_err(|e| ops::OpsError::Store(e.to_string()))?;
        op(store).await.map(|r| ops::Output::of(&r))
    });
    emit(result.map(|o| if json { o.into_json() } else { o }))
}

/// `quipu key …`.
fn run_key(config: &Config, cmd: KeyCmd) -> ExitCode {
    let catalog_config = config.clone();
    match cmd {
        KeyCmd::Create {
            tenant,
            flags,
            json,
        } => run_op(config, json, move |s| async move {
            let catalog = Catalog::of(&catalog_config);
            ops::create_key(s.as_ref(), &catalog, &tenant, &flags.change()).await
        }),
        KeyCmd::Update { id, flags, json } => run_op(config, json, move |s| async move {
            let catalog = Catalog::of(&catalog_config);
            ops::update_key(s.as_ref(), &catalog, &id, &flags.change()).await
        }),
        KeyCmd::Rotate { id, grace, json } => run_op(config, json, move |s| async move {
            let grace = grace.as_deref().map(ops::parse_grace).transpose()?;
            ops::rotate_key(s.as_ref(), &id, grace.unwrap_or(0)).await
        }),
        KeyCmd::Revoke { id, json } => run_op(config, json, move |s| async move {
            ops::revoke_key(s.as_ref(), &id).await
        }),
        KeyCmd::List { tenant, json } => run_op(config, json, move |s| async move {
            ops::list_keys(s.as_ref(), tenant.as_deref()).await
        }),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    quipu::logger::init();
    let code = run(cli);
    // Lines still queued for the log writer (see `quipu::logger`).
    log::logger().flush();
    code
}

fn run(cli: Cli) -> ExitCode {
    let config = match load_config(cli.config.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Serve(args) => {
            if args.check {
                let problems = quipu::server::check(&config);
                if !problems.is_empty() {
                    for p in &problems {
                        let _ = writeln!(std::io::stderr(), "{p}");
                    }
                    return ExitCode::from(2);
                }
                let _ = writeln!(
                    std::io::stdout(),
                    "configuration OK: {} models, store {}; every upstream name resolves",
                    config.models.len(),
                    quipu::config::redact_url(&config.store.url)
                );
                return ExitCode::SUCCESS;
            }
            let flags = quipu::server::ServeFlags {
                upgrade: args.upgrade,
            };
            match quipu::server::serve(config, flags) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Tenant(TenantCmd::Create { name, json }) => {
            run_op(&config, json, move |s| async move {
                ops::create_tenant(s.as_ref(), &name).await
            })
        }
        Command::Tenant(TenantCmd::List { json }) => run_op(&config, json, move |s| async move {
            ops::list_tenants(s.as_ref()).await
        }),
        Command::Key(cmd) => run_key(&config, cmd),
        Command::Tenant(TenantCmd::Update {
            name,
            weight,
            monthly_cap,
            no_monthly_cap,
            time_zone,
            low_balance,
            no_low_balance,
            json,
        }) => {
            let change = ops::TenantChange {
                weight,
                monthly_cap: clear_or(no_monthly_cap, monthly_cap),
                time_zone,
                low_balance: clear_or(no_low_balance, low_balance),
            };
            run_op(&config, json, move |s| async move {
                ops::update_tenant(s.as_ref(), &name, &change).await
            })
        }

        Command::Topup {
            tenant,
            amount,
            note,
            idempotency_key,
            json,
        } => {
            let min = config.billing.min_top_up;
            run_op(&config, json, move |s| async move {
                ops::top_up(
                    s.as_ref(),
                    &tenant,
                    &amount,
                    &note,
                    min,
                    idempotency_key.as_deref(),
                )
                .await
            })
        }
        Command::Ledger(LedgerCmd::Import { files, json }) => {
            run_op(&config, json, move |s| async move {
                ops::import_ledger(s.as_ref(), &files).await
            })
        }
        Command::Statement {
            tenant,
            from,
            to,
            json,
        } => run_op(&config, json, move |s| async move {
            ops::statement(s.as_ref(), &tenant, from.as_deref(), to.as_deref()).await
        }),
    }
}
