//! API-key authentication from an in-memory snapshot.
//!
//! The request path never touches the store: it hashes the presented secret (SHA-256; keys are
//! 256-bit random strings, so a fast hash is the right tool — nothing to brute-force) and looks
//! the digest up in a `HashMap` held in an [`ArcSwap`]. A background task
//! ([`KeySnapshot::refresh`]) polls the store's keys version and swaps in a new map when any
//! replica created or revoked a key, so a revocation applies within one refresh interval
//! (500 ms by default; the configuration refuses anything over 2 s).
//!
//! Timing: the lookup is by digest, so its timing depends on the digest of the presented key,
//! not on any stored secret; the digests are then compared in constant time.

use crate::config::Config;
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::governance::models::{AllowedModels, Catalog, ModelList};
use crate::keys::{constant_time_eq, hash_secret};
use crate::metrics::TenantMeters;
use crate::ratelimit::{RateCounters, Subject, Windows};
use crate::store::{
    ActiveKey, KeyLimits, KeyRules, StoreResult, TenantId, TenantRules, TenantStore,
};
use crate::translate::wire;
use arc_swap::ArcSwap;
use http::HeaderMap;
use std::collections::HashMap;
use std::sync::Arc;

/// Who is calling: the key, its tenant, and what governs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub key_id: String,
    pub tenant_id: TenantId,
    pub tenant_name: String,
    pub limits: KeyLimits,
    /// The tenant's share of a saturated model (weighted fair queueing; default 1).
    pub weight: std::num::NonZeroU32,
    /// The key's requests run only on capacity interactive traffic leaves free.
    pub batch: bool,
    /// The models it may use, compiled against the configured ones (`None`: every model).
    pub models: Option<AllowedModels>,
    /// Its cap, expiry, switch and scope, as stored.
    pub rules: KeyRules,
    pub tenant_rules: TenantRules,
}

impl Principal {
    /// Why the key cannot be used at `now`, if it cannot: switched off, or expired.
    pub fn unusable(&self, now: i64) -> Option<String> {
        if self.rules.disabled {
            return Some("this API key is disabled".into());
        }
        match self.rules.expires_at {
            Some(at) if at <= now => Some(format!(
                "this API key expired at {}",
                chrono::DateTime::from_timestamp_millis(at)
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default()
            )),
            _ => None,
        }
    }
}

/// An authenticated caller, as the key snapshot holds it: who it is, and the state kept per
/// key that the request path needs without a lookup — its rate-limit windows (carried over when
/// the snapshot is rebuilt) and its tenant's resolved billing counters.
#[derive(Debug)]
pub struct Caller {
    pub principal: Principal,
    pub windows: Windows,
    pub meters: TenantMeters,
    /// Its caps for the current periods, computed once a period (see `billing::caps`).
    pub caps: crate::billing::caps::CapCache,
    secret_hash: [u8; 32],
}

#[derive(Default)]
struct Snapshot {
    version: i64,
    keys: HashMap<[u8; 32], Arc<Caller>>,
}

/// The in-memory key table. Cheap to read from any thread.
pub struct KeySnapshot {
    current: ArcSwap<Snapshot>,
    /// Configured models, to size each principal's metric table.
    models: usize,
    /// The configured slugs and alias patterns (with their slugs), that keys' model lists are
    /// compiled against.
    slugs: Vec<String>,
    aliases: Vec<(String, String)>,
}

impl Default for KeySnapshot {
    fn default() -> Self {
        KeySnapshot::new(0)
    }
}

impl KeySnapshot {
    pub fn new(models: usize) -> Self {
        KeySnapshot {
            current: ArcSwap::from_pointee(Snapshot {
                version: -1,
                keys: HashMap::new(),
            }),
            models,
            slugs: Vec::new(),
            aliases: Vec::new(),
        }
    }

    /// The table of a gateway serving `config`'s models.
    pub fn for_config(config: &Config) -> Self {
        let catalog = Catalog::of(config);
        let mut s = KeySnapshot::new(config.models.len());
        s.slugs = catalog.slugs().iter().map(|x| (*x).to_owned()).collect();
        s.aliases = catalog
            .aliases()
            .iter()
            .map(|(p, m)| ((*p).to_owned(), (*m).to_owned()))
            .collect();
        s
    }

    fn catalog(&self) -> Catalog<'_> {
        Catalog::new(
            self.slugs.iter().map(String::as_str).collect(),
            self.aliases
                .iter()
                .map(|(p, m)| (p.as_str(), m.as_str()))
                .collect(),
        )
    }

    /// A stored model list compiled against the configured models.
    fn allowed(&self, key_id: &str, models: Option<&str>) -> Option<AllowedModels> {
        let text = models?;
        match ModelList::parse(text) {
            Ok(list) => Some(list.compile(&self.catalog())),
            Err(e) => {
                // Stored lists were checked when written; refuse every model rather than allow
                // every one if it no longer reads.
                log::error!("key {key_id}: its model list \"{text}\" does not read: {e}");
                Some(ModelList::nothing().compile(&self.catalog()))
            }
        }
    }

    /// Replaces the table (used by [`refresh`](Self::refresh) and by tests). Rate-limit counts
    /// of keys and tenants that stay are kept: creating or revoking one key must not reset the
    /// windows of all the others.
    pub fn install(&self, version: i64, keys: Vec<ActiveKey>) {
        let old = self.current.load();
        let mut key_rates: HashMap<&str, Arc<RateCounters>> = HashMap::new();
        let mut tenant_rates: HashMap<TenantId, Arc<RateCounters>> = HashMap::new();
        for c in old.keys.values() {
            key_rates.insert(c.principal.key_id.as_str(), c.windows.key.clone());
            tenant_rates.insert(c.principal.tenant_id, c.windows.tenant.clone());
        }
        let keys = keys
            .into_iter()
            .map(|k| {
                let key = key_rates
                    .get(k.key_id.as_str())
                    .cloned()
                    .unwrap_or_else(|| Arc::new(RateCounters::new(Subject::Key(k.key_id.clone()))));
                let tenant = tenant_rates
                    .entry(k.tenant_id)
                    .or_insert_with(|| Arc::new(RateCounters::new(Subject::Tenant(k.tenant_id))))
                    .clone();
                (
                    k.secret_hash,
                    Arc::new(Caller {
                        principal: Principal {
                            models: self.allowed(&k.key_id, k.rules.models.as_deref()),
                            weight: std::num::NonZeroU32::new(k.tenant_rules.weight)
                                .unwrap_or(std::num::NonZeroU32::MIN),
                            batch: k.rules.batch,
                            key_id: k.key_id,
                            tenant_id: k.tenant_id,
                            tenant_name: k.tenant_name,
                            limits: k.limits,
                            rules: k.rules,
                            tenant_rules: k.tenant_rules,
                        },
                        windows: Windows { key, tenant },
                        caps: Default::default(),
                        meters: TenantMeters::new(self.models),
                        secret_hash: k.secret_hash,
                    }),
                )
            })
            .collect();
        self.current.store(Arc::new(Snapshot { version, keys }));
    }

    /// Reloads from the store if its keys version moved; returns whether it did.
    pub async fn refresh(&self, store: &(impl TenantStore + ?Sized)) -> StoreResult<bool> {
        let version = store.keys_version().await?;
        if version == self.current.load().version {
            return Ok(false);
        }
        let (version, keys) = store.active_keys().await?;
        self.install(version, keys);
        Ok(true)
    }

    pub fn len(&self) -> usize {
        self.current.load().keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The caller a secret belongs to, if it is an active key.
    pub fn lookup(&self, secret: &str) -> Option<Arc<Caller>> {
        let digest = hash_secret(secret);
        let snap = self.current.load();
        let p = snap.keys.get(&digest)?;
        constant_time_eq(&p.secret_hash, &digest).then(|| p.clone())
    }

    /// Authenticates a request's headers for an endpoint of `format`.
    ///
    /// Every format takes `Authorization: Bearer`. A format whose SDKs send `x-api-key`
    /// ([`crate::translate::Wire::x_api_key`]: the messages format) also takes that, and Claude
    /// Code sends both when both of its variables are set — e.g. a vendor key in
    /// `ANTHROPIC_API_KEY` (as `x-api-key`) and the gateway key in `ANTHROPIC_AUTH_TOKEN` (as
    /// `Bearer`): the request is accepted if either names an active key, the bearer token first,
    /// and refused only if none does. Both candidates are always looked up (digest lookup,
    /// constant-time comparison), so the timing does not say which one matched. A header sent twice
    /// is refused.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        format: ClientFormat,
    ) -> Result<Arc<Caller>, ApiError> {
        let deny = |m: &str| ApiError::new(ErrorKind::Authentication, m);
        let (bearer, malformed_bearer) = match bearer_token(headers) {
            Bearer::Token(t) => (Some(t), false),
            Bearer::Absent => (None, false),
            Bearer::Malformed => (None, true),
            Bearer::Repeated => return Err(deny("send one Authorization header, not several")),
        };
        // Whether the format's SDKs send `x-api-key`.
        let reads_x_api_key = wire(format).x_api_key;
        let mut api_key: Option<&str> = None;
        if reads_x_api_key {
            let mut values = headers.get_all("x-api-key").iter();
            if let Some(v) = values.next() {
                if values.next().is_some() {
                    return Err(deny("send one x-api-key header, not several"));
                }
                api_key = v.to_str().ok().map(str::trim).filter(|k| !k.is_empty());
            }
        }
        let by_bearer = bearer.and_then(|s| self.lookup(s));
        let by_api_key = api_key.and_then(|s| self.lookup(s));
        let found = [by_bearer, by_api_key];
        let mut unusable = None;
        // Only a key with an expiry reads the clock.
        let now = || crate::store::now_ms();
        for caller in found.into_iter().flatten() {
            let why = match caller.principal.rules.expires_at {
                None if !caller.principal.rules.disabled => None,
                _ => caller.principal.unusable(now()),
            };
            match why {
                None => return Ok(caller),
                Some(why) => unusable = unusable.or(Some(why)),
            }
        }
        if let Some(why) = unusable {
            return Err(deny(&why));
        }
        Err(deny(match (bearer.is_some() || api_key.is_some(), reads_x_api_key) {
            (true, _) => "invalid or revoked API key",
            (false, false) if malformed_bearer => {
                "the Authorization header must be `Bearer <API key>`"
            }
            (false, false) => "missing API key: send `Authorization: Bearer <API key>`",
            (false, true) => {
                "missing API key: send `x-api-key: <API key>` or `Authorization: Bearer <API key>`"
            }
        }))
    }
}

/// What a request's `Authorization` header says, read the same way on every listener.
pub enum Bearer<'h> {
    /// `Bearer <token>` (scheme in any case, surrounding whitespace ignored).
    Token(&'h str),
    Absent,
    /// Another scheme, no token, or not text.
    Malformed,
    /// The header sent more than once: refused, whatever the values.
    Repeated,
}

/// Reads the bearer token of `headers` (see [`Bearer`]).
pub fn bearer_token(headers: &HeaderMap) -> Bearer<'_> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(v) = values.next() else {
        return Bearer::Absent;
    };
    if values.next().is_some() {
        return Bearer::Repeated;
    }
    let Ok(v) = v.to_str() else {
        return Bearer::Malformed;
    };
    let (scheme, token) = v.trim().split_once(' ').unwrap_or((v.trim(), ""));
    let token = token.trim();
    if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() {
        Bearer::Token(token)
    } else {
        Bearer::Malformed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn snapshot() -> KeySnapshot {
        let s = KeySnapshot::default();
        let key = |secret: &str, id: &str, tenant: i64| ActiveKey {
            secret_hash: hash_secret(secret),
            key_id: id.into(),
            tenant_id: tenant,
            tenant_name: format!("t{tenant}"),
            limits: KeyLimits::default(),
            rules: Default::default(),
            tenant_rules: Default::default(),
        };
        s.install(
            1,
            vec![
                key("sk-qp-good", "key_1", 1),
                key("sk-qp-other", "key_2", 2),
            ],
        );
        s
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn bearer_and_x_api_key() {
        let s = snapshot();
        let p = s
            .authenticate(
                &headers(&[("authorization", "Bearer sk-qp-good")]),
                ClientFormat::Chat,
            )
            .unwrap();
        assert_eq!(p.principal.key_id, "key_1");
        let p = s
            .authenticate(
                &headers(&[("x-api-key", "sk-qp-other")]),
                ClientFormat::Messages,
            )
            .unwrap();
        assert_eq!(p.principal.tenant_id, 2);
        // Chat does not take x-api-key.
        assert!(s
            .authenticate(
                &headers(&[("x-api-key", "sk-qp-other")]),
                ClientFormat::Chat
            )
            .is_err());
    }

    #[test]
    fn either_header_may_carry_the_key() {
        let s = snapshot();
        let key = |h: &[(&str, &str)], f| {
            s.authenticate(&headers(h), f)
                .map(|p| p.principal.key_id.clone())
        };
        let m = ClientFormat::Messages;
        // Both the same key.
        let same = [
            ("authorization", "Bearer sk-qp-good"),
            ("x-api-key", "sk-qp-good"),
        ];
        assert_eq!(key(&same, m).unwrap(), "key_1");
        // Claude Code with a vendor key in x-api-key and the gateway key as bearer.
        let vendor_x = [
            ("authorization", "Bearer sk-qp-good"),
            ("x-api-key", "sk-ant-api03-vendor"),
        ];
        assert_eq!(key(&vendor_x, m).unwrap(), "key_1");
        // …and the other way round.
        let vendor_bearer = [
            ("authorization", "Bearer sk-ant-oat01-vendor"),
            ("x-api-key", "sk-qp-other"),
        ];
        assert_eq!(key(&vendor_bearer, m).unwrap(), "key_2");
        // Two valid, different keys: the bearer token wins.
        let two = [
            ("authorization", "Bearer sk-qp-other"),
            ("x-api-key", "sk-qp-good"),
        ];
        assert_eq!(key(&two, m).unwrap(), "key_2");
        // A non-bearer Authorization does not hide a valid x-api-key.
        let basic = [("authorization", "Basic abc"), ("x-api-key", "sk-qp-good")];
        assert_eq!(key(&basic, m).unwrap(), "key_1");
        let empty_x = [("authorization", "Bearer sk-qp-good"), ("x-api-key", "")];
        assert_eq!(key(&empty_x, m).unwrap(), "key_1");
        // None valid.
        let none = [("authorization", "Bearer sk-qp-bad"), ("x-api-key", "nope")];
        let e = s.authenticate(&headers(&none), m).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Authentication);
        // The chat format reads the bearer token only.
        let chat_x = [
            ("authorization", "Bearer sk-qp-bad"),
            ("x-api-key", "sk-qp-good"),
        ];
        assert!(key(&chat_x, ClientFormat::Chat).is_err());
        let chat_both = [
            ("authorization", "Bearer sk-qp-good"),
            ("x-api-key", "sk-ant-vendor"),
        ];
        assert_eq!(key(&chat_both, ClientFormat::Chat).unwrap(), "key_1");
        // A header sent twice is refused, whatever the other says.
        let twice = [
            ("x-api-key", "sk-qp-good"),
            ("x-api-key", "sk-qp-good"),
            ("authorization", "Bearer sk-qp-good"),
        ];
        assert!(key(&twice, m).is_err());
    }

    #[test]
    fn refusals() {
        let s = snapshot();
        for h in [
            headers(&[]),
            headers(&[("authorization", "Basic abc")]),
            headers(&[("authorization", "Bearer")]),
            headers(&[("authorization", "Bearer sk-qp-bad")]),
            headers(&[
                ("authorization", "Bearer sk-qp-good"),
                ("authorization", "Bearer sk-qp-good"),
            ]),
        ] {
            let e = s.authenticate(&h, ClientFormat::Chat).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Authentication);
        }
    }

    #[tokio::test]
    async fn rate_windows_survive_a_snapshot_rebuild() {
        use crate::config::Limits;
        use crate::ratelimit::RateLimiter;
        let limits = KeyLimits {
            requests_per_minute: Some(2),
            tokens_per_minute: None,
        };
        let active = |secret: &str, id: &str, tenant: i64| ActiveKey {
            secret_hash: hash_secret(secret),
            key_id: id.into(),
            tenant_id: tenant,
            tenant_name: format!("t{tenant}"),
            limits,
            rules: Default::default(),
            tenant_rules: Default::default(),
        };
        let s = KeySnapshot::default();
        s.install(1, vec![active("sk-qp-0", "key_0", 0)]);
        let rl = RateLimiter::frozen_at(Limits::default(), 1_800_000_030_000);
        let c = s.lookup("sk-qp-0").unwrap();
        assert!(rl.admit(&limits, &c.windows).await.is_ok());
        assert!(rl.admit(&limits, &c.windows).await.is_ok());
        // Another key is created somewhere: the snapshot is rebuilt.
        s.install(
            2,
            vec![
                active("sk-qp-0", "key_0", 0),
                active("sk-qp-new", "key_new", 9),
            ],
        );
        let c = s.lookup("sk-qp-0").unwrap();
        assert!(
            rl.admit(&limits, &c.windows).await.is_err(),
            "the window's count was kept"
        );
    }

    #[test]
    fn revocation_is_a_new_snapshot() {
        let s = snapshot();
        assert!(s.lookup("sk-qp-good").is_some());
        s.install(2, vec![]);
        assert!(s.lookup("sk-qp-good").is_none());
    }
}
