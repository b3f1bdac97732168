//! The admin API's key routes: create with settings, change them, rotate, revoke (see the
//! table in the module above).

use super::{error, read_json, result, AdminApp};
use crate::governance::models::Catalog;
use crate::ops::{self, KeyChange, Output};
use pingora::protocols::http::ServerSession;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rotate {
    /// `24h`, `90m`, `7d`; default none (the old key stops at once).
    #[serde(default)]
    grace: Option<String>,
}

impl AdminApp {
    /// `POST /admin/keys`: `{"tenant", …settings}`.
    pub(super) async fn create_key(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let mut body = match read_json::<serde_json::Map<String, serde_json::Value>>(session).await
        {
            Ok(b) => b,
            Err(e) => return error(400, &e),
        };
        let Some(serde_json::Value::String(tenant)) = body.remove("tenant") else {
            return error(400, "`tenant` (the tenant's name) is required");
        };
        let change: KeyChange = match serde_json::from_value(body.into()) {
            Ok(c) => c,
            Err(e) => return error(400, &format!("invalid key settings: {e}")),
        };
        let catalog = Catalog::of(&self.config);
        result(
            ops::create_key(self.store.as_ref(), &catalog, &tenant, &change)
                .await
                .map(|r| Output::of(&r)),
            true,
        )
    }

    /// `/admin/keys/{rest}`: `PATCH {id}`, `POST {id}/rotate`, `POST {id}/revoke`.
    pub(super) async fn key_route(
        &self,
        method: &str,
        rest: &str,
        session: &mut ServerSession,
    ) -> http::Response<Vec<u8>> {
        let store = self.store.as_ref();
        match (method, rest.split_once('/')) {
            ("PATCH", None) => match read_json::<KeyChange>(session).await {
                Ok(change) => {
                    let catalog = Catalog::of(&self.config);
                    result(
                        ops::update_key(store, &catalog, rest, &change)
                            .await
                            .map(|r| Output::of(&r)),
                        false,
                    )
                }
                Err(e) => error(400, &e),
            },
            ("POST", Some((id, "rotate"))) => match read_json::<Rotate>(session).await {
                Ok(r) => {
                    let grace = match r.grace.as_deref().map(ops::parse_grace).transpose() {
                        Ok(g) => g.unwrap_or(0),
                        Err(e) => return error(400, e.message()),
                    };
                    result(
                        ops::rotate_key(store, id, grace)
                            .await
                            .map(|r| Output::of(&r)),
                        true,
                    )
                }
                Err(e) => error(400, &e),
            },
            ("POST", Some((id, "revoke"))) => result(
                ops::revoke_key(store, id).await.map(|r| Output::of(&r)),
                false,
            ),
            _ => error(404, "no such admin route"),
        }
    }
}
