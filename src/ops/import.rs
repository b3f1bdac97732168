//! `quipu ledger import FILE…`: the rows of ledger spill files (see `billing::spill`) written
//! through the store's idempotent ledger write, and the files renamed once imported.

use super::text::soles_text;
use super::{OpsError, OpsResult, Render};
use crate::billing::spill;
use crate::money::{self, Pen};
use crate::store::{LedgerStore, StoreError, TenantId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A spilled row the store refused for good (see `billing::ledger`): now in the dead-letter
/// table `ledger_rejects`, its charge not applied, for the operator to settle by hand.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImportRejected {
    pub request_id: String,
    pub tenant_id: TenantId,
    /// Exact soles.
    pub charge: String,
    pub reason: String,
}

/// What the new rows of an import charged one tenant.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantCharged {
    pub tenant_id: TenantId,
    pub new_rows: u64,
    /// Exact soles.
    pub charged: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImportedFile {
    pub file: String,
    /// Its name now (`….imported`).
    pub renamed_to: String,
    pub rows: u64,
    /// Request ids of the rows written now: their charges were applied now.
    pub new: Vec<String>,
    /// Request ids already in the ledger (an earlier import, or the store got them before the
    /// shutdown gave up): nothing was charged for them now.
    pub duplicate: Vec<String>,
    pub rejected: Vec<ImportRejected>,
    /// Exact soles charged by the new rows, in all.
    pub charged: String,
    pub per_tenant: Vec<TenantCharged>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ImportTotals {
    pub rows: u64,
    pub new: u64,
    pub duplicate: u64,
    pub rejected: u64,
    /// Exact soles.
    pub charged: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LedgerImport {
    pub files: Vec<ImportedFile>,
    pub totals: ImportTotals,
}

impl Render for LedgerImport {
    fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            let renamed = if f.renamed_to == f.file {
                String::new()
            } else {
                format!(" Renamed to {}.", f.renamed_to)
            };
            out.push_str(&format!(
                "{}: {} rows. {} new, charged {} (exact {}); {} already in the ledger, nothing \
                 charged for them; {} rejected.{renamed}\n",
                f.file,
                f.rows,
                f.new.len(),
                soles_text(&f.charged),
                f.charged,
                f.duplicate.len(),
                f.rejected.len(),
            ));
            for t in &f.per_tenant {
                out.push_str(&format!(
                    "  tenant {}: {} new rows, charged {} (exact {})\n",
                    t.tenant_id,
                    t.new_rows,
                    soles_text(&t.charged),
                    t.charged
                ));
            }
            for r in &f.rejected {
                out.push_str(&format!(
                    "  rejected {} of tenant {} (charge {}, NOT applied): {}; it is in the \
                     ledger_rejects table for you to settle by hand\n",
                    r.request_id, r.tenant_id, r.charge, r.reason
                ));
            }
        }
        if self.files.len() > 1 {
            out.push_str(&format!(
                "In all: {} rows, {} new (charged {}, exact {}), {} duplicate, {} rejected.\n",
                self.totals.rows,
                self.totals.new,
                soles_text(&self.totals.charged),
                self.totals.charged,
                self.totals.duplicate,
                self.totals.rejected
            ));
        }
        out
    }
}

/// `quipu ledger import FILE…`: writes the rows of ledger spill files (see `billing::spill`)
/// through the store's normal ledger write, exactly as the gateway's writer would have:
/// idempotent by request id (a row already in the ledger is skipped, so importing twice, or
/// importing rows the store got after all, never charges twice); each new row lowers its
/// tenant's balance by its charge once, and the lease of the replica that admitted it if that
/// lease still exists (it held the money the request spent; a lease gone since, dropped at the
/// replica's restart or reclaimed as stale, has nothing left to lower, and no other replica's
/// lease is touched). A row the store refuses for good goes to the dead-letter table, as in the
/// gateway. Each fully imported file is renamed to `FILE.imported`.
///
/// Every file is read and checked before anything is written: a damaged file fails the
/// command with its name and line, and nothing is imported.
pub async fn import_ledger(
    store: &(impl LedgerStore + ?Sized),
    files: &[PathBuf],
) -> OpsResult<LedgerImport> {
    if files.is_empty() {
        return Err(OpsError::Invalid(
            "name the spill files to import, e.g. quipu ledger import data/ledger-spill/*.jsonl"
                .into(),
        ));
    }
    let mut parsed = Vec::with_capacity(files.len());
    for path in files {
        parsed.push((path, spill::read(path).map_err(OpsError::Invalid)?));
    }
    let mut out = Vec::with_capacity(parsed.len());
    for (path, rows) in parsed {
        out.push(import_file(store, path, rows).await?);
    }
    let mut totals = ImportTotals {
        rows: 0,
        new: 0,
        duplicate: 0,
        rejected: 0,
        charged: String::new(),
    };
    let mut charged = Pen::ZERO;
    for f in &out {
        totals.rows += f.rows;
        totals.new += f.new.len() as u64;
        totals.duplicate += f.duplicate.len() as u64;
        totals.rejected += f.rejected.len() as u64;
        charged += pen_of(&f.charged);
    }
    totals.charged = charged.to_decimal();
    Ok(LedgerImport { files: out, totals })
}

/// An exact decimal from [`Pen::to_decimal`] back to a [`Pen`] (non-negative here).
fn pen_of(decimal: &str) -> Pen {
    Pen::parse(decimal, money::SCALE_DIGITS).unwrap_or(Pen::ZERO)
}

async fn import_file(
    store: &(impl LedgerStore + ?Sized),
    path: &Path,
    rows: Vec<spill::Spilled>,
) -> OpsResult<ImportedFile> {
    let n = rows.len();
    let interrupted = |i: usize, e: StoreError| {
        OpsError::Store(format!(
            "{e} while importing row {} of {n} of {}; nothing is lost and nothing was charged \
             twice: rows imported so far are recognised by their request id, so run the same \
             command again once the store in store.url is reachable",
            i + 1,
            path.display()
        ))
    };
    let (mut new, mut duplicate, mut rejected) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_tenant: BTreeMap<TenantId, (u64, Pen)> = BTreeMap::new();
    for (i, s) in rows.into_iter().enumerate() {
        match store.record(&s.replica, std::slice::from_ref(&s.row)).await {
            Ok(r) if r.new == 0 => duplicate.push(s.row.request_id),
            Ok(_) => {
                let t = per_tenant.entry(s.row.tenant_id).or_default();
                t.0 += 1;
                t.1 += s.row.charge;
                new.push(s.row.request_id);
            }
            Err(e) if e.is_transient() => return Err(interrupted(i, e)),
            Err(e) => {
                let reason = e.to_string();
                store
                    .reject(&s.row, &reason)
                    .await
                    .map_err(|e| interrupted(i, e))?;
                rejected.push(ImportRejected {
                    request_id: s.row.request_id,
                    tenant_id: s.row.tenant_id,
                    charge: s.row.charge.to_decimal(),
                    reason,
                });
            }
        }
    }
    let renamed = spill::imported_name(path);
    if renamed != path {
        std::fs::rename(path, &renamed).map_err(|e| {
            OpsError::Invalid(format!(
                "every row of {} is in the store now, but renaming the file to {} failed: {e}; \
                 rename it by hand (importing it again is harmless: it adds nothing)",
                path.display(),
                renamed.display()
            ))
        })?;
    }
    let charged: Pen = per_tenant.values().map(|t| t.1).sum();
    Ok(ImportedFile {
        file: path.display().to_string(),
        renamed_to: renamed.display().to_string(),
        rows: n as u64,
        new,
        duplicate,
        rejected,
        charged: charged.to_decimal(),
        per_tenant: per_tenant
            .into_iter()
            .map(|(tenant_id, (new_rows, charged))| TenantCharged {
                tenant_id,
                new_rows,
                charged: charged.to_decimal(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{ledger_row, mem, min};
    use super::super::{create_tenant, top_up};
    use super::*;

    #[tokio::test]
    async fn ledger_import_checks_every_file_first_and_sets_refused_rows_aside() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap().id;
        top_up(&*s, "acme", "10.00", "", min(), None).await.unwrap();
        let dir = std::env::temp_dir().join(format!(
            "quipu-ops-import-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let row = |id: &str, tenant: TenantId, picos: i128| ledger_row(id, tenant, "apu", picos);
        let good = spill::write(&dir, "r~1", &[row("a", t, 1_000), row("orphan", 404, 5)]).unwrap();
        let damaged = dir.join("ledger-spill-damaged.jsonl");
        std::fs::write(&damaged, "{\"replica\":\"r\"}\n").unwrap();

        // A damaged file fails the command before anything of any file is written.
        let e = import_ledger(&*s, &[good.clone(), damaged.clone()])
            .await
            .unwrap_err();
        assert!(e.message().contains("ledger-spill-damaged.jsonl:1"), "{e}");
        assert!(s.ledger_rows(None).await.unwrap().is_empty());
        assert!(good.exists());

        let done = import_ledger(&*s, std::slice::from_ref(&good))
            .await
            .unwrap();
        assert_eq!(done.files[0].new, vec!["a".to_owned()]);
        assert_eq!(done.files[0].rejected[0].request_id, "orphan");
        assert_eq!(done.totals.charged, "0.000000001");
        let text = done.text();
        assert!(
            text.contains("1 new") && text.contains("1 rejected"),
            "{text}"
        );
        assert!(
            text.contains("ledger_rejects") && text.contains("Renamed to"),
            "{text}"
        );
        assert_eq!(s.rejected_rows().await.unwrap()[0].request_id, "orphan");
        assert_eq!(
            s.balance(t).await.unwrap().balance,
            Pen::from_centimos(1000) - Pen::from_picos(1_000)
        );
        let json = serde_json::to_value(&done).unwrap();
        assert_eq!(json["files"][0]["per_tenant"][0]["charged"], "0.000000001");
        let e = import_ledger(&*s, &[]).await.unwrap_err();
        assert!(e.message().contains("quipu ledger import"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
