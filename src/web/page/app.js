// Quipu's account page: signs in with an API key (kept in this tab's sessionStorage only) and
// shows what /v1/account, /v1/usage, /v1/requests, /v1/keys and /v1/topups answer; with a key
// that may manage keys, it creates, limits, rotates and revokes them through /v1/keys. No
// library, nothing loaded from elsewhere; the chart is SVG drawn here.
//
// Words come from i18n.js: Spanish (es-PE) when the browser prefers Spanish, else English, or
// what the switch chose (remembered in localStorage). Days and times are the tenant's time
// zone's (`time_zone` of /v1/account, America/Lima by default). Money is formatted from the
// API's exact decimal strings with integer arithmetic (BigInt pico-soles), never floats.
"use strict";

const STORE = "quipu.key";
const LANG = "quipu.lang";
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

let lang = "en";
let zone = "America/Lima";
let last = null; // the last answers, to re-render on a language switch
let caller = null; // the signed-in key's id and whether it may manage keys

function key() {
  return sessionStorage.getItem(STORE);
}

function chooseLanguage() {
  const saved = localStorage.getItem(LANG);
  if (saved === "es" || saved === "en") return saved;
  const prefs = navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language || "en"];
  return String(prefs[0]).toLowerCase().startsWith("es") ? "es" : "en";
}

const locale = () => (lang === "es" ? "es-PE" : "en-US");

function t(id, vars) {
  let s = (MESSAGES[lang] && MESSAGES[lang][id]) || MESSAGES.en[id] || id;
  for (const [k, v] of Object.entries(vars || {})) s = s.split("{" + k + "}").join(String(v));
  return s;
}

function applyLanguage() {
  document.documentElement.lang = locale();
  for (const el of document.querySelectorAll("[data-i18n]")) el.textContent = t(el.dataset.i18n);
  for (const el of document.querySelectorAll("[data-i18n-aria]")) el.setAttribute("aria-label", t(el.dataset.i18nAria));
  document.title = t("title");
  const sw = $("lang");
  sw.textContent = t("switch_to");
  sw.lang = lang === "es" ? "en" : "es";
  document.body.dataset.lang = lang;
}

// The zone's offset from UTC now, as the usage API takes it (whole hours), or null.
function zoneOffset() {
  try {
    const parts = new Intl.DateTimeFormat("en-US", { timeZone: zone, timeZoneName: "longOffset" }).formatToParts(new Date());
    const name = (parts.find((p) => p.type === "timeZoneName") || {}).value || "";
    if (name === "GMT") return "+00:00";
    const m = /^GMT([+-])(\d{2}):(\d{2})$/.exec(name);
    if (!m || m[3] !== "00") return null;
    return m[1] + m[2] + ":00";
  } catch (_) {
    return null;
  }
}

class AuthError extends Error {}

async function api(path, method, body) {
  const headers = { Authorization: "Bearer " + key() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method: method || "GET",
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  let answer = null;
  try {
    answer = await r.json();
  } catch (_) {
    answer = null;
  }
  const why = (answer && answer.error && answer.error.message) || "HTTP " + r.status;
  if (r.status === 401) throw new AuthError(why);
  if (!r.ok) throw new Error(why);
  return answer;
}

// Soles from an exact decimal string: `S/ 1,234.57` (rounded half up to céntimos), and below
// S/ 0.01 the digits that make it non-zero (three significant ones: `S/ 0.000347`).
function soles(exact) {
  const m = /^(-?)(\d+)(?:\.(\d+))?$/.exec(String(exact).trim());
  if (!m) return "S/ " + exact;
  const sign = m[1] && /[1-9]/.test(m[2] + (m[3] || "")) ? "-" : "";
  const picos = BigInt(m[2]) * 10n ** 12n + BigInt(((m[3] || "") + "000000000000").slice(0, 12));
  const group = (digits) => digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  if (picos === 0n || picos >= 10n ** 10n) {
    const cents = (picos + 5n * 10n ** 9n) / 10n ** 10n;
    return sign + "S/ " + group(String(cents / 100n)) + "." + String(cents % 100n).padStart(2, "0");
  }
  const decimals = Math.min(12, 12 - String(picos).length + 3);
  const unit = 10n ** BigInt(12 - decimals);
  const r = (picos + unit / 2n) / unit;
  const frac = String(r).padStart(decimals, "0").replace(/0+$/, "");
  return sign + "S/ 0." + (frac.length >= 2 ? frac : frac.padEnd(2, "0"));
}

// An amount, its exact figure on hover.
function money(el, m) {
  el.textContent = soles(m.exact);
  el.title = t("exact", { exact: m.exact });
  el.dataset.exact = m.exact;
  el.classList.add("money");
  return el;
}

function moneyCell(m) {
  const td = document.createElement("td");
  td.className = "num";
  if (m) td.appendChild(money(document.createElement("span"), m));
  else td.textContent = "—";
  return td;
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

const fmtInt = (n) => Number(n).toLocaleString(locale());

// A time in the tenant's zone, to the minute; `data-at` keeps the instant.
function fmtTime(at) {
  if (!at) return "—";
  return new Intl.DateTimeFormat(locale(), {
    timeZone: zone, year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", hourCycle: "h23",
  }).format(new Date(at));
}

function timeCell(at) {
  const td = cell(fmtTime(at));
  if (at) td.dataset.at = at;
  return td;
}

// A day of the usage API (`2026-11-28`, already a day of the tenant's zone).
const fmtDay = (day, long) =>
  new Intl.DateTimeFormat(locale(), { timeZone: "UTC", day: "numeric", month: "short", year: long ? "numeric" : undefined })
    .format(new Date(day + "T00:00:00Z"));

const fmtLimit = (l) =>
  [l.requests_per_minute == null ? t("no_request_limit") : t("n_req_limit", { n: fmtInt(l.requests_per_minute) }),
   l.tokens_per_minute == null ? t("no_token_limit") : t("n_tok_limit", { n: fmtInt(l.tokens_per_minute) })].join(", ");

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
  $("who").textContent = a.tenant.name + (k ? " · " + t("who_key", { prefix: k.prefix }) + (k.label ? " (" + k.label + ")" : "") : "");
  $("as-of").textContent = t("as_of", { at: fmtTime(a.as_of), zone });
}

// Bars of the daily spend: one per day, height by share of the largest day.
function renderChart(u) {
  const box = $("chart");
  const W = 720, H = 220, left = 8, right = 8, top = 22, bottom = 26;
  const days = u.data;
  // Heights only (a drawing, not money): the figures themselves are formatted exactly.
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
    const title = document.createElementNS(SVG, "title");
    title.textContent = t("bar_title", { day: fmtDay(d.day, true), amount: soles(d.charge.exact), exact: d.charge.exact, n: fmtInt(d.requests) });
    r.appendChild(title);
    svg.appendChild(r);
    // Weekly labels counted back from the last day, and the first day's when it has room.
    const fromEnd = days.length - 1 - i;
    const weekly = days.length > 10 ? fromEnd % 7 === 0 : fromEnd === 0;
    if (weekly || (i === 0 && (days.length <= 10 || fromEnd % 7 >= 3))) {
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("x", (left + i * step + step / 2).toFixed(2));
      label.setAttribute("y", H - 8);
      label.setAttribute("text-anchor", i === 0 ? "start" : i === days.length - 1 ? "end" : "middle");
      label.textContent = fmtDay(d.day, false);
      svg.appendChild(label);
    }
  });
  const topLabel = document.createElementNS(SVG, "text");
  topLabel.setAttribute("x", left);
  topLabel.setAttribute("y", 14);
  const maxDay = days[values.indexOf(max)];
  topLabel.textContent = max > 0 ? t("highest", { amount: soles(maxDay.charge.exact), day: fmtDay(maxDay.day, true) }) : t("no_spend");
  svg.appendChild(topLabel);
  box.replaceChildren(svg);
  $("chart-days").textContent = t("chart_days", { n: days.length, last: days.length ? fmtDay(days[days.length - 1].day, true) : "" }) + ` (UTC${u.utc_offset})`;
  money($("period-total"), u.totals.charge);
  $("period-requests").textContent = t("n_requests", { n: fmtInt(u.totals.requests) });
}

function renderModels(u) {
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
      s.title = t("tokens_title", { part: t(cls === "cached" ? "cached_input" : cls), n: fmtInt(n) });
      bar.appendChild(s);
    }
    const figures = document.createElement("div");
    figures.className = "model-figures";
    figures.append(
      t("model_figures", { requests: fmtInt(m.requests), input: fmtInt(m.input_tokens), cached: fmtInt(m.cached_tokens), output: fmtInt(m.output_tokens) }),
      money(document.createElement("span"), m.charge),
    );
    row.append(name, bar, figures);
    return row;
  });
  if (rows.length === 0) {
    const p = document.createElement("p");
    p.className = "small";
    p.textContent = t("no_tokens");
    rows.push(p);
  }
  $("models").replaceChildren(...rows);
}

function renderRequests(list) {
  const rows = list.data.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    tr.title = r.id;
    tr.append(
      timeCell(r.at),
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
  $("requests").tBodies[0].replaceChildren(...rows);
  $("requests-empty").hidden = rows.length > 0;
}

function keyState(k) {
  if (k.revoked) return [t("revoked", { at: fmtTime(k.revoked_at) }), "revoked"];
  const r = k.rules;
  if (r.expires_at && Date.parse(r.expires_at) <= Date.now()) return [t("expired"), "revoked"];
  if (r.disabled) return [t("disabled"), "revoked"];
  return [t("active"), ""];
}

function renderKeys(list) {
  const manage = caller && caller.manage;
  for (const el of document.querySelectorAll(".manage-only")) el.hidden = !manage;
  const rows = list.data.map((k) => {
    const tr = document.createElement("tr");
    tr.dataset.id = k.id;
    const r = k.rules;
    const cap = k.cap;
    const capCell = cell(cap ? t("cap_text", { amount: soles(cap.amount.exact), period: t("cap_" + cap.period) }) : t("no_cap"), "cap");
    if (cap && cap.resets_at) capCell.title = t("resets", { at: fmtTime(cap.resets_at) });
    const [state, stateCls] = keyState(k);
    const scopes = r.scopes.includes("manage") ? " · " + t("manage_scope") : "";
    const mine = caller && k.id === caller.id ? " " + t("this_one") : "";
    tr.append(
      cell(k.prefix + "…", "mono"),
      cell((k.label || "—") + mine),
      cell(r.models ? r.models.join(", ") : t("all_models"), "models"),
      capCell,
      moneyCell(cap && cap.spent),
      moneyCell(cap && cap.remaining),
      timeCell(r.expires_at),
      timeCell(k.last_used_at),
      cell(fmtInt(k.usage.requests), "num"),
      cell(state + scopes, "state " + stateCls),
    );
    if (manage) tr.appendChild(actions(k));
    return tr;
  });
  $("keys").tBodies[0].replaceChildren(...rows);
}

// A button that asks once more before it acts.
function twoStep(label, confirm, act) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", () => {
    if (b.dataset.armed) return act();
    b.dataset.armed = "1";
    b.textContent = confirm;
  });
  return b;
}

// Limit, rotate and revoke: for the tenant's active keys without the manage scope (those are
// the operator's).
function actions(k) {
  const td = document.createElement("td");
  td.className = "key-actions";
  if (k.revoked || k.rules.scopes.includes("manage")) return td;
  const limit = document.createElement("button");
  limit.type = "button";
  limit.textContent = t("limit");
  limit.className = "limit";
  limit.addEventListener("click", () => editKey(k));
  const rotate = twoStep(t("rotate"), t("confirm_rotate"), () =>
    write(api("/v1/keys/" + encodeURIComponent(k.id) + "/rotate", "POST", { grace: "24h" }), (made) => {
      showSecret(made.secret);
      return t("rotated");
    }));
  rotate.className = "rotate";
  const revoke = twoStep(t("revoke"), t("confirm_revoke"), () =>
    write(api("/v1/keys/" + encodeURIComponent(k.id), "DELETE"), () => t("revoked_done", { id: k.id })));
  revoke.className = "revoke";
  td.append(limit, rotate, revoke);
  return td;
}

function showSecret(secret) {
  $("new-secret-value").textContent = secret;
  $("new-secret").hidden = false;
}

// Runs a key write, says how it went, and reloads.
async function write(pending, done) {
  $("keys-error").textContent = "";
  $("keys-note").textContent = "";
  try {
    const answer = await pending;
    $("keys-note").textContent = done(answer);
    resetForm();
  } catch (e) {
    if (e instanceof AuthError) return signedOut(e);
    $("keys-error").textContent = t("write_failed", { why: e.message });
    return;
  }
  await load();
}

function resetForm() {
  $("key-form").reset();
  $("kf-id").value = "";
  $("key-form-title").textContent = t("create_key");
  $("kf-submit").textContent = t("create");
  $("kf-cancel").hidden = true;
}

function editKey(k) {
  const r = k.rules;
  $("kf-id").value = k.id;
  $("kf-label").value = k.label;
  $("kf-models").value = r.models ? r.models.join(", ") : "";
  $("kf-amount").value = r.budget ? r.budget.amount : "";
  $("kf-period").value = r.budget ? r.budget.period : "day";
  $("kf-expires").value = r.expires_at ? localDate(r.expires_at) : "";
  $("key-form-title").textContent = t("limit_key", { prefix: k.prefix });
  $("kf-submit").textContent = t("save");
  $("kf-cancel").hidden = false;
  $("key-form").scrollIntoView({ block: "nearest" });
}

// `2026-12-31` of an instant, in the tenant's zone.
function localDate(at) {
  return new Intl.DateTimeFormat("en-CA", { timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit" }).format(new Date(at));
}

// The form as key settings: empty fields clear (on a change) or are left out (on a create).
function settings(editing) {
  const s = { label: $("kf-label").value.trim() };
  const models = $("kf-models").value.split(",").map((m) => m.trim()).filter(Boolean);
  const amount = $("kf-amount").value.trim();
  const expires = $("kf-expires").value;
  if (models.length || editing) s.models = models.length ? models : null;
  if (amount || editing) s.budget = amount ? { amount, period: $("kf-period").value } : null;
  // The end of the chosen day begins at midnight in the tenant's zone.
  if (expires || editing) s.expires_at = expires ? expires + "T00:00:00" + (zoneOffset() || "Z") : null;
  return s;
}

function submitKey(ev) {
  ev.preventDefault();
  const id = $("kf-id").value;
  if (id) {
    write(api("/v1/keys/" + encodeURIComponent(id), "PATCH", settings(true)), (k) => t("changed", { prefix: k.secret_prefix }));
  } else {
    write(api("/v1/keys", "POST", settings(false)), (made) => {
      showSecret(made.secret);
      return t("created", { prefix: made.secret_prefix });
    });
  }
}

function renderTopUps(list) {
  const rows = list.data.map((u) => {
    const tr = document.createElement("tr");
    tr.append(timeCell(u.at), moneyCell(u.amount), cell(u.note || "—"));
    return tr;
  });
  $("topups").tBodies[0].replaceChildren(...rows);
  $("topups-empty").hidden = rows.length > 0;
}

function render() {
  if (!last) return;
  const [account, days, models, requests, keys, topups] = last;
  renderAccount(account);
  renderChart(days);
  renderModels(models);
  renderRequests(requests);
  renderKeys(keys);
  renderTopUps(topups);
}

function show(signedIn) {
  $("signin").hidden = signedIn;
  $("account").hidden = !signedIn;
  $("refresh").hidden = !signedIn;
  $("signout").hidden = !signedIn;
  if (!signedIn) $("who").textContent = "";
}

function signedOut(e) {
  sessionStorage.removeItem(STORE);
  last = null;
  show(false);
  $("signin-error").textContent = t("refused", { why: e.message });
}

let loading = false;

async function load() {
  if (loading || !key()) return;
  loading = true;
  $("refresh").disabled = true;
  try {
    // The tenant's zone first: it decides which days the usage is counted in.
    const account = await api("/v1/account");
    zone = account.time_zone || "America/Lima";
    const off = zoneOffset();
    const q = off ? "&utc_offset=" + encodeURIComponent(off) : "";
    const rest = await Promise.all([
      api("/v1/usage?group_by=day" + q),
      api("/v1/usage?group_by=model&limit=20" + q),
      api("/v1/requests?limit=20"),
      api("/v1/keys?limit=100"),
      api("/v1/topups?limit=10"),
    ]);
    const k = account.key;
    caller = k ? { id: k.id, manage: k.rules.scopes.includes("manage") } : null;
    last = [account, ...rest];
    show(true);
    $("load-error").textContent = "";
    render();
    document.body.dataset.loaded = String(Date.now());
  } catch (e) {
    if (e instanceof AuthError) signedOut(e);
    else $("load-error").textContent = t("load_failed", { why: e.message });
  } finally {
    loading = false;
    $("refresh").disabled = false;
  }
}

function init() {
  lang = chooseLanguage();
  applyLanguage();
  $("lang").addEventListener("click", () => {
    lang = lang === "es" ? "en" : "es";
    localStorage.setItem(LANG, lang);
    applyLanguage();
    resetForm();
    render();
  });
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
    last = null;
    show(false);
  });
  $("refresh").addEventListener("click", load);
  $("key-form").addEventListener("submit", submitKey);
  $("kf-cancel").addEventListener("click", resetForm);
  $("new-secret-done").addEventListener("click", () => {
    $("new-secret").hidden = true;
    $("new-secret-value").textContent = "";
  });
  // Fresh figures while the page is looked at.
  setInterval(() => {
    if (document.visibilityState === "visible") load();
  }, 30000);
  if (key()) load();
  else show(false);
}

init();
