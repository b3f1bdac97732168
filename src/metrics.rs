//! Prometheus metrics: definitions, and the `/metrics` body of the metrics listener.
//!
//! Names follow the OpenTelemetry GenAI conventions where they fit (`gen_ai_*`, see
//! `../shared/reference/ecosystem.md` §1) and are `quipu_`-prefixed otherwise. Labels stay
//! bounded: model slugs, routes, statuses, error kinds, replica URLs from the config, tenant
//! names (tenants are created by the operator). Never key ids, request ids or anything a
//! client chooses.
//!
//! Token types are disjoint so sums are meaningful: `input` is *uncached* input, `cached_input`
//! the prefix-cache hits, `output` the generated tokens. Money in metrics is a float counter
//! for dashboards only; the ledger is the authoritative record.

use prometheus::{
    exponential_buckets, Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::LazyLock;

/// OTel GenAI token-usage buckets.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];
/// OTel GenAI request-duration buckets (seconds).
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 163.84,
    327.68,
];
/// OTel GenAI time-to-first-token buckets (seconds), extended for long queues.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
/// OTel GenAI time-per-output-token buckets (seconds).
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// Every metric Quipu exports.
pub struct Metrics {
    pub registry: Registry,
    pub token_usage: HistogramVec,
    pub request_duration: HistogramVec,
    pub time_to_first_token: HistogramVec,
    pub time_per_output_token: HistogramVec,
    pub requests: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub streams_open: IntGauge,
    pub auth_failures: IntCounterVec,
    pub rate_limited: IntCounterVec,
    pub billing_refused: IntCounterVec,
    pub tokens: IntCounterVec,
    pub spend_pen: prometheus::CounterVec,
    pub unbilled_pen: prometheus::CounterVec,
    pub input_estimated: IntCounterVec,
    pub reservations_open: IntGauge,
    pub reserved_pen: Gauge,
    pub upstream_healthy: IntGaugeVec,
    pub upstream_in_flight: IntGaugeVec,
    pub upstream_selected: IntCounterVec,
    pub upstream_failures: IntCounterVec,
    pub upstream_retries: IntCounterVec,
    pub affinity_hits: IntCounterVec,
    pub client_disconnects: IntCounterVec,
    pub client_connections: IntGauge,
    pub connections_refused: IntCounter,
    pub ledger_queue: IntGauge,
    pub ledger_flush_seconds: HistogramVec,
    pub ledger_rows: IntCounterVec,
    pub ledger_spill_files: IntGaugeVec,
    pub keys_active: IntGauge,
    pub build_info: IntGaugeVec,
    pub gateway_overhead: HistogramVec,
}

// Names, labels and buckets are constants of this file: construction cannot fail.
#[expect(clippy::expect_used, reason = "static metric definitions")]
fn hist(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid histogram")
}

#[expect(clippy::expect_used, reason = "static metric definitions")]
fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter")
}

#[expect(clippy::expect_used, reason = "static metric definitions")]
fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge")
}

impl Metrics {
    #[expect(clippy::expect_used, reason = "static metric definitions")]
    fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::new(),
            token_usage: hist(
                "gen_ai_client_token_usage",
                "Tokens per request by type: input (uncached), cached_input, output",
                TOKEN_BUCKETS,
                &["gen_ai_token_type", "gen_ai_request_model", "gen_ai_operation_name"],
            ),
            request_duration: hist(
                "gen_ai_server_request_duration_seconds",
                "Time from request arrival to the last byte sent to the client",
                DURATION_BUCKETS,
                &["gen_ai_request_model", "format", "stream", "error_type"],
            ),
            time_to_first_token: hist(
                "gen_ai_server_time_to_first_token_seconds",
                "Time from request arrival to the first generated chunk of a streamed response",
                TTFT_BUCKETS,
                &["gen_ai_request_model", "format"],
            ),
            time_per_output_token: hist(
                "gen_ai_server_time_per_output_token_seconds",
                "(duration - time to first token) / (output tokens - 1), streams only",
                TPOT_BUCKETS,
                &["gen_ai_request_model"],
            ),
            requests: counter(
                "quipu_requests_total",
                "Requests by route, model, HTTP status and error type (none when successful)",
                &["route", "model", "status", "error_type"],
            ),
            in_flight: gauge_vec(
                "quipu_requests_in_flight",
                "Requests being handled, by route",
                &["route"],
            ),
            streams_open: IntGauge::new("quipu_streams_open", "Streaming responses in progress")
                .expect("valid gauge"),
            auth_failures: counter(
                "quipu_auth_failures_total",
                "Requests refused for a missing, invalid or revoked key",
                &["route"],
            ),
            rate_limited: counter(
                "quipu_rate_limited_total",
                "Requests refused by a rate limit, by tenant, scope (key|tenant) and limit",
                &["tenant", "scope", "limit"],
            ),
            billing_refused: counter(
                "quipu_billing_refused_total",
                "Requests refused because the balance did not cover them (402)",
                &["tenant"],
            ),
            tokens: counter(
                "quipu_tokens_total",
                "Billed tokens by tenant, model and type (input is uncached input)",
                &["tenant", "model", "type"],
            ),
            spend_pen: prometheus::CounterVec::new(
                Opts::new(
                    "quipu_spend_pen_total",
                    "Charges in soles by tenant and model (dashboards only; the ledger is exact)",
                ),
                &["tenant", "model"],
            )
            .expect("valid counter"),
            unbilled_pen: prometheus::CounterVec::new(
                Opts::new(
                    "quipu_unbilled_pen_total",
                    "Soles that requests' tokens cost beyond their reservation, which caps every charge: not billed (dashboards only; the ledger's unbilled column is exact)",
                ),
                &["model"],
            )
            .expect("valid counter"),
            input_estimated: counter(
                "quipu_input_tokens_estimated_total",
                "Requests billed an estimate of their input tokens because the upstream reported none (a cut stream)",
                &["model"],
            ),
            reservations_open: IntGauge::new(
                "quipu_reservations_open",
                "Admitted requests whose worst-case cost is reserved",
            )
            .expect("valid gauge"),
            reserved_pen: Gauge::new(
                "quipu_reserved_pen",
                "Soles held by open reservations (dashboards only)",
            )
            .expect("valid gauge"),
            upstream_healthy: gauge_vec(
                "quipu_upstream_healthy",
                "1 if the replica is healthy and not ejected",
                &["model", "replica"],
            ),
            upstream_in_flight: gauge_vec(
                "quipu_upstream_in_flight",
                "Requests in flight to the replica",
                &["model", "replica"],
            ),
            upstream_selected: counter(
                "quipu_upstream_selected_total",
                "Times the replica was picked, by selection reason",
                &["model", "replica", "reason"],
            ),
            upstream_failures: counter(
                "quipu_upstream_failures_total",
                "Failed upstream attempts by kind (connect, status_503, reset, timeout, …)",
                &["model", "replica", "kind"],
            ),
            upstream_retries: counter(
                "quipu_upstream_retries_total",
                "Requests retried on another replica before any byte reached the client",
                &["model"],
            ),
            affinity_hits: counter(
                "quipu_prefix_affinity_total",
                "Prefix-affinity routing outcomes: hit (sent to the replica holding the prefix), overloaded, miss",
                &["model", "outcome"],
            ),
            client_disconnects: counter(
                "quipu_client_disconnects_total",
                "Clients that went away before their response was complete",
                &["route"],
            ),
            client_connections: IntGauge::new(
                "quipu_client_connections",
                "Open client connections on the API listener, idle keep-alive ones included",
            )
            .expect("valid gauge"),
            connections_refused: IntCounter::new(
                "quipu_client_connections_refused_total",
                "Client connections closed on accept because server.max_connections were open",
            )
            .expect("valid counter"),
            ledger_queue: IntGauge::new(
                "quipu_ledger_queue_rows",
                "Ledger rows waiting to be written to the store",
            )
            .expect("valid gauge"),
            ledger_flush_seconds: hist(
                "quipu_ledger_flush_seconds",
                "Time to write one batch of ledger rows, by result",
                &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
                &["result"],
            ),
            ledger_rows: counter(
                "quipu_ledger_rows_total",
                "Ledger rows written (new), skipped as already recorded (duplicate), refused as invalid and moved to the dead-letter table (rejected), or written to a spill file at a shutdown with the store unreachable (spilled)",
                &["result"],
            ),
            ledger_spill_files: gauge_vec(
                "quipu_ledger_spill_files",
                "Ledger spill files in store.spill_dir not imported yet: their charges are not in the tenants' balances until `quipu ledger import` (complete), or a process died writing them (incomplete)",
                &["state"],
            ),
            keys_active: IntGauge::new("quipu_keys_active", "Active API keys in the snapshot")
                .expect("valid gauge"),
            build_info: gauge_vec(
                "quipu_build_info",
                "Always 1; the labels say which build is running",
                &["version", "store"],
            ),
            gateway_overhead: hist(
                "quipu_gateway_overhead_seconds",
                "Time the gateway spent on a request outside the upstream exchange",
                &exponential_buckets(0.000_005, 2.0, 16).unwrap_or_default(),
                &["route"],
            ),
        };
        m.register_all();
        m
    }

    fn register_all(&self) {
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.token_usage.clone()),
            Box::new(self.request_duration.clone()),
            Box::new(self.time_to_first_token.clone()),
            Box::new(self.time_per_output_token.clone()),
            Box::new(self.requests.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.streams_open.clone()),
            Box::new(self.auth_failures.clone()),
            Box::new(self.rate_limited.clone()),
            Box::new(self.billing_refused.clone()),
            Box::new(self.tokens.clone()),
            Box::new(self.spend_pen.clone()),
            Box::new(self.unbilled_pen.clone()),
            Box::new(self.input_estimated.clone()),
            Box::new(self.reservations_open.clone()),
            Box::new(self.reserved_pen.clone()),
            Box::new(self.upstream_healthy.clone()),
            Box::new(self.upstream_in_flight.clone()),
            Box::new(self.upstream_selected.clone()),
            Box::new(self.upstream_failures.clone()),
            Box::new(self.upstream_retries.clone()),
            Box::new(self.affinity_hits.clone()),
            Box::new(self.client_disconnects.clone()),
            Box::new(self.client_connections.clone()),
            Box::new(self.connections_refused.clone()),
            Box::new(self.ledger_queue.clone()),
            Box::new(self.ledger_flush_seconds.clone()),
            Box::new(self.ledger_rows.clone()),
            Box::new(self.ledger_spill_files.clone()),
            Box::new(self.keys_active.clone()),
            Box::new(self.build_info.clone()),
            Box::new(self.gateway_overhead.clone()),
        ];
        for c in collectors {
            if let Err(e) = self.registry.register(c) {
                log::error!("metric registration failed: {e}");
            }
        }
    }

    /// The exposition text for `/metrics`.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            log::error!("metrics encoding failed: {e}");
        }
        out
    }
}

/// The process-wide metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Shorthand for [`METRICS`].
pub fn m() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_once_touched() {
        let m = m();
        m.requests
            .with_label_values(&["chat", "colibri", "200", "none"])
            .inc();
        m.build_info.with_label_values(&["0.1.0", "sqlite"]).set(1);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("quipu_requests_total{"));
        assert!(text.contains("quipu_build_info{"));
    }
}
