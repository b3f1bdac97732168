//! `[aliases]` and `[[plans]]`: the other names clients may use for a model (glob patterns)
//! and the plans the catalog lists, validated; [`glob_match`] is the alias matcher.

use super::models::Model;
use super::raw::RawPlan;
use super::ModelId;
use crate::money::{Pen, AMOUNT_DECIMALS};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct Alias {
    pub pattern: String,
    pub model: ModelId,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub id: String,
    pub display_name: String,
    pub price: Pen,
    pub usage_label: String,
    pub web_search: bool,
}

pub(super) fn validate_aliases(
    aliases: BTreeMap<String, String>,
    models: &[Model],
    errs: &mut Vec<String>,
) -> Vec<Alias> {
    let mut out = Vec::new();
    for (pattern, slug) in aliases {
        match models.iter().find(|m| m.slug == slug) {
            Some(m) => out.push(Alias {
                pattern,
                model: m.id,
            }),
            None => errs.push(format!(
                "aliases.\"{pattern}\" points to \"{slug}\", which is not a configured slug"
            )),
        }
    }
    // Most specific first: fewer wildcards, then longer patterns.
    out.sort_by_key(|a| {
        let wild = a.pattern.matches(['*', '?']).count();
        (wild, std::cmp::Reverse(a.pattern.len()))
    });
    out
}

pub(super) fn validate_plans(plans: Vec<RawPlan>, errs: &mut Vec<String>) -> Vec<Plan> {
    let mut out: Vec<Plan> = Vec::new();
    for (i, p) in plans.into_iter().enumerate() {
        if p.id.trim().is_empty() {
            errs.push(format!("plans[{i}].id must not be empty"));
        }
        if out.iter().any(|o| o.id == p.id) {
            errs.push(format!("plans[{i}].id \"{}\" is used twice", p.id));
        }
        let price = Pen::parse(&p.price, AMOUNT_DECIMALS).unwrap_or_else(|e| {
            errs.push(format!("plans[{i}].price: {e}"));
            Pen::ZERO
        });
        out.push(Plan {
            id: p.id,
            display_name: p.display_name,
            price,
            usage_label: p.usage_label,
            web_search: p.web_search,
        });
    }
    out
}

/// Glob match with `*` (any run) and `?` (one char). Iterative, linear in practice.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}
