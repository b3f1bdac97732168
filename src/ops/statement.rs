//! `quipu statement` and `GET /admin/statement`: a tenant's charges per model and top-ups over
//! a period, with the exact amounts beside the céntimos.

use super::tenants::tenant_id;
use super::text::{align_decimals, group_digits, human_time_text, rfc3339, soles_text, Table};
use super::{OpsError, OpsResult, Render};
use crate::store::{Store, TenantId, UnixMs};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ModelLine {
    pub model: String,
    pub requests: u64,
    /// All prompt tokens, cached ones included.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Exact soles.
    pub charge: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopUpLine {
    pub id: String,
    pub at: String,
    /// Exact soles.
    pub amount: String,
    pub note: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// Exact soles.
    pub charges: String,
    /// Exact soles.
    pub top_ups: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StatementReport {
    pub tenant: String,
    pub tenant_id: TenantId,
    /// Start of the period (inclusive), RFC 3339; `null` = since the beginning.
    pub from: Option<String>,
    /// End of the period (exclusive), RFC 3339; `null` = up to now.
    pub to: Option<String>,
    pub models: Vec<ModelLine>,
    pub top_ups: Vec<TopUpLine>,
    pub totals: Totals,
    /// The balance now (not at `to`), exact soles.
    pub balance: String,
}

impl Render for StatementReport {
    fn text(&self) -> String {
        let mut out = format!(
            "Statement for {} (tenant {})\nPeriod: {} to {} (end exclusive)\n\n",
            self.tenant,
            self.tenant_id,
            self.from
                .as_deref()
                .map_or_else(|| "the beginning".into(), human_time_text),
            self.to
                .as_deref()
                .map_or_else(|| "now".into(), human_time_text),
        );
        if self.models.is_empty() {
            out.push_str("No requests in this period.\n");
        } else {
            let mut t = Table::new(&[
                ("MODEL", false),
                ("REQUESTS", true),
                ("INPUT TOKENS", true),
                ("CACHED", true),
                ("OUTPUT TOKENS", true),
                ("CHARGE", true),
                ("EXACT (S/)", true),
            ]);
            let tt = &self.totals;
            let mut exact: Vec<String> = self.models.iter().map(|m| m.charge.clone()).collect();
            exact.push(tt.charges.clone());
            let exact = align_decimals(&exact);
            for (m, exact) in self.models.iter().zip(&exact) {
                t.row(vec![
                    m.model.clone(),
                    group_digits(m.requests),
                    group_digits(m.input_tokens),
                    group_digits(m.cached_tokens),
                    group_digits(m.output_tokens),
                    soles_text(&m.charge),
                    exact.clone(),
                ]);
            }
            t.row(vec![
                "TOTAL".into(),
                group_digits(tt.requests),
                group_digits(tt.input_tokens),
                group_digits(tt.cached_tokens),
                group_digits(tt.output_tokens),
                soles_text(&tt.charges),
                exact.last().cloned().unwrap_or_default(),
            ]);
            out.push_str(&t.render());
        }
        out.push('\n');
        if self.top_ups.is_empty() {
            out.push_str("No top-ups in this period.\n");
        } else {
            let mut t = Table::new(&[
                ("TOP-UP", false),
                ("DATE", false),
                ("AMOUNT", true),
                ("NOTE", false),
            ]);
            for u in &self.top_ups {
                t.row(vec![
                    u.id.clone(),
                    human_time_text(&u.at),
                    soles_text(&u.amount),
                    u.note.clone(),
                ]);
            }
            out.push_str(&t.render());
        }
        out.push('\n');
        let mut t = Table::new(&[("", false), ("", true), ("", false)]);
        t.row(vec![
            "Charges:".into(),
            soles_text(&self.totals.charges),
            format!("(exact {})", self.totals.charges),
        ]);
        t.row(vec![
            "Top-ups:".into(),
            soles_text(&self.totals.top_ups),
            format!("(exact {})", self.totals.top_ups),
        ]);
        t.row(vec![
            "Balance now:".into(),
            soles_text(&self.balance),
            format!("(exact {})", self.balance),
        ]);
        out.push_str(&t.render_body());
        out
    }
}

/// Parses a statement bound: `YYYY-MM-DD` (a day in UTC) or an RFC 3339 time (exact, any
/// offset). As `from` a day means its first instant; as `to` it means the **end** of that day,
/// so `--from 2026-11-01 --to 2026-11-30` covers all of November. The same rule as the account
/// API's periods (`quipu_core::account::period`).
pub fn parse_bound(text: &str, is_end: bool) -> OpsResult<UnixMs> {
    crate::account::period::parse_bound(text, is_end).map_err(OpsError::Invalid)
}

/// A tenant's statement over `[from, to)`; see [`parse_bound`] for the accepted dates.
pub async fn statement(
    store: &dyn Store,
    tenant_name: &str,
    from: Option<&str>,
    to: Option<&str>,
) -> OpsResult<StatementReport> {
    let from_ms = from.map(|f| parse_bound(f, false)).transpose()?;
    let to_ms = to.map(|t| parse_bound(t, true)).transpose()?;
    if let (Some(f), Some(t)) = (from_ms, to_ms) {
        if f >= t {
            return Err(OpsError::Invalid(format!(
                "the period is empty: it starts at {} and ends at {}; the start must come first",
                rfc3339(f),
                rfc3339(t)
            )));
        }
    }
    let tenant = tenant_id(store, tenant_name).await?;
    let s = store.statement(tenant, from_ms, to_ms).await?;
    let totals = Totals {
        requests: s.per_model.iter().map(|m| m.requests).sum(),
        input_tokens: s.per_model.iter().map(|m| m.input_tokens).sum(),
        cached_tokens: s.per_model.iter().map(|m| m.cached_tokens).sum(),
        output_tokens: s.per_model.iter().map(|m| m.output_tokens).sum(),
        charges: s.total_charges.to_decimal(),
        top_ups: s.total_top_ups.to_decimal(),
    };
    Ok(StatementReport {
        tenant: s.tenant.name,
        tenant_id: s.tenant.id,
        from: s.from.map(rfc3339),
        to: s.to.map(rfc3339),
        models: s
            .per_model
            .into_iter()
            .map(|m| ModelLine {
                model: m.model,
                requests: m.requests,
                input_tokens: m.input_tokens,
                cached_tokens: m.cached_tokens,
                output_tokens: m.output_tokens,
                charge: m.charge.to_decimal(),
            })
            .collect(),
        top_ups: s
            .top_ups
            .into_iter()
            .map(|u| TopUpLine {
                id: u.id,
                at: rfc3339(u.at),
                amount: u.amount.to_decimal(),
                note: u.note,
            })
            .collect(),
        totals,
        balance: s.balance.to_decimal(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{ledger_row, mem, min};
    use super::super::{create_tenant, top_up};
    use super::*;
    use crate::store::LedgerRow;

    #[test]
    fn bounds() {
        assert_eq!(
            parse_bound("2026-11-01", false).unwrap(),
            1_793_491_200_000 // 2026-11-01T00:00:00Z
        );
        // As an end, a day includes itself.
        assert_eq!(
            parse_bound("2026-11-30", true).unwrap(),
            1_796_083_200_000 // 2026-12-01T00:00:00Z
        );
        assert_eq!(
            parse_bound("2026-11-01T00:00:00-05:00", false).unwrap(),
            1_793_491_200_000 + 5 * 3_600_000
        );
        let e = parse_bound("2026-13-01", false).unwrap_err();
        assert!(e.message().contains("YYYY-MM-DD"), "{e}");
    }

    #[tokio::test]
    async fn statement_rendering() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap();
        top_up(&*s, "acme", "50.00", "", min(), None).await.unwrap();
        let row = |id: &str, model: &str, picos: i128, input: u64| LedgerRow {
            input_tokens: input,
            cached_tokens: 10,
            output_tokens: 2_000,
            ..ledger_row(id, t.id, model, picos)
        };
        s.record(
            "r1",
            &[
                row("a", "colibri", 1_050_000, 1_234_567),
                row("b", "colibri", 2_000_000_000_000, 3),
                row("c", "aguila", 1, 5),
            ],
        )
        .await
        .unwrap();
        let st = statement(&*s, "acme", None, None).await.unwrap();
        assert_eq!(st.models.len(), 2);
        assert_eq!(st.models[0].model, "aguila");
        assert_eq!(st.models[1].charge, "2.00000105");
        assert_eq!(st.totals.charges, "2.000001050001");
        assert_eq!(st.totals.top_ups, "50.00");
        assert_eq!(st.balance, "47.999998949999");
        assert_eq!(st.totals.requests, 3);
        assert_eq!(st.totals.input_tokens, 1_234_575);

        let text = st.text();
        assert!(text.contains("Statement for acme"), "{text}");
        assert!(text.contains("1,234,570"), "{text}");
        assert!(text.contains("2.000001050001"), "{text}");
        // Exact charges line up on the decimal point.
        assert!(text.contains(" 0.000000000001\n"), "{text}");
        assert!(text.contains(" 2.000001050000\n"), "{text}");
        assert!(text.contains("S/ 48.00"), "{text}");
        assert!(text.contains("S/ 50.00"), "{text}");
        // The table is aligned: every row of the model table has the same width up to CHARGE.
        let lines: Vec<&str> = text.lines().skip(3).take(4).collect();
        let col = lines[0].find("CHARGE").unwrap() + "CHARGE".len();
        for l in &lines[1..] {
            assert_eq!(&l[col - 1..col], "0", "{l}");
        }

        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["totals"]["charges"], "2.000001050001");
        assert_eq!(json["balance"], "47.999998949999");
        assert!(json["models"][0]["charge"].is_string());

        // A period with nothing in it.
        let empty = statement(&*s, "acme", Some("2000-01-01"), Some("2000-01-31"))
            .await
            .unwrap();
        assert!(empty.models.is_empty());
        assert_eq!(empty.totals.charges, "0.00");
        assert!(empty.text().contains("No requests in this period."));
        assert_eq!(empty.to.as_deref(), Some("2000-02-01T00:00:00Z"));

        let e = statement(&*s, "acme", Some("2026-02-01"), Some("2026-01-01"))
            .await
            .unwrap_err();
        assert!(e.message().contains("start must come first"), "{e}");
    }
}
