//! The configuration as the binary reads it: a file from disk, secrets from the process
//! environment.
//!
//! `quipu_core::config` does no I/O: it validates text and looks `"env:NAME"` secrets up
//! through a function it is given. This module is where that text and that function come from
//! for `quipu` itself. (Upstream host names are resolved at `serve` start by
//! [`crate::upstream::resolve`].)

use crate::config::{Config, ConfigErrors};
use std::path::Path;

/// Reads, parses and validates a file, with the process environment for secrets.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![format!(
            "cannot read {}: {e}; pass --config with the path of a quipu.toml",
            path.display()
        )])
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates TOML text, with the process environment for secrets; `origin` names it
/// in messages.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
    Config::parse_with_env(text, origin, &process_env)
}

/// A variable of the process environment (`None` if unset or not UTF-8).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_says_how_to_point_at_one() {
        let e = load(Path::new("/nonexistent/quipu.toml")).unwrap_err();
        assert!(
            e.0[0].starts_with("cannot read /nonexistent/quipu.toml"),
            "{e}"
        );
        assert!(e.0[0].contains("--config"), "{e}");
    }

    #[test]
    fn secrets_come_from_the_process_environment() {
        // PATH is set wherever the tests run; a secret naming it gets its value.
        let Some(path) = process_env("PATH") else {
            return;
        };
        let text = crate::config::EMBEDDED_DEFAULT.replacen(
            "url = \"sqlite://data/quipu.db\"",
            "url = \"env:PATH\"",
            1,
        );
        let e = parse(&text, "t").unwrap_err();
        // PATH is no store URL: the message shows the value that was read.
        assert!(e.0[0].contains(&format!("got \"{path}\"")), "{e}");
        let e = Config::parse(&text, "t").unwrap_err();
        assert!(
            e.0[0].contains("environment variable PATH is not set"),
            "{e}"
        );
    }
}
