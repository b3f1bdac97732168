//! Settling a finished request: the policy is [`policy::settle`] (pure, in the core);
//! this applies it — the reservation replaced by the charge, the ledger row queued, the
//! unbilled and estimated-input metrics counted — from `finish`, or from the context's `Drop`
//! when a request task died before reaching it.
//!
//! The terms it settles on ([`charging`]) are the ones the response translators were given
//! (`relay`), so the `usage.cost` an answer shows is this charge: both are
//! [`policy::Charging`] applied to the usage the answer reports, which is what the relay
//! leaves in `ctx.usage`.

use super::ctx::{Admitted, RequestCtx};
use crate::billing::policy;
use crate::config::ModelId;
use crate::metrics::m;
use crate::store::{now_ms, LedgerRow};
use crate::usage::Usage;

/// What a settled request was billed, for the caller's metrics.
pub struct Settled {
    pub usage: Usage,
    pub charge: crate::money::Pen,
}

/// The terms `admitted` is settled on, on `model`: its prices, the reservation, the quote's
/// input estimate. Given to the translators for the cost they write, and used here.
pub fn charging(admitted: &Admitted, model: ModelId) -> policy::Charging {
    policy::Charging {
        prices: admitted.books.config.models[model].prices,
        reserved: admitted.reservation.amount,
        input_estimate: admitted.input_estimate,
    }
}

/// Takes the request's reservation, bills its usage (see [`policy::settle`]) and queues its
/// ledger row. `None` if nothing was reserved (the request never reached admission).
pub fn settle_request(ctx: &mut RequestCtx) -> Option<Settled> {
    let admitted = ctx.admitted.take()?;
    let (Some(caller), Some(model_id)) = (ctx.caller.clone(), ctx.model) else {
        admitted
            .books
            .accounts
            .settle(admitted.reservation, crate::money::Pen::ZERO);
        return None;
    };
    let terms = charging(&admitted, model_id);
    let books = admitted.books;
    let model = &books.config.models[model_id];
    let reserved = terms.reserved;
    let s = terms.settle(ctx.usage);
    let charge = books.accounts.settle(admitted.reservation, s.charge);
    debug_assert_eq!(
        charge, s.charge,
        "the policy caps at the reservation already"
    );
    let p = &caller.principal;
    if s.input_estimated {
        m().input_estimated
            .with_label_values(&[model.slug.as_str()])
            .inc();
    }
    if s.unbilled > crate::money::Pen::ZERO {
        log::warn!(
            "request {} of tenant {} on {}: its tokens cost {} but only {} was reserved; billed the reservation, {} unbilled (in={} cached={} out={})",
            ctx.request_id,
            p.tenant_name,
            model.slug,
            s.full.to_decimal(),
            reserved.to_decimal(),
            s.unbilled.to_decimal(),
            s.usage.prompt_tokens,
            s.usage.cached(),
            s.usage.completion_tokens
        );
        m().unbilled_pen
            .with_label_values(&[model.slug.as_str()])
            .inc_by(s.unbilled.picos() as f64 / 1e12);
    }
    books.ledger.record(LedgerRow {
        request_id: ctx.request_id.clone(),
        at: now_ms(),
        tenant_id: p.tenant_id,
        key_id: p.key_id.clone(),
        model: model.slug.clone(),
        format: ctx.format.as_str().to_owned(),
        input_tokens: s.usage.prompt_tokens,
        cached_tokens: s.usage.cached(),
        output_tokens: s.usage.completion_tokens,
        charge,
        status: ctx.ending.outcome.as_str().to_owned(),
        http_status: ctx.ending.status,
        unbilled: s.unbilled,
        input_estimated: s.input_estimated,
        caps: admitted.caps,
    });
    ctx.usage = Some(s.usage);
    ctx.charged = charge;
    Some(Settled {
        usage: s.usage,
        charge,
    })
}
