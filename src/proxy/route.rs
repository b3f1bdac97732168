//! Which handler a request goes to, from its method and path.

use crate::error::ClientFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    #[default]
    Unrouted,
    Chat,
    Messages,
    CountTokens,
    Models,
    Model,
    Pricing,
    Plans,
    Health,
    NotFound,
    MethodNotAllowed,
}

impl Route {
    /// Number of variants (for tables indexed by `route as usize`).
    pub const COUNT: usize = 11;

    /// Stable label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Unrouted => "unrouted",
            Route::Chat => "chat",
            Route::Messages => "messages",
            Route::CountTokens => "count_tokens",
            Route::Models => "models",
            Route::Model => "model",
            Route::Pricing => "pricing",
            Route::Plans => "plans",
            Route::Health => "health",
            Route::NotFound => "not_found",
            Route::MethodNotAllowed => "method_not_allowed",
        }
    }

    /// Routes whose requests carry a key and are metered.
    pub fn is_api(self) -> bool {
        matches!(self, Route::Chat | Route::Messages | Route::CountTokens)
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
    let want = |ok: bool, r: Route| if ok { r } else { Route::MethodNotAllowed };
    match path {
        "/v1/chat/completions" => want(post, Route::Chat),
        "/v1/messages" => want(post, Route::Messages),
        "/v1/messages/count_tokens" => want(post, Route::CountTokens),
        "/v1/models" => want(get, Route::Models),
        "/v1/pricing" => want(get, Route::Pricing),
        "/v1/plans" => want(get, Route::Plans),
        "/health" | "/healthz" => want(get, Route::Health),
        p if p.starts_with("/v1/models/") && p.len() > "/v1/models/".len() => {
            want(get, Route::Model)
        }
        _ => Route::NotFound,
    }
}

/// The error shape to use for a path, when the route does not decide it.
pub fn format_for_path(path: &str) -> ClientFormat {
    if path.starts_with("/v1/messages") {
        ClientFormat::Messages
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
        assert_eq!(route(&Method::GET, "/api/hello"), Route::NotFound);
        assert_eq!(route(&Method::GET, "/"), Route::NotFound);
    }
}
