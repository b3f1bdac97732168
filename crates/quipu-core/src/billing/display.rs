//! Amounts as people read them, in the gateway's messages (a `402` says what a request may
//! cost and what is available). Statements and the admin API have their own exact columns.

use crate::money::Pen;

/// `S/ 1,234.56`; below one céntimo the exact figure (`S/ 0.00000105`), so a small cost never
/// reads as zero.
pub fn cost_text(p: Pen) -> String {
    if p < Pen::from_centimos(1) {
        format!("S/ {}", p.to_decimal())
    } else {
        p.format_soles()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_a_centimo_is_exact_and_above_is_rounded() {
        assert_eq!(cost_text(Pen::from_picos(1_050_000)), "S/ 0.00000105");
        assert_eq!(cost_text(Pen::from_centimos(123_456)), "S/ 1,234.56");
        assert_eq!(cost_text(Pen::from_centimos(1)), "S/ 0.01");
    }
}
