//! The one table of endpoints: which handler a request goes to, from its method and path.
//!
//! A new endpoint is a variant here (its label comes from its name), an arm in [`route`], and
//! its handler in `src/proxy/` (the compiler then points at every `match` that must say what
//! the new route does). Tables indexed by route are sized by [`Route::COUNT`], derived from the
//! variants, so they grow with the enum.
//!
//! Routes fall in three kinds, each sorted by one exhaustive `match`: the **API** routes
//! ([`Route::api`]: a key, a body, translated, admitted and metered), the **account** routes
//! ([`Route::account`]: a key, never metered or billed — the tenant's own balance, usage, keys
//! and history, read-only but for a managing key's writes on its keys) and the rest, which the gateway answers without a key (the catalog,
//! health, the account web page, and 404/405).

use crate::error::ClientFormat;
use strum::{EnumCount, IntoStaticStr};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, EnumCount, IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum Route {
    #[default]
    Unrouted,
    Chat,
    Messages,
    CountTokens,
    /// `POST /v1/responses`: a Responses API request.
    Responses,
    /// `GET` / `DELETE /v1/responses/{id}`: a stored response.
    Response,
    /// `GET /v1/responses/{id}/input_items`: a stored response's input items.
    ResponseInputItems,
    Models,
    Model,
    Pricing,
    Plans,
    Health,
    /// `GET /v1/account`: the caller's tenant, balance, limits and spend.
    Account,
    /// `GET /v1/usage`: requests, tokens and charges over a period, grouped.
    Usage,
    /// `GET /v1/keys`: the tenant's keys, with their spend.
    Keys,
    /// `GET /v1/requests`: the tenant's requests, newest first.
    Requests,
    /// `GET /v1/topups`: the tenant's top-ups, newest first.
    TopUps,
    /// `GET` / `POST /v1/webhooks`: the tenant's webhook endpoints, listed or registered
    /// (a key with the `manage` scope).
    Webhooks,
    /// `DELETE /v1/webhooks/{id}`: one of them removed.
    Webhook,
    /// `GET /account` and its assets: the web page that shows the account routes.
    AccountPage,
    NotFound,
    MethodNotAllowed,
}

impl Route {
    /// Stable label for metrics and logs: the variant's name in snake case.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Number of routes, derived from the variants.
    pub const COUNT: usize = <Route as EnumCount>::COUNT;

    /// Index into tables of [`Route::COUNT`] entries.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The API route this is (a request with a key, metered), or `None` for the routes the
    /// gateway answers itself. The one place that sorts routes into the two.
    pub fn api(self) -> Option<ApiRoute> {
        match self {
            Route::Chat => Some(ApiRoute::Chat),
            Route::Messages => Some(ApiRoute::Messages),
            Route::CountTokens => Some(ApiRoute::CountTokens),
            Route::Responses => Some(ApiRoute::Responses),
            Route::Response => Some(ApiRoute::Response),
            Route::ResponseInputItems => Some(ApiRoute::ResponseInputItems),
            Route::Unrouted
            | Route::Models
            | Route::Model
            | Route::Pricing
            | Route::Plans
            | Route::Health
            | Route::Account
            | Route::Usage
            | Route::Keys
            | Route::Requests
            | Route::TopUps
            | Route::Webhooks
            | Route::Webhook
            | Route::AccountPage
            | Route::NotFound
            | Route::MethodNotAllowed => None,
        }
    }

    /// The account route this is (a key, not metered), or `None`.
    pub fn account(self) -> Option<AccountRoute> {
        match self {
            Route::Account => Some(AccountRoute::Account),
            Route::Usage => Some(AccountRoute::Usage),
            Route::Keys => Some(AccountRoute::Keys),
            Route::Requests => Some(AccountRoute::Requests),
            Route::TopUps => Some(AccountRoute::TopUps),
            Route::Unrouted
            | Route::Chat
            | Route::Messages
            | Route::CountTokens
            | Route::Responses
            | Route::Response
            | Route::ResponseInputItems
            | Route::Models
            | Route::Model
            | Route::Pricing
            | Route::Plans
            | Route::Health
            | Route::Webhooks
            | Route::Webhook
            | Route::AccountPage
            | Route::NotFound
            | Route::MethodNotAllowed => None,
        }
    }

    /// Routes whose requests carry a key and are metered.
    pub fn is_api(self) -> bool {
        self.api().is_some()
    }

    /// The format of a request on this route: its body, its errors and its stream. Routes that
    /// belong to no format answer in the one their path suggests ([`format_for_path`]).
    pub fn format(self, path: &str) -> ClientFormat {
        match (self.api(), self.account()) {
            (Some(api), _) => api.format(),
            (None, Some(account)) => account.format(),
            (None, None) => format_for_path(path),
        }
    }
}

/// The account routes: the caller's key names the tenant whose money they show; never metered
/// or billed. Read-only, but for a managing key's writes on `/v1/keys` (`POST`, `PATCH`,
/// `DELETE`, `…/rotate`: see [`key_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountRoute {
    Account,
    Usage,
    Keys,
    Requests,
    TopUps,
}

impl AccountRoute {
    /// They belong to no client format: errors come in the chat shape, like other `/v1`
    /// routes of no format.
    pub fn format(self) -> ClientFormat {
        match self {
            AccountRoute::Account
            | AccountRoute::Usage
            | AccountRoute::Keys
            | AccountRoute::Requests
            | AccountRoute::TopUps => ClientFormat::Chat,
        }
    }
}

/// The routes of the API: requests with a key, translated, admitted and metered — except the
/// two that read or delete a stored response (a key, no upstream, nothing billed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiRoute {
    Chat,
    Messages,
    CountTokens,
    Responses,
    Response,
    ResponseInputItems,
}

impl ApiRoute {
    /// The client format the route speaks.
    pub fn format(self) -> ClientFormat {
        match self {
            ApiRoute::Chat => ClientFormat::Chat,
            ApiRoute::Messages | ApiRoute::CountTokens => ClientFormat::Messages,
            ApiRoute::Responses | ApiRoute::Response | ApiRoute::ResponseInputItems => {
                ClientFormat::Responses
            }
        }
    }
}

/// Routes a request. The query string is ignored (`?beta=true` is accepted everywhere).
pub fn route(method: &http::Method, path: &str) -> Route {
    let path = path.split('?').next().unwrap_or(path);
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    let post = method == http::Method::POST;
    let get = method == http::Method::GET || method == http::Method::HEAD;
    let delete = method == http::Method::DELETE;
    let patch = method == http::Method::PATCH;
    let want = |ok: bool, r: Route| if ok { r } else { Route::MethodNotAllowed };
    match path {
        "/v1/chat/completions" => want(post, Route::Chat),
        "/v1/messages" => want(post, Route::Messages),
        "/v1/messages/count_tokens" => want(post, Route::CountTokens),
        "/v1/responses" => want(post, Route::Responses),
        p if p.starts_with("/v1/responses/") => match stored_response_path(p) {
            Some((_, false)) => want(get || delete, Route::Response),
            Some((_, true)) => want(get, Route::ResponseInputItems),
            None => Route::NotFound,
        },
        "/v1/models" => want(get, Route::Models),
        "/v1/pricing" => want(get, Route::Pricing),
        "/v1/plans" => want(get, Route::Plans),
        "/health" | "/healthz" => want(get, Route::Health),
        "/v1/account" => want(get, Route::Account),
        "/v1/usage" => want(get, Route::Usage),
        "/v1/keys" => want(get || post, Route::Keys),
        p if p.starts_with("/v1/keys/") => match key_path(p) {
            Some((_, false)) => want(patch || delete, Route::Keys),
            Some((_, true)) => want(post, Route::Keys),
            None => Route::NotFound,
        },
        "/v1/requests" => want(get, Route::Requests),
        "/v1/topups" => want(get, Route::TopUps),
        "/v1/webhooks" => want(get || post, Route::Webhooks),
        p if webhook_path(p).is_some() => want(delete, Route::Webhook),
        "/account" => want(get, Route::AccountPage),
        p if p.starts_with("/account/") => want(get, Route::AccountPage),
        p if p.starts_with("/v1/models/") && p.len() > "/v1/models/".len() => {
            want(get, Route::Model)
        }
        _ => Route::NotFound,
    }
}

/// `/v1/responses/{id}` → `(id, false)`, `/v1/responses/{id}/input_items` → `(id, true)`; the
/// query string and one trailing slash are not part of it. An id is one non-empty path segment.
pub fn stored_response_path(path: &str) -> Option<(&str, bool)> {
    let path = path.split('?').next().unwrap_or(path);
    let rest = path.strip_prefix("/v1/responses/")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (id, items) = match rest.split_once('/') {
        Some((id, "input_items")) => (id, true),
        Some(_) => return None,
        None => (rest, false),
    };
    (!id.is_empty()).then_some((id, items))
}

/// `/v1/keys/{id}` → `(id, false)`, `/v1/keys/{id}/rotate` → `(id, true)` (a tenant's
/// self-service on its keys); the query string and one trailing slash are not part of it.
pub fn key_path(path: &str) -> Option<(&str, bool)> {
    let path = path.split('?').next().unwrap_or(path);
    let rest = path.strip_prefix("/v1/keys/")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (id, rotate) = match rest.split_once('/') {
        Some((id, "rotate")) => (id, true),
        Some(_) => return None,
        None => (rest, false),
    };
    (!id.is_empty()).then_some((id, rotate))
}

/// `/v1/webhooks/{id}` → the id (one non-empty path segment; the query string and one
/// trailing slash are not part of it).
pub fn webhook_path(path: &str) -> Option<&str> {
    let path = path.split('?').next().unwrap_or(path);
    let rest = path.strip_prefix("/v1/webhooks/")?;
    let id = rest.strip_suffix('/').unwrap_or(rest);
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The error shape to use for a path, when the route does not decide it.
pub fn format_for_path(path: &str) -> ClientFormat {
    if path.starts_with("/v1/messages") {
        ClientFormat::Messages
    } else if path.starts_with("/v1/responses") {
        ClientFormat::Responses
    } else {
        ClientFormat::Chat
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn routes() {
        assert_eq!(route(&Method::POST, "/v1/chat/completions"), Route::Chat);
        assert_eq!(
            route(&Method::POST, "/v1/messages?beta=true"),
            Route::Messages
        );
        assert_eq!(
            route(&Method::POST, "/v1/messages/count_tokens?beta=true"),
            Route::CountTokens
        );
        assert_eq!(route(&Method::GET, "/v1/models?limit=1000"), Route::Models);
        assert_eq!(route(&Method::GET, "/v1/models/apu"), Route::Model);
        assert_eq!(route(&Method::GET, "/v1/pricing/"), Route::Pricing);
        assert_eq!(route(&Method::HEAD, "/v1/plans"), Route::Plans);
        assert_eq!(
            route(&Method::GET, "/v1/chat/completions"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(&Method::POST, "/v1/models"), Route::MethodNotAllowed);
        assert_eq!(route(&Method::POST, "/v1/responses/"), Route::Responses);
        assert_eq!(
            route(&Method::GET, "/v1/responses"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(&Method::GET, "/v1/responses/resp_1"), Route::Response);
        assert_eq!(
            route(&Method::DELETE, "/v1/responses/resp_1"),
            Route::Response
        );
        assert_eq!(
            route(&Method::POST, "/v1/responses/resp_1"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(&Method::GET, "/v1/responses/resp_1/input_items?limit=5"),
            Route::ResponseInputItems
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/responses/resp_1/input_items"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(&Method::POST, "/v1/responses/resp_1/cancel"),
            Route::NotFound
        );
        assert_eq!(route(&Method::GET, "/v1/webhooks/"), Route::Webhooks);
        assert_eq!(
            route(&Method::GET, "/v1/webhooks/wh_1"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/webhooks"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/webhooks/wh_1/x"),
            Route::NotFound
        );
        assert_eq!(route(&Method::GET, "/api/hello"), Route::NotFound);
        assert_eq!(route(&Method::GET, "/"), Route::NotFound);
    }

    /// A request that reaches each route. Exhaustive on purpose: a new route does not compile
    /// until it has one here, and then this test fails until [`route`] sends it there.
    fn sample(r: Route) -> Option<(Method, &'static str)> {
        match r {
            Route::Chat => Some((Method::POST, "/v1/chat/completions")),
            Route::Messages => Some((Method::POST, "/v1/messages")),
            Route::CountTokens => Some((Method::POST, "/v1/messages/count_tokens")),
            Route::Responses => Some((Method::POST, "/v1/responses")),
            Route::Response => Some((Method::GET, "/v1/responses/resp_0123")),
            Route::ResponseInputItems => Some((Method::GET, "/v1/responses/resp_0123/input_items")),
            Route::Models => Some((Method::GET, "/v1/models")),
            Route::Model => Some((Method::GET, "/v1/models/colibri")),
            Route::Pricing => Some((Method::GET, "/v1/pricing")),
            Route::Plans => Some((Method::GET, "/v1/plans")),
            Route::Health => Some((Method::GET, "/health")),
            Route::Account => Some((Method::GET, "/v1/account")),
            Route::Usage => Some((Method::GET, "/v1/usage?group_by=day")),
            Route::Keys => Some((Method::GET, "/v1/keys")),
            Route::Requests => Some((Method::GET, "/v1/requests?limit=5")),
            Route::TopUps => Some((Method::GET, "/v1/topups")),
            Route::Webhooks => Some((Method::POST, "/v1/webhooks")),
            Route::Webhook => Some((Method::DELETE, "/v1/webhooks/wh_0123")),
            Route::AccountPage => Some((Method::GET, "/account/app.js")),
            Route::NotFound => Some((Method::GET, "/nowhere")),
            Route::MethodNotAllowed => Some((Method::DELETE, "/v1/models")),
            // Only before routing.
            Route::Unrouted => None,
        }
    }

    #[test]
    fn every_route_is_reachable() {
        use strum::IntoEnumIterator;
        for r in Route::iter() {
            if let Some((method, path)) = sample(r) {
                assert_eq!(route(&method, path), r, "{method} {path}");
            }
        }
    }

    #[test]
    fn stored_response_paths() {
        assert_eq!(
            stored_response_path("/v1/responses/resp_1"),
            Some(("resp_1", false))
        );
        assert_eq!(
            stored_response_path("/v1/responses/resp_1/"),
            Some(("resp_1", false))
        );
        assert_eq!(
            stored_response_path("/v1/responses/resp_1/input_items?limit=2"),
            Some(("resp_1", true))
        );
        assert_eq!(stored_response_path("/v1/responses/"), None);
        assert_eq!(stored_response_path("/v1/responses/a/b"), None);
        assert_eq!(
            format_for_path("/v1/responses/x/cancel"),
            ClientFormat::Responses
        );
        assert_eq!(
            Route::ResponseInputItems.format("/x"),
            ClientFormat::Responses
        );
    }

    #[test]
    fn labels_are_the_variant_names() {
        assert_eq!(Route::CountTokens.as_str(), "count_tokens");
        assert_eq!(Route::MethodNotAllowed.as_str(), "method_not_allowed");
        assert_eq!(Route::Unrouted.as_str(), "unrouted");
        assert_eq!(Route::COUNT, Route::MethodNotAllowed.index() + 1);
    }

    #[test]
    fn account_routes_are_read_with_a_key_and_never_metered() {
        use strum::IntoEnumIterator;
        for r in Route::iter() {
            assert!(
                !(r.api().is_some() && r.account().is_some()),
                "{r:?} is both an API and an account route"
            );
        }
        assert_eq!(Route::Usage.account(), Some(AccountRoute::Usage));
        assert!(!Route::Usage.is_api());
        assert_eq!(Route::TopUps.format("/v1/topups"), ClientFormat::Chat);
        assert_eq!(route(&Method::POST, "/v1/account"), Route::MethodNotAllowed);
        assert_eq!(route(&Method::HEAD, "/v1/usage"), Route::Usage);
        assert_eq!(route(&Method::GET, "/account/"), Route::AccountPage);
        assert_eq!(route(&Method::GET, "/account"), Route::AccountPage);
        assert_eq!(route(&Method::GET, "/accounts"), Route::NotFound);
        assert_eq!(Route::AccountPage.account(), None);
    }

    #[test]
    fn a_tenant_writes_its_keys_on_the_keys_route() {
        assert_eq!(route(&Method::POST, "/v1/keys"), Route::Keys);
        assert_eq!(route(&Method::PATCH, "/v1/keys/key_1"), Route::Keys);
        assert_eq!(route(&Method::DELETE, "/v1/keys/key_1/"), Route::Keys);
        assert_eq!(route(&Method::POST, "/v1/keys/key_1/rotate"), Route::Keys);
        assert_eq!(
            route(&Method::GET, "/v1/keys/key_1"),
            Route::MethodNotAllowed
        );
        assert_eq!(
            route(&Method::POST, "/v1/keys/key_1"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(&Method::DELETE, "/v1/keys"), Route::MethodNotAllowed);
        assert_eq!(route(&Method::POST, "/v1/keys/key_1/x"), Route::NotFound);
        assert_eq!(route(&Method::POST, "/v1/topups"), Route::MethodNotAllowed);
        assert_eq!(key_path("/v1/keys/key_1/rotate?x=1"), Some(("key_1", true)));
        assert_eq!(key_path("/v1/keys/"), None);
    }
}
