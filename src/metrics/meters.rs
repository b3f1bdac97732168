//! The request path's metric children, resolved once and kept.
//!
//! `with_label_values` hashes every label and takes the metric family's read lock: a lock and a
//! few hundred instructions per metric, a dozen times per request. These tables resolve each
//! child the first time a request needs it (so no series is exported before it has happened)
//! and keep it, so a request touches only atomics. Rare outcomes (errors, unusual statuses)
//! still go through `with_label_values`.

use super::m;
use crate::error::ClientFormat;
use crate::route::Route;
use prometheus::{Counter, Histogram, IntCounter, IntGauge};
use std::sync::OnceLock;

/// Token kinds in the order of `quipu_tokens_total` / `gen_ai_client_token_usage` labels.
pub const TOKEN_KINDS: [&str; 3] = ["input", "cached_input", "output"];

/// Children of the gateway's per-route and per-model metrics.
pub struct Meters {
    routes: [RouteMeters; Route::COUNT],
    models: Vec<ModelMeters>,
}

#[derive(Default)]
struct RouteMeters {
    in_flight: OnceLock<IntGauge>,
    overhead: OnceLock<Histogram>,
}

#[derive(Default)]
struct ModelMeters {
    slug: String,
    /// `quipu_requests_total{status="200",error_type="none"}` by route.
    requests_ok: [OnceLock<IntCounter>; Route::COUNT],
    /// `gen_ai_server_request_duration_seconds{error_type="none"}` by format and stream.
    duration_ok: [[OnceLock<Histogram>; 2]; ClientFormat::COUNT],
    ttft: [OnceLock<Histogram>; ClientFormat::COUNT],
    tpot: OnceLock<Histogram>,
    token_usage: [OnceLock<Histogram>; 3],
}

impl Meters {
    /// One table per configured model, in config order (indexed by `ModelId`).
    pub fn new<'a>(slugs: impl Iterator<Item = &'a str>) -> Meters {
        Meters {
            routes: Default::default(),
            models: slugs
                .map(|slug| ModelMeters {
                    slug: slug.to_owned(),
                    ..ModelMeters::default()
                })
                .collect(),
        }
    }

    pub fn in_flight(&self, route: Route) -> &IntGauge {
        self.routes[route.index()]
            .in_flight
            .get_or_init(|| m().in_flight.with_label_values(&[route.as_str()]))
    }

    pub fn overhead(&self, route: Route) -> &Histogram {
        self.routes[route.index()]
            .overhead
            .get_or_init(|| m().gateway_overhead.with_label_values(&[route.as_str()]))
    }

    /// Counts a finished request.
    pub fn request(&self, route: Route, model: Option<usize>, status: u16, error: &str) {
        if let (Some(mm), 200, "none") = (model.and_then(|i| self.models.get(i)), status, error) {
            return mm.requests_ok[route.index()]
                .get_or_init(|| {
                    m().requests
                        .with_label_values(&[route.as_str(), &mm.slug, "200", "none"])
                })
                .inc();
        }
        let slug = model
            .and_then(|i| self.models.get(i))
            .map_or("none", |mm| mm.slug.as_str());
        m().requests
            .with_label_values(&[route.as_str(), slug, &status.to_string(), error])
            .inc();
    }

    /// Observes the duration of an API request.
    pub fn duration(
        &self,
        model: Option<usize>,
        format: ClientFormat,
        stream: bool,
        error: &str,
        secs: f64,
    ) {
        let stream_label = if stream { "true" } else { "false" };
        match (model.and_then(|i| self.models.get(i)), error) {
            (Some(mm), "none") => mm.duration_ok[format.index()][usize::from(stream)]
                .get_or_init(|| {
                    m().request_duration.with_label_values(&[
                        &mm.slug,
                        format.as_str(),
                        stream_label,
                        "none",
                    ])
                })
                .observe(secs),
            (mm, _) => m()
                .request_duration
                .with_label_values(&[
                    mm.map_or("none", |mm| mm.slug.as_str()),
                    format.as_str(),
                    stream_label,
                    error,
                ])
                .observe(secs),
        }
    }

    pub fn ttft(&self, model: usize, format: ClientFormat) -> Option<&Histogram> {
        let mm = self.models.get(model)?;
        Some(mm.ttft[format.index()].get_or_init(|| {
            m().time_to_first_token
                .with_label_values(&[&mm.slug, format.as_str()])
        }))
    }

    pub fn tpot(&self, model: usize) -> Option<&Histogram> {
        let mm = self.models.get(model)?;
        Some(
            mm.tpot
                .get_or_init(|| m().time_per_output_token.with_label_values(&[&mm.slug])),
        )
    }

    /// `gen_ai_client_token_usage` for the token kind at `kind` in [`TOKEN_KINDS`].
    pub fn token_usage(&self, model: usize, kind: usize) -> Option<&Histogram> {
        let mm = self.models.get(model)?;
        Some(mm.token_usage[kind].get_or_init(|| {
            m().token_usage
                .with_label_values(&[TOKEN_KINDS[kind], &mm.slug, "chat"])
        }))
    }
}

/// A tenant's per-model billing counters, kept with its keys in the key snapshot.
pub struct TenantMeters {
    by_model: Box<[OnceLock<TenantModelMeters>]>,
}

pub struct TenantModelMeters {
    /// `quipu_tokens_total` by [`TOKEN_KINDS`].
    pub tokens: [IntCounter; 3],
    pub spend_pen: Counter,
}

impl TenantModelMeters {
    fn resolve(tenant: &str, slug: &str) -> TenantModelMeters {
        TenantModelMeters {
            tokens: TOKEN_KINDS.map(|kind| m().tokens.with_label_values(&[tenant, slug, kind])),
            spend_pen: m().spend_pen.with_label_values(&[tenant, slug]),
        }
    }
}

impl std::fmt::Debug for TenantMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TenantMeters")
    }
}

impl TenantMeters {
    pub fn new(models: usize) -> TenantMeters {
        TenantMeters {
            by_model: (0..models).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Runs `f` on the counters of `tenant` × `slug` (`model` indexes the config's models).
    pub fn with<R>(
        &self,
        model: usize,
        tenant: &str,
        slug: &str,
        f: impl FnOnce(&TenantModelMeters) -> R,
    ) -> R {
        match self.by_model.get(model) {
            Some(cell) => f(cell.get_or_init(|| TenantModelMeters::resolve(tenant, slug))),
            None => f(&TenantModelMeters::resolve(tenant, slug)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_children_are_the_labelled_series() {
        let meters = Meters::new(["meters-test-model"].into_iter());
        meters.request(Route::Chat, Some(0), 200, "none");
        meters.request(Route::Chat, Some(0), 200, "none");
        meters.request(Route::Chat, Some(0), 500, "upstream_error");
        let ok = m()
            .requests
            .with_label_values(&["chat", "meters-test-model", "200", "none"])
            .get();
        let failed = m()
            .requests
            .with_label_values(&["chat", "meters-test-model", "500", "upstream_error"])
            .get();
        assert_eq!((ok, failed), (2, 1));

        let tenant = TenantMeters::new(1);
        for model in [0, 7] {
            // 7 is out of range: resolved on the spot, same series.
            tenant.with(model, "meters-test-tenant", "meters-test-model", |t| {
                t.tokens[2].inc_by(5)
            });
        }
        let out = m()
            .tokens
            .with_label_values(&["meters-test-tenant", "meters-test-model", "output"])
            .get();
        assert_eq!(out, 10);
    }
}
