//! The text that every group's [`Render`](super::Render) shares: money as `S/ 1,234.56` from the
//! exact decimals the JSON carries, times as RFC 3339 (JSON) and `2026-11-22 10:54 UTC` (text),
//! digit grouping, and a plain aligned [`Table`].

use crate::money::{self, Pen};
use crate::store::UnixMs;
use chrono::{DateTime, SecondsFormat, Utc};

/// `2026-11-22T10:54:55.123Z` (milliseconds only when non-zero).
pub(super) fn rfc3339(ms: UnixMs) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        None => ms.to_string(),
    }
}

/// An RFC 3339 string from this module back to `2026-11-22 10:54 UTC` for text.
pub(super) fn human_time_text(rfc: &str) -> String {
    match DateTime::parse_from_rfc3339(rfc) {
        Ok(t) => t
            .with_timezone(&Utc)
            .format("%Y-%m-%d %H:%M UTC")
            .to_string(),
        Err(_) => rfc.to_owned(),
    }
}

/// An exact decimal string from this module as `S/ 1,234.56`.
pub(super) fn soles_text(decimal: &str) -> String {
    // Every decimal here came from `Pen::to_decimal`, which `Pen::parse` reads back exactly
    // (a negative balance carries a sign that `parse` does not take: strip and restore it).
    let (neg, digits) = match decimal.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, decimal),
    };
    match Pen::parse(digits, money::SCALE_DIGITS) {
        Ok(p) => (if neg { -p } else { p }).format_soles(),
        Err(_) => decimal.to_owned(),
    }
}

/// Exact decimals padded with trailing zeros to the same number of decimals, so that
/// right-aligned they line up on the point (`0.00000105` → `0.000001050000` beside
/// `12.345678901234`). The values are unchanged.
pub(super) fn align_decimals(values: &[String]) -> Vec<String> {
    let decimals = |v: &str| v.split_once('.').map_or(0, |(_, f)| f.len());
    let most = values.iter().map(|v| decimals(v)).max().unwrap_or(0);
    values
        .iter()
        .map(|v| {
            let mut v = v.clone();
            if most > 0 && !v.contains('.') {
                v.push('.');
            }
            let pad = most - decimals(&v);
            v.push_str(&"0".repeat(pad));
            v
        })
        .collect()
}

/// `1234567` → `1,234,567`.
pub(super) fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A plain aligned text table: a header row, two spaces between columns, numbers right-aligned.
pub(super) struct Table {
    headers: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            headers: columns.iter().map(|c| c.0).collect(),
            right: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub(super) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(slot) = w.get_mut(i) {
                    *slot = (*slot).max(cell.chars().count());
                }
            }
        }
        w
    }

    fn line(&self, cells: &[String], widths: &[usize]) -> String {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if self.right.get(i).copied().unwrap_or(false) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        let mut line = line.trim_end().to_owned();
        line.push('\n');
        line
    }

    /// Header and rows.
    pub(super) fn render(&self) -> String {
        let widths = self.widths();
        let headers: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        let mut out = self.line(&headers, &widths);
        for row in &self.rows {
            out.push_str(&self.line(row, &widths));
        }
        out
    }

    /// Rows only (for label/value blocks).
    pub(super) fn render_body(&self) -> String {
        let widths = self.widths();
        self.rows.iter().map(|r| self.line(r, &widths)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_and_soles() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_234_567), "1,234,567");
        assert_eq!(soles_text("1234.56"), "S/ 1,234.56");
        assert_eq!(soles_text("0.00000105"), "S/ 0.00");
        assert_eq!(soles_text("-3.50"), "-S/ 3.50");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_500), "1970-01-01T00:00:01.500Z");
        assert_eq!(
            human_time_text("1970-01-01T00:00:01.500Z"),
            "1970-01-01 00:00 UTC"
        );
        assert_eq!(
            align_decimals(&["12.345678901234".into(), "0.00000105".into(), "3".into()]),
            ["12.345678901234", "0.000001050000", "3.000000000000"]
        );
    }
}
