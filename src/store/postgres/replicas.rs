//! Signals between gateway replicas on PostgreSQL ([`ReplicaChannel`]): the `LISTEN`/`NOTIFY`
//! channel [`CHANNEL`].
//!
//! [`listen`] opens a connection of its own, runs `LISTEN`, and forwards every
//! notification it understands; when the connection breaks it reconnects (with a growing
//! pause, at most [`RELISTEN_MAX`]). Notifications sent while it was down are lost — what they
//! ask for (idle leases coming home) still happens after a few idle seconds.

use super::{error_text, PgErr, PgResult, PgStore};
use crate::store::{ReplicaChannel, ReplicaSignal, StoreResult};
use async_trait::async_trait;
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// The `LISTEN`/`NOTIFY` channel replicas talk on.
pub const CHANNEL: &str = "quipu_replicas";
/// Longest pause between attempts to re-establish the listening connection.
const RELISTEN_MAX: Duration = Duration::from_secs(5);
/// Signals waiting to be handled; beyond this, new ones are dropped (they are hints).
const SIGNAL_QUEUE: usize = 4096;

async fn notify(client: &mut Client, payload: &str) -> PgResult<()> {
    client
        .execute_typed(
            "SELECT pg_notify($1, $2)",
            &[(&CHANNEL, Type::TEXT), (&payload, Type::TEXT)],
        )
        .await?;
    Ok(())
}

/// A listening connection: the client (the connection closes when it is dropped) and the
/// payloads its connection task forwards; the channel closes when the connection ends.
struct Listening {
    _client: Client,
    payloads: mpsc::UnboundedReceiver<String>,
}

async fn listen_once(config: &tokio_postgres::Config, name: &str) -> PgResult<Listening> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, payloads) = mpsc::unbounded_channel();
    let name = name.to_owned();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    log::warn!(
                        "postgres {name}: the replica-signal connection closed: {}; reconnecting",
                        error_text(&e)
                    );
                    return;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok(Listening {
        _client: client,
        payloads,
    })
}

/// Starts listening (the first connection is made before this returns, so a failure shows at
/// start) and returns the signals received from now on.
async fn listen(
    config: tokio_postgres::Config,
    name: String,
) -> PgResult<mpsc::Receiver<ReplicaSignal>> {
    let first = listen_once(&config, &name).await?;
    let (tx, rx) = mpsc::channel(SIGNAL_QUEUE);
    tokio::spawn(async move {
        let mut current = Some(first);
        let mut pause = Duration::from_millis(100);
        loop {
            let Some(mut listening) = current.take() else {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RELISTEN_MAX);
                match listen_once(&config, &name).await {
                    Ok(l) => {
                        log::info!("postgres {name}: listening for replica signals again");
                        pause = Duration::from_millis(100);
                        current = Some(l);
                    }
                    Err(PgErr::Db(e)) => log::warn!(
                        "postgres {name}: cannot listen for replica signals: {}",
                        error_text(&e)
                    ),
                    Err(PgErr::Store(e)) => {
                        log::warn!("postgres {name}: cannot listen for replica signals: {e}")
                    }
                }
                continue;
            };
            while let Some(payload) = listening.payloads.recv().await {
                let Some(signal) = ReplicaSignal::from_payload(&payload) else {
                    log::debug!("ignoring an unknown replica signal: {payload}");
                    continue;
                };
                match tx.try_send(signal) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        log::debug!("replica signal queue full; a signal was dropped")
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    Ok(rx)
}

#[async_trait]
impl ReplicaChannel for PgStore {
    async fn notify_replicas(&self, signal: &ReplicaSignal) -> StoreResult<bool> {
        let payload = signal.to_payload();
        with_retry!(self, c => notify(c, &payload)).map(|()| true)
    }

    async fn listen_replicas(&self) -> StoreResult<Option<mpsc::Receiver<ReplicaSignal>>> {
        listen(self.pool.config.clone(), self.pool.name.clone())
            .await
            .map(Some)
            .map_err(|e| match e {
                PgErr::Db(e) => self.db_error(&e),
                PgErr::Store(e) => e,
            })
    }
}
