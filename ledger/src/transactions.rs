//! One decision, one transaction: `transaction!` (BEGIN … COMMIT, retried whole on a deadlock or a
//! serialization failure), `alone!` (one repeatable statement without BEGIN), and the commit
//! witness that tells whether a COMMIT cut off by a lost connection happened all the same.
use crate::connections::{DatabaseFault, connection_lost};
use crate::store::Ledger;
use std::time::Duration;
use uuid::Uuid;

/// How long the confirmation of a lost COMMIT waits for the synchronous standbys to have it
/// ([`Ledger::durable_here`]); NiFi's call waits that long at most, then is answered 503.
pub(crate) const DURABLE_WAIT: Duration = Duration::from_secs(10);

/// Runs `$body` (an expression using `$conn: &mut PgConnection`) in one READ COMMITTED transaction:
/// commit on `Ok`, roll back on `Err`, and re-run the whole body on a deadlock or serialization
/// failure, up to `tx_attempts` attempts (50 ms, 100 ms, … between them). Nothing is begun when
/// this binary does not run on the database's schema version (`SchemaUnsupported`).
macro_rules! transaction {
    ($ledger:expr, |$conn:ident| $body:expr) => {{
        let ledger: &$crate::store::Ledger = $ledger;
        let mut attempt: u32 = 0;
        loop {
            // Nothing is begun by a binary that does not run on the schema (`crate::schema`).
            if attempt == 0
                && let Err(e) = ledger.admit_write().await
            {
                break Err(e);
            }
            attempt += 1;
            let outcome: $crate::error::LedgerResult<_> = $crate::transactions::COMMIT_MARKER
                .scope(std::cell::Cell::new(None), async {
                    let mut tx = ledger.begin().await?;
                    let value = {
                        let $conn: &mut sqlx::PgConnection = &mut *tx;
                        let body: $crate::error::LedgerResult<_> = $body.await;
                        body?
                    };
                    match tx.commit().await {
                        Ok(()) => Ok(value),
                        Err(e) => {
                            let marker = $crate::transactions::COMMIT_MARKER.with(|m| m.get());
                            if ledger.committed_after_all(&e, marker).await {
                                Ok(value)
                            } else {
                                Err(e.into())
                            }
                        }
                    }
                })
                .await;
            let e = match outcome {
                Ok(value) => break Ok(value),
                Err(e) => e,
            };
            if !ledger.again_after(&e, attempt, false).await {
                break Err(e);
            }
        }
    }};
}
pub(crate) use transaction;

tokio::task_local! {
    /// The id of the last event the running [`transaction!`] inserted (`Event::insert`): the row
    /// that tells whether the transaction committed when its COMMIT got no answer.
    pub(crate) static COMMIT_MARKER: std::cell::Cell<Option<Uuid>>;
}

/// `$body` on a pooled connection without BEGIN: one statement on its own is its own
/// transaction, so a decision that a server-side function makes whole (a chunk report's
/// progress, a claim) costs one round trip. Retried like [`transaction!`] on a deadlock or a
/// serialization failure, and also on a lost connection: unlike a BEGIN, such a statement may
/// have committed before its connection was lost, so only a statement whose repetition finds
/// its own write and answers the same may run here.
macro_rules! alone {
    ($ledger:expr, |$conn:ident| $body:expr) => {{
        let ledger: &$crate::store::Ledger = $ledger;
        let mut attempt: u32 = 0;
        loop {
            if attempt == 0
                && let Err(e) = ledger.admit_write().await
            {
                break Err(e);
            }
            attempt += 1;
            let outcome: $crate::error::LedgerResult<_> = async {
                let mut pooled = ledger.acquire().await?;
                let $conn: &mut sqlx::PgConnection = &mut pooled;
                $body.await
            }
            .await;
            let e = match outcome {
                // A repeat after a lost connection may find what the lost attempt committed on
                // the primary only; it is answered after its own commit, which waits for the
                // synchronous standbys as the witness's does: every repeat takes the run's row
                // locks, which are WAL-logged (seen with a validation start whose repeat waited for
                // a stopped standby).
                Ok(value) => break Ok(value),
                Err(e) => e,
            };
            if !ledger.again_after(&e, attempt, true).await {
                break Err(e);
            }
        }
    }};
}
pub(crate) use alone;

impl Ledger {
    /// Whether a transaction whose COMMIT failed committed all the same. When the server ends a
    /// connection during COMMIT (a terminated backend, a restart), the commit may have happened:
    /// PostgreSQL keeps a commit whose wait for a synchronous standby was cut short ("the
    /// transaction has already committed locally"). Answering that as an error would tell NiFi a
    /// decision did not happen when it did, and a decision such as a validation start or a stage
    /// verdict is not repeatable (its replay is refused), so the run would wait for a person.
    /// The transaction's last event is its witness: visible from a new connection (on whichever
    /// server the address now names, a standby included, where only committed rows are visible),
    /// the transaction committed. Looked for a few times (a standby may not have replayed it yet),
    /// then the error stands: the outcome is unknown, as before.
    pub(crate) async fn committed_after_all(&self, e: &sqlx::Error, marker: Option<Uuid>) -> bool {
        let Some(event_id) = marker else {
            return false;
        };
        if !connection_lost(e) {
            return false;
        }
        self.retirement.retire_all(DatabaseFault::of(e));
        const LOOKS: u32 = 5;
        for look in 1..=LOOKS {
            let seen: std::result::Result<bool, sqlx::Error> = match self.acquire().await {
                Ok(mut conn) => {
                    sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM nifi_ops.load_event WHERE event_id = $1)",
                    )
                    .bind(event_id)
                    .fetch_one(&mut *conn)
                    .await
                }
                Err(e) => Err(e),
            };
            if let Ok(true) = seen {
                if !self.durable_here().await {
                    tracing::warn!(event = "commit_not_durable", error = %e, %event_id,
                        "the connection was lost during COMMIT; the transaction's event is on the primary, but the \
                         synchronous standbys did not confirm it within {DURABLE_WAIT:?}: answered as failed \
                         (a failover now would lose it)");
                    return false;
                }
                tracing::warn!(event = "commit_confirmed", error = %e, %event_id, looks = look,
                    "the connection was lost during COMMIT; the transaction's event is there, and durable, so it committed");
                return true;
            }
            if look < LOOKS {
                tokio::time::sleep(Ledger::backoff(look)).await;
            }
        }
        tracing::warn!(event = "commit_unknown", error = %e, %event_id,
            "the connection was lost during COMMIT and the transaction's event was not found: answered as failed");
        false
    }

    /// Whether what this server shows would survive a failover: on a standby (the address moved
    /// to one), it has replayed it; on a primary, a commit of its own, which waits for the
    /// synchronous standbys as every commit does (`synchronous_commit = on`) and so for all WAL
    /// before it, the lost COMMIT included, returns within [`DURABLE_WAIT`]. Without synchronous
    /// standbys that commit waits for nothing. A commit still waiting after the bound leaves its
    /// connection out of the pool (it would hold a slot until the standby returns).
    pub(crate) async fn durable_here(&self) -> bool {
        let barrier = async {
            let mut conn = self.acquire().await?.detach();
            let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await?;
            if !standby {
                let mut tx = sqlx::Connection::begin(&mut conn).await?;
                // A statement timeout would cancel the wait and let the COMMIT succeed
                // without the standbys (PostgreSQL only warns).
                sqlx::query("SET LOCAL statement_timeout = 0")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("SET LOCAL synchronous_commit = on")
                    .execute(&mut *tx)
                    .await?;
                // A WAL record of its own (a transaction that only took an xid commits without
                // waiting for the standbys): a logical decoding message, which needs no table or
                // privilege and which a change-data-capture consumer sees under this prefix.
                sqlx::query(
                    "SELECT pg_logical_emit_message(true, 'load-control', 'durability barrier')",
                )
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
            sqlx::Connection::close(conn).await?;
            Ok::<(), sqlx::Error>(())
        };
        match tokio::time::timeout(DURABLE_WAIT, barrier).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(event = "durability_unknown", error = %e,
                    "could not confirm that the synchronous standbys have the lost COMMIT");
                false
            }
            Err(_) => false,
        }
    }
}
