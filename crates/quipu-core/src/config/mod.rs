//! The gateway's configuration: `conf/quipu.toml`, parsed once and validated once.
//!
//! Two types, as in TensorZero and River: [`RawConfig`] is the file's shape (serde,
//! `deny_unknown_fields`, optional fields with defaults), and [`Config`] is what the rest of
//! the gateway reads: every value resolved, every secret looked up, every address parsed, no
//! `Option` standing for "not yet known". [`Config::from_raw`] collects *every* problem and
//! names the full key of each ("models[1].prices.input: …"), so one run of
//! `quipu serve --check` shows them all.
//!
//! Secrets may come from the environment: a string value `"env:NAME"` is replaced by the
//! variable `NAME` (an error names it if it is unset), looked up through a function the caller
//! passes (see [`secrets`]).
//!
//! No I/O here: the core reads no file, no environment variable and no DNS. The binary reads
//! the file and passes the process environment (`quipu::config_file`), and resolves the host
//! names of upstream replicas once at `serve` start (`quipu::upstream::resolve`); upstream URLs
//! are checked here for syntax only. So `--check`, the CLI's store commands, tests and the
//! `config_parse` fuzz target never touch DNS.
//!
//! Layout, one file per part of the file:
//! - [`raw`]: the serde types (`Raw*`);
//! - [`server`]: `[server]`, `[limits]`, `[streaming]`, `[security]`;
//! - [`store`]: `[store]`, `[billing]`, and [`redact_url`];
//! - [`models`]: `[[models]]`; their replica URLs in [`replica`];
//! - [`catalog`]: `[aliases]` (and [`glob_match`]), `[[plans]]`;
//! - [`responses`]: `[responses]` (stored responses of the Responses API);
//! - [`scheduling`]: `[scheduling]` and each model's `max_concurrency` (the queue);
//! - [`secrets`]: `"env:NAME"` values;
//! - [`webhooks`]: `[[webhooks]]` (the operator's alert endpoints) and `[webhook_delivery]`.

pub mod catalog;
pub mod models;
pub mod raw;
pub mod replica;
pub mod responses;
pub mod scheduling;
pub mod secrets;
pub mod server;
pub mod store;
pub mod webhooks;

#[cfg(test)]
mod tests;

pub use catalog::{glob_match, Alias, Plan};
pub use models::{Health, Model, Routing, Timeouts, UpstreamTls};
pub use raw::{
    RawBilling, RawConfig, RawHealth, RawLimits, RawModel, RawPlan, RawPrices, RawResponses,
    RawScheduling, RawSecurity, RawServer, RawStore, RawStreaming, RawTimeouts, RawTls,
    RawUpstreamTls, RawWebhook, RawWebhookDelivery,
};
pub use replica::{parse_replica, Replica};
pub use responses::Responses;
pub use scheduling::{Capacity, EngineLoadMode, Scheduling};
pub use server::{
    runtime_file_stem, ImageUrlPolicy, LimitEngine, Limits, ReasoningField, Security, Server,
    Streaming, TlsFiles, PINGORA_MAX_HEAD_BYTES,
};
pub use store::{redact_url, Billing, Store};
pub use webhooks::{Webhook, WebhookDelivery};

use std::fmt;

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
    pub responses: Responses,
    pub scheduling: Scheduling,
    pub models: Vec<Model>,
    pub aliases: Vec<Alias>,
    pub plans: Vec<Plan>,
    pub webhooks: Vec<Webhook>,
    pub webhook_delivery: WebhookDelivery,
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

/// An environment that sets no variable: every `"env:NAME"` value is reported unset.
pub fn no_env(_name: &str) -> Option<String> {
    None
}

impl Config {
    /// Parses and validates TOML text with no environment (see [`no_env`]): for tests, fuzzing
    /// and the embedded default. `origin` names the text in messages. The binary reads files
    /// through `quipu::config_file`, which passes the process environment to
    /// [`Config::parse_with_env`].
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
        Config::parse_with_env(text, origin, &no_env)
    }

    /// Parses and validates TOML text; `env` looks up `"env:NAME"` secrets.
    pub fn parse_with_env(
        text: &str,
        origin: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| ConfigErrors(vec![format!("{origin}: {}", e.to_string().trim())]))?;
        Config::from_raw(raw, env)
    }

    /// Validates a parsed file. `env` looks up `"env:NAME"` secrets.
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
            responses,
            scheduling,
            models,
            aliases,
            plans,
            webhooks,
            webhook_delivery,
        } = raw;
        let mut errs = Vec::new();
        let server = server::validate_server(server, env, &mut errs);
        let store = store::validate_store(store, env, &mut errs);
        let billing = store::validate_billing(billing, &mut errs);
        let limits = server::limits(limits, &mut errs);
        let streaming = server::validate_streaming(streaming, &mut errs);
        let security = server::validate_security(security, &mut errs);
        let responses = responses::validate_responses(responses, &mut errs);
        let scheduling = scheduling::validate_scheduling(scheduling, &mut errs);
        let models = models::validate_models(models, env, &mut errs);
        let aliases = catalog::validate_aliases(aliases, &models, &mut errs);
        let plans = catalog::validate_plans(plans, &mut errs);
        let webhooks = webhooks::validate_webhooks(webhooks, env, &mut errs);
        let webhook_delivery = webhooks::validate_delivery(webhook_delivery, &mut errs);
        if errs.is_empty() {
            Ok(Config {
                server,
                store,
                billing,
                limits,
                streaming,
                security,
                responses,
                scheduling,
                models,
                aliases,
                plans,
                webhooks,
                webhook_delivery,
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
}
