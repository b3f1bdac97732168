//! What a request is charged when it ends, on every path (success, upstream error, client
//! disconnect, a task that died).
//!
//! - **Nothing reported, upstream never reached** (`reported = None`): nothing to bill (401,
//!   402, 429, an unreachable replica cost nothing).
//! - **The upstream had the request but reported no input** (a stream cut before its usage, a
//!   cancel): the input is billed as the quote's estimate and the row says `input_estimated`.
//! - **Charge** = [`Prices::charge`] of the usage, capped at the reservation; what the cap
//!   holds back is `unbilled` (the ledger row's column and `quipu_unbilled_pen_total`). The
//!   token counts are recorded as the upstream reported them — a prompt longer than the
//!   configured context window that the upstream still accepted shows its real size, and its
//!   whole excess appears in `unbilled`.
//! - **Storable bounds**: a count above [`MAX_TOKENS`] (no model has such a context; only a
//!   broken upstream reports it) is clamped to it, and `unbilled` to what a ledger row holds
//!   (`i64` pico-soles), so a broken report cannot produce a row the store refuses.
//!
//! **The cost on every answer.** What settling needs besides the usage is fixed at admission
//! ([`Charging`]: the model's prices, the reservation, the quote's input estimate). The
//! translators are given it and write [`Charging::cost`] of the usage they report as
//! `usage.cost`; the settlement applies [`Charging::settle`] to the same usage, so the answer's
//! cost and the ledger row's charge are one function of one input, never two computations
//! that could drift.

use super::Prices;
use crate::money::Pen;
use crate::usage::Usage;

/// Largest token count recorded for one field of one request.
pub const MAX_TOKENS: u64 = u32::MAX as u64;

/// The money of a finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// What is recorded (the estimate in place of an unreported input).
    pub usage: Usage,
    /// The usage at the model's prices.
    pub full: Pen,
    /// What the tenant pays: `full`, capped at the reservation.
    pub charge: Pen,
    /// `full − charge`, bounded to what a ledger row stores.
    pub unbilled: Pen,
    /// The input was billed as an estimate.
    pub input_estimated: bool,
}

/// Settles a request: `reported` is what the upstream reported (or was counted of a cut
/// stream), `None` if the upstream never had the request; `input_estimate` comes from the
/// request's quote; `reserved` is what its reservation holds.
pub fn settle(
    reported: Option<Usage>,
    input_estimate: u64,
    prices: &Prices,
    reserved: Pen,
) -> Settlement {
    let mut usage = reported.unwrap_or_default();
    usage.prompt_tokens = usage.prompt_tokens.min(MAX_TOKENS);
    usage.cached_tokens = usage.cached_tokens.min(MAX_TOKENS);
    usage.completion_tokens = usage.completion_tokens.min(MAX_TOKENS);
    // The upstream had the request but reported no input: a real prompt is never 0 tokens.
    let input_estimated = reported.is_some() && usage.prompt_tokens == 0;
    if input_estimated {
        usage.prompt_tokens = input_estimate;
        usage.cached_tokens = 0;
    }
    let full = prices.charge(&usage);
    let charge = full.min(reserved).max(Pen::ZERO);
    let unbilled = (full - charge).min(Pen::from_picos(i128::from(i64::MAX)));
    Settlement {
        usage,
        full,
        charge,
        unbilled,
        input_estimated,
    }
}

/// What settling a request needs besides its usage, fixed when it is admitted: given to the
/// response translators (the cost they write) and to the settlement (the charge it records).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charging {
    /// The model's prices.
    pub prices: Prices,
    /// What the request's reservation holds: no charge exceeds it.
    pub reserved: Pen,
    /// The quote's input estimate, billed when the upstream reports no input.
    pub input_estimate: u64,
}

impl Charging {
    /// [`settle`] with these terms.
    pub fn settle(&self, reported: Option<Usage>) -> Settlement {
        settle(reported, self.input_estimate, &self.prices, self.reserved)
    }

    /// What a request that used `usage` is charged: the `usage.cost` an answer shows, equal
    /// to the ledger row of a request settled with that usage.
    pub fn cost(&self, usage: Usage) -> Pen {
        self.settle(Some(usage)).charge
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::test_support::{colibri as prices, usage};
    use crate::billing::{quote, PromptSize};
    use crate::money::Rate;

    #[test]
    fn a_reported_usage_within_the_reservation_is_charged_in_full() {
        let u = usage(1000, 200, 50);
        let s = settle(Some(u), 7, &prices(), Pen::from_centimos(100));
        assert_eq!(s.usage, u);
        assert_eq!(s.charge, prices().charge(&u));
        assert_eq!((s.unbilled, s.input_estimated), (Pen::ZERO, false));
    }

    #[test]
    fn nothing_reported_costs_nothing() {
        let s = settle(None, 7, &prices(), Pen::from_centimos(100));
        assert_eq!((s.charge, s.usage), (Pen::ZERO, Usage::default()));
        assert!(!s.input_estimated);
    }

    #[test]
    fn an_unreported_input_is_billed_as_the_estimate() {
        let s = settle(
            Some(usage(0, 0, 12)),
            300,
            &prices(),
            Pen::from_centimos(100),
        );
        assert!(s.input_estimated);
        assert_eq!(s.usage, usage(300, 0, 12));
        assert_eq!(s.charge, prices().charge(&usage(300, 0, 12)));
    }

    #[test]
    fn a_prompt_over_the_window_keeps_its_size_and_its_excess_is_unbilled() {
        // The gateway believes the window is 64 tokens; the upstream accepted 500.
        let p = prices();
        let q = quote(
            PromptSize {
                bytes: 40,
                has_images: true,
                max_tokens: 16,
            },
            64,
            &p,
        );
        let reported = usage(500, 0, 16);
        let s = settle(Some(reported), q.input_estimate, &p, q.worst);
        assert_eq!(s.usage, reported, "the real counts are recorded");
        assert_eq!(s.charge, q.worst, "never more than reserved");
        assert_eq!(s.unbilled, p.charge(&reported) - q.worst);
        assert_eq!(s.charge + s.unbilled, s.full);
    }

    #[test]
    fn absurd_reports_stay_storable() {
        let s = settle(
            Some(usage(u64::MAX, u64::MAX, u64::MAX)),
            1,
            &Prices {
                output: Rate::parse("1000000").unwrap(),
                ..prices()
            },
            Pen::from_centimos(1),
        );
        assert_eq!(s.usage, usage(MAX_TOKENS, MAX_TOKENS, MAX_TOKENS));
        assert_eq!(s.charge, Pen::from_centimos(1));
        assert_eq!(s.unbilled, Pen::from_picos(i128::from(i64::MAX)));
    }

    #[test]
    fn the_cost_shown_is_the_settled_charge() {
        let terms = Charging {
            prices: prices(),
            reserved: Pen::from_picos(50_000_000),
            input_estimate: 40,
        };
        // Within the reservation, capped by it, and an unreported input estimated.
        for u in [usage(10, 4, 3), usage(10_000, 0, 10_000), usage(0, 0, 5)] {
            let s = settle(Some(u), 40, &prices(), Pen::from_picos(50_000_000));
            assert_eq!(terms.cost(u), s.charge, "{u:?}");
            assert_eq!(terms.settle(Some(u)), s);
        }
        assert_eq!(
            terms.cost(usage(0, 0, 5)),
            prices().charge(&usage(40, 0, 5))
        );
        assert_eq!(terms.cost(usage(10_000, 0, 10_000)), terms.reserved);
    }
}
