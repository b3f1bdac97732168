//! The sender's loop (see the module docs of `webhooks`): lease, scan, fan out, send.

use super::deliver::{self, NoAnswer};
use crate::config::{Webhook, WebhookDelivery};
use crate::metrics::m;
use crate::store::webhooks::{Attempt, DueDelivery, WebhookEndpoint, WebhookEvent};
use crate::store::{now_ms, Store, StoreResult, UnixMs};
use pingora::connectors::TransportConnector;
use quipu_core::governance::webhooks::backoff::Retry;
use quipu_core::governance::webhooks::crossing::{expiry_notice, ExpiryNotice};
use quipu_core::governance::webhooks::endpoint::{self, EndpointUrl, EventFilter};
use quipu_core::governance::webhooks::event::{Event, KeyExpiring};
use quipu_core::governance::webhooks::signature;
use std::sync::Arc;
use std::time::Duration;

/// Events fanned out per round.
const FAN_OUT_BATCH: u32 = 200;
/// Deliveries sent per round, at once.
const SEND_BATCH: u32 = 32;
const DAY_MS: i64 = 86_400_000;
/// Finished deliveries and their events are kept this long.
const RETENTION_MS: i64 = 30 * DAY_MS;
/// How often they are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Where a delivery goes and how it is signed.
struct Target {
    url: EndpointUrl,
    secret: String,
    events: EventFilter,
    /// A tenant's endpoint gets only that tenant's events; the operator's get every tenant's.
    tenant: Option<i64>,
}

/// One replica's sender: it sends only while it holds the store's sender lease.
pub struct Sender {
    store: Arc<dyn Store>,
    replica: String,
    operator: Vec<Webhook>,
    delivery: WebhookDelivery,
    connector: TransportConnector,
}

impl Sender {
    pub fn new(
        store: Arc<dyn Store>,
        replica: String,
        operator: Vec<Webhook>,
        delivery: WebhookDelivery,
    ) -> Sender {
        Sender {
            store,
            replica,
            operator,
            delivery,
            connector: TransportConnector::new(None),
        }
    }

    /// How long a lease lasts: three attempt timeouts, at least 5 s.
    fn lease_ms(&self) -> i64 {
        let ms = self
            .delivery
            .timeout
            .saturating_mul(3)
            .max(Duration::from_secs(5));
        i64::try_from(ms.as_millis()).unwrap_or(i64::MAX)
    }

    /// Runs until `stop` turns true, then gives the lease up.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        for outcome in ["delivered", "failed", "dead"] {
            m().webhook_deliveries.with_label_values(&[outcome]);
        }
        let mut tick = tokio::time::interval(self.delivery.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_scan: Option<tokio::time::Instant> = None;
        let mut last_prune: Option<tokio::time::Instant> = None;
        let mut held_until: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
            if !self.hold_lease(&mut held_until).await {
                continue;
            }
            let scan_due = last_scan.is_none_or(|at| at.elapsed() >= self.delivery.key_scan);
            if scan_due {
                last_scan = Some(tokio::time::Instant::now());
                if let Err(e) = self.scan_expiring_keys().await {
                    log::warn!("webhooks: scanning for expiring keys failed: {e}");
                }
            }
            if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(tokio::time::Instant::now());
                if let Err(e) = self.store.prune_webhooks(now_ms() - RETENTION_MS).await {
                    log::warn!("webhooks: pruning old deliveries failed: {e}");
                }
            }
            if let Err(e) = self.round().await {
                log::warn!("webhooks: a sending round failed (retried next round): {e}");
            }
        }
        if let Err(e) = self.store.resign_sender(&self.replica).await {
            log::warn!("webhooks: could not give up the sender's lease: {e}");
        }
    }

    /// Whether this replica holds the sender's lease for this round: renewed once less than
    /// half of it is left (on SQLite each renewal is a write and an fsync), taken when free.
    /// `held_until` is when it runs out at the latest, by this process's clock (measured from
    /// before the store call, so never later than the store's own reckoning).
    async fn hold_lease(&self, held_until: &mut Option<tokio::time::Instant>) -> bool {
        let lease = Duration::from_millis(u64::try_from(self.lease_ms()).unwrap_or(u64::MAX));
        let asked = tokio::time::Instant::now();
        if held_until.is_some_and(|until| until.saturating_duration_since(asked) > lease / 2) {
            return true;
        }
        *held_until = match self.store.lead_sender(&self.replica, self.lease_ms()).await {
            Ok(true) => Some(asked + lease),
            Ok(false) => None,
            Err(e) => {
                log::warn!("webhooks: cannot take the sender's lease: {e}");
                None
            }
        };
        held_until.is_some()
    }

    /// The expiry notices due now, each inserted once (see `crossing::expiry_notice`).
    async fn scan_expiring_keys(&self) -> StoreResult<u64> {
        let now = now_ms();
        let keys = self.store.expiring_keys(now, now + 7 * DAY_MS).await?;
        let events: Vec<_> = keys
            .into_iter()
            .filter_map(|k| {
                let notice = KeyExpiring {
                    key_id: k.key_id,
                    expires_at: k.expires_at.div_euclid(1000),
                };
                let event = match expiry_notice(k.expires_at, now)? {
                    ExpiryNotice::SevenDays => Event::KeyExpiring7d(notice),
                    ExpiryNotice::OneDay => Event::KeyExpiring1d(notice),
                };
                Some((k.tenant_id, WebhookEvent::new(&k.tenant_name, now, event)))
            })
            .collect();
        self.store.emit(&events).await
    }

    /// Every endpoint by id: the operator's, and the tenants' (read each round, so one
    /// registered or removed counts from the next).
    async fn targets(&self) -> StoreResult<Vec<(String, Target)>> {
        let mut out: Vec<(String, Target)> = self
            .operator
            .iter()
            .map(|w| {
                let target = Target {
                    url: w.url.clone(),
                    secret: w.secret.clone(),
                    events: w.events.clone(),
                    tenant: None,
                };
                (w.id.clone(), target)
            })
            .collect();
        for e in self.store.endpoints(None).await? {
            match tenant_target(&e) {
                Ok(t) => out.push((e.id, t)),
                Err(why) => log::warn!("webhooks: endpoint {} is unusable: {why}", e.id),
            }
        }
        Ok(out)
    }

    async fn round(&self) -> StoreResult<()> {
        let targets = self.targets().await?;
        let now = now_ms();
        let events = self.store.unfanned(FAN_OUT_BATCH).await?;
        if !events.is_empty() {
            let mut deliveries = Vec::new();
            for e in &events {
                for (id, t) in &targets {
                    if t.events.matches(&e.kind) && t.tenant.is_none_or(|t| t == e.tenant_id) {
                        deliveries.push((e.event_id.clone(), id.clone()));
                    }
                }
            }
            let ids: Vec<String> = events.into_iter().map(|e| e.event_id).collect();
            self.store.fan_out(&ids, &deliveries, now).await?;
        }
        let due = self.store.due(now, SEND_BATCH).await?;
        let sends = due.iter().map(|d| self.attempt(&targets, d));
        futures::future::join_all(sends).await;
        let backlog = self.store.backlog().await?;
        m().webhook_backlog
            .set(i64::try_from(backlog.pending + backlog.unfanned).unwrap_or(i64::MAX));
        Ok(())
    }

    /// One attempt at a delivery, recorded.
    async fn attempt(&self, targets: &[(String, Target)], d: &DueDelivery) {
        let attempt = match targets.iter().find(|(id, _)| *id == d.endpoint) {
            None => Attempt::Dead {
                status: None,
                error: "the endpoint was removed".into(),
            },
            Some((_, t)) => {
                let now = now_ms();
                let header =
                    signature::sign(t.secret.as_bytes(), now.div_euclid(1000), d.body.as_bytes());
                let bytes =
                    endpoint::request(&t.url, &d.event_id, &d.kind, &header, d.body.as_bytes());
                let public_only = t.tenant.is_some() && !self.delivery.tenant_private_urls;
                let timeout = self.delivery.timeout;
                let result =
                    deliver::post(&self.connector, &t.url, &bytes, timeout, public_only).await;
                self.judge(d, result, now)
            }
        };
        let outcome = match &attempt {
            Attempt::Delivered { .. } => "delivered",
            Attempt::Retry { .. } => "failed",
            Attempt::Dead { .. } => "dead",
        };
        m().webhook_deliveries.with_label_values(&[outcome]).inc();
        if let Attempt::Retry { error, .. } | Attempt::Dead { error, .. } = &attempt {
            log::warn!(
                "webhooks: {} {} of tenant {} to endpoint {}: attempt {} {outcome}: {error}",
                d.kind,
                d.event_id,
                d.tenant_id,
                d.endpoint,
                d.attempts + 1
            );
        }
        if let Err(e) = self
            .store
            .attempted(&d.event_id, &d.endpoint, &attempt, now_ms())
            .await
        {
            // Not recorded: it is due again, and sent again (at least once).
            log::warn!("webhooks: cannot record an attempt at {}: {e}", d.event_id);
        }
    }

    /// What an attempt's result makes of the delivery.
    fn judge(&self, d: &DueDelivery, result: Result<u16, NoAnswer>, now: UnixMs) -> Attempt {
        let (status, error) = match result {
            Ok(s) if endpoint::delivered(s) => return Attempt::Delivered { status: s },
            Ok(s) => (Some(s), format!("the endpoint answered {s}")),
            Err(NoAnswer::Failed(e)) => (None, e),
            Err(NoAnswer::Forbidden(e)) => {
                return Attempt::Dead {
                    status: None,
                    error: e,
                }
            }
        };
        match self
            .delivery
            .backoff
            .delay(d.attempts + 1, rand::random::<u32>())
        {
            Retry::After(delay) => Attempt::Retry {
                next_at: now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
                status,
                error,
            },
            Retry::GiveUp => Attempt::Dead { status, error },
        }
    }
}

fn tenant_target(e: &WebhookEndpoint) -> Result<Target, String> {
    Ok(Target {
        url: EndpointUrl::parse(&e.url)?,
        secret: e.secret.clone(),
        events: EventFilter::from_text(&e.events)?,
        tenant: Some(e.tenant_id),
    })
}
