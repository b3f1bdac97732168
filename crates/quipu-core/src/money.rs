//! Exact money in Peruvian soles (PEN). No floats anywhere money flows.
//!
//! An amount is an integer number of **pico-soles** (10⁻¹² S/) in an `i128`. Rates are
//! configured as decimal strings per million tokens with at most [`RATE_DECIMALS`] decimals, so
//! a rate in pico-soles per million tokens is always a multiple of 10⁶ and
//! `tokens × rate / 1 000 000` is an exact integer: **no charge is ever rounded**. Example:
//! 3 tokens at S/ 0.35 per million cost 1 050 000 pico-soles (1.05 micro-soles), exactly.
//!
//! Only display rounds: [`Pen::format_soles`] shows céntimos (`S/ 1,234.56`, the es-PE CLDR
//! pattern, pinned here rather than read from locale data), rounding half away from zero.
//! [`Pen::to_decimal`] prints the exact value; [`Pen::json_number`] writes it as a JSON number
//! (the `usage.cost` of every answer), never through a float.

use std::fmt;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};

/// Digits after the decimal point of the internal unit (pico-soles).
pub const SCALE_DIGITS: u32 = 12;
const SCALE: i128 = 1_000_000_000_000;
/// Most decimals a per-million-token rate may have: keeps every charge exact (see module docs).
pub const RATE_DECIMALS: u32 = 6;
/// Most decimals an amount of money typed by an operator may have (top-ups, minimum top-up).
pub const AMOUNT_DECIMALS: u32 = 2;
/// The highest rate accepted, in whole soles per million tokens: S/ 1 per token, orders of
/// magnitude above any real price, so a larger value is a typo. It also bounds every cost:
/// u64::MAX tokens at this rate is about 1.8 × 10³¹ pico-soles, far inside an `i128`.
pub const MAX_RATE_SOLES: i128 = 1_000_000;

/// An exact amount of soles. See the module docs for the unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pen(i128);

/// Why a decimal string is not an acceptable amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoneyError {
    /// Not of the form `123` or `123.45` (no sign, exponent, spaces or grouping).
    NotADecimal(String),
    /// More decimals than allowed for this kind of amount.
    TooManyDecimals { value: String, max: u32 },
    /// Too large to be a sensible amount.
    TooLarge(String),
    /// A rate above [`MAX_RATE_SOLES`] per million tokens.
    RateTooLarge(String),
}

impl fmt::Display for MoneyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MoneyError::NotADecimal(v) => write!(
                f,
                "\"{v}\" is not a decimal amount; write it like \"12.50\" (digits, an optional point and decimals; no sign, exponent or thousands separator)"
            ),
            MoneyError::TooManyDecimals { value, max } => {
                write!(f, "\"{value}\" has more than {max} decimals")
            }
            MoneyError::TooLarge(v) => write!(f, "\"{v}\" is too large"),
            MoneyError::RateTooLarge(v) => write!(
                f,
                "\"{v}\" per million tokens is more than S/ {MAX_RATE_SOLES} (S/ 1 per token); a rate that high is taken for a typo"
            ),
        }
    }
}

impl std::error::Error for MoneyError {}

impl Pen {
    pub const ZERO: Pen = Pen(0);

    pub const fn from_picos(picos: i128) -> Pen {
        Pen(picos)
    }

    pub const fn picos(self) -> i128 {
        self.0
    }

    /// Whole céntimos, e.g. `Pen::from_centimos(1050)` is S/ 10.50.
    pub const fn from_centimos(centimos: i64) -> Pen {
        Pen(centimos as i128 * (SCALE / 100))
    }

    /// Parses a non-negative decimal string with at most `max_decimals` decimals.
    pub fn parse(text: &str, max_decimals: u32) -> Result<Pen, MoneyError> {
        let s = text.trim();
        let (int_part, frac_part) = match s.split_once('.') {
            Some((i, f)) => (i, f),
            None => (s, ""),
        };
        let digits_only = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if int_part.is_empty()
            || !digits_only(int_part)
            || !digits_only(frac_part)
            || (s.contains('.') && frac_part.is_empty())
        {
            return Err(MoneyError::NotADecimal(text.to_owned()));
        }
        let frac_trimmed = frac_part.trim_end_matches('0');
        if frac_trimmed.len() as u32 > max_decimals.min(SCALE_DIGITS) {
            return Err(MoneyError::TooManyDecimals {
                value: text.to_owned(),
                max: max_decimals,
            });
        }
        // 10^15 soles is far beyond any balance and keeps every product below i128::MAX.
        let int_trimmed = int_part.trim_start_matches('0');
        if int_trimmed.len() > 15 {
            return Err(MoneyError::TooLarge(text.to_owned()));
        }
        let whole: i128 = if int_trimmed.is_empty() {
            0
        } else {
            int_trimmed
                .parse()
                .map_err(|_| MoneyError::NotADecimal(text.to_owned()))?
        };
        let mut frac: i128 = 0;
        for (i, b) in frac_trimmed.bytes().enumerate() {
            frac += i128::from(b - b'0') * 10i128.pow(SCALE_DIGITS - 1 - i as u32);
        }
        Ok(Pen(whole * SCALE + frac))
    }

    /// The exact value as a decimal string with the fewest decimals (at least two):
    /// `"12.50"`, `"0.00000105"`, `"-3.00"`.
    pub fn to_decimal(self) -> String {
        self.decimal().to_string()
    }

    /// [`Pen::to_decimal`] as a `Display`, for writing into a log line or a buffer without
    /// an intermediate `String`.
    pub fn decimal(self) -> ExactDecimal {
        ExactDecimal {
            pen: self,
            min_digits: 2,
        }
    }

    /// The exact value as a JSON number literal with no trailing zeros (`0.5`, `12`, `0`,
    /// `0.0000026`): at most [`SCALE_DIGITS`] decimals, no exponent, no float on the way. As a
    /// `Display` (for a byte buffer) and a `Serialize` (for a typed answer).
    pub fn json_number(self) -> ExactDecimal {
        ExactDecimal {
            pen: self,
            min_digits: 0,
        }
    }

    /// [`Pen::json_number`] as a string, for the catalog's numeric fields.
    pub fn to_json_number(self) -> String {
        self.json_number().to_string()
    }

    /// `S/ 1,234.56`: céntimos, half away from zero, comma grouping, `-S/ 1.00` when negative.
    pub fn format_soles(self) -> String {
        let neg = self.0 < 0;
        let abs = self.0.unsigned_abs();
        let unit = (SCALE / 100) as u128;
        let centimos = (abs + unit / 2) / unit;
        let whole = centimos / 100;
        let cents = centimos % 100;
        let digits = whole.to_string();
        let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        let sign = if neg && centimos > 0 { "-" } else { "" };
        format!("{sign}S/ {grouped}.{cents:02}")
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    pub fn max(self, other: Pen) -> Pen {
        Pen(self.0.max(other.0))
    }

    pub fn min(self, other: Pen) -> Pen {
        Pen(self.0.min(other.0))
    }
}

impl Add for Pen {
    type Output = Pen;
    fn add(self, rhs: Pen) -> Pen {
        Pen(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Pen {
    fn add_assign(&mut self, rhs: Pen) {
        *self = *self + rhs;
    }
}

impl Sub for Pen {
    type Output = Pen;
    fn sub(self, rhs: Pen) -> Pen {
        Pen(self.0.saturating_sub(rhs.0))
    }
}

impl SubAssign for Pen {
    fn sub_assign(&mut self, rhs: Pen) {
        *self = *self - rhs;
    }
}

impl Neg for Pen {
    type Output = Pen;
    fn neg(self) -> Pen {
        Pen(self.0.saturating_neg())
    }
}

impl std::iter::Sum for Pen {
    fn sum<I: Iterator<Item = Pen>>(iter: I) -> Pen {
        iter.fold(Pen::ZERO, |a, b| a + b)
    }
}

impl fmt::Display for Pen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format_soles())
    }
}

/// The exact decimal form of an amount, with the fewest decimals but `min_digits` (see
/// [`Pen::decimal`], [`Pen::json_number`]).
#[derive(Clone, Copy, Debug)]
pub struct ExactDecimal {
    pen: Pen,
    min_digits: usize,
}

/// Twelve zeros: the leading zeros of a fraction, sliced.
const ZEROS: &str = "000000000000";

/// An [`ExactDecimal`]'s digits, formatted ([`ExactDecimal::parts`]).
struct Digits {
    whole: itoa::Buffer,
    frac: itoa::Buffer,
}

impl Digits {
    fn new() -> Digits {
        Digits {
            whole: itoa::Buffer::new(),
            frac: itoa::Buffer::new(),
        }
    }
}

impl ExactDecimal {
    /// The text in pieces (sign, whole part, point, the fraction's leading zeros, its other
    /// digits), formatted into `d` without the formatting machinery: this runs for every
    /// answer (its `usage.cost`) and every access-log line, so it takes 64-bit divisions
    /// whenever the amount fits (every real one does) and copies its digits directly.
    fn parts(self, d: &mut Digits) -> [&str; 5] {
        let v = self.pen.0;
        let abs = v.unsigned_abs();
        let sign = if v < 0 { "-" } else { "" };
        // The fraction is below 10^12, so it fits a u64.
        let (whole, mut frac) = match u64::try_from(abs) {
            Ok(a) => (d.whole.format(a / SCALE as u64), a % SCALE as u64),
            Err(_) => (
                d.whole.format(abs / SCALE as u128),
                (abs % SCALE as u128) as u64,
            ),
        };
        // Fewest decimals, at least `min_digits`: drop trailing zeros of the 12-digit fraction.
        let mut digits = SCALE_DIGITS as usize;
        while digits > self.min_digits && frac % 10 == 0 {
            frac /= 10;
            digits -= 1;
        }
        if digits == 0 {
            return [sign, whole, "", "", ""];
        }
        let frac = d.frac.format(frac);
        let zeros = ZEROS.get(..digits.saturating_sub(frac.len())).unwrap_or("");
        [sign, whole, ".", zeros, frac]
    }

    /// Appends the text to `out` (what its `Display` writes, without a `String` or the
    /// formatting machinery on the way).
    pub fn write_to(self, out: &mut Vec<u8>) {
        let mut d = Digits::new();
        for part in self.parts(&mut d) {
            out.extend_from_slice(part.as_bytes());
        }
    }
}

impl fmt::Display for ExactDecimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = Digits::new();
        for part in self.parts(&mut d) {
            f.write_str(part)?;
        }
        Ok(())
    }
}

impl serde::Serialize for ExactDecimal {
    /// A JSON number written as is (an exact decimal is not an `f64`): through a raw value
    /// borrowed from a buffer on the stack, for the amounts an answer carries (its
    /// `usage.cost`, on every answer).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let mut d = Digits::new();
        // A sign, the 27 digits of the largest whole part, a point and 12 decimals fit.
        let mut buf = [0u8; 48];
        let mut len = 0;
        for part in self.parts(&mut d) {
            let end = len + part.len();
            buf.get_mut(len..end)
                .ok_or_else(|| S::Error::custom("an amount too long to write"))?
                .copy_from_slice(part.as_bytes());
            len = end;
        }
        let text =
            std::str::from_utf8(buf.get(..len).unwrap_or_default()).map_err(S::Error::custom)?;
        let raw: &serde_json::value::RawValue =
            serde_json::from_str(text).map_err(S::Error::custom)?;
        raw.serialize(s)
    }
}

/// A price per million tokens. Constructed only from a decimal with ≤ [`RATE_DECIMALS`]
/// decimals, which is what makes [`Rate::cost`] exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rate(Pen);

impl Rate {
    /// A rate per million tokens: at most [`RATE_DECIMALS`] decimals and at most
    /// [`MAX_RATE_SOLES`].
    pub fn parse(text: &str) -> Result<Rate, MoneyError> {
        let pen = Pen::parse(text, RATE_DECIMALS)?;
        if pen.0 > MAX_RATE_SOLES * SCALE {
            return Err(MoneyError::RateTooLarge(text.to_owned()));
        }
        Ok(Rate(pen))
    }

    /// The configured price of one million tokens.
    pub fn per_million(self) -> Pen {
        self.0
    }

    /// Exact cost of `tokens` tokens at this rate. Token counts come from the upstream, so
    /// the product is checked: with rates bounded by [`Rate::parse`] it cannot overflow, and
    /// if it ever did it would saturate rather than wrap into a negative charge.
    pub fn cost(self, tokens: u64) -> Pen {
        // rate picos is a multiple of 10^6 (≤ 6 decimals of a sol), so this division is exact.
        // Every rate fits an i64 (MAX_RATE_SOLES is 10^18 picos): a 64-bit division, not a
        // call to the 128-bit one, on every answer's cost and every settlement.
        let per_token = match i64::try_from(self.0 .0) {
            Ok(picos) => i128::from(picos / 1_000_000),
            Err(_) => self.0 .0 / 1_000_000,
        };
        Pen(i128::from(tokens)
            .checked_mul(per_token)
            .unwrap_or(i128::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print_exactly() {
        assert_eq!(Pen::parse("12.50", 2).unwrap(), Pen::from_centimos(1250));
        assert_eq!(Pen::parse("0", 2).unwrap(), Pen::ZERO);
        assert_eq!(Pen::parse("007.1", 2).unwrap().to_decimal(), "7.10");
        assert_eq!(Pen::parse("0.000001", 6).unwrap().picos(), 1_000_000);
        assert_eq!(Pen::parse("1.500000", 2).unwrap(), Pen::from_centimos(150));
        assert_eq!(Pen::from_picos(1_050_000).to_decimal(), "0.00000105");
        assert_eq!(Pen::from_picos(-3 * SCALE).to_decimal(), "-3.00");
        assert_eq!(Pen::from_picos(-5).to_decimal(), "-0.000000000005");
        // A whole part beyond u64 (the 128-bit path).
        let huge = Pen::from_picos(u64::MAX as i128 * 10 * SCALE + 5);
        assert_eq!(huge.to_decimal(), "184467440737095516150.000000000005");
        assert_eq!(format!("{}", Pen::from_picos(SCALE / 10).decimal()), "0.10");
    }

    #[test]
    fn parse_rejects_what_is_not_a_plain_decimal() {
        for bad in [
            "", ".5", "5.", "-1", "+1", "1e3", "1,000.00", "1.2.3", "abc", "NaN", " ",
        ] {
            assert!(
                matches!(Pen::parse(bad, 6), Err(MoneyError::NotADecimal(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Pen::parse("0.001", 2),
            Err(MoneyError::TooManyDecimals { max: 2, .. })
        ));
        assert!(matches!(
            Rate::parse("0.0000001"),
            Err(MoneyError::TooManyDecimals { max: 6, .. })
        ));
        assert!(matches!(
            Pen::parse("1000000000000000", 2),
            Err(MoneyError::TooLarge(_))
        ));
    }

    #[test]
    fn costs_are_exact() {
        // The style guide's example: 3 tokens at S/ 0.35 per million is 1.05 micro-soles.
        let r = Rate::parse("0.35").unwrap();
        assert_eq!(r.cost(3).to_decimal(), "0.00000105");
        // Many decimals.
        let r = Rate::parse("0.123457").unwrap();
        assert_eq!(r.cost(1).picos(), 123_457);
        assert_eq!(r.cost(7).to_decimal(), "0.000000864199");
        // Very large token counts (an upstream's usage is not trusted to be sane).
        let r = Rate::parse("999999.999999").unwrap();
        let c = r.cost(u64::MAX);
        assert_eq!(c.picos(), i128::from(u64::MAX) * 999_999_999_999);
        assert!(c > Pen::ZERO);
        let top = Rate::parse("1000000").unwrap();
        assert_eq!(
            top.cost(u64::MAX).picos(),
            i128::from(u64::MAX) * 1_000_000_000_000
        );
        assert!(top.cost(u64::MAX) + top.cost(u64::MAX) > Pen::ZERO);
    }

    #[test]
    fn absurd_rates_are_refused() {
        assert!(matches!(
            Rate::parse("1000000.000001"),
            Err(MoneyError::RateTooLarge(_))
        ));
        assert!(matches!(
            Rate::parse("999999999999999"),
            Err(MoneyError::RateTooLarge(_))
        ));
        let e = Rate::parse("5000000").unwrap_err().to_string();
        assert!(e.contains("S/ 1 per token"), "{e}");
        // Pen arithmetic saturates at its ends instead of wrapping or panicking.
        let min = Pen::from_picos(i128::MIN);
        assert_eq!((-min).picos(), i128::MAX);
        assert_eq!((min - Pen::from_picos(1)).picos(), i128::MIN);
        assert_eq!(
            (Pen::from_picos(i128::MAX) + Pen::from_picos(1)).picos(),
            i128::MAX
        );
    }

    #[test]
    fn sums_of_exact_charges_do_not_drift() {
        let r = Rate::parse("0.000003").unwrap();
        let total: Pen = (0..1_000_000).map(|_| r.cost(1)).sum();
        assert_eq!(total.picos(), 3_000_000);
        assert_eq!(total.to_decimal(), "0.000003");
    }

    #[test]
    fn soles_formatting() {
        assert_eq!(Pen::from_centimos(123_456).format_soles(), "S/ 1,234.56");
        assert_eq!(Pen::from_centimos(0).format_soles(), "S/ 0.00");
        assert_eq!(
            Pen::from_centimos(100_000_000).format_soles(),
            "S/ 1,000,000.00"
        );
        assert_eq!(Pen::from_centimos(-150).format_soles(), "-S/ 1.50");
        assert_eq!(Pen::parse("0.005", 3).unwrap().format_soles(), "S/ 0.01");
        assert_eq!(Pen::parse("0.0049", 4).unwrap().format_soles(), "S/ 0.00");
        assert_eq!(Pen::from_picos(-1).format_soles(), "S/ 0.00");
        assert_eq!(Pen::from_centimos(99_999).format_soles(), "S/ 999.99");
    }

    #[test]
    fn json_numbers() {
        assert_eq!(
            Rate::parse("0.50").unwrap().per_million().to_json_number(),
            "0.5"
        );
        assert_eq!(Pen::parse("10.00", 2).unwrap().to_json_number(), "10");
        assert_eq!(
            Rate::parse("0.000001")
                .unwrap()
                .per_million()
                .to_json_number(),
            "0.000001"
        );
        assert_eq!(Pen::ZERO.to_json_number(), "0");
        assert_eq!(Pen::from_picos(2_600_000).to_json_number(), "0.0000026");
        assert_eq!(Pen::from_picos(1).to_json_number(), "0.000000000001");
        assert_eq!(
            Pen::from_picos(SCALE * 7 + 1).to_json_number(),
            "7.000000000001"
        );
        assert_eq!(Pen::from_picos(-SCALE / 2).to_json_number(), "-0.5");
        // As a typed value's member: the same literal, a number for every JSON reader.
        let member =
            std::collections::BTreeMap::from([("cost", Pen::from_picos(2_600_000).json_number())]);
        assert_eq!(
            serde_json::to_string(&member).unwrap(),
            r#"{"cost":0.0000026}"#
        );
        let typed = serde_json::to_string(&[Pen::ZERO.json_number()]).unwrap();
        assert_eq!(typed, "[0]");
    }

    /// The formatting `ExactDecimal` had before it rendered its own digits: the reference.
    fn formatted(v: i128, min_digits: usize) -> String {
        let abs = v.unsigned_abs();
        let whole = abs / SCALE as u128;
        let mut frac = (abs % SCALE as u128) as u64;
        let mut digits = SCALE_DIGITS as usize;
        while digits > min_digits && frac % 10 == 0 {
            frac /= 10;
            digits -= 1;
        }
        let sign = if v < 0 { "-" } else { "" };
        if digits > 0 {
            format!("{sign}{whole}.{frac:0digits$}")
        } else {
            format!("{sign}{whole}")
        }
    }

    #[test]
    fn exact_decimals_render_every_range_as_the_formatter_did() {
        let edges = [
            0,
            1,
            -1,
            9,
            10,
            SCALE - 1,
            SCALE,
            SCALE + 1,
            -SCALE / 2,
            123_456_789_012_345,
            1_050_000,
            i128::from(u64::MAX) - 1,
            i128::from(u64::MAX),
            i128::from(u64::MAX) + 1,
            -i128::from(u64::MAX),
            -i128::from(u64::MAX) - 1,
            i128::MAX,
            i128::MIN,
            i128::MIN + 1,
            i128::MAX / SCALE * SCALE,
        ];
        for v in edges {
            let pen = Pen::from_picos(v);
            assert_eq!(pen.json_number().to_string(), formatted(v, 0), "{v}");
            assert_eq!(pen.to_decimal(), formatted(v, 2), "{v}");
            let mut out = b"x".to_vec();
            pen.json_number().write_to(&mut out);
            assert_eq!(out, format!("x{}", formatted(v, 0)).into_bytes(), "{v}");
        }
    }
}
