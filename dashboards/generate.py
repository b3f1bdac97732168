#!/usr/bin/env python3
"""Generates Quipu's Grafana dashboards: `python3 dashboards/generate.py` rewrites the JSON.

The dashboards are code so they stay consistent (every panel uses the `datasource` variable,
every rate uses `$__rate_interval`, every query filters by the `model`/`tenant` variables where
the metric has that label) and so the test suite can check that the committed JSON is what
this file produces (tests/python/test_observability.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
M = 'model=~"$model"'
GM = 'gen_ai_request_model=~"$model"'
T = 'tenant=~"$tenant"'


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict:
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": not instant}
    if instant:
        t["instant"] = True
    return t


class Layout:
    """Places panels on the 24-column grid, left to right, top to bottom."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, w: int, h: int) -> dict:
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title: str) -> dict:
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        panel = {"type": "row", "title": title, "id": self.next_id, "collapsed": False,
                 "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []}
        self.next_id += 1
        self.y += 1
        return panel

    def panel(self, kind: str, title: str, description: str, targets: list[dict], unit: str,
              w: int = 8, h: int = 8, stack: bool = False, **extra) -> dict:
        refs = "ABCDEFGH"
        for i, t in enumerate(targets):
            t["refId"] = refs[i]
        p = {
            "type": kind,
            "title": title,
            "description": description,
            "id": self.next_id,
            "datasource": DS,
            "gridPos": self.place(w, h),
            "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        }
        if kind == "timeseries" and stack:
            p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 30}
        if kind == "stat":
            p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value", "graphMode": "area"}
        p.update(extra)
        self.next_id += 1
        return p


def quantile(q: float, metric: str, by: str, filt: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{filt}}}[{RI}])))"


def variables(with_tenant: bool) -> list[dict]:
    v = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        {"name": "model", "label": "Model", "type": "query", "datasource": DS,
         "query": {"query": "label_values(quipu_requests_total, model)", "refId": "model"},
         "definition": "label_values(quipu_requests_total, model)",
         "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
         "refresh": 2, "sort": 1, "hide": 0},
    ]
    if with_tenant:
        v.append({"name": "tenant", "label": "Tenant", "type": "query", "datasource": DS,
                  "query": {"query": "label_values(quipu_tokens_total, tenant)", "refId": "tenant"},
                  "definition": "label_values(quipu_tokens_total, tenant)",
                  "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
                  "refresh": 2, "sort": 1, "hide": 0})
    return v


def dashboard(uid: str, title: str, description: str, panels: list[dict], with_tenant: bool) -> dict:
    return {
        "id": None,
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["quipu", "llm-gateway"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables(with_tenant)},
        "annotations": {"list": []},
        "links": [{"title": "Quipu", "type": "dashboards", "tags": ["quipu"], "asDropdown": False}],
        "panels": panels,
    }


def operations() -> dict:
    L = Layout()
    P = []
    P.append(L.row("Traffic"))
    P.append(L.panel("timeseries", "Requests per second by route",
        "Every request the API listener answered, by route (chat, messages, count_tokens, catalog routes, errors).",
        [target(f'sum by (route) (rate(quipu_requests_total{{{M}}}[{RI}]))', "{{route}}")], "reqps", stack=True))
    P.append(L.panel("timeseries", "Requests per second by model and status",
        "Chat, messages and count_tokens requests by model and HTTP status.",
        [target(f'sum by (model, status) (rate(quipu_requests_total{{route=~"chat|messages|count_tokens",{M}}}[{RI}]))', "{{model}} {{status}}")], "reqps"))
    P.append(L.panel("timeseries", "Error ratio",
        "Share of API requests that ended in an error (any error_type but none), overall and by error type.",
        [target(f'sum(rate(quipu_requests_total{{route=~"chat|messages|count_tokens",error_type!="none",{M}}}[{RI}])) / sum(rate(quipu_requests_total{{route=~"chat|messages|count_tokens",{M}}}[{RI}]))', "all errors"),
         target(f'sum by (error_type) (rate(quipu_requests_total{{route=~"chat|messages|count_tokens",error_type!="none",{M}}}[{RI}])) / scalar(sum(rate(quipu_requests_total{{route=~"chat|messages|count_tokens",{M}}}[{RI}])))', "{{error_type}}")], "percentunit"))
    P.append(L.panel("timeseries", "In-flight requests and open streams",
        "API requests being handled right now, by route, and streaming responses in progress.",
        [target("sum by (route) (quipu_requests_in_flight)", "{{route}}"), target("quipu_streams_open", "open streams")], "short"))
    P.append(L.panel("timeseries", "Client disconnects",
        "Clients that went away before their response was complete (their upstream request is cancelled; tokens so far are billed).",
        [target(f"sum by (route) (rate(quipu_client_disconnects_total[{RI}]))", "{{route}}")], "reqps"))
    P.append(L.panel("stat", "Build", "Running version and store backend.",
        [target("max by (version, store) (quipu_build_info)", "{{version}} ({{store}})", instant=True)], "none"))

    P.append(L.row("Latency"))
    P.append(L.panel("timeseries", "Request duration p50 / p95 / p99",
        "From request arrival to the last byte sent (gen_ai_server_request_duration_seconds), all models selected.",
        [target(quantile(q, "gen_ai_server_request_duration_seconds", "format", GM), f"p{int(q*100)} {{{{format}}}}") for q in (0.5, 0.95, 0.99)], "s"))
    P.append(L.panel("timeseries", "Time to first token p50 / p95 / p99",
        "From request arrival to the first generated chunk (the model's prefill plus queueing).",
        [target(quantile(q, "gen_ai_server_time_to_first_token_seconds", "gen_ai_request_model", GM), f"p{int(q*100)} {{{{gen_ai_request_model}}}}") for q in (0.5, 0.95, 0.99)], "s"))
    P.append(L.panel("timeseries", "Time per output token p50 / p95",
        "Decode speed of streams: (duration − TTFT) / (output tokens − 1).",
        [target(quantile(q, "gen_ai_server_time_per_output_token_seconds", "gen_ai_request_model", GM), f"p{int(q*100)} {{{{gen_ai_request_model}}}}") for q in (0.5, 0.95)], "s"))
    P.append(L.panel("timeseries", "Gateway overhead p50 / p99",
        "Time Quipu itself spent on a request, outside the upstream exchange (auth, parsing, translation, writing).",
        [target(quantile(q, "quipu_gateway_overhead_seconds", "route", 'route=~"chat|messages|count_tokens"'), f"p{int(q*100)} {{{{route}}}}") for q in (0.5, 0.99)], "s"))

    P.append(L.row("Tokens"))
    P.append(L.panel("timeseries", "Tokens per second by type",
        "Billed tokens: input (uncached), cached_input (prefix-cache hits) and output. The types are disjoint, so they add up.",
        [target(f"sum by (gen_ai_token_type) (rate(gen_ai_client_token_usage_sum{{{GM}}}[{RI}]))", "{{gen_ai_token_type}}")], "short", stack=True))
    P.append(L.panel("timeseries", "Cached-token share",
        "cached_input / (input + cached_input): how much of the prompt the upstreams' prefix caches served (higher is cheaper).",
        [target(f'sum(rate(gen_ai_client_token_usage_sum{{gen_ai_token_type="cached_input",{GM}}}[{RI}])) / sum(rate(gen_ai_client_token_usage_sum{{gen_ai_token_type=~"input|cached_input",{GM}}}[{RI}]))', "cached share"),
         target(f'sum by (gen_ai_request_model) (rate(gen_ai_client_token_usage_sum{{gen_ai_token_type="cached_input",{GM}}}[{RI}])) / sum by (gen_ai_request_model) (rate(gen_ai_client_token_usage_sum{{gen_ai_token_type=~"input|cached_input",{GM}}}[{RI}]))', "{{gen_ai_request_model}}")], "percentunit"))
    P.append(L.panel("timeseries", "Output tokens per request p50 / p95",
        "Distribution of output tokens per request.",
        [target(f'histogram_quantile({q}, sum by (le) (rate(gen_ai_client_token_usage_bucket{{gen_ai_token_type="output",{GM}}}[{RI}])))', f"p{int(q*100)}") for q in (0.5, 0.95)], "short"))

    P.append(L.row("Upstreams"))
    P.append(L.panel("timeseries", "Replica health",
        "1 when the replica passes its health checks and is not ejected after consecutive failures.",
        [target(f"quipu_upstream_healthy{{{M}}}", "{{model}} {{replica}}")], "short"))
    P.append(L.panel("timeseries", "Requests in flight per replica",
        "What least-loaded selection balances.",
        [target(f"quipu_upstream_in_flight{{{M}}}", "{{model}} {{replica}}")], "short"))
    P.append(L.panel("timeseries", "Replica selections by reason",
        "Picks per second: affinity (the replica holding the prompt's prefix), least_loaded, round_robin.",
        [target(f"sum by (replica, reason) (rate(quipu_upstream_selected_total{{{M}}}[{RI}]))", "{{replica}} {{reason}}")], "reqps", stack=True))
    P.append(L.panel("timeseries", "Prefix-affinity outcomes",
        "hit: sent to the replica that served the prefix; overloaded: that replica was too busy; miss: no known prefix.",
        [target(f"sum by (outcome) (rate(quipu_prefix_affinity_total{{{M}}}[{RI}]))", "{{outcome}}")], "reqps", stack=True))
    P.append(L.panel("timeseries", "Upstream failures and retries",
        "Failed attempts by replica and kind (connect, reset, status_503, …), and requests retried on another replica before any byte reached the client.",
        [target(f"sum by (replica, kind) (rate(quipu_upstream_failures_total{{{M}}}[{RI}]))", "{{replica}} {{kind}}"),
         target(f"sum by (model) (rate(quipu_upstream_retries_total{{{M}}}[{RI}]))", "retries {{model}}")], "reqps"))

    P.append(L.row("Keys and ledger"))
    P.append(L.panel("timeseries", "Authentication failures",
        "Requests refused for a missing, invalid or revoked key, by route.",
        [target(f"sum by (route) (rate(quipu_auth_failures_total[{RI}]))", "{{route}}")], "reqps"))
    P.append(L.panel("stat", "Active keys", "API keys in the in-memory snapshot.",
        [target("max(quipu_keys_active)", "keys")], "short"))
    P.append(L.panel("timeseries", "Ledger queue", "Ledger rows waiting to be written to the store (should stay near zero).",
        [target("quipu_ledger_queue_rows", "rows queued")], "short"))
    P.append(L.panel("timeseries", "Ledger flush latency p50 / p99", "Time to write one batch of ledger rows.",
        [target(quantile(q, "quipu_ledger_flush_seconds", "result", 'result="ok"'), f"p{int(q*100)}") for q in (0.5, 0.99)], "s"))
    return dashboard("quipu-operations", "Quipu — operations",
                     "Traffic, errors, latency, tokens, upstream replicas and the ledger of the Quipu gateway.", P, False)


def billing() -> dict:
    L = Layout()
    P = []
    P.append(L.row("Spend"))
    P.append(L.panel("timeseries", "Spend in soles per hour by tenant",
        "Charges in PEN (quipu_spend_pen_total; exact amounts are in the ledger and in `quipu statement`).",
        [target(f"sum by (tenant) (rate(quipu_spend_pen_total{{{T},{M}}}[{RI}])) * 3600", "{{tenant}}")], "prefix:S/ ", w=12, stack=True))
    P.append(L.panel("timeseries", "Spend in soles per hour by model",
        "Charges in PEN by model.",
        [target(f"sum by (model) (rate(quipu_spend_pen_total{{{T},{M}}}[{RI}])) * 3600", "{{model}}")], "prefix:S/ ", w=12, stack=True))
    P.append(L.panel("bargauge", "Top tenants by spend (time range)",
        "The ten tenants that spent most over the selected range.",
        [target(f"topk(10, sum by (tenant) (increase(quipu_spend_pen_total{{{T},{M}}}[$__range])))", "{{tenant}}", instant=True)], "prefix:S/ ", w=12,
        options={"orientation": "horizontal", "reduceOptions": {"calcs": ["lastNotNull"]}, "displayMode": "gradient"}))
    P.append(L.panel("stat", "Spend over the range",
        "Total charges over the selected range, all selected tenants and models.",
        [target(f"sum(increase(quipu_spend_pen_total{{{T},{M}}}[$__range]))", "soles", instant=True)], "prefix:S/ ", w=12))
    P.append(L.row("Tokens"))
    P.append(L.panel("timeseries", "Tokens per second by tenant",
        "Billed tokens of each tenant, all types.",
        [target(f"sum by (tenant) (rate(quipu_tokens_total{{{T},{M}}}[{RI}]))", "{{tenant}}")], "short", w=12, stack=True))
    P.append(L.panel("timeseries", "Tokens per second by type",
        "input (uncached), cached_input and output, selected tenants and models.",
        [target(f"sum by (type) (rate(quipu_tokens_total{{{T},{M}}}[{RI}]))", "{{type}}")], "short", w=12, stack=True))
    P.append(L.row("Refusals"))
    P.append(L.panel("timeseries", "Rate-limited requests",
        "429s by tenant, scope (key or tenant) and limit (requests or tokens per minute).",
        [target(f"sum by (tenant, scope, limit) (rate(quipu_rate_limited_total{{{T}}}[{RI}]))", "{{tenant}} {{scope}} {{limit}}")], "reqps", w=12))
    P.append(L.panel("timeseries", "Refused for balance (402)",
        "Requests whose worst-case cost the tenant's balance did not cover.",
        [target(f"sum by (tenant) (rate(quipu_billing_refused_total{{{T}}}[{RI}]))", "{{tenant}}")], "reqps", w=12))
    P.append(L.row("Reservations and ledger"))
    P.append(L.panel("timeseries", "Open reservations",
        "Admitted requests holding their worst-case cost, and the soles held.",
        [target("quipu_reservations_open", "reservations"), target("quipu_reserved_pen", "soles reserved")], "short", w=12))
    P.append(L.panel("timeseries", "Ledger rows written",
        "Rows per second written to the store (new) or skipped because already recorded (duplicate).",
        [target(f"sum by (result) (rate(quipu_ledger_rows_total[{RI}]))", "{{result}}")], "short", w=12))
    return dashboard("quipu-billing", "Quipu — billing",
                     "Spend in soles, tokens and refusals by tenant and model.", P, True)


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    for name, d in (("quipu-operations.json", operations()), ("quipu-billing.json", billing())):
        text = json.dumps(d, indent=2, ensure_ascii=False) + "\n"
        path = HERE / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale dashboards (run python3 dashboards/generate.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
