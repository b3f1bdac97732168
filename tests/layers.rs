//! The binary's modules import only downward: each top-level module of `src/` sits in a layer,
//! and a `crate::…` path in its code (tests and comments aside) may only name a module of a
//! lower layer or the pure core (`quipu_core`, re-exported at the crate root). So there is no
//! import cycle and no upward import; a new module must be placed here before it compiles into
//! the suite's good graces.
//!
//! A source scan rather than a compiler check: Rust allows cycles between modules of one
//! crate, so the order is a rule of this project, kept by this test.

#![expect(
    clippy::unwrap_used,
    reason = "a test: an unreadable source tree is the test failing"
)]

use std::collections::BTreeMap;
use std::path::Path;

/// Lowest first. A module may use the modules of the layers before its own.
const LAYERS: &[&[&str]] = &[
    &["threads", "keys"],
    &["logger", "metrics", "store"],
    &["ratelimit", "billing", "catalog", "http", "web"],
    &["auth", "upstream", "ops", "webhooks"],
    &["proxy", "admin", "config_file"],
    &["server"],
];

/// The core's modules, re-exported at the crate root: below every layer.
const CORE: &[&str] = &[
    "account",
    "ascii",
    "config",
    "error",
    "governance",
    "h1",
    "money",
    "protocol",
    "route",
    "schedule",
    "sse",
    "translate",
    "upstream_profile",
    "usage",
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The code of a file without its `#[cfg(test)]` tail and its comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules each module's code names through `crate::`.
fn uses(src: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let mut found: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_owned();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.extension().is_none_or(|e| e != "rs")
                || matches!(module.as_str(), "lib" | "main")
                || name == "tests.rs"
            {
                continue;
            }
            let text = code(&std::fs::read_to_string(&path).unwrap());
            for (i, _) in text.match_indices("crate::") {
                let rest = &text[i + "crate::".len()..];
                let used: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if used != module && !CORE.contains(&used.as_str()) && !used.is_empty() {
                    found
                        .entry(module.clone())
                        .or_default()
                        .push((used, rel.display().to_string()));
                }
            }
        }
    }
    found
}

#[test]
fn modules_import_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (module, used) in uses(&src) {
        let Some(from) = layer_of(&module) else {
            broken.push(format!("src/{module} is in no layer of tests/layers.rs"));
            continue;
        };
        for (target, file) in used {
            match layer_of(&target) {
                Some(to) if to < from => {}
                Some(_) => broken.push(format!(
                    "src/{file} ({module}, layer {from}) uses crate::{target}, which is not below it"
                )),
                None => broken.push(format!(
                    "src/{file} uses crate::{target}, which is in no layer of tests/layers.rs"
                )),
            }
        }
    }
    if !broken.is_empty() {
        panic!("{}", broken.join("\n"));
    }
}

#[test]
fn the_scan_sees_an_upward_import() {
    let dir = std::env::temp_dir().join(format!("quipu-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("store")).unwrap();
    std::fs::write(dir.join("store/mod.rs"), "use crate::proxy::Gateway;\n").unwrap();
    std::fs::write(dir.join("auth.rs"), "// crate::server in a comment\n").unwrap();
    let found = uses(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found["store"],
        vec![("proxy".to_owned(), "store/mod.rs".to_owned())]
    );
    assert!(!found.contains_key("auth"), "comments are not imports");
}
