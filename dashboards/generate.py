#!/usr/bin/env python3
"""Generates Quipu's Grafana dashboards from the metric definitions in `src/metrics.rs`.

    python3 dashboards/generate.py           # writes dashboards/quipu-*.json
    python3 dashboards/generate.py --check   # exits 1 if a committed file differs

The committed JSON must equal this script's output (`tests/python/test_observability.py`
checks it, and evaluates every target below against a real Prometheus scraping a real gateway).

Conventions (see `docs/observability.md`): `"id": null` and a fixed `uid`; one `datasource`
template variable that every panel and target references as `${datasource}`; query variables
`model` and `tenant` (multi-value, All = `.*`) used with `=~`; `$__rate_interval` in every
`rate()`; a unit and a description on every panel. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"

# Selectors for the template variables, by the label each metric carries.
M = 'model=~"$model"'
GM = 'gen_ai_request_model=~"$model"'
T = 'tenant=~"$tenant"'
CHAT_MESSAGES = 'route=~"chat|messages|responses"'
ERR = 'error_type!="none"'
S5 = 'status=~"5.."'
CACHED = 'type="cached_input"'
PROMPT = 'type=~"input|cached_input"'
OUTPUT = 'type="output"'
HIT = 'outcome="hit"'
SOLES = "prefix:S/ "
TENANT_VALUES = 'label_values({__name__=~"quipu_tokens_total|quipu_billing_refused_total|quipu_cap_refused_total|quipu_rate_limited_total"}, tenant)'


def j(*selectors: str) -> str:
    return ", ".join(selectors)


def rate(metric: str, sel: str = "") -> str:
    return f"rate({metric}{{{sel}}}[{RI}])" if sel else f"rate({metric}[{RI}])"


def quantiles(metric: str, sel: str = "", by: str = "") -> list[tuple[str, str]]:
    """p50/p95/p99 targets of a histogram: (expr, legend)."""
    extra = f", {by}" if by else ""
    prefix = "{{" + by + "}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by (le{extra}) ({rate(metric + '_bucket', sel)}))",
            f"{prefix}p{int(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


class Board:
    """Lays panels out left to right in rows of 24 grid units."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._id(),
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def add(self, panel: dict, w: int, h: int) -> None:
        if self.x + w > 24:
            self._newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)


def targets(exprs: list[tuple[str, str]], instant: bool = False) -> list[dict]:
    out = []
    for i, (expr, legend) in enumerate(exprs):
        out.append(
            {
                "datasource": DS,
                "editorMode": "code",
                "expr": expr,
                "legendFormat": legend,
                "range": not instant,
                "instant": instant,
                "refId": chr(ord("A") + i),
            }
        )
    return out


def timeseries(
    title: str,
    description: str,
    exprs: list[tuple[str, str]],
    unit: str,
    stack: bool = False,
    minimum: float | None = 0,
) -> dict:
    defaults: dict = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 15 if stack else 5,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
                "calcs": ["mean", "max", "lastNotNull"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets(exprs),
    }


def stat(
    title: str,
    description: str,
    exprs: list[tuple[str, str]],
    unit: str,
    text_mode: str = "auto",
    thresholds: list[tuple[float | None, str]] | None = None,
    decimals: int | None = None,
) -> dict:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    defaults: dict = {
        "unit": unit,
        "color": {"mode": "thresholds"},
        "thresholds": {"mode": "absolute", "steps": steps},
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none" if text_mode == "name" else "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": text_mode,
            "wideLayout": True,
        },
        "targets": targets(exprs),
    }


def state_timeline(title: str, description: str, exprs: list[tuple[str, str]]) -> dict:
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": "bool_yes_no",
                "color": {"mode": "thresholds"},
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"color": "red", "value": None}, {"color": "green", "value": 1}],
                },
                "mappings": [
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "down", "color": "red", "index": 0},
                            "1": {"text": "healthy", "color": "green", "index": 1},
                        },
                    }
                ],
                "custom": {"fillOpacity": 80, "lineWidth": 0},
            },
            "overrides": [],
        },
        "options": {
            "showValue": "auto",
            "mergeValues": True,
            "rowHeight": 0.9,
            "alignValue": "left",
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "single", "sort": "none"},
        },
        "targets": targets(exprs),
    }


def bargauge(title: str, description: str, exprs: list[tuple[str, str]], unit: str) -> dict:
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "min": 0,
                "color": {"mode": "continuous-GrYlRd"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}]},
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["mean"], "fields": "", "values": False},
            "displayMode": "gradient",
            "orientation": "horizontal",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        },
        "targets": targets(exprs),
    }


def variables() -> list[dict]:
    def query_var(name: str, label: str, query: str) -> dict:
        return {
            "type": "query",
            "name": name,
            "label": label,
            "datasource": DS,
            "definition": query,
            "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "sort": 1,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "regex": "",
            "hide": 0,
            "skipUrlSync": False,
        }

    return [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "current": {},
            "options": [],
            "refresh": 1,
            "regex": "",
            "hide": 0,
            "includeAll": False,
            "multi": False,
            "skipUrlSync": False,
        },
        query_var("model", "Model", "label_values(quipu_requests_total, model)"),
        # Not only quipu_tokens_total: a tenant refused (402, 429) before it was ever served has
        # no token series, and it is the one the refusal panels are for.
        query_var("tenant", "Tenant", TENANT_VALUES),
    ]


def dashboard(uid: str, title: str, description: str, board: Board) -> dict:
    return {
        "id": None,
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["quipu", "llm-gateway"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "weekStart": "",
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "type": "dashboards",
                "tags": ["quipu"],
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
                "title": "Quipu",
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "templating": {"list": variables()},
        "panels": board.panels,
    }


def operations() -> dict:
    b = Board()
    req = "quipu_requests_total"

    b.row("Overview")
    b.add(stat("Requests per second", "All requests the gateway answered (API and catalog), for the selected models.",
               [(f"sum({rate(req, M)})", "requests/s")], "reqps"), 4, 4)
    b.add(stat("Error ratio", "Share of requests answered with an error of any kind (error_type != none): client errors (4xx) and server or upstream errors (5xx).",
               [(f'sum({rate(req, j(ERR, M))}) / sum({rate(req, M)})', "errors")],
               "percentunit", thresholds=[(None, "green"), (0.05, "orange"), (0.2, "red")]), 4, 4)
    b.add(stat("p95 latency (API)", "95th percentile of the time from request arrival to the last byte sent, all API requests (gen_ai_server_request_duration_seconds).",
               [(f"histogram_quantile(0.95, sum by (le) ({rate('gen_ai_server_request_duration_seconds_bucket', GM)}))", "p95")],
               "s"), 4, 4)
    b.add(stat("In-flight API requests", "API requests between arrival and their logging phase, all routes (quipu_requests_in_flight).",
               [("sum(quipu_requests_in_flight)", "in flight")], "short"), 3, 4)
    b.add(stat("Open streams", "Streaming responses in progress (quipu_streams_open).",
               [("sum(quipu_streams_open)", "streams")], "short"), 3, 4)
    b.add(stat("Healthy replicas", "Upstream replicas that pass their health checks and are not ejected, out of all configured replicas of the selected models. With several gateways, a replica counts once (healthy if any gateway sees it healthy).",
               [(f"sum(max by (model, replica) (quipu_upstream_healthy{{{M}}}))", "healthy"),
                (f"count(max by (model, replica) (quipu_upstream_healthy{{{M}}}))", "configured")],
               "short"), 3, 4)
    b.add(stat("Build", "The running version and store backend (quipu_build_info), and the number of active API keys in the gateway's snapshot (quipu_keys_active).",
               [("max by (version, store) (quipu_build_info)", "{{version}} · {{store}}"),
                ("max(quipu_keys_active)", "active keys")], "none", text_mode="value_and_name"), 3, 4)

    b.row("Traffic")
    b.add(timeseries("Requests by route", "Requests per second by route. Catalog routes (models, pricing, plans, health) have model=\"none\", so selecting a model hides them.",
                     [(f"sum by (route) ({rate(req, M)})", "{{route}}")], "reqps", stack=True), 8, 8)
    b.add(timeseries("API requests by model", "Chat, messages and Responses API requests per second by model slug.",
                     [(f'sum by (model) ({rate(req, j(CHAT_MESSAGES, M))})', "{{model}}")], "reqps", stack=True), 8, 8)
    b.add(timeseries("Requests by HTTP status", "Requests per second by the status written to the client (0 if the client left before any was written).",
                     [(f"sum by (status) ({rate(req, M)})", "{{status}}")], "reqps", stack=True), 8, 8)
    b.add(timeseries("Errors by type", "Failed requests per second by error kind (authentication, invalid_request, context_length, model_not_found, insufficient_balance, rate_limited, overloaded, upstream_timeout, upstream_error, …).",
                     [(f'sum by (error_type) ({rate(req, j(ERR, M))})', "{{error_type}}")], "reqps", stack=True), 8, 8)
    b.add(timeseries("Error ratio", "Share of requests that failed: every error, and only server-side ones (HTTP 5xx: overloaded, upstream errors and timeouts, internal).",
                     [(f'sum({rate(req, j(ERR, M))}) / sum({rate(req, M)})', "all errors"),
                      (f'sum({rate(req, j(S5, M))}) / sum({rate(req, M)})', "5xx")],
                     "percentunit"), 8, 8)
    b.add(timeseries("Authentication failures", "Requests refused for a missing, invalid or revoked key, by route (quipu_auth_failures_total).",
                     [(f"sum by (route) ({rate('quipu_auth_failures_total')})", "{{route}}")], "reqps"), 8, 8)

    b.row("Latency")
    dur = "gen_ai_server_request_duration_seconds"
    b.add(timeseries("Request duration", "Time from request arrival to the last byte sent to the client, API requests (gen_ai_server_request_duration_seconds), p50/p95/p99.",
                     quantiles(dur, GM), "s"), 8, 8)
    b.add(timeseries("Request duration p95 by model and mode", "95th percentile request duration by model and by stream (true) or single response (false).",
                     [(f"histogram_quantile(0.95, sum by (le, gen_ai_request_model, stream) ({rate(dur + '_bucket', GM)}))",
                       "{{gen_ai_request_model}} stream={{stream}}")], "s"), 8, 8)
    b.add(timeseries("Mean request duration by format", "Mean request duration (sum / count of the histogram) by client format: OpenAI chat, Anthropic messages or the OpenAI Responses API.",
                     [(f"sum by (format) ({rate(dur + '_sum', GM)}) / sum by (format) ({rate(dur + '_count', GM)})", "{{format}}")],
                     "s"), 8, 8)
    b.add(timeseries("Time to first token", "Streamed requests only: time from request arrival to the first generated chunk (gen_ai_server_time_to_first_token_seconds), p50/p95/p99.",
                     quantiles("gen_ai_server_time_to_first_token_seconds", GM), "s"), 8, 8)
    b.add(timeseries("Time per output token", "(duration − time to first token) / (output tokens − 1), streams only (gen_ai_server_time_per_output_token_seconds), p50/p95/p99.",
                     quantiles("gen_ai_server_time_per_output_token_seconds", GM), "s"), 8, 8)
    b.add(timeseries("Gateway overhead", "Time the gateway spent on a request outside the upstream exchange (auth, parsing, translation, admission, writing), all API routes (quipu_gateway_overhead_seconds), p50/p95/p99.",
                     quantiles("quipu_gateway_overhead_seconds"), "s"), 8, 8)

    b.row("Tokens")
    tok = "quipu_tokens_total"
    b.add(timeseries("Tokens per second by type", "Billed tokens per second: input (uncached), cached_input (prefix-cache hits) and output. The types are disjoint, so the stack is the total.",
                     [(f"sum by (type) ({rate(tok, M + ', ' + T)})", "{{type}}")], "short", stack=True), 8, 8)
    b.add(timeseries("Cached-token share", "cached_input / (input + cached_input): the share of prompt tokens served from the upstream's prefix cache.",
                     [(f'sum({rate(tok, j(CACHED, M, T))}) / sum({rate(tok, j(PROMPT, M, T))})', "cached share")],
                     "percentunit", minimum=0), 8, 8)
    b.add(timeseries("Tokens per request p95 by type", "95th percentile of tokens per request by type (gen_ai_client_token_usage histogram).",
                     [(f"histogram_quantile(0.95, sum by (le, gen_ai_token_type) ({rate('gen_ai_client_token_usage_bucket', GM)}))",
                       "{{gen_ai_token_type}}")], "short"), 8, 8)
    b.add(timeseries("Output tokens per second by model", "Generated tokens per second by model.",
                     [(f'sum by (model) ({rate(tok, j(OUTPUT, M, T))})', "{{model}}")], "short", stack=True), 12, 8)
    b.add(timeseries("Mean tokens per request by type", "Mean tokens per request by type (sum / count of gen_ai_client_token_usage).",
                     [(f"sum by (gen_ai_token_type) ({rate('gen_ai_client_token_usage_sum', GM)}) / sum by (gen_ai_token_type) ({rate('gen_ai_client_token_usage_count', GM)})",
                       "{{gen_ai_token_type}}")], "short"), 12, 8)

    b.row("Upstream replicas")
    b.add(state_timeline("Replica health", "1 while the replica passes its health checks and is not ejected after consecutive failures (quipu_upstream_healthy).",
                         [(f"max by (model, replica) (quipu_upstream_healthy{{{M}}})", "{{model}} {{replica}}")]), 12, 8)
    b.add(timeseries("Requests in flight per replica", "Requests the gateway has in flight to each replica (quipu_upstream_in_flight): the least-loaded picker's input.",
                     [(f"sum by (model, replica) (quipu_upstream_in_flight{{{M}}})", "{{model}} {{replica}}")], "short"), 12, 8)
    b.add(timeseries("Replica selections by reason", "Times a replica was picked per second, by reason: affinity (holds the prompt's prefix), least_loaded, round_robin.",
                     [(f"sum by (reason) ({rate('quipu_upstream_selected_total', M)})", "{{reason}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Selections by replica", "Times each replica was picked per second.",
                     [(f"sum by (model, replica) ({rate('quipu_upstream_selected_total', M)})", "{{model}} {{replica}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Prefix-affinity outcomes", "Prefix-affinity routing per second: hit (sent to the replica holding the prefix), overloaded (that replica was too busy), miss (no replica holds it yet).",
                     [(f"sum by (outcome) ({rate('quipu_prefix_affinity_total', M)})", "{{outcome}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Prefix-affinity hit ratio", "hit / (hit + overloaded + miss) of prefix-affinity routing decisions.",
                     [(f'sum({rate("quipu_prefix_affinity_total", j(HIT, M))}) / sum({rate("quipu_prefix_affinity_total", M)})', "hit ratio")],
                     "percentunit"), 8, 8)
    b.add(timeseries("Upstream failures by kind", "Failed upstream attempts per second by kind: connect, reset (before any response), status_503; tokenizer calls also count other 5xx. Other 5xx answers, first-byte timeouts and streams broken midway are not replica failures: see Errors by type (quipu_upstream_failures_total).",
                     [(f"sum by (kind) ({rate('quipu_upstream_failures_total', M)})", "{{kind}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Upstream failures by replica", "Failed upstream attempts per second by replica; a replica is ejected after max_failures in a row.",
                     [(f"sum by (model, replica) ({rate('quipu_upstream_failures_total', M)})", "{{model}} {{replica}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Retries on another replica", "Requests retried on another replica before any byte reached the client, per second by model (quipu_upstream_retries_total).",
                     [(f"sum by (model) ({rate('quipu_upstream_retries_total', M)})", "{{model}}")], "ops"), 8, 8)

    b.row("Queue (saturated models)")
    b.add(timeseries("Queue depth", "Requests waiting in Quipu for a slot of a model with max_concurrency, by model and priority (quipu_queue_depth). Nothing waits inside the engines' own queues meanwhile.",
                     [(f"sum by (model, priority) (quipu_queue_depth{{{M}}})", "{{model}} {{priority}}")], "short", stack=True), 8, 8)
    b.add(timeseries("Queue wait", "Time from arrival to dispatch of requests to scheduled models (quipu_queue_wait_seconds; 0 when a slot was free), p50/p95/p99.",
                     quantiles("quipu_queue_wait_seconds", M), "s"), 8, 8)
    b.add(timeseries("Queue rejections by reason", "Requests the queue did not run, per second: tenant_queue_full and timeout (429 queue_full), cluster_overloaded and no_replica (503/529), cancelled (the client left while waiting; charged nothing) (quipu_queue_rejections_total).",
                     [(f"sum by (reason) ({rate('quipu_queue_rejections_total', M)})", "{{reason}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Dispatches by placement", "Requests the queue started per second: preferred (the replica holding the prompt's prefix), spilled (elsewhere after the affinity wait), balanced (no preference) (quipu_dispatches_total).",
                     [(f"sum by (placement) ({rate('quipu_dispatches_total', M)})", "{{placement}}")], "ops", stack=True), 8, 8)
    b.add(timeseries("Slots in use and capacity per replica", "Slots of each scheduled replica in use as the scheduler counts them (quipu_replica_slots_in_use) against the slots this gateway may use (quipu_replica_slots: max_concurrency, or its share).",
                     [(f"sum by (model, replica) (quipu_replica_slots_in_use{{{M}}})", "{{model}} {{replica}} in use"),
                      (f"sum by (model, replica) (quipu_replica_slots{{{M}}})", "{{model}} {{replica}} slots")], "short"), 8, 8)
    b.add(timeseries("Engine-reported requests", "Requests each engine reports running and waiting in its own scheduler (its /metrics, read every scheduling.load_interval_ms: quipu_engine_requests). Waiting should stay near 0: Quipu holds the queue.",
                     [(f"sum by (model, replica, state) (quipu_engine_requests{{{M}}})", "{{model}} {{replica}} {{state}}")], "short"), 8, 8)

    b.row("Gateways")
    b.add(timeseries("Requests by gateway", "Requests per second answered by each gateway process (the `instance` Prometheus scrapes): how the balancer spreads traffic over the replicas; every other panel sums over them.",
                     [(f"sum by (instance) ({rate(req, M)})", "{{instance}}")], "reqps", stack=True), 12, 8)
    b.add(timeseries("In-flight requests by gateway", "API requests being handled by each gateway process (quipu_requests_in_flight): a replica that is draining or stuck shows here.",
                     [("sum by (instance) (quipu_requests_in_flight)", "{{instance}}")], "short"), 12, 8)

    b.row("Connections")
    b.add(timeseries("Client connections", "Open client connections on the API listener, idle keep-alive ones included (quipu_client_connections), and connections closed on accept because server.max_connections were open (quipu_client_connections_refused_total, per second).",
                     [("sum(quipu_client_connections)", "open"),
                      (f"sum({rate('quipu_client_connections_refused_total')})", "refused/s")], "short"), 6, 8)
    b.add(timeseries("In-flight requests by route", "API requests being handled, by route (quipu_requests_in_flight).",
                     [("sum by (route) (quipu_requests_in_flight)", "{{route}}")], "short", stack=True), 6, 8)
    b.add(timeseries("Open streams", "Streaming responses in progress (quipu_streams_open).",
                     [("sum(quipu_streams_open)", "open streams")], "short"), 6, 8)
    b.add(timeseries("Client disconnects", "Clients that went away before their response was complete, per second by route; their usage so far is still billed (quipu_client_disconnects_total).",
                     [(f"sum by (route) ({rate('quipu_client_disconnects_total')})", "{{route}}")], "reqps"), 6, 8)
    b.add(timeseries("TLS and HTTP/2 refusals", "Client TLS handshakes that failed, by reason (quipu_tls_handshake_failures_total: error = garbage or refused, timeout = not finished in server.tls_handshake_timeout_ms), and HTTP/2 misbehaviour (quipu_http2_abuse_total: streams refused over the per-connection cap, connections closed for too many malformed streams or cancellations), per second. A burst is a scan or an attack; a steady rate, a misconfigured client.",
                     [(f"sum by (reason) ({rate('quipu_tls_handshake_failures_total')})", "TLS {{reason}}"),
                      (f"sum by (kind) ({rate('quipu_http2_abuse_total')})", "HTTP/2 {{kind}}")], "ops"), 24, 8)

    b.row("Ledger")
    flush = "quipu_ledger_flush_seconds"
    b.add(timeseries("Ledger queue depth", "Ledger rows waiting to be written to the store (quipu_ledger_queue_rows). A crash loses at most this many rows; growth means the store is slow or down.",
                     [("sum(quipu_ledger_queue_rows)", "queued rows")], "short"), 6, 8)
    b.add(timeseries("Ledger flush latency", "Time to write one batch of ledger rows to the store, successful batches (quipu_ledger_flush_seconds{result=\"ok\"}), p50/p95/p99.",
                     quantiles(flush, 'result="ok"'), "s"), 6, 8)
    b.add(timeseries("Ledger flushes by result", "Batch writes per second by result: ok, or error (retried with backoff, rows kept).",
                     [(f"sum by (result) ({rate(flush + '_count')})", "{{result}}")], "ops"), 6, 8)
    b.add(timeseries("Unimported ledger spill files", "Spill files left by a shutdown with the store unreachable (quipu_ledger_spill_files; the most any gateway counts, as gateways may share a directory): their charges are not in the balances until `quipu ledger import` runs. Should be 0.",
                     [("max by (state) (quipu_ledger_spill_files)", "{{state}}")], "short"), 6, 8)

    return dashboard(
        "quipu-operations",
        "Quipu · Operations",
        "Traffic, errors, latency, tokens, upstream replicas, connections and the ledger writer of the Quipu LLM gateway.",
        b,
    )


def billing() -> dict:
    b = Board()
    spend = "quipu_spend_pen_total"
    tok = "quipu_tokens_total"
    MT = j(M, T)

    b.row("Overview")
    b.add(stat("Spend rate", "Charges in soles per hour for the selected tenants and models (quipu_spend_pen_total, a float for dashboards; the ledger is exact).",
               [(f"sum({rate(spend, MT)}) * 3600", "S/ per hour")], SOLES, decimals=4), 6, 4)
    b.add(stat("Tokens per second", "Billed tokens per second, all types, for the selected tenants and models.",
               [(f"sum({rate(tok, MT)})", "tokens/s")], "short"), 6, 4)
    b.add(stat("Open reservations", "Admitted requests whose worst-case cost is held against the balance (quipu_reservations_open).",
               [("sum(quipu_reservations_open)", "open")], "short"), 6, 4)
    b.add(stat("Reserved soles", "Soles held by open reservations (quipu_reserved_pen; updated every second).",
               [("sum(quipu_reserved_pen)", "reserved")], SOLES, decimals=4), 6, 4)

    b.row("Spend")
    b.add(timeseries("Spend by tenant", "Charges in soles per hour by tenant.",
                     [(f"sum by (tenant) ({rate(spend, MT)}) * 3600", "{{tenant}}")], SOLES, stack=True), 12, 8)
    b.add(timeseries("Spend by model", "Charges in soles per hour by model.",
                     [(f"sum by (model) ({rate(spend, MT)}) * 3600", "{{model}}")], SOLES, stack=True), 12, 8)
    b.add(bargauge("Top tenants by spend", "The ten tenants with the highest spend rate, in soles per hour (mean over the time range).",
                   [(f"topk(10, sum by (tenant) ({rate(spend, MT)}) * 3600)", "{{tenant}}")], SOLES), 12, 8)
    b.add(bargauge("Top tenants by tokens", "The ten tenants with the most billed tokens per second, all types (mean over the time range).",
                   [(f"topk(10, sum by (tenant) ({rate(tok, MT)}))", "{{tenant}}")], "short"), 12, 8)

    b.row("Tokens")
    b.add(timeseries("Tokens by tenant and type", "Billed tokens per second by tenant and type: input (uncached), cached_input, output.",
                     [(f"sum by (tenant, type) ({rate(tok, MT)})", "{{tenant}} {{type}}")], "short", stack=True), 12, 8)
    b.add(timeseries("Cached-token share by tenant", "cached_input / (input + cached_input) per tenant: how much of each tenant's prompts the prefix cache served (billed at the cached price).",
                     [(f'sum by (tenant) ({rate(tok, j(CACHED, MT))}) / sum by (tenant) ({rate(tok, j(PROMPT, MT))})', "{{tenant}}")],
                     "percentunit"), 12, 8)

    b.row("Refusals")
    b.add(timeseries("Rate-limited requests", "Requests refused with 429 per minute, by tenant, scope (key or tenant) and limit (requests or tokens per minute).",
                     [(f"sum by (tenant, scope, limit) ({rate('quipu_rate_limited_total', T)}) * 60", "{{tenant}} {{scope}} {{limit}}")], "reqpm"), 12, 8)
    b.add(timeseries("Insufficient balance (402)", "Requests refused with 402 per minute by tenant: the balance did not cover the request's worst-case cost.",
                     [(f"sum by (tenant) ({rate('quipu_billing_refused_total', T)}) * 60", "{{tenant}}")], "reqpm"), 12, 8)
    b.add(timeseries("Spend caps reached", "Requests refused per minute by a spend cap (429 until the period ends, 402 for a total cap), by tenant and cap: the key's or the tenant's monthly.",
                     [(f"sum by (tenant, cap) ({rate('quipu_cap_refused_total', T)}) * 60", "{{tenant}} {{cap}}")], "reqpm"), 12, 8)

    b.row("Reservations and ledger")
    b.add(timeseries("Open reservations", "Admitted requests holding a reservation (quipu_reservations_open).",
                     [("sum(quipu_reservations_open)", "open reservations")], "short"), 8, 8)
    b.add(timeseries("Reserved soles", "Soles held by open reservations (quipu_reserved_pen).",
                     [("sum(quipu_reserved_pen)", "reserved")], SOLES), 8, 8)
    b.add(timeseries("Ledger rows written", "Ledger rows per second: new, or duplicate (a retried batch; skipped by request id, never charged twice).",
                     [(f"sum by (result) ({rate('quipu_ledger_rows_total')})", "{{result}}")], "ops", stack=True), 8, 8)

    return dashboard(
        "quipu-billing",
        "Quipu · Billing",
        "Spend in soles, tokens, refusals (429, 402), reservations and ledger rows of the Quipu LLM gateway, by tenant and model.",
        b,
    )


DASHBOARDS = {"quipu-operations.json": operations, "quipu-billing.json": billing}


def render() -> dict[str, str]:
    """File name -> JSON text, exactly as committed."""
    return {name: json.dumps(fn(), indent=2, ensure_ascii=False) + "\n" for name, fn in DASHBOARDS.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if a committed dashboard differs from the output")
    args = ap.parse_args()
    stale = []
    for name, text in render().items():
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `python3 dashboards/generate.py` and commit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
