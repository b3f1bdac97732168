//! What a finished request leaves behind besides its ledger row: its metrics and its
//! access-log line.

use super::settle::Settled;
use super::{Gateway, RequestCtx};
use crate::metrics::meters::TOKEN_KINDS;

/// Billing metrics of a settled request: rate-limit token windows, token histograms, the
/// tenant's token and spend counters.
pub fn billed(gw: &Gateway, ctx: &RequestCtx, settled: &Settled) {
    let (Some(caller), Some(model_id)) = (ctx.caller.as_ref(), ctx.model) else {
        return;
    };
    let usage = settled.usage;
    let p = &caller.principal;
    gw.limits
        .consumed(&p.limits, &caller.windows, usage.total());
    let tokens: [u64; TOKEN_KINDS.len()] = [
        usage.uncached_input(),
        usage.cached(),
        usage.completion_tokens,
    ];
    for (kind, n) in tokens.into_iter().enumerate() {
        if let Some(h) = gw.meters.token_usage(model_id, kind) {
            h.observe(n as f64);
        }
    }
    let slug = &gw.config.models[model_id].slug;
    caller.meters.with(model_id, &p.tenant_name, slug, |t| {
        for (counter, n) in t.tokens.iter().zip(tokens) {
            counter.inc_by(n);
        }
        // Float soles for dashboards only; the ledger has the exact amount.
        t.spend_pen.inc_by(settled.charge.picos() as f64 / 1e12);
    });
}

/// Request metrics and the access-log line.
pub fn request(gw: &Gateway, ctx: &RequestCtx) {
    let elapsed = ctx.started.elapsed();
    let ending = ctx.ending;
    let error = ending.error.unwrap_or("none");
    gw.meters
        .request(ctx.route, ctx.model, ending.status, error);
    if ctx.route.is_api() {
        gw.meters.duration(
            ctx.model,
            ctx.format,
            ctx.stream,
            error,
            elapsed.as_secs_f64(),
        );
        gw.meters
            .overhead(ctx.route)
            .observe(elapsed.saturating_sub(ctx.upstream.time).as_secs_f64());
        if let (Some(t), Some(model_id)) = (ctx.upstream.ttft, ctx.model) {
            if let Some(h) = gw.meters.ttft(model_id, ctx.format) {
                h.observe(t.as_secs_f64());
            }
            let out = ctx.usage.map_or(0, |u| u.completion_tokens);
            if ctx.stream && out > 1 {
                let per = (elapsed.saturating_sub(t)).as_secs_f64() / (out - 1) as f64;
                if let Some(h) = gw.meters.tpot(model_id) {
                    h.observe(per);
                }
            }
        }
    }
    if gw.config.server.access_log && log::log_enabled!(target: "quipu::access", log::Level::Info) {
        access_log(gw, ctx, error, elapsed);
    }
}

fn access_log(gw: &Gateway, ctx: &RequestCtx, error: &str, elapsed: std::time::Duration) {
    let u = ctx.usage.unwrap_or_default();
    let model = ctx
        .model
        .map_or("none", |i| gw.config.models[i].slug.as_str());
    let replica = ctx
        .model
        .zip(ctx.upstream.replica)
        .map_or("-", |(m, r)| gw.config.models[m].replicas[r].url.as_str());
    let principal = ctx.caller.as_ref().map(|c| &c.principal);
    crate::logger::info_fields("quipu::access", |line| {
        line.str("request_id", &ctx.request_id)
            .str("route", ctx.route.as_str())
            .str("format", ctx.format.as_str())
            .str("tenant", principal.map_or("-", |p| p.tenant_name.as_str()))
            .str("key", principal.map_or("-", |p| p.key_id.as_str()))
            .str("model", model)
            .num("status", ctx.ending.status.into())
            .str("outcome", ctx.ending.outcome.as_str())
            .str("error", error)
            .num("in", u.prompt_tokens)
            .num("cached", u.cached())
            .num("out", u.completion_tokens)
            .money("charge_pen", ctx.charged.decimal())
            .millis("latency_ms", Some(elapsed))
            .millis("ttft_ms", ctx.upstream.ttft)
            .millis(
                "queue_ms",
                (!ctx.upstream.queued.is_zero()).then_some(ctx.upstream.queued),
            )
            .str("replica", replica)
            .num("attempts", ctx.upstream.attempts.into());
    });
}
