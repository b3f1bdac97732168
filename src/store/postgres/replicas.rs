//! What PostgreSQL carries between gateway replicas besides money: the shared rate windows
//! (`rate_windows`) and signals on the `LISTEN`/`NOTIFY` channel [`CHANNEL`].
//!
//! **Rate windows.** A batch of asks is two statements, sent together (pipelined, one round
//! trip): an `INSERT … ON CONFLICT DO NOTHING` that makes sure every window's row exists, then
//! one `UPDATE … FROM UNNEST(…)` that applies every ask. Each row is changed under its row lock
//! with the values the `SET` reads from it, so concurrent replicas' asks on one window
//! serialise and none is lost; the amount granted is written to the row's `granted` column by
//! the same `SET` and returned (PostgreSQL before 18 cannot return a row's old values). The
//! statements need no transaction: the insert only makes sure the row exists.
//!
//! **Signals.** [`listen`] opens a connection of its own, runs `LISTEN`, and forwards every
//! notification it understands; when the connection breaks it reconnects (with a growing
//! pause, at most [`RELISTEN_MAX`]). Notifications sent while it was down are lost — what they
//! ask for (idle leases coming home) still happens after a few idle seconds.

use super::{error_text, PgErr, PgResult};
use crate::store::{QuotaAsk, QuotaGrant, ReplicaSignal, StoreError, UnixMs};
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

/// The store's clock, milliseconds since the epoch.
pub(super) async fn store_now(client: &mut Client) -> PgResult<UnixMs> {
    let row = client
        .query_typed_one(concat!("SELECT ", db_now_ms!()), &[])
        .await?;
    Ok(row.try_get(0)?)
}

fn to_i64(v: u64, what: &str) -> Result<i64, PgErr> {
    i64::try_from(v).map_err(|_| {
        PgErr::Store(StoreError::Invalid(format!(
            "{what} {v} does not fit a 64-bit count"
        )))
    })
}

pub(super) async fn take_quota(
    client: &mut Client,
    asks: &[QuotaAsk],
) -> PgResult<(Vec<QuotaGrant>, UnixMs)> {
    let subjects: Vec<&str> = asks.iter().map(|a| a.subject.as_str()).collect();
    let windows: Vec<i64> = asks.iter().map(|a| a.window_ms).collect();
    let starts: Vec<i64> = asks.iter().map(|a| a.window_start).collect();
    let adds: Vec<i64> = asks.iter().map(|a| a.add).collect();
    let mut wants = Vec::with_capacity(asks.len());
    let mut limits = Vec::with_capacity(asks.len());
    for a in asks {
        wants.push(to_i64(a.want, "a rate-window ask of")?);
        limits.push(to_i64(a.limit, "a rate limit of")?);
    }
    let idx: Vec<i64> = (0..asks.len() as i64).collect();
    let ensure_params = [
        (
            &subjects as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::TEXT_ARRAY,
        ),
        (&windows, Type::INT8_ARRAY),
        (&starts, Type::INT8_ARRAY),
    ];
    let apply_params = [
        (
            &subjects as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::TEXT_ARRAY,
        ),
        (&windows, Type::INT8_ARRAY),
        (&starts, Type::INT8_ARRAY),
        (&adds, Type::INT8_ARRAY),
        (&wants, Type::INT8_ARRAY),
        (&limits, Type::INT8_ARRAY),
        (&idx, Type::INT8_ARRAY),
    ];
    let ensure = client.execute_typed(
        "INSERT INTO rate_windows (subject, window_ms, window_start, taken, ends_at)
         SELECT s, w, ws, 0, ws + w FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS u(s, w, ws)
         ON CONFLICT (subject, window_ms, window_start) DO NOTHING",
        &ensure_params,
    );
    // `base`: the count after the unconditional `add`, never below zero; then the grant.
    let apply = client.query_typed(
        concat!(
            "UPDATE rate_windows AS r
                SET taken = GREATEST(r.taken + u.a, 0)
                            + LEAST(u.want, GREATEST(u.lim - GREATEST(r.taken + u.a, 0), 0)),
                    granted = LEAST(u.want, GREATEST(u.lim - GREATEST(r.taken + u.a, 0), 0))
               FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[],
                           $6::int8[], $7::int8[]) AS u(s, w, ws, a, want, lim, i)
              WHERE r.subject = u.s AND r.window_ms = u.w AND r.window_start = u.ws
          RETURNING u.i, r.granted, r.taken, ",
            db_now_ms!()
        ),
        &apply_params,
    );
    // Both are sent before either answer is read: one round trip. The insert is queued first
    // on the connection, so the update sees its rows.
    let (ensured, rows) = futures::future::join(ensure, apply).await;
    ensured?;
    let rows = rows?;
    let mut grants = vec![
        QuotaGrant {
            granted: 0,
            taken: 0
        };
        asks.len()
    ];
    let mut now: UnixMs = 0;
    let mut seen = 0usize;
    for r in rows {
        let i: i64 = r.try_get(0)?;
        let granted: i64 = r.try_get(1)?;
        let taken: i64 = r.try_get(2)?;
        now = r.try_get(3)?;
        if let Some(g) = usize::try_from(i).ok().and_then(|i| grants.get_mut(i)) {
            *g = QuotaGrant {
                granted: u64::try_from(granted).unwrap_or(0),
                taken: u64::try_from(taken).unwrap_or(0),
            };
            seen += 1;
        }
    }
    if seen != asks.len() {
        // A window expired between the two statements (only ones long over are): say so
        // rather than report a grant of nothing.
        return Err(PgErr::Store(StoreError::Backend(format!(
            "{} of {} rate windows vanished while being updated",
            asks.len() - seen,
            asks.len()
        ))));
    }
    Ok((grants, now))
}

pub(super) async fn expire_quota(client: &mut Client, age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "DELETE FROM rate_windows WHERE ends_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&age_ms, Type::INT8)],
        )
        .await?)
}

pub(super) async fn notify(client: &mut Client, payload: &str) -> PgResult<()> {
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
pub(super) async fn listen(
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
