//! The gateway's configuration: `conf/quipu.toml`, parsed once and validated once.
//!
//! Two types, as in TensorZero and River: [`RawConfig`] is the file's shape (serde,
//! `deny_unknown_fields`, optional fields with defaults), and [`Config`] is what the rest of
//! the gateway reads: every value resolved, every secret fetched from the environment, every
//! address parsed, no `Option` standing for "not yet known". [`Config::from_raw`] collects
//! *every* problem and names the full key of each ("models[1].prices.input: …"), so one run of
//! `quipu serve --check` shows them all.
//!
//! Secrets may come from the environment: a string value `"env:NAME"` is replaced by the
//! variable `NAME` (an error names it if it is unset).
//!
//! Parsing does no I/O besides reading those variables: upstream URLs are checked for syntax
//! only, and a replica named by a host name gets its socket address from
//! [`Config::resolve_upstreams`], which `quipu serve` calls once at start (the gateway never
//! resolves names on the request path). So `--check`, the CLI's store commands, tests and the
//! `config_parse` fuzz target never touch DNS.
//!
//! Layout, one file per part of the file:
//! - [`raw`]: the serde types (`Raw*`);
//! - [`server`]: `[server]`, `[limits]`, `[streaming]`, `[security]`;
//! - [`store`]: `[store]`, `[billing]`, and [`redact_url`];
//! - [`models`]: `[[models]]`; their replica URLs in [`replica`];
//! - [`catalog`]: `[aliases]` (and [`glob_match`]), `[[plans]]`;
//! - [`secrets`]: `"env:NAME"` values.

pub mod catalog;
pub mod models;
pub mod raw;
pub mod replica;
pub mod secrets;
pub mod server;
pub mod store;

#[cfg(test)]
mod tests;

pub use catalog::{glob_match, Alias, Plan};
pub use models::{Health, Model, Routing, Timeouts};
pub use raw::{
    RawBilling, RawConfig, RawHealth, RawLimits, RawModel, RawPlan, RawPrices, RawSecurity,
    RawServer, RawStore, RawStreaming, RawTimeouts,
};
pub use replica::{parse_replica, Replica};
pub use server::{
    ImageUrlPolicy, Limits, ReasoningField, Security, Server, Streaming, PINGORA_MAX_HEAD_BYTES,
};
pub use store::{redact_url, Billing, Store};

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

/// Index of a model in [`Config::models`]; cheap to copy into request contexts.
pub type ModelId = usize;

/// The validated configuration. Built only by [`Config::from_raw`].
#[derive(Debug, Clone)]
pub struct Config {
    pub server: Server,
    pub store: Store,
    pub billing: Billing,
    pub limits: Limits,
    pub streaming: Streaming,
    pub security: Security,
    pub models: Vec<Model>,
    pub aliases: Vec<Alias>,
    pub plans: Vec<Plan>,
}

/// Every problem found in a configuration, each naming its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The configuration Quipu runs on when no file is given: three models on a local upstream.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../../conf/quipu.toml");

impl Config {
    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![format!(
                "cannot read {}: {e}; pass --config with the path of a quipu.toml",
                path.display()
            )])
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `origin` names it in messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigErrors(vec![format!("{origin}: {}", e.to_string().trim())]))?;
        Config::from_raw(raw, &|name| std::env::var(name).ok())
    }

    /// Validates a parsed file. `env` looks up `env:NAME` secrets (injected for tests).
    pub fn from_raw(
        raw: RawConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        let RawConfig {
            server,
            store,
            billing,
            limits,
            streaming,
            security,
            models,
            aliases,
            plans,
        } = raw;
        let mut errs = Vec::new();
        let server = server::validate_server(server, env, &mut errs);
        let store = store::validate_store(store, env, &mut errs);
        let billing = store::validate_billing(billing, &mut errs);
        let limits = server::limits(limits);
        let streaming = server::validate_streaming(streaming, &mut errs);
        let security = server::validate_security(security, &mut errs);
        let models = models::validate_models(models, env, &mut errs);
        let aliases = catalog::validate_aliases(aliases, &models, &mut errs);
        let plans = catalog::validate_plans(plans, &mut errs);
        if errs.is_empty() {
            Ok(Config {
                server,
                store,
                billing,
                limits,
                streaming,
                security,
                models,
                aliases,
                plans,
            })
        } else {
            Err(ConfigErrors(errs))
        }
    }

    /// The model a client's name refers to: a slug, else the first matching alias.
    pub fn resolve_model(&self, name: &str) -> Option<&Model> {
        if let Some(m) = self.models.iter().find(|m| m.slug == name) {
            return Some(m);
        }
        self.aliases
            .iter()
            .find(|a| glob_match(&a.pattern, name))
            .map(|a| &self.models[a.model])
    }

    /// `colibri, aguila, apu`: for "unknown model" messages.
    pub fn slug_list(&self) -> String {
        self.models
            .iter()
            .map(|m| format!("`{}`", m.slug))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Resolves the host names of upstream replicas (system resolver, first address), once,
    /// when the server starts. Every failure is reported with its key; two replicas of a model
    /// that turn out to be the same address are an error too.
    pub fn resolve_upstreams(self) -> Result<Config, ConfigErrors> {
        self.resolve_upstreams_with(&|host, port| {
            (host, port).to_socket_addrs().map(|a| a.collect())
        })
    }

    /// [`Config::resolve_upstreams`] with an injected resolver (for tests).
    pub fn resolve_upstreams_with(
        mut self,
        resolve: &dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    ) -> Result<Config, ConfigErrors> {
        let mut errs = Vec::new();
        for (i, m) in self.models.iter_mut().enumerate() {
            for (j, r) in m.replicas.iter_mut().enumerate() {
                if r.is_resolved() {
                    continue;
                }
                match resolve(&r.host, r.port) {
                    Ok(addrs) => match addrs.first() {
                        Some(a) => r.addr = *a,
                        None => errs.push(format!(
                            "models[{i}].upstreams[{j}]: \"{}\" resolves to no address",
                            r.host
                        )),
                    },
                    Err(e) => errs.push(format!(
                        "models[{i}].upstreams[{j}]: cannot resolve \"{}\": {e}",
                        r.host
                    )),
                }
            }
            for (j, r) in m.replicas.iter().enumerate() {
                if let Some(k) = m.replicas[..j]
                    .iter()
                    .position(|o| o.is_resolved() && o.addr == r.addr)
                {
                    errs.push(format!(
                        "models[{i}].upstreams[{j}] (\"{}\") is the same server as upstreams[{k}] ({})",
                        r.url, r.addr
                    ));
                }
            }
        }
        if errs.is_empty() {
            Ok(self)
        } else {
            Err(ConfigErrors(errs))
        }
    }
}
