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
//! - **Stored.** A stored response is written after the response's last byte has gone to the
//!   client ([`write_finished`], from `serve`), on the billing runtime; `serve` waits for it
//!   (bounded by [`WRITE_WAIT`]) before reading the connection's next request, so a client
//!   continuing the conversation on the same connection finds it. Responses waiting for the
//!   store are bounded in bytes (`responses.max_queued_mib`): beyond, a response is not stored
//!   (logged). A failed response is not stored.
//! - **Read and delete** name the caller's tenant in every query; they reach no upstream and
//!   bill nothing.

use super::{Failure, Gateway, Outcome, Reply, RequestCtx};
use crate::error::{ApiError, ErrorKind};
use crate::route::{stored_response_path, ApiRoute};
use crate::store::{now_ms, Store, StoredResponse};
use crate::translate::responses::request::{parse_request, responses_to_upstream, Prior};
use crate::translate::responses::stored::{deleted, list_input_items, normalize_items, ListQuery};
use crate::translate::responses::{
    id_base, response_id, Conversation, ResponsesContext, ResponsesTurn, ToolName,
};
use crate::translate::{ResponseContext, UpstreamRequest};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long `serve` waits for a finished response's write before reading the connection's
/// next request (the write goes on if it takes longer).
pub const WRITE_WAIT: Duration = Duration::from_secs(5);

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

/// The store of responses, and what is waiting for it.
pub struct StoredResponses {
    store: Arc<dyn Store>,
    /// Where writes run (the billing runtime).
    rt: tokio::runtime::Handle,
    /// Bytes of responses waiting for the store.
    queued: AtomicUsize,
    max_queued: usize,
}

impl StoredResponses {
    pub fn new(store: Arc<dyn Store>, rt: tokio::runtime::Handle, max_queued: usize) -> Self {
        StoredResponses {
            store,
            rt,
            queued: AtomicUsize::new(0),
            max_queued,
        }
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
            match gw.responses.store.get_response(tenant, id).await {
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
    let turn: ResponsesTurn = responses_to_upstream(parsed, prior, &gw.config)?;
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
    let store = &gw.responses.store;
    match ctx.route.api() {
        Some(ApiRoute::Response) if header.method == http::Method::DELETE => {
            match store.delete_response(tenant, id).await {
                Ok(true) => Ok(deleted(id)),
                Ok(false) => Err(not_found(id)),
                Err(e) => Err(store_unavailable(&e)),
            }
        }
        Some(ApiRoute::Response) => match store.get_response(tenant, id).await {
            Ok(Some(row)) => Ok(row.response.into_bytes()),
            Ok(None) => Err(not_found(id)),
            Err(e) => Err(store_unavailable(&e)),
        },
        Some(ApiRoute::ResponseInputItems) => {
            let query = ListQuery::parse(header.uri.query().unwrap_or(""))?;
            match store.get_response(tenant, id).await {
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

/// Starts writing the request's finished response to the store, if it is to be stored (see
/// the module docs); `serve` awaits the handle, bounded.
pub fn write_finished(gw: &Gateway, ctx: &mut RequestCtx) -> Option<tokio::task::JoinHandle<()>> {
    let turn = ctx.responses.take()?;
    let Turn {
        conversation: Some(conversation),
        object: Some(object),
        ..
    } = *turn
    else {
        return None;
    };
    if ctx.ending.outcome != Outcome::Ok {
        return None;
    }
    let caller = ctx.caller.as_ref()?;
    let model = gw.config.models.get(ctx.model?)?;
    let id = response_id(&ctx.request_id);
    let size = object.len() + conversation.items.len();
    let shared = &gw.responses;
    let queued = shared.queued.fetch_add(size, Ordering::SeqCst) + size;
    if queued > shared.max_queued {
        shared.queued.fetch_sub(size, Ordering::SeqCst);
        log::warn!(
            "response {id} not stored: {queued} bytes of responses are waiting for the store \
             (responses.max_queued_mib)"
        );
        return None;
    }
    let base = id_base(&ctx.request_id).to_owned();
    let principal = &caller.principal;
    let (tenant_id, key_id) = (principal.tenant_id, principal.key_id.clone());
    let slug = model.slug.clone();
    let shared = Arc::clone(shared);
    Some(shared.rt.clone().spawn(async move {
        let row = match normalize_items(&conversation.items, conversation.new_from, &base)
            .map_err(|e| e.to_string())
            .and_then(|items| {
                let items = String::from_utf8(items).map_err(|e| e.to_string())?;
                let response = String::from_utf8(object).map_err(|e| e.to_string())?;
                Ok((items, response))
            }) {
            Ok((input_items, response)) => StoredResponse {
                id,
                tenant_id,
                key_id,
                model: slug,
                created_at: now_ms(),
                response,
                input_items,
            },
            Err(e) => {
                log::error!("response {id} not stored: {e}");
                shared.queued.fetch_sub(size, Ordering::SeqCst);
                return;
            }
        };
        if let Err(e) = shared.store.put_responses(std::slice::from_ref(&row)).await {
            log::error!("response {} not stored: {e}", row.id);
        }
        shared.queued.fetch_sub(size, Ordering::SeqCst);
    }))
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
