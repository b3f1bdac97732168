//! The routes the gateway answers itself, without a key: the catalog (`/v1/models`,
//! `/v1/models/{id}`, `/v1/pricing`, `/v1/plans`, pre-rendered at start by
//! [`crate::catalog`]), `/health`, the account web page (`/account`, files compiled in by
//! [`crate::web`]; it asks the account routes for the data itself, with the key the person
//! signs in with), and the answers for paths and methods no route takes.

use super::{Failure, Gateway, Reply};
use crate::error::{ApiError, ErrorKind};
use crate::route::Route;
use bytes::Bytes;
use pingora::protocols::http::ServerSession;

/// Answers a route that is not an API route.
pub fn handle(gw: &Gateway, session: &ServerSession, route: Route) -> Reply {
    let header = session.req_header();
    let path = header.uri.path();
    match route {
        Route::Models => Reply::Json(gw.catalog.models.clone()),
        Route::Pricing => Reply::Json(gw.catalog.pricing.clone()),
        Route::Plans => Reply::Json(gw.catalog.plans.clone()),
        Route::Health => Reply::Json(Bytes::from_static(b"{\"status\":\"ok\"}")),
        Route::Model => {
            let id = path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default();
            match gw.catalog.model(id) {
                Some(body) => Reply::Json(body),
                None => Failure::refused(ApiError::new(
                    ErrorKind::ModelNotFound,
                    format!(
                        "model `{id}` does not exist; valid models are {}",
                        gw.config.slug_list()
                    ),
                ))
                .into(),
            }
        }
        Route::AccountPage => match crate::web::asset(path) {
            Some(asset) => Reply::Asset(asset),
            None => Failure::refused_unread(ApiError::new(
                ErrorKind::RouteNotFound,
                format!("no file {path}; the account page is /account"),
            ))
            .into(),
        },
        Route::NotFound | Route::Unrouted => Failure::refused_unread(ApiError::new(
            ErrorKind::RouteNotFound,
            format!("no route for {} {path}", header.method),
        ))
        .into(),
        Route::MethodNotAllowed => Failure::refused_unread(ApiError::new(
            ErrorKind::MethodNotAllowed,
            if path.trim_end_matches('/') == "/v1/topups" {
                // No key tops up, not even a managing one: money comes from the operator.
                format!(
                    "{} is not allowed on {path}: top-ups are made by the operator, never with \
                     an API key; this route only lists them",
                    header.method
                )
            } else {
                format!("{} is not allowed on {path}", header.method)
            },
        ))
        .into(),
        Route::Chat
        | Route::Messages
        | Route::CountTokens
        | Route::Responses
        | Route::Response
        | Route::ResponseInputItems
        | Route::Account
        | Route::Usage
        | Route::Keys
        | Route::Requests
        | Route::TopUps
        | Route::Webhooks
        | Route::Webhook => {
            // `serve` sends API and account routes to their handlers; reaching here is a bug,
            // answered as one.
            log::error!("route {} reached the local handler", route.as_str());
            Failure::new(super::Outcome::InternalError, super::internal_error()).into()
        }
    }
}
