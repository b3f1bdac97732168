//! Which models a key may use: its model list, as the operator or the tenant wrote it, and
//! what that list allows against the configured catalog.
//!
//! An entry is a model slug (`colibri`), a name the `[aliases]` table resolves (`gpt-4o`,
//! `claude-opus-4-1`, or an alias pattern itself, `claude-opus-*`), or a glob over slugs and
//! alias patterns (`claude-*`, `c*`, `*`; `*` any run, `?` one character, matched by
//! [`glob_match`], the alias matcher). **A list allows a set of models**: each entry stands
//! for the slugs it names, resolves to, or matches, and a glob also for the models of the alias
//! patterns it matches (`claude-*` matches `claude-opus-*`, so it allows `apu`). A request is
//! allowed when the slug its model name resolved to is in the set, whatever name it used: a
//! key limited to `apu` may call it `apu` or `claude-opus-4-1`, and a key limited to
//! `claude-opus-*` may also call it `apu`. A limit is on what the key spends, not on spelling.
//!
//! A list is checked at key creation ([`ModelList::validate`]: every entry must name at least
//! one configured model) and compiled against the catalog in force ([`ModelList::compile`])
//! into [`AllowedModels`], which answers per request without matching any glob. Compile again
//! when the configuration changes: `*` then covers a model added since.
//!
//! ```
//! use quipu_core::governance::models::{Catalog, ModelList};
//! let catalog = Catalog::new(
//!     vec!["colibri", "aguila", "apu"],
//!     vec![("claude-opus-*", "apu"), ("claude-haiku-*", "colibri")],
//! );
//! let list = ModelList::parse("colibri, aguila").unwrap();
//! list.validate(&catalog).unwrap();
//! let allowed = list.compile(&catalog);
//! assert!(allowed.check("colibri", "colibri").is_ok());
//! let refusal = allowed.check("claude-opus-4-1", "apu").unwrap_err();
//! assert_eq!(
//!     refusal.to_string(),
//!     "this key may use colibri, aguila; not claude-opus-4-1 (apu)"
//! );
//! ```

use crate::config::{glob_match, Config};
use std::fmt;

/// Most entries in one list.
pub const MAX_ENTRIES: usize = 64;
/// Longest entry, in bytes.
pub const MAX_ENTRY_LEN: usize = 128;

/// The names a list is checked against: the configured slugs and the `[aliases]` patterns,
/// each with the slug it points to.
#[derive(Clone, Debug)]
pub struct Catalog<'a> {
    slugs: Vec<&'a str>,
    /// `(pattern, slug)`, in the order aliases are tried (most specific first).
    aliases: Vec<(&'a str, &'a str)>,
}

impl<'a> Catalog<'a> {
    /// Slugs in catalog order; aliases in the order they are tried.
    pub fn new(slugs: Vec<&'a str>, aliases: Vec<(&'a str, &'a str)>) -> Catalog<'a> {
        Catalog { slugs, aliases }
    }

    /// The configured slugs, in catalog order.
    pub fn slugs(&self) -> &[&'a str] {
        &self.slugs
    }

    /// `(pattern, slug)` of every alias, in the order they are tried.
    pub fn aliases(&self) -> &[(&'a str, &'a str)] {
        &self.aliases
    }

    /// The configuration's models and aliases.
    pub fn of(config: &'a Config) -> Catalog<'a> {
        let slugs: Vec<&str> = config.models.iter().map(|m| m.slug.as_str()).collect();
        let aliases = config
            .aliases
            .iter()
            .filter_map(|a| Some((a.pattern.as_str(), *slugs.get(a.model)?)))
            .collect();
        Catalog { slugs, aliases }
    }

    /// The slug a model name refers to, by the rule of `Config::resolve_model`: a slug, else
    /// the first alias whose pattern matches.
    fn resolve(&self, name: &str) -> Option<&'a str> {
        if let Some(s) = self.slugs.iter().find(|s| **s == name) {
            return Some(s);
        }
        self.aliases
            .iter()
            .find(|(pattern, _)| glob_match(pattern, name))
            .map(|(_, slug)| *slug)
    }

    /// Whether list entry `entry` stands for model `slug` (see the module docs).
    fn entry_allows(&self, entry: &str, slug: &str) -> bool {
        if is_glob(entry) {
            glob_match(entry, slug)
                || self
                    .aliases
                    .iter()
                    .any(|(pattern, s)| *s == slug && glob_match(entry, pattern))
        } else {
            self.resolve(entry) == Some(slug)
        }
    }

    /// `colibri, aguila, apu`.
    fn slug_list(&self) -> Vec<String> {
        self.slugs.iter().map(|s| (*s).to_owned()).collect()
    }
}

fn is_glob(entry: &str) -> bool {
    entry.contains(['*', '?'])
}

/// A key's model list, checked for form (not yet against a catalog): 1 to [`MAX_ENTRIES`]
/// distinct entries in the order written, each 1 to [`MAX_ENTRY_LEN`] printable ASCII bytes
/// without spaces, commas or quotes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelList(Vec<String>);

impl ModelList {
    /// A list that allows nothing (what a stored list that no longer reads falls back to).
    pub fn nothing() -> ModelList {
        ModelList(Vec::new())
    }

    /// Reads `colibri,aguila` or `colibri, aguila` (the CLI's `--models` and the stored
    /// form).
    pub fn parse(text: &str) -> Result<ModelList, ModelListError> {
        ModelList::new(text.split(','))
    }

    /// A list from separate entries (a JSON array); each is trimmed, repeats are dropped.
    pub fn new<I, S>(entries: I) -> Result<ModelList, ModelListError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<String> = Vec::new();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                return Err(ModelListError::EmptyEntry);
            }
            if entry.len() > MAX_ENTRY_LEN {
                return Err(ModelListError::EntryTooLong(entry.to_owned()));
            }
            if !entry
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b',' | b'"' | b'\'' | b'\\'))
            {
                return Err(ModelListError::BadCharacter(entry.to_owned()));
            }
            if !out.iter().any(|e| e == entry) {
                out.push(entry.to_owned());
            }
            if out.len() > MAX_ENTRIES {
                return Err(ModelListError::TooMany);
            }
        }
        if out.is_empty() {
            return Err(ModelListError::EmptyEntry);
        }
        Ok(ModelList(out))
    }

    /// The entries, as written.
    pub fn entries(&self) -> &[String] {
        &self.0
    }

    /// `colibri,aguila`: the form [`ModelList::parse`] reads back (for storage).
    pub fn to_text(&self) -> String {
        self.0.join(",")
    }

    /// Every entry must name at least one model of `catalog`; the first that names none is
    /// the error, with the slugs there are.
    pub fn validate(&self, catalog: &Catalog<'_>) -> Result<(), ModelListError> {
        for entry in &self.0 {
            if !catalog.slugs.iter().any(|s| catalog.entry_allows(entry, s)) {
                return Err(ModelListError::NamesNoModel {
                    entry: entry.clone(),
                    slugs: catalog.slug_list(),
                });
            }
        }
        Ok(())
    }

    /// The models this list allows in `catalog` (an entry that names none allows nothing).
    pub fn compile(&self, catalog: &Catalog<'_>) -> AllowedModels {
        let slugs = catalog
            .slugs
            .iter()
            .filter(|s| self.0.iter().any(|e| catalog.entry_allows(e, s)))
            .map(|s| (*s).to_owned())
            .collect();
        AllowedModels {
            list: self.clone(),
            slugs,
        }
    }
}

impl fmt::Display for ModelList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

/// Why a model list was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelListError {
    /// No entries, or an empty one (`colibri,,aguila`).
    EmptyEntry,
    /// More than [`MAX_ENTRIES`] distinct entries.
    TooMany,
    /// An entry over [`MAX_ENTRY_LEN`] bytes.
    EntryTooLong(String),
    /// An entry with a space, a comma, a quote or a character outside printable ASCII.
    BadCharacter(String),
    /// An entry that is no slug, resolves through no alias and matches nothing.
    NamesNoModel { entry: String, slugs: Vec<String> },
}

impl fmt::Display for ModelListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelListError::EmptyEntry => f.write_str(
                "a model list has one or more names separated by commas, none empty; leave the list out to allow every model",
            ),
            ModelListError::TooMany => {
                write!(f, "a model list has at most {MAX_ENTRIES} entries")
            }
            ModelListError::EntryTooLong(e) => write!(
                f,
                "model list entry \"{}…\" is longer than {MAX_ENTRY_LEN} characters",
                e.get(..32).unwrap_or(e)
            ),
            ModelListError::BadCharacter(e) => write!(
                f,
                "model list entry \"{e}\" may not contain spaces, commas, quotes or non-ASCII characters"
            ),
            ModelListError::NamesNoModel { entry, slugs } => write!(
                f,
                "model list entry \"{entry}\" is not a model, an alias or a pattern that matches one; the models are {}",
                slugs.join(", ")
            ),
        }
    }
}

impl std::error::Error for ModelListError {}

/// A model list compiled against a catalog: the slugs it allows, in catalog order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedModels {
    list: ModelList,
    slugs: Vec<String>,
}

impl AllowedModels {
    /// The list as written.
    pub fn list(&self) -> &ModelList {
        &self.list
    }

    /// The slugs allowed, in catalog order.
    pub fn slugs(&self) -> &[String] {
        &self.slugs
    }

    /// Whether model `slug` is allowed.
    pub fn allows(&self, slug: &str) -> bool {
        self.slugs.iter().any(|s| s == slug)
    }

    /// A request for model name `requested`, which resolved to `slug`: allowed, or why not.
    pub fn check(&self, requested: &str, slug: &str) -> Result<(), ModelNotAllowed> {
        if self.allows(slug) {
            return Ok(());
        }
        Err(ModelNotAllowed {
            requested: requested.to_owned(),
            slug: slug.to_owned(),
            allowed: self.slugs.clone(),
        })
    }

    /// The slugs `self` allows that `limit` does not, in catalog order (empty: a subset).
    pub fn beyond(&self, limit: &AllowedModels) -> Vec<String> {
        self.slugs
            .iter()
            .filter(|s| !limit.allows(s))
            .cloned()
            .collect()
    }
}

/// A request for a model its key may not use (403 `permission_error` / `model_not_allowed`).
/// `Display` is the client's message: `this key may use colibri, aguila; not apu`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelNotAllowed {
    /// The model name as the client sent it.
    pub requested: String,
    /// The slug it resolved to.
    pub slug: String,
    /// The slugs the key may use, in catalog order.
    pub allowed: Vec<String>,
}

impl fmt::Display for ModelNotAllowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allowed.is_empty() {
            f.write_str("this key may use no configured model")?;
        } else {
            write!(f, "this key may use {}", self.allowed.join(", "))?;
        }
        if self.requested == self.slug {
            write!(f, "; not {}", self.slug)
        } else {
            write!(f, "; not {} ({})", self.requested, self.slug)
        }
    }
}

#[cfg(test)]
#[path = "models_tests.rs"]
mod tests;
