//! Ledger spill files: where the ledger writer puts the rows it could not store before a
//! shutdown, so that an unreachable store costs no charge.
//!
//! A spill file is JSON Lines: one ledger row per line, as [`LedgerRow::to_json`] writes it
//! (money as decimal strings of integer pico-soles), plus `"replica"`, the replica that admitted
//! the request. `quipu ledger import` replays such files through the store's normal,
//! idempotent ledger write (see [`crate::ops::import_ledger`]).
//!
//! Files are named `ledger-spill-<replica>-<UTC time>.jsonl` and written to a hidden temporary
//! name first (`.ledger-spill-….jsonl.tmp`), fsynced, then renamed, and the directory fsynced:
//! a file with the final name is always complete. An imported file is renamed to
//! `….jsonl.imported`. `quipu serve` warns at start about files still to import
//! ([`pending`]); it never imports them itself.

use crate::store::LedgerRow;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const PREFIX: &str = "ledger-spill-";
pub const SUFFIX: &str = ".jsonl";
/// Appended to a file's name once it has been imported.
pub const IMPORTED_SUFFIX: &str = ".imported";
/// Appended to a file while it is written; such a file is incomplete.
pub const TEMP_SUFFIX: &str = ".tmp";

/// One spilled row: the replica that admitted the request, and the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spilled {
    pub replica: String,
    pub row: LedgerRow,
}

/// One line of a spill file as written: the replica, then the row's fields.
#[derive(serde::Serialize)]
struct Line<'a> {
    replica: &'a str,
    #[serde(flatten)]
    row: &'a LedgerRow,
}

/// One line of a spill file (without the newline).
pub fn encode_line(replica: &str, row: &LedgerRow) -> String {
    #[expect(
        clippy::expect_used,
        reason = "a ledger row and a string under fixed names always serialize"
    )]
    serde_json::to_string(&Line { replica, row }).expect("a spill line serializes")
}

/// Reads one line of a spill file.
pub fn decode_line(line: &str) -> Result<Spilled, String> {
    let mut o = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(o)) => o,
        Ok(_) => return Err("a spilled row must be a JSON object".into()),
        Err(e) => {
            return Err(format!(
                "not JSON ({e}); the file may be damaged or cut short"
            ))
        }
    };
    let replica = match o.remove("replica") {
        Some(serde_json::Value::String(r)) => r,
        Some(other) => return Err(format!("field \"replica\" must be a string, got {other}")),
        None => return Err("field \"replica\" is missing".into()),
    };
    let row = LedgerRow::from_json_value(serde_json::Value::Object(o))?;
    Ok(Spilled { replica, row })
}

/// A replica id as a file-name part: `host:123~9f…` → `host_123_9f…`.
fn file_safe(replica: &str) -> String {
    let s: String = replica
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    if s.is_empty() {
        "replica".into()
    } else {
        s
    }
}

/// Writes `rows` of `replica` to a new spill file in `dir` (created if missing) and returns its
/// path. The file appears under its final name only once complete and on disk.
pub fn write(dir: &Path, replica: &str, rows: &[LedgerRow]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string();
    let base = format!("{PREFIX}{}-{stamp}", file_safe(replica));
    // Two spills in one millisecond by one replica cannot happen in practice (one per process
    // exit), but a name is never reused: an existing file is never overwritten.
    let mut name = format!("{base}{SUFFIX}");
    let mut n = 1;
    while dir.join(&name).exists() || dir.join(format!("{name}{IMPORTED_SUFFIX}")).exists() {
        name = format!("{base}-{n}{SUFFIX}");
        n += 1;
    }
    let path = dir.join(&name);
    let temp = dir.join(format!(".{name}{TEMP_SUFFIX}"));
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        let mut out = std::io::BufWriter::new(file);
        for row in rows {
            out.write_all(encode_line(replica, row).as_bytes())?;
            out.write_all(b"\n")?;
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, &path)?;
        // The rename itself must survive a power cut too.
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

/// Reads a whole spill file. An error names the file and the line, and nothing of the file is
/// returned: a damaged file is not imported in part.
pub fn read(path: &Path) -> Result<Vec<Spilled>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the spill file {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let spilled = decode_line(line).map_err(|e| {
            format!(
                "{}:{}: not a spilled ledger row: {e}; fix or remove that line and import again \
                 (rows already imported are skipped)",
                path.display(),
                i + 1
            )
        })?;
        out.push(spilled);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        return Err(format!(
            "{}: the last line has no newline, so the file may be cut short; check it, add the \
             newline and import again",
            path.display()
        ));
    }
    Ok(out)
}

/// Spill files in `dir` not yet imported, oldest name first, and incomplete ones (a process
/// that died while writing one): `(complete, incomplete)`. A missing directory has none.
pub fn pending(dir: &Path) -> std::io::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => return Err(e),
    };
    let (mut complete, mut incomplete) = (Vec::new(), Vec::new());
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
            complete.push(entry.path());
        } else if name.starts_with(&format!(".{PREFIX}")) && name.ends_with(TEMP_SUFFIX) {
            incomplete.push(entry.path());
        }
    }
    complete.sort();
    incomplete.sort();
    Ok((complete, incomplete))
}

/// The name an imported file is given: `x.jsonl` → `x.jsonl.imported` (unchanged if it has it).
pub fn imported_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.ends_with(IMPORTED_SUFFIX) {
        path.to_path_buf()
    } else {
        path.with_file_name(format!("{name}{IMPORTED_SUFFIX}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Pen;

    fn row(id: &str, picos: i128) -> LedgerRow {
        LedgerRow {
            request_id: id.into(),
            at: 1_793_491_200_000,
            tenant_id: 3,
            key_id: "key_x".into(),
            model: "apu".into(),
            format: "chat".into(),
            input_tokens: 10,
            cached_tokens: 2,
            output_tokens: 5,
            charge: Pen::from_picos(picos),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
            caps: Vec::new(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "quipu-spill-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_spill_file_reads_back_exactly_and_is_listed_until_imported() {
        let dir = scratch("roundtrip").join("nested");
        let rows = vec![
            row("a", 1),
            row("b", i128::MAX),
            row("c", 123_456_789_012_345_678),
        ];
        let path = write(&dir, "host:12~00ff", &rows).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("ledger-spill-host_12_00ff-"), "{name}");
        assert!(name.ends_with(".jsonl"), "{name}");
        let back = read(&path).unwrap();
        assert_eq!(back.len(), 3);
        assert!(back.iter().all(|s| s.replica == "host:12~00ff"));
        assert_eq!(back.into_iter().map(|s| s.row).collect::<Vec<_>>(), rows);
        // One row per line, nothing else; no temporary file left behind.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("\"charge_picos\":\"170141183460469231731687303715884105727\""));
        let (complete, incomplete) = pending(&dir).unwrap();
        assert_eq!(complete, vec![path.clone()]);
        assert!(incomplete.is_empty());
        // A second spill never overwrites the first.
        let second = write(&dir, "host:12~00ff", &rows[..1]).unwrap();
        assert_ne!(second, path);
        assert_eq!(read(&path).unwrap().len(), 3);
        // Imported files and others are not pending; a temporary one is reported as incomplete.
        std::fs::rename(&second, imported_name(&second)).unwrap();
        std::fs::write(dir.join(".ledger-spill-x.jsonl.tmp"), "{").unwrap();
        std::fs::write(dir.join("notes.txt"), "").unwrap();
        let (complete, incomplete) = pending(&dir).unwrap();
        assert_eq!(complete, vec![path.clone()]);
        assert_eq!(incomplete, vec![dir.join(".ledger-spill-x.jsonl.tmp")]);
        assert_eq!(imported_name(&path).extension().unwrap(), "imported");
        assert_eq!(imported_name(&imported_name(&path)), imported_name(&path));
        assert_eq!(
            pending(&dir.join("missing")).unwrap(),
            (Vec::new(), Vec::new())
        );
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn lines_read_back_and_so_do_those_of_older_versions() {
        let row = row("a", 1_050_000);
        assert_eq!(
            decode_line(&encode_line("host:12~00ff", &row)),
            Ok(Spilled {
                replica: "host:12~00ff".into(),
                row: row.clone()
            })
        );
        // As the hand-written encoder of earlier versions wrote it: keys sorted.
        let older = "{\"at\":1793491200000,\"cached_tokens\":\"2\",\"charge_picos\":\"1050000\",\
                     \"format\":\"chat\",\"http_status\":200,\"input_estimated\":false,\
                     \"input_tokens\":\"10\",\"key_id\":\"key_x\",\"model\":\"apu\",\
                     \"output_tokens\":\"5\",\"replica\":\"host:12~00ff\",\"request_id\":\"a\",\
                     \"status\":\"ok\",\"tenant_id\":3,\"unbilled_picos\":\"0\"}";
        assert_eq!(
            decode_line(older),
            Ok(Spilled {
                replica: "host:12~00ff".into(),
                row
            })
        );
    }

    #[test]
    fn a_damaged_file_is_refused_naming_the_line() {
        let dir = scratch("damaged");
        std::fs::create_dir_all(&dir).unwrap();
        let good = encode_line("r1", &row("a", 5));
        let cases = [
            (format!("{good}\n{{\"replica\":\"r1\"}}\n"), ":2:"),
            (format!("{good}\n{}", &good[..good.len() - 4]), ":2:"),
            (format!("{good}\n{good}"), "no newline"),
            (
                format!("{}\n", good.replace("\"replica\":\"r1\",", "")),
                "replica",
            ),
        ];
        for (text, needle) in cases {
            let path = dir.join("f.jsonl");
            std::fs::write(&path, &text).unwrap();
            let e = read(&path).unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
            assert!(e.contains("f.jsonl"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
