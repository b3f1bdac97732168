//! The Responses API's I/O: a create request's translation around its stored conversation
//! (`previous_response_id`), the stored-response routes (`GET` / `DELETE /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`), and writing a finished response to the store.
//!
//! - **Create.** The request's top level is read, then the conversation `previous_response_id`
//!   names is read from the store (one round trip: a prompt the client asked the gateway to
//!   rebuild; no other request pays it), then the whole conversation is translated. A missing
//!   id and another tenant's are the same 404, which leaks nothing. What the response
//!   translators need beyond the chat formats' context is kept in [`Turn`], on the request's
//!   context.
//! - **Stored.** A finished response is queued for the store after its last byte went out
//!   ([`write_finished`], from `serve`) and kept in memory until the writer (a task of the
//!   billing runtime, gathering as the ledger's does: `store::batch`) has stored it, in
//!   batches of one transaction: a conversation continued at once reads it from there. Responses waiting for the store are
//!   bounded in bytes (`responses.max_queued_mib`): beyond, a response is not stored (logged).
//!   A failed response is not stored; a batch the store refuses is logged and dropped. Each
//!   outcome is counted (`quipu_stored_responses_total{result}`).
//! - **Read and delete** name the caller's tenant in every query; they reach no upstream and
//!   bill nothing.

use super::{Failure, Gateway, Outcome, Reply, RequestCtx};
use crate::error::{ApiError, ErrorKind};
use crate::metrics::m;
use crate::route::{stored_response_path, ApiRoute};
use crate::store::batch::{self, BatchQueue, Sink};
use crate::store::{now_ms, Store, StoreError, StoredResponse, TenantId};
use crate::translate::responses::request::{parse_request, responses_to_upstream, Prior};
use crate::translate::responses::stored::{deleted, list_input_items, ListQuery};
use crate::translate::responses::{
    id_base, response_id, Conversation, ResponsesContext, ResponsesTurn, ToolName,
};
use crate::translate::{ResponseContext, UpstreamRequest};
use bytes::Bytes;
use parking_lot::Mutex;
use pingora::protocols::http::ServerSession;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What a Responses API request carries beyond an [`UpstreamRequest`], from translation to
/// the store.
#[derive(Debug)]
pub struct Turn {
    /// The response object's echo of the request's parameters.
    pub echo: Vec<u8>,
    pub tools: Vec<ToolName>,
    pub encrypted_reasoning: bool,
    /// Unix seconds of the request's arrival.
    pub created_at: u64,
    /// What to store (`store: true`).
    pub conversation: Option<Conversation>,
    /// The finished response object (set by the relay when it is to be stored).
    pub object: Option<Vec<u8>>,
}

impl Turn {
    /// The context of the response translators.
    pub fn context(&self, base: ResponseContext) -> ResponsesContext {
        ResponsesContext {
            base,
            created_at: self.created_at,
            echo: self.echo.clone(),
            tools: self.tools.clone(),
            encrypted_reasoning: self.encrypted_reasoning,
            keep_object: self.conversation.is_some(),
        }
    }
}

/// Most responses the writer stores in one transaction.
const WRITE_BATCH: usize = 256;

/// How often the writer takes what queued, for one transaction. A transaction (with SQLite, a
/// write lock, a commit and an fsync) costs far more than a row: under load this turns one
/// transaction per response into one per interval, as the ledger's flush interval does for
/// ledger rows. A response waiting for the store is served from memory meanwhile, so nobody
/// waits for it.
const WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// The store of responses, and what is waiting for it.
pub struct StoredResponses {
    store: Arc<dyn Store>,
    /// Bytes of responses waiting for the store.
    queued: AtomicUsize,
    max_queued: usize,
    pending: Mutex<Pending>,
    queue: BatchQueue<Arc<StoredResponse>>,
}

/// What the writer has not finished with.
#[derive(Default)]
struct Pending {
    /// Finished responses not stored yet, by id: what `previous_response_id` and the
    /// stored-response routes read first, so a conversation continued at once finds its
    /// previous turn.
    rows: HashMap<String, Arc<StoredResponse>>,
    /// Ids deleted while their batch was being written: they read as missing until the
    /// writer has deleted them from the store again.
    deleted: HashSet<String>,
}

impl StoredResponses {
    /// Starts the writer on `rt` (the billing runtime).
    pub fn start(
        store: Arc<dyn Store>,
        rt: &tokio::runtime::Handle,
        max_queued: usize,
    ) -> Arc<Self> {
        let this = Arc::new(StoredResponses {
            store,
            queued: AtomicUsize::new(0),
            max_queued,
            pending: Mutex::new(Pending::default()),
            queue: BatchQueue::default(),
        });
        let writer = Arc::clone(&this);
        rt.spawn(async move {
            batch::run(&writer.queue, &*writer, WRITE_INTERVAL, WRITE_BATCH, None).await;
        });
        for result in ["stored", "queue_full", "failed", "invalid"] {
            m().stored_responses.with_label_values(&[result]);
        }
        this
    }

    /// The stored response `id` of `tenant` (waiting for the store, or stored).
    async fn get(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> Result<Option<Arc<StoredResponse>>, StoreError> {
        {
            let pending = self.pending.lock();
            if pending.deleted.contains(id) {
                return Ok(None);
            }
            let waiting = pending.rows.get(id).filter(|r| r.tenant_id == tenant);
            if let Some(row) = waiting {
                return Ok(Some(Arc::clone(row)));
            }
        }
        let stored = self.store.get_response(tenant, id).await?;
        // Deleted while this read was in flight (its batch being written meanwhile).
        if self.pending.lock().deleted.contains(id) {
            return Ok(None);
        }
        Ok(stored.map(Arc::new))
    }

    /// Waits, at most `timeout`, until every queued response is in the store (a graceful
    /// shutdown calls it after the drain, so a response answered just before SIGTERM is not
    /// lost); returns how many are still waiting.
    pub async fn flush(&self, timeout: std::time::Duration) -> usize {
        let by = tokio::time::Instant::now() + timeout;
        loop {
            let waiting = self.pending.lock().rows.len();
            if self.queued.load(Ordering::SeqCst) == 0 || waiting == 0 {
                return 0;
            }
            if tokio::time::Instant::now() >= by {
                return waiting;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Deletes the stored response `id` of `tenant`; whether there was one.
    async fn delete(&self, tenant: TenantId, id: &str) -> Result<bool, StoreError> {
        let (waiting, deleted_before) = {
            let mut pending = self.pending.lock();
            match pending.rows.get(id) {
                _ if pending.deleted.contains(id) => (false, true),
                Some(r) if r.tenant_id == tenant => {
                    pending.rows.remove(id);
                    pending.deleted.insert(id.to_owned());
                    (true, false)
                }
                _ => (false, false),
            }
        };
        let stored = self.store.delete_response(tenant, id).await?;
        // Deleted already while its batch was being written: the row this found in the store
        // was that write's, and this is a second delete.
        Ok(waiting || (stored && !deleted_before))
    }
}

/// Stores queued responses, up to [`WRITE_BATCH`] per transaction, what queued every
/// [`WRITE_INTERVAL`]. A response deleted before its batch is written is left out of it; one
/// deleted while the batch was being written is deleted from the store again, and reads as
/// missing meanwhile (its id is in `Pending::deleted`). A batch the store refuses is logged and
/// dropped: stored responses are a convenience the store's outage may cost, never a charge.
impl Sink<Arc<StoredResponse>> for StoredResponses {
    async fn write(&self, mut batch: Vec<Arc<StoredResponse>>) {
        let bytes: u64 = batch.iter().map(|r| r.size()).sum();
        {
            let mut pending = self.pending.lock();
            batch.retain(|r| {
                let kept = pending.rows.contains_key(&r.id);
                if !kept {
                    pending.deleted.remove(&r.id);
                }
                kept
            });
        }
        if !batch.is_empty() {
            let result = match self.store.put_responses(&batch).await {
                Ok(_) => "stored",
                Err(e) => {
                    log::error!("{} stored responses not written: {e}", batch.len());
                    "failed"
                }
            };
            m().stored_responses
                .with_label_values(&[result])
                .inc_by(batch.len() as u64);
        }
        let deleted: Vec<(TenantId, String)> = {
            let mut pending = self.pending.lock();
            batch
                .iter()
                .filter(|r| pending.rows.remove(&r.id).is_none())
                .map(|r| (r.tenant_id, r.id.clone()))
                .collect()
        };
        for (tenant, id) in deleted {
            match self.store.delete_response(tenant, &id).await {
                Ok(_) => {
                    self.pending.lock().deleted.remove(&id);
                }
                // Its id stays in `deleted`, so it keeps reading as missing; the retention
                // removes the row.
                Err(e) => log::error!("stored response {id}, deleted while written: {e}"),
            }
        }
        self.queued
            .fetch_sub(usize::try_from(bytes).unwrap_or(0), Ordering::SeqCst);
    }
}

fn store_unavailable(e: &crate::store::StoreError) -> ApiError {
    log::error!("stored responses: the store failed: {e}");
    ApiError::new(
        ErrorKind::Overloaded { retry_after: 1 },
        "the gateway cannot reach its store of responses right now; retry shortly",
    )
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        ErrorKind::ResponseNotFound,
        format!("no response with id `{id}` was found"),
    )
}

/// Translates a create request, reading the conversation it continues; keeps its [`Turn`] on
/// the context.
pub async fn translate(
    gw: &Gateway,
    ctx: &mut RequestCtx,
    body: &[u8],
) -> Result<UpstreamRequest, ApiError> {
    let parsed = parse_request(body)?;
    let stored = match parsed.previous_response_id.as_deref() {
        None => None,
        Some(id) => {
            let tenant = ctx
                .caller
                .as_ref()
                .map(|c| c.principal.tenant_id)
                .ok_or_else(super::internal_error)?;
            match gw.responses.get(tenant, id).await {
                Ok(Some(row)) => Some(row),
                Ok(None) => return Err(not_found(id)),
                Err(e) => return Err(store_unavailable(&e)),
            }
        }
    };
    let prior = stored.as_ref().map(|row| Prior {
        items: &row.input_items,
        response: &row.response,
    });
    let turn: ResponsesTurn =
        responses_to_upstream(parsed, prior, &gw.config, id_base(&ctx.request_id))?;
    let ResponsesTurn {
        upstream,
        echo,
        tools,
        encrypted_reasoning,
        store: _,
        conversation,
    } = turn;
    ctx.responses = Some(Box::new(Turn {
        echo,
        tools,
        encrypted_reasoning,
        created_at: u64::try_from(now_ms() / 1000).unwrap_or(0),
        conversation,
        object: None,
    }));
    Ok(upstream)
}

/// Answers `GET` / `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.
pub async fn stored(gw: &Gateway, session: &ServerSession, ctx: &RequestCtx) -> Reply {
    match read_or_delete(gw, session, ctx).await {
        Ok(body) => Reply::Json(Bytes::from(body)),
        Err(e) => Failure::refused_unread(e).into(),
    }
}

async fn read_or_delete(
    gw: &Gateway,
    session: &ServerSession,
    ctx: &RequestCtx,
) -> Result<Vec<u8>, ApiError> {
    let header = session.req_header();
    let Some((id, _)) = stored_response_path(header.uri.path()) else {
        return Err(ApiError::new(
            ErrorKind::RouteNotFound,
            format!("no route for {} {}", header.method, header.uri.path()),
        ));
    };
    let tenant = ctx
        .caller
        .as_ref()
        .map(|c| c.principal.tenant_id)
        .ok_or_else(super::internal_error)?;
    let store = &gw.responses;
    match ctx.route.api() {
        Some(ApiRoute::Response) if header.method == http::Method::DELETE => {
            match store.delete(tenant, id).await {
                Ok(true) => Ok(deleted(id)),
                Ok(false) => Err(not_found(id)),
                Err(e) => Err(store_unavailable(&e)),
            }
        }
        Some(ApiRoute::Response) => match store.get(tenant, id).await {
            Ok(Some(row)) => Ok(row.response.as_bytes().to_vec()),
            Ok(None) => Err(not_found(id)),
            Err(e) => Err(store_unavailable(&e)),
        },
        Some(ApiRoute::ResponseInputItems) => {
            let query = ListQuery::parse(header.uri.query().unwrap_or(""))?;
            match store.get(tenant, id).await {
                Ok(Some(row)) => list_input_items(&row.input_items, &query).map_err(|e| {
                    log::error!("stored response {id}: unreadable input items: {e}");
                    super::internal_error()
                }),
                Ok(None) => Err(not_found(id)),
                Err(e) => Err(store_unavailable(&e)),
            }
        }
        Some(ApiRoute::Chat | ApiRoute::Messages | ApiRoute::CountTokens | ApiRoute::Responses)
        | None => {
            log::error!("route {} reached the stored responses", ctx.route.as_str());
            Err(super::internal_error())
        }
    }
}

/// Queues the request's finished response for the store, if it is to be stored (see the
/// module docs): after its last byte went out, before the connection's next request.
pub fn write_finished(gw: &Gateway, ctx: &mut RequestCtx) {
    let Some(turn) = ctx.responses.take() else {
        return;
    };
    let Turn {
        conversation: Some(conversation),
        object: Some(object),
        ..
    } = *turn
    else {
        return;
    };
    if ctx.ending.outcome != Outcome::Ok {
        return;
    }
    let (Some(caller), Some(model)) = (
        ctx.caller.as_ref(),
        ctx.model.and_then(|m| gw.config.models.get(m)),
    ) else {
        return;
    };
    let id = response_id(&ctx.request_id);
    let response = match String::from_utf8(object) {
        Ok(response) => response,
        Err(e) => {
            log::error!("response {id} not stored: {e}");
            m().stored_responses.with_label_values(&["invalid"]).inc();
            return;
        }
    };
    let row = Arc::new(StoredResponse {
        id,
        tenant_id: caller.principal.tenant_id,
        key_id: caller.principal.key_id.clone(),
        model: model.slug.clone(),
        created_at: now_ms(),
        response,
        input_items: conversation.items,
    });
    let shared = &gw.responses;
    let size = usize::try_from(row.size()).unwrap_or(usize::MAX);
    let queued = shared
        .queued
        .fetch_add(size, Ordering::SeqCst)
        .saturating_add(size);
    if queued > shared.max_queued {
        shared.queued.fetch_sub(size, Ordering::SeqCst);
        m().stored_responses
            .with_label_values(&["queue_full"])
            .inc();
        log::warn!(
            "response {} not stored: {queued} bytes of responses are waiting for the store \
             (responses.max_queued_mib)",
            row.id
        );
        return;
    }
    shared
        .pending
        .lock()
        .rows
        .insert(row.id.clone(), Arc::clone(&row));
    shared.queue.push(row);
}

/// Deletes stored responses past the retention, then each tenant's oldest beyond its cap,
/// every `responses.cleanup_interval` (a background task of the billing runtime).
pub async fn cleanup(store: Arc<dyn Store>, config: Arc<crate::config::Config>) {
    let r = &config.responses;
    let mut tick = tokio::time::interval(r.cleanup_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retention_ms = i64::try_from(r.retention.as_millis()).unwrap_or(i64::MAX);
    loop {
        tick.tick().await;
        let before = now_ms().saturating_sub(retention_ms);
        match store.prune_responses(before, r.max_bytes_per_tenant).await {
            Ok(0) => {}
            Ok(n) => log::info!("stored responses: {n} deleted (retention, per-tenant cap)"),
            Err(e) => log::warn!("stored responses: cleanup failed: {e}"),
        }
    }
}
