//! Secrets written as `"env:NAME"`: the value of `NAME` from an injected lookup.
//!
//! The core never reads the process environment itself: [`Config::parse`](super::Config::parse)
//! passes a lookup that knows no variable (tests, fuzzing, the embedded default), and the
//! binary passes `std::env::var` (`quipu::config_file`). Any other value is taken as written.

/// `value`, or the variable it names with `env:NAME` (an error names `key` if it is unset).
pub(super) fn secret(
    value: &str,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<String>,
) -> String {
    match value.strip_prefix("env:") {
        Some(name) => env(name).unwrap_or_else(|| {
            errs.push(format!(
                "{key} says \"env:{name}\" but the environment variable {name} is not set"
            ));
            String::new()
        }),
        None => value.to_owned(),
    }
}
