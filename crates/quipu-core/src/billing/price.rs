//! A model's prices and the charge for a request's tokens: the one place price rules live.
//!
//! Rates are per million tokens ([`Rate`]); `Rate::cost` is exact, so a charge is never
//! rounded. A new rule (a per-tenant discount, a minimum charge, a price per image) changes
//! [`Prices::charge`] — and [`Prices::worst_case`], which must stay an upper bound of it so
//! that no charge exceeds its reservation — and adds its tests below. A new rate is published
//! in `/v1/pricing` by naming it in [`Prices::published`].

use crate::money::{Pen, Rate};
use crate::usage::Usage;

/// The three rates of one model (`[[models]] prices` in the config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prices {
    pub input: Rate,
    pub cached: Rate,
    pub output: Rate,
}

impl Prices {
    /// Every rate with the name `/v1/pricing` publishes it under, in the order it is shown.
    /// The catalog writes exactly these, so a rate added to `Prices` fails to compile here
    /// until it is named, and cannot be left out of the published prices.
    pub fn published(&self) -> [(&'static str, Rate); 3] {
        let Prices {
            input,
            cached,
            output,
        } = *self;
        [
            ("inputPerMillionPEN", input),
            ("cachePerMillionPEN", cached),
            ("outputPerMillionPEN", output),
        ]
    }

    /// uncached input × input rate + cached input × cache rate + output × output rate.
    pub fn charge(&self, usage: &Usage) -> Pen {
        self.input.cost(usage.uncached_input())
            + self.cached.cost(usage.cached())
            + self.output.cost(usage.completion_tokens)
    }

    /// The most `input_tokens` (cached or not) plus `output_tokens` can cost: an upper bound of
    /// [`Prices::charge`] for any usage within those counts.
    pub fn worst_case(&self, input_tokens: u64, output_tokens: u64) -> Pen {
        let input_rate = self.input.max(self.cached);
        input_rate.cost(input_tokens) + self.output.cost(output_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::test_support::{prices, usage};

    #[test]
    fn charge_formula() {
        let p = prices("2.00", "0.50", "8.00");
        // 1M uncached = 2, 2M cached = 1, 0.5M out = 4 (prompt_tokens includes the cached).
        assert_eq!(
            p.charge(&usage(3_000_000, 2_000_000, 500_000)),
            Pen::from_centimos(700)
        );
        assert_eq!(p.worst_case(1_000_000, 1_000_000), Pen::from_centimos(1000));
    }

    #[test]
    fn cached_above_the_prompt_is_clamped_not_negative() {
        let p = prices("2.00", "0.50", "8.00");
        // An upstream that reports more cached than prompt tokens: all of the prompt is cached.
        assert_eq!(
            p.charge(&usage(10, 50, 0)),
            Rate::parse("0.50").unwrap().cost(10)
        );
    }

    #[test]
    fn the_worst_case_bounds_every_split_of_the_input() {
        // Whichever input rate is higher, the worst case covers any cached/uncached split.
        for p in [
            prices("2.00", "0.50", "8.00"),
            prices("0.10", "0.90", "0.3"),
        ] {
            for cached in [0, 500, 1000] {
                assert!(p.charge(&usage(1000, cached, 300)) <= p.worst_case(1000, 300));
            }
        }
    }

    #[test]
    fn absurd_counts_at_the_top_rate_saturate_positive() {
        let p = prices("1000000", "1000000", "1000000");
        let u = usage(u64::MAX, u64::MAX / 2, u64::MAX);
        assert!(p.charge(&u) > Pen::ZERO);
        assert!(p.worst_case(u64::MAX, u64::MAX) > Pen::ZERO);
    }

    #[test]
    fn tiny_charges_are_exact() {
        // 3 tokens at S/ 0.35 per million: 1.05 micro-soles, not rounded.
        let p = prices("0.35", "0", "0");
        assert_eq!(p.charge(&usage(3, 0, 0)).picos(), 1_050_000);
    }
}
