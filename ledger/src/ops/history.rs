//! History retention (CONTRACT §7.2 rule 7 [v1-ext]): a cleaned run whose end time is older than
//! `cleanup.history_retention` is deleted with every row that belongs to it, and so are run-less
//! events older than that. Unlike rules 1–6 it does not run inside the tick's transaction: each
//! run is deleted in a short fenced transaction of its own, at most `cleanup.history_batch` runs
//! per tick, so that no request ever waits on the retention for longer than one run's delete.
//! Optionally each run is first written to a JSON-lines archive (`cleanup.history_archive`).
use super::fence::{Fence, check_fence};
use crate::error::{LedgerError, Result};
use crate::settings::HistoryArchive;
use crate::store::Ledger;
use crate::transactions::transaction;
use std::path::{Path, PathBuf};
use uuid::Uuid;

/// What one pass of history retention did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryReport {
    /// Runs deleted with all their rows (`history_deleted`).
    pub runs_deleted: u64,
    /// Run-less events deleted (counted with the events of rule 6, `events_deleted`).
    pub events_deleted: u64,
    /// What failed (the rest of the pass went on, or stopped for an archive failure).
    pub errors: Vec<String>,
}

/// Run-less events deleted per tick at most (§7.2 rule 7, like rule 6).
const EVENT_BATCH: i64 = 10_000;

/// A run rule 7 may delete; `$1` is the retention in seconds. Active runs and PUBLISH_UNKNOWN are
/// never due; nor is a run with a dispatch still in flight (PENDING, SENT) or a DEAD dispatch an
/// operator still has to look at: one that raises the DISPATCH_DEAD alert
/// (`crate::machine::alerting_dead_dispatch`). A resend makes such a dispatch PENDING (still kept); its ACK makes it ACKED.
/// `now()`, not `clock_timestamp()`, so that the end-time bound is an index condition of
/// `ix_load_run_cleaned_end`.
macro_rules! due_run {
    () => {
        concat!(
            "r.cleaned_at IS NOT NULL \
         AND COALESCE(r.completed_at, r.heartbeat_at) < now() - make_interval(secs => $1) \
         AND r.status IN ('SUCCESS', 'FAILED_MANIFEST', 'FAILED_EXTRACT', 'FAILED_STAGE_VALIDATION', \
                          'FAILED_PUBLISH', 'FAILED_TARGET_VALIDATION', 'FAILED_SNAPSHOT_EXPIRED', \
                          'TIMED_OUT', 'CANCELLED') \
         AND NOT EXISTS (SELECT 1 FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id \
               AND (d.status IN ('PENDING', 'SENT') OR ",
            crate::machine::alerting_dead_dispatch!("d", "r"),
            "))"
        )
    };
}

/// The oldest due runs (by end time, then id: the order of `ix_load_run_cleaned_end`).
pub const DUE_RUNS: &str = concat!(
    "SELECT r.run_id, r.status FROM nifi_ops.load_run r WHERE ",
    due_run!(),
    " ORDER BY COALESCE(r.completed_at, r.heartbeat_at), r.run_id LIMIT $2"
);

/// The same predicate for one run, checked again under its lock.
const STILL_DUE: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM nifi_ops.load_run r WHERE r.run_id = $2 AND ",
    due_run!(),
    ")"
);

/// An event row as the archive writes it: its columns, with a token in its details (the publish
/// token of `PUBLISH_STARTED`, a claim token a NiFi flow put in its own rows) replaced by `***`
/// as in the logs (CONTRACT §9.2: files outside the database never hold a token).
macro_rules! archived_event {
    () => {
        "(to_jsonb(e) || jsonb_build_object('details', e.details \
           || CASE WHEN e.details ? 'publishToken' THEN '{\"publishToken\": \"***\"}'::jsonb ELSE '{}'::jsonb END \
           || CASE WHEN e.details ? 'claimToken' THEN '{\"claimToken\": \"***\"}'::jsonb ELSE '{}'::jsonb END))"
    };
}

/// The archive line of a run: every column of the run and of every row that belongs to it, as
/// PostgreSQL writes them (`to_jsonb`: numeric(38,0) keeps all its digits), tokens masked (the
/// run's publish token, the partitions' claim tokens, [`archived_event`]), with the UTC day of
/// its end time (the file it goes to).
const ARCHIVE_RUN: &str = concat!(
    "SELECT to_char(COALESCE(r.completed_at, r.heartbeat_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), \
    jsonb_build_object( \
      'run', to_jsonb(r) || CASE WHEN r.publish_token IS NULL THEN '{}'::jsonb \
                                 ELSE '{\"publish_token\": \"***\"}'::jsonb END, \
      'partitions', COALESCE((SELECT jsonb_agg(to_jsonb(p) || CASE WHEN p.claim_token IS NULL THEN '{}'::jsonb \
                                                                ELSE '{\"claim_token\": \"***\"}'::jsonb END \
                                               ORDER BY p.partition_id) \
                                FROM nifi_ops.load_partition p WHERE p.run_id = r.run_id), '[]'::jsonb), \
      'files', COALESCE((SELECT jsonb_agg(to_jsonb(f) ORDER BY f.partition_id, f.chunk_index) \
                           FROM nifi_ops.load_file f WHERE f.run_id = r.run_id), '[]'::jsonb), \
      'validations', COALESCE((SELECT jsonb_agg(to_jsonb(v) ORDER BY v.validation_id) \
                                 FROM nifi_ops.load_validation v WHERE v.run_id = r.run_id), '[]'::jsonb), \
      'dispatches', COALESCE((SELECT jsonb_agg(to_jsonb(d) ORDER BY d.created_at, d.dispatch_id) \
                                FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id), '[]'::jsonb), \
      'events', COALESCE((SELECT jsonb_agg(",
    archived_event!(),
    " ORDER BY e.event_time, e.event_id) \
                            FROM nifi_ops.load_event e WHERE e.run_id = r.run_id), '[]'::jsonb))::text \
    FROM nifi_ops.load_run r WHERE r.run_id = $1"
);

/// A run's rows, children first (foreign keys: files → partitions → run; validations and
/// dispatches → run; events have no foreign key).
const DELETE_RUN: [&str; 6] = [
    "DELETE FROM nifi_ops.load_file WHERE run_id = $1",
    "DELETE FROM nifi_ops.load_partition WHERE run_id = $1",
    "DELETE FROM nifi_ops.load_validation WHERE run_id = $1",
    "DELETE FROM nifi_ops.load_dispatch WHERE run_id = $1",
    "DELETE FROM nifi_ops.load_event WHERE run_id = $1",
    "DELETE FROM nifi_ops.load_run WHERE run_id = $1",
];

/// What became of one due run.
enum RunOutcome {
    Deleted,
    /// Busy in a request, gone, or no longer due under its lock: left for a later tick.
    Skipped,
    /// The archive could not be written: nothing was deleted.
    ArchiveFailed(String),
}

/// One archive write is done at a time in this process, so lines of two passes never interleave.
static ARCHIVE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Ledger {
    /// Rule 7, one pass: at most `cleanup.history_batch` due runs, each deleted (and archived
    /// first, when an archive is configured) in its own fenced transaction, then one batch of at
    /// most 10,000 run-less events. Nothing when `cleanup.history_retention` is null. `Fenced`
    /// as soon as a transaction finds this process deposed; any other failure of a run is
    /// reported and the pass goes on with the next run, except an archive failure, which ends
    /// the pass (the next run would meet the same directory).
    pub async fn sweep_history(&self, fence: &Fence) -> Result<HistoryReport> {
        let mut report = HistoryReport::default();
        let Some(retention) = self.config.thresholds.history_retention else {
            return Ok(report);
        };
        let retention = retention.as_secs_f64();
        let due: Vec<(Uuid, String)> = sqlx::query_as(DUE_RUNS)
            .bind(retention)
            .bind(i64::from(self.config.history.batch))
            .fetch_all(&mut *self.acquire().await?)
            .await?;
        for (run_id, status) in due {
            match self
                .delete_history_run(fence, run_id, &status, retention)
                .await
            {
                Ok(RunOutcome::Deleted) => report.runs_deleted += 1,
                Ok(RunOutcome::Skipped) => {}
                Ok(RunOutcome::ArchiveFailed(why)) => {
                    tracing::error!(event = "history_archive_error", run_id = %run_id, error = %why,
                        "history archive not written; the run was not deleted");
                    report.errors.push(format!("archive: {why}"));
                    return Ok(report);
                }
                Err(e @ LedgerError::Fenced { .. }) => return Err(e),
                Err(e) => {
                    tracing::error!(event = "sweeper_rule_error", rule = "history_retention", run_id = %run_id,
                        error = %e, "deleting a run's history failed; it is left for a later tick");
                    report.errors.push(format!("run {run_id}: {e}"));
                }
            }
        }
        match self.delete_runless_events(fence, retention).await {
            Ok(Ok(n)) => report.events_deleted = n,
            Ok(Err(why)) => {
                tracing::error!(event = "history_archive_error", error = %why,
                    "history archive not written; no run-less event was deleted");
                report.errors.push(format!("archive: {why}"));
            }
            Err(e @ LedgerError::Fenced { .. }) => return Err(e),
            Err(e) => {
                tracing::error!(event = "sweeper_rule_error", rule = "history_retention", error = %e,
                    "deleting old run-less events failed");
                report.errors.push(format!("run-less events: {e}"));
            }
        }
        Ok(report)
    }

    /// One run in one transaction: fence, the run's lock without waiting (a run busy in a request
    /// is skipped), the predicate again under the lock, the deletes, the archive line written and
    /// fsynced (read before the deletes); the commit releases the lock.
    async fn delete_history_run(
        &self,
        fence: &Fence,
        run_id: Uuid,
        status: &str,
        retention: f64,
    ) -> Result<RunOutcome> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            if self.try_lock_run(conn, run_id, status).await?.is_none() {
                return Ok(RunOutcome::Skipped);
            }
            let due: bool = sqlx::query_scalar(STILL_DUE)
                .bind(retention)
                .bind(run_id)
                .fetch_one(&mut *conn)
                .await?;
            if !due {
                self.let_go_of_run(conn).await?;
                return Ok(RunOutcome::Skipped);
            }
            self.keep_run(conn).await?;
            // The archive line is read before the deletes and written after them, so a delete
            // that fails (no DELETE grant, say) archives nothing; a write that fails undoes the
            // deletes. Either way the commit only ever follows a line on disk.
            let archive = match &self.config.history.archive {
                HistoryArchive::None => None,
                HistoryArchive::JsonLines { dir } => {
                    let line: (String, String) = sqlx::query_as(ARCHIVE_RUN)
                        .bind(run_id)
                        .fetch_one(&mut *conn)
                        .await?;
                    Some((dir, line))
                }
            };
            sqlx::query("SAVEPOINT history_delete")
                .execute(&mut *conn)
                .await?;
            for sql in DELETE_RUN {
                sqlx::query(sql).bind(run_id).execute(&mut *conn).await?;
            }
            if let Some((dir, line)) = archive
                && let Err(e) = append_lines(dir, vec![line]).await
            {
                sqlx::query("ROLLBACK TO SAVEPOINT history_delete")
                    .execute(&mut *conn)
                    .await?;
                return Ok(RunOutcome::ArchiveFailed(e));
            }
            Ok(RunOutcome::Deleted)
        })
    }

    /// Run-less events older than the retention, at most 10,000, in one fenced transaction; with
    /// an archive they are written (one line each, by the UTC day of their time) before the delete
    /// commits, and a failed write undoes it. The inner `Err` is an archive failure (nothing deleted).
    async fn delete_runless_events(
        &self,
        fence: &Fence,
        retention: f64,
    ) -> Result<Result<u64, String>> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            let HistoryArchive::JsonLines { dir } = &self.config.history.archive else {
                let n = sqlx::query(
                    "DELETE FROM nifi_ops.load_event WHERE event_id IN ( \
                       SELECT event_id FROM nifi_ops.load_event \
                        WHERE run_id IS NULL AND event_time < now() - make_interval(secs => $1) LIMIT $2)",
                )
                .bind(retention)
                .bind(EVENT_BATCH)
                .execute(&mut *conn)
                .await?
                .rows_affected();
                return Ok(Ok(n));
            };
            let rows: Vec<(Uuid, String, String)> = sqlx::query_as(concat!(
                "SELECT e.event_id, to_char(e.event_time AT TIME ZONE 'UTC', 'YYYY-MM-DD'), \
                        jsonb_build_object('event', ",
                archived_event!(),
                ")::text \
                   FROM nifi_ops.load_event e \
                  WHERE e.run_id IS NULL AND e.event_time < now() - make_interval(secs => $1) \
                  ORDER BY e.event_time, e.event_id LIMIT $2 FOR UPDATE SKIP LOCKED"
            ))
            .bind(retention)
            .bind(EVENT_BATCH)
            .fetch_all(&mut *conn)
            .await?;
            if rows.is_empty() {
                return Ok(Ok(0));
            }
            let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
            let lines: Vec<(String, String)> =
                rows.into_iter().map(|(_, day, line)| (day, line)).collect();
            sqlx::query("SAVEPOINT history_delete")
                .execute(&mut *conn)
                .await?;
            let n = sqlx::query("DELETE FROM nifi_ops.load_event WHERE event_id = ANY($1)")
                .bind(&ids)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if let Err(e) = append_lines(dir, lines).await {
                sqlx::query("ROLLBACK TO SAVEPOINT history_delete")
                    .execute(&mut *conn)
                    .await?;
                return Ok(Err(e));
            }
            Ok(Ok(n))
        })
    }
}

/// The archive file of a UTC day.
pub fn archive_file(dir: &Path, day: &str) -> PathBuf {
    dir.join(format!("load-history-{day}.jsonl"))
}

/// Appends `(day, line)` pairs to the day files of `dir` and fsyncs them (and the directory, for
/// a file it created) before returning. A failed write is cut back to the file's former length,
/// so a retry never follows half a line. Errors are described for the log.
async fn append_lines(dir: &Path, lines: Vec<(String, String)>) -> Result<(), String> {
    let _one_at_a_time = ARCHIVE_LOCK.lock().await;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || append_lines_now(&dir, lines))
        .await
        .map_err(|e| format!("archive writer failed: {e}"))?
}

fn append_lines_now(dir: &Path, lines: Vec<(String, String)>) -> Result<(), String> {
    use std::io::Write;
    let mut by_day: std::collections::BTreeMap<String, String> = Default::default();
    for (day, line) in lines {
        let text = by_day.entry(day).or_default();
        text.push_str(&line);
        text.push('\n');
    }
    for (day, text) in by_day {
        let path = archive_file(dir, &day);
        let describe = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
        let created = !path.exists();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| describe("cannot open", e))?;
        let before = file
            .metadata()
            .map_err(|e| describe("cannot stat", e))?
            .len();
        if let Err(e) = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_data())
        {
            let _ = file.set_len(before).and_then(|()| file.sync_data());
            return Err(describe("cannot write", e));
        }
        if created {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| describe("cannot sync the directory of", e))?;
        }
    }
    Ok(())
}

impl Ledger {
    /// The tick's part of rule 7: its counts join the tick's (`history_deleted` in runs, run-less
    /// events with `events_deleted`), its failures the tick's rule errors.
    pub(crate) async fn history_into(
        &self,
        fence: &Fence,
        report: &mut super::sweeper::SweepReport,
    ) -> Result<()> {
        let h = match self.sweep_history(fence).await {
            Ok(h) => h,
            Err(e @ LedgerError::Fenced { .. }) => return Err(e),
            Err(e) => {
                tracing::error!(event = "sweeper_rule_error", rule = "history_retention", error = %e,
                    "history retention failed");
                report
                    .rule_errors
                    .push(("history_retention", e.to_string()));
                return Ok(());
            }
        };
        for (rule, n) in [
            ("history_deleted", h.runs_deleted),
            ("events_deleted", h.events_deleted),
        ] {
            if n > 0 {
                *report.actions.entry(rule).or_default() += n;
            }
        }
        report
            .rule_errors
            .extend(h.errors.into_iter().map(|e| ("history_retention", e)));
        Ok(())
    }
}
