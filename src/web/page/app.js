// Quipu's account page: signs in with an API key (kept in this tab's sessionStorage only) and
// shows what /v1/account, /v1/usage, /v1/requests, /v1/keys and /v1/topups answer. No library,
// nothing loaded from elsewhere; the chart is SVG drawn here.
"use strict";

const STORE = "quipu.key";
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function key() {
  return sessionStorage.getItem(STORE);
}

// Days begin where the browser's do, when that is a whole hour from UTC (the API's grain).
function utcOffset() {
  const minutes = -new Date().getTimezoneOffset();
  if (minutes % 60 !== 0) return null;
  const h = Math.abs(minutes / 60);
  return (minutes < 0 ? "-" : "+") + String(h).padStart(2, "0") + ":00";
}

class AuthError extends Error {}

async function api(path) {
  const r = await fetch(path, {
    headers: { Authorization: "Bearer " + key() },
    cache: "no-store",
    credentials: "omit",
  });
  let body = null;
  try {
    body = await r.json();
  } catch (_) {
    body = null;
  }
  if (r.status === 401) throw new AuthError((body && body.error && body.error.message) || "invalid key");
  if (!r.ok) throw new Error((body && body.error && body.error.message) || "HTTP " + r.status);
  return body;
}

// An amount as `S/ 12.34`, the exact figure on hover.
function money(el, m) {
  el.textContent = m.display;
  el.title = "S/ " + m.exact + " (exact)";
  el.dataset.exact = m.exact;
  el.classList.add("money");
  return el;
}

function moneyCell(m) {
  const td = document.createElement("td");
  td.className = "num";
  td.appendChild(money(document.createElement("span"), m));
  return td;
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

const fmtInt = (n) => Number(n).toLocaleString("en-US");
const fmtTime = (t) => (t ? new Date(t).toLocaleString() : "—");
const fmtLimit = (l) =>
  [l.requests_per_minute == null ? "no request limit" : fmtInt(l.requests_per_minute) + " requests",
   l.tokens_per_minute == null ? "no token limit" : fmtInt(l.tokens_per_minute) + " tokens"].join(", ");

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderAccount(a) {
  money($("balance"), a.balance);
  money($("available"), a.available);
  money($("reserved"), a.reserved);
  money($("pending"), a.pending);
  $("in-flight").textContent = fmtInt(a.requests_in_flight);
  money($("spend-today"), a.spend.today);
  money($("spend-month"), a.spend.this_month);
  money($("spend-total"), a.spend.total);
  $("requests-total").textContent = fmtInt(a.usage.requests);
  $("limits-key").textContent = a.limits.key ? fmtLimit(a.limits.key) : "—";
  $("limits-tenant").textContent = fmtLimit(a.limits.tenant);
  const k = a.key;
  $("who").textContent = a.tenant.name + (k ? " · key " + k.prefix + "…" + (k.label ? " (" + k.label + ")" : "") : "");
  $("as-of").textContent = "As of " + fmtTime(a.as_of) + ". Held and pending amounts are this gateway's.";
}

// Bars of the daily spend: one per day, height by share of the largest day.
function renderChart(u) {
  const box = $("chart");
  const W = 720, H = 220, left = 8, right = 8, top = 22, bottom = 26;
  const days = u.data;
  const values = days.map((d) => Number(d.charge.exact));
  const max = Math.max(...values, 0);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("id", "chart-svg");
  svg.dataset.bars = String(days.length);
  const base = document.createElementNS(SVG, "line");
  base.setAttribute("class", "axis");
  base.setAttribute("x1", left);
  base.setAttribute("x2", W - right);
  base.setAttribute("y1", H - bottom);
  base.setAttribute("y2", H - bottom);
  svg.appendChild(base);
  const step = (W - left - right) / Math.max(days.length, 1);
  days.forEach((d, i) => {
    const v = values[i];
    const h = max > 0 ? Math.max((v / max) * (H - top - bottom), v > 0 ? 2 : 0) : 0;
    const r = document.createElementNS(SVG, "rect");
    r.setAttribute("class", "bar-rect");
    r.setAttribute("x", (left + i * step + step * 0.15).toFixed(2));
    r.setAttribute("width", (step * 0.7).toFixed(2));
    r.setAttribute("y", (H - bottom - h).toFixed(2));
    r.setAttribute("height", h.toFixed(2));
    r.dataset.day = d.day;
    r.dataset.exact = d.charge.exact;
    const t = document.createElementNS(SVG, "title");
    t.textContent = `${d.day}: ${d.charge.display} (S/ ${d.charge.exact} exact), ${fmtInt(d.requests)} requests`;
    r.appendChild(t);
    svg.appendChild(r);
    // Weekly labels counted back from the last day, and the first day's when it has room.
    const fromEnd = days.length - 1 - i;
    const weekly = days.length > 10 ? fromEnd % 7 === 0 : fromEnd === 0;
    if (weekly || (i === 0 && (days.length <= 10 || fromEnd % 7 >= 3))) {
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("x", (left + i * step + step / 2).toFixed(2));
      label.setAttribute("y", H - 8);
      label.setAttribute("text-anchor", i === 0 ? "start" : i === days.length - 1 ? "end" : "middle");
      label.textContent = d.day.slice(5);
      svg.appendChild(label);
    }
  });
  const top_label = document.createElementNS(SVG, "text");
  top_label.setAttribute("x", left);
  top_label.setAttribute("y", 14);
  const maxDay = days[values.indexOf(max)];
  top_label.textContent = max > 0 ? "highest: " + maxDay.charge.display + " (" + maxDay.day + ")" : "no spend in this period";
  svg.appendChild(top_label);
  box.replaceChildren(svg);
  $("chart-days").textContent = `${days.length} days to ${days.length ? days[days.length - 1].day : ""} (UTC${u.utc_offset})`;
  money($("period-total"), u.totals.charge);
  $("period-requests").textContent = fmtInt(u.totals.requests);
}

function renderModels(u) {
  const box = $("models");
  const max = Math.max(...u.data.map((m) => m.input_tokens + m.output_tokens), 0);
  const rows = u.data.map((m) => {
    const row = document.createElement("div");
    row.className = "model-row";
    row.dataset.model = m.model;
    const name = document.createElement("div");
    name.className = "model-name";
    name.textContent = m.model;
    const bar = document.createElement("div");
    bar.className = "model-bar";
    const parts = [["input", m.input_tokens - m.cached_tokens], ["cached", m.cached_tokens], ["output", m.output_tokens]];
    for (const [cls, n] of parts) {
      const s = document.createElement("span");
      s.className = cls;
      s.style.width = (max > 0 ? (100 * n) / max : 0).toFixed(2) + "%";
      s.title = `${cls}: ${fmtInt(n)} tokens`;
      bar.appendChild(s);
    }
    const figures = document.createElement("div");
    figures.className = "model-figures";
    figures.append(
      `${fmtInt(m.requests)} requests · ${fmtInt(m.input_tokens)} input (${fmtInt(m.cached_tokens)} cached) · ${fmtInt(m.output_tokens)} output · `,
      money(document.createElement("span"), m.charge),
    );
    row.append(name, bar, figures);
    return row;
  });
  if (rows.length === 0) {
    const p = document.createElement("p");
    p.className = "small";
    p.textContent = "No tokens in the last 30 days.";
    rows.push(p);
  }
  box.replaceChildren(...rows);
}

function renderRequests(list) {
  const rows = list.data.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    tr.title = r.id;
    tr.append(
      cell(fmtTime(r.at)),
      cell(r.model),
      cell(r.key, "mono"),
      cell(fmtInt(r.input_tokens) + (r.input_estimated ? "*" : ""), "num"),
      cell(fmtInt(r.cached_tokens), "num"),
      cell(fmtInt(r.output_tokens), "num"),
      moneyCell(r.charge),
      cell(r.status === "ok" ? "ok" : r.status + " (" + r.http_status + ")"),
    );
    return tr;
  });
  fill($("requests").tBodies[0], rows);
  $("requests-empty").hidden = rows.length > 0;
}

function renderKeys(list) {
  const rows = list.data.map((k) => {
    const tr = document.createElement("tr");
    tr.dataset.id = k.id;
    tr.append(
      cell(k.prefix + "…", "mono"),
      cell(k.label || "—"),
      cell(fmtTime(k.created_at)),
      cell(fmtTime(k.last_used_at)),
      cell(fmtInt(k.usage.requests), "num"),
      moneyCell(k.usage.charge),
      cell(k.revoked ? "revoked " + fmtTime(k.revoked_at) : "active", k.revoked ? "revoked" : ""),
    );
    return tr;
  });
  fill($("keys").tBodies[0], rows);
}

function renderTopUps(list) {
  const rows = list.data.map((t) => {
    const tr = document.createElement("tr");
    tr.append(cell(fmtTime(t.at)), moneyCell(t.amount), cell(t.note || "—"));
    return tr;
  });
  fill($("topups").tBodies[0], rows);
  $("topups-empty").hidden = rows.length > 0;
}

function show(signedIn) {
  $("signin").hidden = signedIn;
  $("account").hidden = !signedIn;
  $("refresh").hidden = !signedIn;
  $("signout").hidden = !signedIn;
  if (!signedIn) $("who").textContent = "";
}

let loading = false;

async function load() {
  if (loading || !key()) return;
  loading = true;
  $("refresh").disabled = true;
  const off = utcOffset();
  const q = off ? "&utc_offset=" + encodeURIComponent(off) : "";
  try {
    const [account, days, models, requests, keys, topups] = await Promise.all([
      api("/v1/account?" + q.slice(1)),
      api("/v1/usage?group_by=day" + q),
      api("/v1/usage?group_by=model&limit=20" + q),
      api("/v1/requests?limit=20"),
      api("/v1/keys?limit=100"),
      api("/v1/topups?limit=10"),
    ]);
    show(true);
    $("load-error").textContent = "";
    renderAccount(account);
    renderChart(days);
    renderModels(models);
    renderRequests(requests);
    renderKeys(keys);
    renderTopUps(topups);
    document.body.dataset.loaded = String(Date.now());
  } catch (e) {
    if (e instanceof AuthError) {
      sessionStorage.removeItem(STORE);
      show(false);
      $("signin-error").textContent = "That key was refused: " + e.message;
    } else {
      $("load-error").textContent = "Could not load your account: " + e.message;
    }
  } finally {
    loading = false;
    $("refresh").disabled = false;
  }
}

function init() {
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const k = $("key").value.trim();
    if (!k) return;
    sessionStorage.setItem(STORE, k);
    $("key").value = "";
    $("signin-error").textContent = "";
    load();
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(STORE);
    show(false);
  });
  $("refresh").addEventListener("click", load);
  // Fresh figures while the page is looked at.
  setInterval(() => {
    if (document.visibilityState === "visible") load();
  }, 30000);
  if (key()) load();
  else show(false);
}

init();
