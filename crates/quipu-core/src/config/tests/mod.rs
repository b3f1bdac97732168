//! The configuration's tests, by topic: [`validation`] (defaults, bounds, every problem
//! reported with its key), [`replicas`] (upstream URLs), [`catalog`] (the shipped file, model
//! names and aliases). [`parse`] and [`MINIMAL`] are shared.

use super::*;
use crate::money::{Pen, Rate};
use std::path::PathBuf;
use std::time::Duration;

mod catalog;
mod replicas;
mod validation;

/// Validates `text` with no environment, keeping serde's message as is.
fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigErrors(vec![e.to_string()]))?;
    Config::from_raw(raw, &no_env)
}

/// The smallest valid file: one model, everything else defaulted.
const MINIMAL: &str = r#"
[[models]]
slug = "colibri"
display_name = "Colibrí"
upstream_model = "qwen"
upstreams = ["http://127.0.0.1:8000"]
prices = { input = "0.20", cached = "0.05", output = "0.80" }
"#;
