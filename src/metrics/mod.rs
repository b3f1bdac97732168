//! Prometheus metrics: definitions, and the `/metrics` body of the metrics listener.
//!
//! Names follow the OpenTelemetry GenAI semantic conventions where they fit (`gen_ai_*`, see
//! <https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-metrics/>; dots become
//! underscores in Prometheus) and are `quipu_`-prefixed otherwise. Labels stay
//! bounded: model slugs, routes, statuses, error kinds, replica URLs from the config, tenant
//! names (tenants are created by the operator). Never key ids, request ids or anything a
//! client chooses.
//!
//! Token types are disjoint so sums are meaningful: `input` is *uncached* input, `cached_input`
//! the prefix-cache hits, `output` the generated tokens. Money in metrics is a float counter
//! for dashboards only; the ledger is the authoritative record.

pub mod meters;

pub use meters::{Meters, TenantMeters};

use prometheus::{
    exponential_buckets, CounterVec, Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
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

/// Declares every metric once: its field, type and definition. The struct, its constructor
/// and the registration are generated from this one list, so a metric cannot be defined and
/// forgotten at registration (or registered twice).
macro_rules! metrics {
    ($( $(#[$doc:meta])* $field:ident: $ty:ty = $make:expr; )*) => {
        /// Every metric Quipu exports.
        pub struct Metrics {
            pub registry: Registry,
            $( $(#[$doc])* pub $field: $ty, )*
        }

        impl Metrics {
            /// Defines and registers every metric; the first registration error (a name
            /// defined twice) is returned.
            fn build() -> Result<Metrics, prometheus::Error> {
                let registry = Registry::new();
                $(
                    let $field: $ty = $make?;
                    registry.register(Box::new($field.clone()))?;
                )*
                Ok(Metrics { registry, $($field,)* })
            }
        }
    };
}

fn hist(
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

fn counter(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn float_counter(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<CounterVec> {
    CounterVec::new(Opts::new(name, help), labels)
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

metrics! {
    token_usage: HistogramVec = hist(
        "gen_ai_client_token_usage",
        "Tokens per request by type: input (uncached), cached_input, output",
        TOKEN_BUCKETS,
        &["gen_ai_token_type", "gen_ai_request_model", "gen_ai_operation_name"],
    );
    request_duration: HistogramVec = hist(
        "gen_ai_server_request_duration_seconds",
        "Time from request arrival to the last byte sent to the client",
        DURATION_BUCKETS,
        &["gen_ai_request_model", "format", "stream", "error_type"],
    );
    time_to_first_token: HistogramVec = hist(
        "gen_ai_server_time_to_first_token_seconds",
        "Time from request arrival to the first generated chunk of a streamed response",
        TTFT_BUCKETS,
        &["gen_ai_request_model", "format"],
    );
    time_per_output_token: HistogramVec = hist(
        "gen_ai_server_time_per_output_token_seconds",
        "(duration - time to first token) / (output tokens - 1), streams only",
        TPOT_BUCKETS,
        &["gen_ai_request_model"],
    );
    requests: IntCounterVec = counter(
        "quipu_requests_total",
        "Requests by route, model, HTTP status and error type (none when successful)",
        &["route", "model", "status", "error_type"],
    );
    in_flight: IntGaugeVec = gauge_vec(
        "quipu_requests_in_flight",
        "Requests being handled, by route",
        &["route"],
    );
    streams_open: IntGauge = IntGauge::new("quipu_streams_open", "Streaming responses in progress");
    auth_failures: IntCounterVec = counter(
        "quipu_auth_failures_total",
        "Requests refused for a missing, invalid or revoked key",
        &["route"],
    );
    rate_limited: IntCounterVec = counter(
        "quipu_rate_limited_total",
        "Requests refused by a rate limit, by tenant, scope (key|tenant) and limit",
        &["tenant", "scope", "limit"],
    );
    billing_refused: IntCounterVec = counter(
        "quipu_billing_refused_total",
        "Requests refused because the balance did not cover them (402)",
        &["tenant"],
    );
    cap_refused: IntCounterVec = counter(
        "quipu_cap_refused_total",
        "Requests refused because a spend cap did not cover them, by tenant and cap (key|tenant)",
        &["tenant", "cap"],
    );
    tokens: IntCounterVec = counter(
        "quipu_tokens_total",
        "Billed tokens by tenant, model and type (input is uncached input)",
        &["tenant", "model", "type"],
    );
    spend_pen: CounterVec = float_counter(
        "quipu_spend_pen_total",
        "Charges in soles by tenant and model (dashboards only; the ledger is exact)",
        &["tenant", "model"],
    );
    unbilled_pen: CounterVec = float_counter(
        "quipu_unbilled_pen_total",
        "Soles that requests' tokens cost beyond their reservation, which caps every charge: not billed (dashboards only; the ledger's unbilled column is exact)",
        &["model"],
    );
    input_estimated: IntCounterVec = counter(
        "quipu_input_tokens_estimated_total",
        "Requests billed an estimate of their input tokens because the upstream reported none (a cut stream)",
        &["model"],
    );
    lease_recalls: IntCounterVec = counter(
        "quipu_lease_recalls_total",
        "Balance leases called home: recalls this replica sent (a request short of balance other replicas held) and leases it returned when asked",
        &["side"],
    );
    rate_window_calls: IntCounterVec = counter(
        "quipu_rate_window_calls_total",
        "Calls to the store's shared rate windows (slices of a window's quota taken or returned), by result: ok, or error (the replica then counts alone until the store answers again)",
        &["result"],
    );
    rate_window_waits: IntCounter = IntCounter::new(
        "quipu_rate_window_waits_total",
        "Requests that waited for a slice of a shared rate window (no slice held yet: a key's first request on a replica in a window, or traffic faster than the slices arrive)",
    );
    reservations_open: IntGauge = IntGauge::new(
        "quipu_reservations_open",
        "Admitted requests whose worst-case cost is reserved",
    );
    reserved_pen: Gauge = Gauge::new(
        "quipu_reserved_pen",
        "Soles held by open reservations (dashboards only)",
    );
    upstream_healthy: IntGaugeVec = gauge_vec(
        "quipu_upstream_healthy",
        "1 if the replica is healthy and not ejected",
        &["model", "replica"],
    );
    upstream_in_flight: IntGaugeVec = gauge_vec(
        "quipu_upstream_in_flight",
        "Requests in flight to the replica",
        &["model", "replica"],
    );
    upstream_selected: IntCounterVec = counter(
        "quipu_upstream_selected_total",
        "Times the replica was picked, by selection reason",
        &["model", "replica", "reason"],
    );
    upstream_failures: IntCounterVec = counter(
        "quipu_upstream_failures_total",
        "Failed upstream attempts by kind (connect, status_503, reset, timeout, …)",
        &["model", "replica", "kind"],
    );
    upstream_retries: IntCounterVec = counter(
        "quipu_upstream_retries_total",
        "Requests retried on another replica before any byte reached the client",
        &["model"],
    );
    affinity_hits: IntCounterVec = counter(
        "quipu_prefix_affinity_total",
        "Prefix-affinity routing outcomes: hit (sent to the replica holding the prefix), overloaded, miss",
        &["model", "outcome"],
    );
    queue_depth: IntGaugeVec = gauge_vec(
        "quipu_queue_depth",
        "Requests waiting in the queue of a scheduled model, by priority (a promoted batch request counts as interactive)",
        &["model", "priority"],
    );
    queue_wait_seconds: HistogramVec = hist(
        "quipu_queue_wait_seconds",
        "Time from a request's arrival at a scheduled model's queue to its dispatch (0 when a slot was free)",
        TTFT_BUCKETS,
        &["model", "priority"],
    );
    dispatches: IntCounterVec = counter(
        "quipu_dispatches_total",
        "Requests a scheduled model's queue started, by placement: preferred (its cache-warm replica), spilled (elsewhere after the affinity wait), balanced (no preference), returned (the slot its tenant's previous request freed, kept for it), engine_queue (sent to wait at the head of a full engine's own queue, its tenant below its share)",
        &["model", "placement"],
    );
    queue_rejections: IntCounterVec = counter(
        "quipu_queue_rejections_total",
        "Requests a scheduled model's queue did not run, by reason: tenant_queue_full and timeout (429), cluster_overloaded and no_replica (503/529), cancelled (the client left while queued)",
        &["model", "reason"],
    );
    slots_in_use: IntGaugeVec = gauge_vec(
        "quipu_replica_slots_in_use",
        "Slots of a scheduled replica in use, as the scheduler counts them (the engine's own report, or this gateway's requests)",
        &["model", "replica"],
    );
    slots: IntGaugeVec = gauge_vec(
        "quipu_replica_slots",
        "Slots of a scheduled replica this gateway may use (max_concurrency, or its share of it)",
        &["model", "replica"],
    );
    engine_load: IntGaugeVec = gauge_vec(
        "quipu_engine_requests",
        "Requests a replica's engine reports in its own scheduler (its /metrics), by state: running, waiting",
        &["model", "replica", "state"],
    );
    client_disconnects: IntCounterVec = counter(
        "quipu_client_disconnects_total",
        "Clients that went away before their response was complete",
        &["route"],
    );
    client_connections: IntGauge = IntGauge::new(
        "quipu_client_connections",
        "Open client connections on the API listener, idle keep-alive ones included",
    );
    connections_refused: IntCounter = IntCounter::new(
        "quipu_client_connections_refused_total",
        "Client connections closed on accept because server.max_connections were open",
    );
    tls_handshake_failures: IntCounterVec = counter(
        "quipu_tls_handshake_failures_total",
        "Client TLS handshakes that failed (error: refused or garbage, timeout: not finished within server.tls_handshake_timeout_ms)",
        &["reason"],
    );
    h2_abuse: IntCounterVec = counter(
        "quipu_http2_abuse_total",
        "HTTP/2 misbehaviour: streams refused over the per-connection cap (refused), connections closed for too many malformed or refused streams (rejected), cancellations (cancels), reset or frame floods (flood: GOAWAY ENHANCE_YOUR_CALM) or other protocol errors (protocol_error)",
        &["kind"],
    );
    ledger_queue: IntGauge = IntGauge::new(
        "quipu_ledger_queue_rows",
        "Ledger rows waiting to be written to the store",
    );
    ledger_flush_seconds: HistogramVec = hist(
        "quipu_ledger_flush_seconds",
        "Time to write one batch of ledger rows, by result",
        &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
        &["result"],
    );
    ledger_rows: IntCounterVec = counter(
        "quipu_ledger_rows_total",
        "Ledger rows written (new), skipped as already recorded (duplicate), refused as invalid and moved to the dead-letter table (rejected), or written to a spill file at a shutdown with the store unreachable (spilled)",
        &["result"],
    );
    stored_responses: IntCounterVec = counter(
        "quipu_stored_responses_total",
        "Responses of the Responses API to keep (store: true), by result: written to the store (stored), not kept because too many bytes were waiting for the store (queue_full), lost with a batch the store refused (failed), or not storable (invalid)",
        &["result"],
    );
    ledger_spill_files: IntGaugeVec = gauge_vec(
        "quipu_ledger_spill_files",
        "Ledger spill files in store.spill_dir not imported yet: their charges are not in the tenants' balances until `quipu ledger import` (complete), or a process died writing them (incomplete)",
        &["state"],
    );
    webhook_deliveries: IntCounterVec = counter(
        "quipu_webhook_deliveries_total",
        "Webhook delivery attempts by outcome: delivered, failed (retried later), dead (given up)",
        &["outcome"],
    );
    webhook_backlog: IntGauge = IntGauge::new(
        "quipu_webhook_backlog",
        "Webhook deliveries pending plus events not yet fanned out, as the sender last counted",
    );
    keys_active: IntGauge = IntGauge::new("quipu_keys_active", "Active API keys in the snapshot");
    build_info: IntGaugeVec = gauge_vec(
        "quipu_build_info",
        "Always 1; the labels say which build is running",
        &["version", "store"],
    );
    gateway_overhead: HistogramVec = hist(
        "quipu_gateway_overhead_seconds",
        "Time the gateway spent on a request outside the upstream exchange",
        &exponential_buckets(0.000_005, 2.0, 16)?,
        &["route"],
    );
}

impl Metrics {
    /// The process's metrics. Every definition is a constant of this file, so building them
    /// cannot fail unless a definition is wrong, which the tests below catch.
    #[expect(
        clippy::expect_used,
        reason = "static metric definitions, checked by a test"
    )]
    fn new() -> Metrics {
        Metrics::build().expect("valid metric definitions")
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
    fn every_definition_is_valid_and_registered_once() {
        let m = Metrics::build().unwrap();
        // Vectors appear once they have a child; plain gauges and counters at once.
        m.requests
            .with_label_values(&["x", "y", "200", "none"])
            .inc();
        let names: Vec<String> = m
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert!(
            names.contains(&"quipu_requests_total".to_owned()),
            "{names:?}"
        );
        assert!(
            names.contains(&"quipu_streams_open".to_owned()),
            "{names:?}"
        );
    }

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
