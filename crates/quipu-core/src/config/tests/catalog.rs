//! The shipped configuration, model names and aliases.

use super::*;

#[test]
fn embedded_default_is_valid() {
    let c = Config::parse(EMBEDDED_DEFAULT, "embedded").unwrap();
    let slugs: Vec<_> = c.models.iter().map(|m| m.slug.as_str()).collect();
    assert_eq!(slugs, ["colibri", "aguila", "apu"]);
    assert!(!c.plans.is_empty());
    assert_eq!(
        c.resolve_model("claude-opus-5-5").map(|m| m.slug.as_str()),
        Some("apu")
    );
    assert_eq!(
        c.resolve_model("claude-haiku-4-5").map(|m| m.slug.as_str()),
        Some("colibri")
    );
}

#[test]
fn globs() {
    assert!(glob_match("claude-opus-*", "claude-opus-5-5"));
    assert!(glob_match("*sonnet*", "claude-sonnet-4"));
    assert!(glob_match("gpt-?o", "gpt-4o"));
    assert!(!glob_match("claude-opus-*", "claude-haiku-4"));
    assert!(glob_match("*", ""));
    assert!(!glob_match("a", ""));
    assert!(glob_match("a*b*c", "axxbyyc"));
    assert!(!glob_match("a*b*c", "axxbyy"));
}
