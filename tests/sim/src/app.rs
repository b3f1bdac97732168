//! The simulator's HTTP surface, answered from pingora's `request_filter`.

use crate::cache::PrefixCache;
use crate::directives::{self, Directives};
use crate::engine::{Admission, Engine, Slot};
use crate::generate::{self, Piece, Plan};
use crate::render::{Head, Shape};
use crate::tokenizer;
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use pingora::http::ResponseHeader;
use pingora::proxy::{ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MAX_RECORDS: usize = 200_000;

/// One request as the simulator saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Position in the log: assigned when the request ends, so `since=` paging never skips a
    /// long request that ended after a later one.
    pub seq: u64,
    /// The `x-request-id` header (the gateway's request id).
    pub request_id: Option<String>,
    pub at_ms: u64,
    pub ended_ms: u64,
    pub model: String,
    pub stream: bool,
    pub body_len: usize,
    pub body_sha256: String,
    pub status: u16,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Tokens a client could use: those whose chunks were written before the response ended
    /// (all of them, unless the client went away or a fault cut the stream). After an injected
    /// `garbage_after` no further token counts: a reader stops at the garbage.
    pub completion_tokens: usize,
    /// Tokens the final usage chunk reported (when one was sent).
    pub reported_completion_tokens: Option<usize>,
    pub cancelled: bool,
    /// Milliseconds spent waiting for a slot (`--max-num-seqs`) before generating.
    pub queue_ms: f64,
    pub finish_reason: Option<String>,
    /// The client's address (`ip:port`): one per connection, so a client that reuses its
    /// connections shows few.
    pub peer: String,
}

pub struct Sim {
    pub shape: Shape,
    pub served_model: Option<String>,
    pub max_model_len: usize,
    pub token_delay: Duration,
    pub healthy: AtomicBool,
    /// When not 0, every chat completion is answered with this HTTP status (`/sim/fault`): a
    /// replica that fails while its health check still passes, e.g. an overloaded 503.
    pub fault_status: AtomicU64,
    pub cache: Mutex<PrefixCache>,
    pub records: Mutex<VecDeque<Record>>,
    pub last_body: Mutex<Bytes>,
    /// Requests received.
    pub seq: AtomicU64,
    /// Records logged (ends of requests).
    pub logged: AtomicU64,
    pub in_flight: AtomicU64,
    pub cancelled: AtomicU64,
    /// Slots (`--max-num-seqs`) and the FIFO of requests waiting for one.
    pub engine: Engine,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn respond(
    session: &mut Session,
    status: u16,
    ctype: &str,
    body: Bytes,
) -> pingora::Result<()> {
    let mut h = ResponseHeader::build(status, Some(4))?;
    h.insert_header("content-type", ctype)?;
    h.insert_header("content-length", body.len().to_string())?;
    if status == 429 || status == 503 {
        h.insert_header("retry-after", "1")?;
    }
    session.write_response_header(Box::new(h), false).await?;
    session.write_response_body(Some(body), true).await
}

async fn respond_json(session: &mut Session, status: u16, v: &Value) -> pingora::Result<()> {
    respond(
        session,
        status,
        "application/json",
        Bytes::from(v.to_string()),
    )
    .await
}

async fn read_body(session: &mut Session) -> pingora::Result<Bytes> {
    let mut buf = Vec::new();
    while let Some(chunk) = session.read_request_body().await? {
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// Sleeps, unless the client goes away first (then `false`).
async fn pause(session: &mut Session, d: Duration) -> bool {
    if d.is_zero() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = session.as_downstream_mut().read_body_or_idle(true) => false,
    }
}

fn frame(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

pub struct Ctx {
    record: Option<Record>,
    /// Counted in `in_flight` until `logging` has stored the record.
    in_flight: bool,
}

impl Sim {
    /// Waits for a generation slot, FIFO behind earlier requests; `None` if the client went
    /// away first (the request is then marked cancelled).
    async fn slot(&self, session: &mut Session, ctx: &mut Ctx) -> Option<Slot<'_>> {
        let mut waiting = match self.engine.admit() {
            Admission::Now(slot) => return Some(slot),
            Admission::Wait(w) => w,
        };
        let since = Instant::now();
        let slot = tokio::select! {
            s = waiting.slot() => s,
            _ = session.as_downstream_mut().read_body_or_idle(true) => None,
        };
        if let Some(r) = ctx.record.as_mut() {
            r.queue_ms = since.elapsed().as_secs_f64() * 1000.0;
            r.cancelled |= slot.is_none();
        }
        slot
    }

    fn push(&self, mut r: Record) {
        let mut recs = self.records.lock();
        r.seq = self.logged.fetch_add(1, Ordering::SeqCst) + 1;
        recs.push_back(r);
        while recs.len() > MAX_RECORDS {
            recs.pop_front();
        }
    }

    async fn chat(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<()> {
        let body = read_body(session).await?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        *self.last_body.lock() = body.clone();
        let mut rec = Record {
            seq,
            request_id: session
                .req_header()
                .headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            at_ms: now_ms(),
            ended_ms: 0,
            model: String::new(),
            stream: false,
            body_len: body.len(),
            body_sha256: Sha256::digest(&body)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            status: 200,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            reported_completion_tokens: None,
            cancelled: false,
            queue_ms: 0.0,
            finish_reason: None,
            peer: session
                .client_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        };
        let req: Value = match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                rec.status = 400;
                ctx.record = Some(rec);
                let e = self
                    .shape
                    .error(400, "The request body is not a valid JSON object.");
                return respond_json(session, 400, &e).await;
            }
        };
        rec.model = req["model"].as_str().unwrap_or("").to_owned();
        rec.stream = req["stream"].as_bool().unwrap_or(false);
        let messages = match req["messages"].as_array() {
            Some(m) if !m.is_empty() => m.clone(),
            _ => {
                rec.status = 400;
                ctx.record = Some(rec);
                let e = self
                    .shape
                    .error(400, "messages: Field required and must be a non-empty list");
                return respond_json(session, 400, &e).await;
            }
        };
        if let Some(served) = &self.served_model {
            if &rec.model != served {
                rec.status = 404;
                ctx.record = Some(rec.clone());
                let e = self
                    .shape
                    .error(404, &format!("The model `{}` does not exist.", rec.model));
                return respond_json(session, 404, &e).await;
            }
        }
        let d = directives::parse(&messages);
        if d.ttfb_ms > 0 && !pause(session, Duration::from_millis(d.ttfb_ms)).await {
            rec.cancelled = true;
            ctx.record = Some(rec);
            return Ok(());
        }
        let forced = match self.fault_status.load(Ordering::SeqCst) {
            0 => None,
            s => u16::try_from(s).ok(),
        };
        if let Some(status) = forced.or(d.status) {
            rec.status = status;
            ctx.record = Some(rec);
            let e = self
                .shape
                .error(status, &format!("simulated failure with status {status}"));
            return respond_json(session, status, &e).await;
        }
        let ids = tokenizer::prompt_ids(&messages, req.get("tools"));
        let prompt = ids.len();
        let requested = req["max_completion_tokens"]
            .as_u64()
            .or_else(|| req["max_tokens"].as_u64())
            .map(|n| n as usize);
        if d.overflow || prompt + requested.unwrap_or(0) > self.max_model_len {
            rec.status = 400;
            rec.prompt_tokens = prompt;
            ctx.record = Some(rec);
            // The `overflow` directive stands for a prompt that alone exceeds the window: the
            // error reports such a prompt, as a real server would (the true count is tiny).
            let reported = if d.overflow {
                prompt + self.max_model_len
            } else {
                prompt
            };
            let e = self
                .shape
                .overflow(reported, requested.unwrap_or(0), self.max_model_len);
            return respond_json(session, 400, &e).await;
        }
        let max_tokens = requested.unwrap_or(self.max_model_len - prompt);
        let cached = self.cache.lock().prefill(&ids);
        let seed = ids
            .iter()
            .fold(req["seed"].as_u64().unwrap_or(0x9e37_79b9), |h, &id| {
                (h ^ u64::from(id)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        let named = req["tool_choice"].is_object();
        let plan = generate::plan(seed, &d, max_tokens, named);
        rec.prompt_tokens = prompt;
        rec.cached_tokens = cached;
        rec.finish_reason = Some(plan.finish_reason.to_owned());
        let head = Head {
            id: format!("chatcmpl-{seq:016x}"),
            created: now_ms() / 1000,
            model: rec.model.clone(),
        };
        if !rec.stream {
            ctx.record = Some(rec);
            let Some(slot) = self.slot(session, ctx).await else {
                return Ok(());
            };
            let Some(mut rec) = ctx.record.take() else {
                return Ok(());
            };
            let delay = d.delay_ms.map_or(self.token_delay, Duration::from_millis);
            let total = delay * plan.completion_tokens as u32 + Duration::from_millis(d.prefill_ms);
            if !pause(session, total).await {
                rec.cancelled = true;
                ctx.record = Some(rec);
                return Ok(());
            }
            // Generation is over: the slot goes to the next request while the answer is sent.
            drop(slot);
            let v = self.shape.completion(&head, &plan, prompt, cached);
            if d.body_ms > 0 {
                let body = Bytes::from(v.to_string());
                let mut h = ResponseHeader::build(200, Some(2))?;
                h.insert_header("content-type", "application/json")?;
                h.insert_header("content-length", body.len().to_string())?;
                session.write_response_header(Box::new(h), false).await?;
                if !pause(session, Duration::from_millis(d.body_ms)).await {
                    rec.cancelled = true;
                    ctx.record = Some(rec);
                    return Ok(());
                }
                rec.completion_tokens = plan.completion_tokens;
                rec.reported_completion_tokens = Some(plan.completion_tokens);
                ctx.record = Some(rec);
                return session.write_response_body(Some(body), true).await;
            }
            rec.completion_tokens = plan.completion_tokens;
            rec.reported_completion_tokens = Some(plan.completion_tokens);
            ctx.record = Some(rec);
            return respond_json(session, 200, &v).await;
        }
        ctx.record = Some(rec);
        self.stream(session, ctx, &req, &d, &plan, &head, prompt, cached)
            .await
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the pieces of one response"
    )]
    async fn stream(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: &Value,
        d: &Directives,
        plan: &Plan,
        head: &Head,
        prompt: usize,
        cached: usize,
    ) -> pingora::Result<()> {
        let include_usage = req
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let continuous = req
            .pointer("/stream_options/continuous_usage_stats")
            .and_then(Value::as_bool)
            == Some(true);
        let delay = d.delay_ms.map_or(self.token_delay, Duration::from_millis);
        let mut h = ResponseHeader::build(200, Some(4))?;
        h.insert_header("content-type", "text/event-stream; charset=utf-8")?;
        h.insert_header("transfer-encoding", "chunked")?;
        session.write_response_header(Box::new(h), false).await?;
        // Like vLLM, the head goes out at once and the first chunk once the request has a
        // slot: time to first token includes the wait in the engine's queue.
        let Some(_slot) = self.slot(session, ctx).await else {
            return Ok(());
        };
        let usage = |n: usize| continuous.then(|| self.shape.usage(prompt, cached, n));
        let cancelled = |ctx: &mut Ctx| {
            if let Some(r) = ctx.record.as_mut() {
                r.cancelled = true;
            }
        };
        if !pause(session, Duration::from_millis(d.prefill_ms)).await {
            cancelled(ctx);
            return Ok(());
        }
        let mut first = json!({"role": "assistant", "content": ""});
        if self.shape.flavor == crate::render::Flavor::Sglang {
            first["reasoning_content"] = Value::Null;
        }
        let role = head.chunk(
            json!([{"index": 0, "delta": first, "logprobs": null, "finish_reason": null}]),
            usage(0),
        );
        if !self.write(session, d, &frame(&role)).await {
            cancelled(ctx);
            return Ok(());
        }
        // vLLM sends a lumped tool-argument string in the finish chunk (vllm#50627).
        let lump_last = d.args_lump && matches!(plan.pieces.last(), Some(Piece::ToolArgs(..)));
        let mut garbled = false;
        let n = plan.pieces.len() - usize::from(lump_last);
        for (i, piece) in plan.pieces[..n].iter().enumerate() {
            if d.fail_after == Some(i) {
                let e = self.shape.error(500, "simulated engine failure mid-stream");
                let mut out = frame(&e);
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.write(session, d, &out).await;
                return Ok(());
            }
            if d.reset_after == Some(i) {
                session.as_downstream_mut().set_keepalive(None);
                return pingora::Error::e_explain(
                    pingora::ErrorType::ConnectionClosed,
                    "simulated reset mid-stream",
                );
            }
            if d.garbage_after == Some(i) {
                garbled = true;
                if !self.write(session, d, b"data: {not json\n\n").await {
                    cancelled(ctx);
                    return Ok(());
                }
            }
            if i > 0 && !pause(session, delay).await {
                cancelled(ctx);
                return Ok(());
            }
            let c = head.chunk(
                json!([{"index": 0, "delta": self.shape.delta(piece), "logprobs": null, "finish_reason": null}]),
                usage(i + 1),
            );
            if !self.write(session, d, &frame(&c)).await {
                cancelled(ctx);
                return Ok(());
            }
            if let Some(r) = ctx.record.as_mut().filter(|_| !garbled) {
                r.completion_tokens = i + 1;
            }
        }
        let mut finish = json!({"index": 0, "delta": {}, "logprobs": null});
        if lump_last {
            if let Some(p) = plan.pieces.last() {
                finish["delta"] = self.shape.delta(p);
            }
        }
        self.shape.finish_fields(&mut finish, plan);
        let mut out = frame(&head.chunk(json!([finish]), usage(plan.completion_tokens)));
        if include_usage && !d.no_usage {
            let mut u = head.chunk(
                json!([]),
                Some(self.shape.usage(prompt, cached, plan.completion_tokens)),
            );
            if let Some(t) = self.shape.timings(prompt, cached, plan.completion_tokens) {
                u["timings"] = t;
            }
            out.extend_from_slice(&frame(&u));
            if let Some(r) = ctx.record.as_mut() {
                r.reported_completion_tokens = Some(plan.completion_tokens);
            }
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        if !self.write(session, d, &out).await {
            cancelled(ctx);
            return Ok(());
        }
        if let Some(r) = ctx.record.as_mut().filter(|_| !garbled) {
            r.completion_tokens = plan.completion_tokens;
        }
        session.write_response_body(None, true).await
    }

    /// Writes bytes (in 2–3 pieces with short pauses in `split` mode); `false` if the client is
    /// gone.
    async fn write(&self, session: &mut Session, d: &Directives, bytes: &[u8]) -> bool {
        if !d.split || bytes.len() < 4 {
            return session
                .write_response_body(Some(Bytes::copy_from_slice(bytes)), false)
                .await
                .is_ok();
        }
        let a = bytes.len() / 3 + 1;
        let b = 2 * bytes.len() / 3 + 1;
        for part in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
            if session
                .write_response_body(Some(Bytes::copy_from_slice(part)), false)
                .await
                .is_err()
            {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    async fn tokenize(&self, session: &mut Session) -> pingora::Result<()> {
        let body = read_body(session).await?;
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if let Some(m) = req["messages"].as_array() {
            // `ttfb_ms` delays the tokenizer's answer too.
            let d = directives::parse(m);
            if d.ttfb_ms > 0 && !pause(session, Duration::from_millis(d.ttfb_ms)).await {
                return Ok(());
            }
        }
        let ids: Vec<u32> = if let Some(m) = req["messages"].as_array() {
            tokenizer::prompt_ids(m, req.get("tools"))
        } else if let Some(p) = req["prompt"].as_str() {
            tokenizer::pieces(p)
                .iter()
                .map(|t| tokenizer::token_id(t.trim_start()))
                .collect()
        } else {
            let e = self
                .shape
                .error(400, "tokenize needs `messages` or `prompt`");
            return respond_json(session, 400, &e).await;
        };
        let v = json!({"count": ids.len(), "max_model_len": self.max_model_len, "tokens": ids});
        respond_json(session, 200, &v).await
    }

    async fn control(&self, session: &mut Session, path: &str, query: &str) -> pingora::Result<()> {
        match path {
            "/sim/requests" => {
                let since: u64 = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("since="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let recs: Vec<Record> = self
                    .records
                    .lock()
                    .iter()
                    .filter(|r| r.seq > since)
                    .cloned()
                    .collect();
                let v = json!({"seq": self.logged.load(Ordering::SeqCst), "requests": recs});
                respond_json(session, 200, &v).await
            }
            "/sim/stats" => {
                let v = json!({
                    "seq": self.logged.load(Ordering::SeqCst),
                    "requests": self.seq.load(Ordering::SeqCst),
                    "in_flight": self.in_flight.load(Ordering::SeqCst),
                    "cancelled": self.cancelled.load(Ordering::SeqCst),
                    "healthy": self.healthy.load(Ordering::SeqCst),
                });
                respond_json(session, 200, &v).await
            }
            "/sim/engine" => respond_json(session, 200, &self.engine.report()).await,
            "/sim/last-body" => {
                let b = self.last_body.lock().clone();
                respond(session, 200, "application/json", b).await
            }
            "/sim/reset" => {
                read_body(session).await?;
                // Records are cleared but numbering goes on, so `since=` stays valid.
                self.records.lock().clear();
                self.cache.lock().clear();
                self.engine.reset_window();
                respond_json(session, 200, &json!({"ok": true})).await
            }
            "/sim/fault" => {
                let body = read_body(session).await?;
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                self.fault_status
                    .store(v["status"].as_u64().unwrap_or(0), Ordering::SeqCst);
                respond_json(
                    session,
                    200,
                    &json!({"status": self.fault_status.load(Ordering::SeqCst)}),
                )
                .await
            }
            "/sim/health" => {
                let body = read_body(session).await?;
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                self.healthy
                    .store(v["healthy"].as_bool().unwrap_or(true), Ordering::SeqCst);
                respond_json(
                    session,
                    200,
                    &json!({"healthy": self.healthy.load(Ordering::SeqCst)}),
                )
                .await
            }
            _ => respond_json(session, 404, &json!({"error": "unknown simulator route"})).await,
        }
    }
}

#[async_trait]
impl ProxyHttp for Sim {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            record: None,
            in_flight: false,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_owned();
        let query = session.req_header().uri.query().unwrap_or("").to_owned();
        match (method.as_str(), path.as_str()) {
            ("GET", "/health") => {
                let status = if self.healthy.load(Ordering::SeqCst) {
                    200
                } else {
                    503
                };
                respond(session, status, "text/plain", Bytes::new()).await?;
            }
            ("GET", "/v1/models") => {
                let id = self.served_model.clone().unwrap_or_else(|| "sim".into());
                let v = json!({"object": "list", "data": [{"id": id, "object": "model", "created": 0,
                    "owned_by": "vllm", "root": id, "parent": null, "max_model_len": self.max_model_len}]});
                respond_json(session, 200, &v).await?;
            }
            ("POST", "/tokenize") => self.tokenize(session).await?,
            ("GET", "/metrics") => {
                let model = self.served_model.as_deref().unwrap_or("sim");
                let text = self.engine.metrics(self.shape.flavor, model);
                let ctype = "text/plain; version=0.0.4; charset=utf-8";
                respond(session, 200, ctype, Bytes::from(text)).await?;
            }
            ("GET", "/slots") if self.shape.flavor == crate::render::Flavor::Llamacpp => {
                respond_json(session, 200, &self.engine.slots(self.max_model_len)).await?;
            }
            ("POST", "/v1/chat/completions") => {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                ctx.in_flight = true;
                self.chat(session, ctx).await?;
            }
            (_, p) if p.starts_with("/sim/") => self.control(session, p, &query).await?,
            _ => {
                let e = self.shape.error(404, &format!("no route {path}"));
                respond_json(session, 404, &e).await?;
            }
        }
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _s: &mut Session,
        _c: &mut Ctx,
    ) -> pingora::Result<Box<HttpPeer>> {
        pingora::Error::e_explain(
            pingora::ErrorType::InternalError,
            "the simulator has no upstream",
        )
    }

    async fn logging(&self, _s: &mut Session, _e: Option<&pingora::Error>, ctx: &mut Ctx) {
        if let Some(mut r) = ctx.record.take() {
            r.ended_ms = now_ms();
            if r.cancelled {
                self.cancelled.fetch_add(1, Ordering::SeqCst);
            }
            self.push(r);
        }
        if ctx.in_flight {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
