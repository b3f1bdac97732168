//! Amounts as people read them, in the gateway's messages (a `402` says what a request may
//! cost and what is available) and on the account page. Statements and the admin API have
//! their own exact columns.
//!
//! One format serves English and Spanish (es-PE) readers alike: Peru writes soles as
//! `S/ 1,234.56` (the es-PE convention: the `S/` symbol and a space before the number, comma
//! thousands, a point before the céntimos), the same digits an English reader expects, so
//! there is no per-language variant to choose.

use crate::money::{Pen, SCALE_DIGITS};

/// Most significant digits [`soles_text`] shows for an amount under one céntimo.
pub const SMALL_SIGNIFICANT_DIGITS: u32 = 4;

/// `S/ 1,234.56`; below one céntimo the exact figure (`S/ 0.00000105`), so a small cost never
/// reads as zero.
pub fn cost_text(p: Pen) -> String {
    if p < Pen::from_centimos(1) {
        format!("S/ {}", p.to_decimal())
    } else {
        p.format_soles()
    }
}

/// An amount of any size for a person: from one céntimo up, rounded to céntimos
/// (`S/ 1,234.56`, as [`Pen::format_soles`]); under one céntimo, at most
/// [`SMALL_SIGNIFICANT_DIGITS`] significant digits, rounded half away from zero, trailing zeros
/// dropped (`S/ 0.0000026`, `S/ 0.001235`). A non-zero amount never reads as `S/ 0.00`: a day
/// of small requests shows what it cost. Negative amounts read `-S/ 0.0000026`.
pub fn soles_text(p: Pen) -> String {
    let abs = p.picos().unsigned_abs();
    let centimo = 10u128.pow(SCALE_DIGITS - 2);
    if abs == 0 || abs >= centimo {
        return p.format_soles();
    }
    let sign = if p.is_negative() { "-" } else { "" };
    let shown = round_significant(abs, SMALL_SIGNIFICANT_DIGITS);
    // `shown` ≤ one céntimo (rounding may carry up to it), far inside an i128.
    let shown = Pen::from_picos(i128::try_from(shown).unwrap_or(i128::MAX));
    format!("{sign}S/ {}", shown.to_decimal())
}

/// `n` (non-zero) rounded half away from zero to `digits` significant digits.
fn round_significant(n: u128, digits: u32) -> u128 {
    let len = n.ilog10() + 1;
    if len <= digits {
        return n;
    }
    let unit = 10u128.pow(len - digits);
    (n + unit / 2) / unit * unit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picos(n: i128) -> Pen {
        Pen::from_picos(n)
    }

    #[test]
    fn under_a_centimo_is_exact_and_above_is_rounded() {
        assert_eq!(cost_text(Pen::from_picos(1_050_000)), "S/ 0.00000105");
        assert_eq!(cost_text(Pen::from_centimos(123_456)), "S/ 1,234.56");
        assert_eq!(cost_text(Pen::from_centimos(1)), "S/ 0.01");
    }

    #[test]
    fn small_amounts_show_the_digits_that_make_them_non_zero() {
        // 2.6 micro-soles.
        assert_eq!(soles_text(picos(2_600_000)), "S/ 0.0000026");
        assert_eq!(soles_text(picos(1_050_000)), "S/ 0.00000105");
        // Five significant digits round to four, half away from zero.
        assert_eq!(soles_text(picos(1_234_567_000)), "S/ 0.001235");
        assert_eq!(soles_text(picos(1_234_449_999)), "S/ 0.001234");
        assert_eq!(soles_text(picos(1_234_500_000)), "S/ 0.001235");
        // Trailing zeros dropped, at least two decimals kept.
        assert_eq!(soles_text(picos(5_000_000_000)), "S/ 0.005");
        // The smallest amount there is: one pico-sol.
        assert_eq!(soles_text(picos(1)), "S/ 0.000000000001");
        assert_eq!(soles_text(picos(123)), "S/ 0.000000000123");
        assert_eq!(soles_text(picos(-2_600_000)), "-S/ 0.0000026");
    }

    #[test]
    fn no_non_zero_amount_reads_as_zero() {
        let mut n: i128 = 1;
        while n < 10_000_000_000 {
            for m in [n, n + 1, 3 * n - 1, 9 * n + 7] {
                let text = soles_text(picos(m));
                assert_ne!(text, "S/ 0.00", "{m} picos");
                assert!(text.starts_with("S/ 0.0"), "{m} picos: {text}");
                // Round trip: what is shown is within half a unit of the 4th digit.
                let shown = Pen::parse(&text["S/ ".len()..], 12).unwrap().picos();
                let unit = 10i128.pow((m.ilog10() + 1).saturating_sub(4));
                assert!((shown - m).abs() * 2 <= unit, "{m} picos shown as {text}");
            }
            n *= 10;
        }
    }

    #[test]
    fn a_centimo_and_above_are_centimos_and_rounding_may_reach_one_centimo() {
        assert_eq!(soles_text(Pen::ZERO), "S/ 0.00");
        assert_eq!(soles_text(Pen::from_centimos(1)), "S/ 0.01");
        assert_eq!(soles_text(Pen::from_centimos(123_456)), "S/ 1,234.56");
        assert_eq!(soles_text(picos(12_345_000_000)), "S/ 0.01");
        // 0.0099996 rounds to four significant digits as 0.01000.
        assert_eq!(soles_text(picos(9_999_600_000)), "S/ 0.01");
        assert_eq!(soles_text(picos(9_999_400_000)), "S/ 0.009999");
    }
}
