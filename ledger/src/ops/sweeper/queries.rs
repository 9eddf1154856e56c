//! The sweeper's statements, named so that `plans` can check each one's query plan.

/// Rule 1's candidates, `$1` the shortest `recovery.stale` of any job: EXTRACTING runs with a
/// stale RUNNING partition. The stale partitions come from `ix_load_partition_live` (the RUNNING
/// and RETRY partitions only; the heartbeat bound is checked on the row, since an index on
/// `heartbeat_at` would make every heartbeat a non-HOT update), or, per EXTRACTING run, from the
/// run's key: either way only live partitions are read.
pub const STALE_PARTITION_RUNS: &str = "SELECT r.run_id, r.job_key FROM nifi_ops.load_run r \
              WHERE r.status = 'EXTRACTING' AND r.run_id IN (SELECT p.run_id FROM nifi_ops.load_partition p \
                WHERE p.status = 'RUNNING' AND p.heartbeat_at < statement_timestamp() - make_interval(secs => $1)) \
              ORDER BY r.started_at, r.run_id";

/// Rule 1, one run (`$1`) with its job's threshold (`$2`). `(status || '')` is no index column on
/// purpose: with statistics from a quiet hour (few RUNNING partitions) the planner would otherwise
/// take `ix_load_partition_live` and filter every RUNNING partition of every run by `run_id`;
/// this way the run's key bounds the scan.
pub const STALE_PARTITION_DUE: &str = "SELECT EXISTS (SELECT 1 FROM nifi_ops.load_partition WHERE run_id = $1 \
                   AND (status || '') = 'RUNNING' AND heartbeat_at < clock_timestamp() - make_interval(secs => $2))";

/// Rule 1, the stale partitions of one locked run (`$1`, threshold `$2`), by the primary key in
/// partition order (see [`STALE_PARTITION_DUE`] for `(status || '')`).
pub const STALE_PARTITIONS_LOCK: &str = "SELECT partition_id, attempt_count FROM nifi_ops.load_partition WHERE run_id = $1 \
                   AND (status || '') = 'RUNNING' AND heartbeat_at < clock_timestamp() - make_interval(secs => $2) \
                   ORDER BY partition_id FOR UPDATE";

/// Rule 2's candidates, `$1` the shortest `recovery.run_timeout`: CREATED/EXTRACTING runs, each
/// with its age in seconds, judged against its own job's limit before anything is locked.
pub const DEADLINE_RUNS: &str = "SELECT run_id, job_key, extract(epoch FROM clock_timestamp() - started_at)::float8 \
               FROM nifi_ops.load_run WHERE status IN ('CREATED', 'EXTRACTING') \
               AND started_at < clock_timestamp() - make_interval(secs => $1) ORDER BY started_at, run_id";

/// Rule 3's rows, `$1` the shortest `dispatch.ack_timeout`: SENT rows (from `ix_load_dispatch_due`).
pub const UNACKED_DISPATCHES: &str = "SELECT d.dispatch_id, d.run_id, d.dispatch_type, d.partition_id, d.attempt_count, r.job_key, \
                    extract(epoch FROM clock_timestamp() - d.sent_at)::float8 AS age_s \
               FROM nifi_ops.load_dispatch d JOIN nifi_ops.load_run r ON r.run_id = d.run_id \
               LEFT JOIN nifi_ops.load_partition p ON p.run_id = d.run_id AND p.partition_id = d.partition_id \
              WHERE d.status = 'SENT' AND d.sent_at < clock_timestamp() - make_interval(secs => $1) \
                AND ((d.dispatch_type = 'VALIDATE_RUN' AND r.status = 'EXTRACTED_VALIDATED') \
                  OR (d.dispatch_type = 'REISSUE_PARTITION' AND r.status = 'EXTRACTING' AND p.status = 'RETRY')) \
              ORDER BY d.sent_at, d.dispatch_id FOR UPDATE OF d SKIP LOCKED";

/// Rule 4, in one statement: the runs stuck in STAGE_VALIDATING or PUBLISHED past their own job's
/// `recovery.validation_stale` (`$1` the jobs with their own settings, `$2` their windows, `$3`
/// the global one) with no alert within that window; `$4` the shortest window of all, `$5` the
/// longest. Only the due runs leave the database (sending every stuck run to be judged, and
/// binding them back, was most of a tick on a ledger holding hundreds). The stuck runs are a
/// range of the covering `ix_load_run_stuck` and their alerts of the longest window one range of
/// `ix_load_event_stale_alert`, read once: both bounds start from `statement_timestamp()` (an
/// index bound must not be volatile), and each run is then judged by `clock_timestamp()`.
pub const STALE_ALERT_DUE: &str = "WITH recent AS MATERIALIZED ( \
           SELECT e.run_id, max(e.event_time) AS last_alert FROM nifi_ops.load_event e \
            WHERE e.event_name = 'RUN_STALE_ALERT' AND e.event_time > statement_timestamp() - make_interval(secs => $5) \
            GROUP BY e.run_id) \
         SELECT r.run_id, r.job_key, r.business_key, r.status, r.heartbeat_at FROM nifi_ops.load_run r \
          CROSS JOIN LATERAL (SELECT COALESCE(($2::float8[])[array_position($1::text[], r.job_key::text)], $3) AS window_s) w \
           LEFT JOIN recent a ON a.run_id = r.run_id \
          WHERE r.status IN ('STAGE_VALIDATING', 'PUBLISHED') \
            AND r.heartbeat_at < statement_timestamp() - make_interval(secs => $4) \
            AND r.heartbeat_at <= clock_timestamp() - make_interval(secs => w.window_s) \
            AND (a.last_alert IS NULL OR a.last_alert <= clock_timestamp() - make_interval(secs => w.window_s)) \
          ORDER BY r.heartbeat_at, r.run_id";

/// Rule 5's candidates, `$1` the shortest `recovery.publish_stale`.
pub const PUBLISH_STALE_RUNS: &str = "SELECT run_id, job_key, extract(epoch FROM clock_timestamp() - publish_started_at)::float8 FROM nifi_ops.load_run \
              WHERE status = 'PUBLISHING' AND publish_started_at < clock_timestamp() - make_interval(secs => $1) \
              ORDER BY publish_started_at, run_id";

/// Rule 6, the due cleaned runs: `$1` jobs with their own settings, `$2` their
/// `event_retention`, `$3` the global one, `$4` the shortest of them all, `$5` how many runs.
/// A run is due when its `events_kept_from` (a lower bound of its events' times, see
/// `migrations/20261203000008_event_retention_watermark.sql`) is older than its retention; the
/// shortest retention bounds the range of `ix_load_run_events_due` (an index condition: the bound
/// is stable), the run's own is checked on the row. A cleaned run with nothing due is not read.
/// Each run with its cutoff, locked without waiting (`FOR NO KEY UPDATE`: event inserts, which
/// take a key-share lock on their run, are not blocked).
pub const EVENT_RETENTION_RUNS: &str = "SELECT r.run_id, statement_timestamp() \
         - make_interval(secs => COALESCE(($2::float8[])[array_position($1::text[], r.job_key::text)], $3)) AS cutoff \
       FROM nifi_ops.load_run r \
      WHERE r.cleaned_at IS NOT NULL \
        AND r.events_kept_from < statement_timestamp() - make_interval(secs => $4) \
        AND r.events_kept_from < statement_timestamp() \
              - make_interval(secs => COALESCE(($2::float8[])[array_position($1::text[], r.job_key::text)], $3)) \
      ORDER BY r.events_kept_from, r.run_id LIMIT $5 FOR NO KEY UPDATE SKIP LOCKED";

/// Rule 6, the events: `$1` the due runs, `$2` their cutoffs; each run's old events from
/// `ix_load_event_run_time` (the inner LIMIT keeps that a parameterized index scan), at most
/// 10,000 in all, to the primary key as one array.
pub const EVENT_RETENTION: &str = "DELETE FROM nifi_ops.load_event WHERE event_id = ANY (ARRAY( \
       SELECT e.event_id FROM unnest($1::uuid[], $2::timestamptz[]) AS d(run_id, cutoff) \
        CROSS JOIN LATERAL (SELECT e.event_id FROM nifi_ops.load_event e \
                             WHERE e.run_id = d.run_id AND e.event_time < d.cutoff LIMIT 10000) e \
        LIMIT 10000))";

/// Rule 6, the runs visited get their bound again: their oldest event left (still due when the
/// 10,000 cap left some), or, with none left, the visit's time less a margin of half the
/// retention, at most a day (an event written meanwhile may carry an event_time a little older
/// than its commit). `$1` the runs, `$2` their cutoffs.
pub const EVENT_RETENTION_MARK: &str = "UPDATE nifi_ops.load_run r SET events_kept_from = LEAST( \
         COALESCE((SELECT min(e.event_time) FROM nifi_ops.load_event e WHERE e.run_id = r.run_id), 'infinity'), \
         statement_timestamp() - LEAST(interval '1 day', \
           (statement_timestamp() - ($2::timestamptz[])[array_position($1::uuid[], r.run_id)]) / 2)) \
       WHERE r.run_id = ANY ($1::uuid[])";

/// Runs rule 6 visits per tick at most (the events deleted are capped at 10,000 as well).
pub const EVENT_RETENTION_RUN_BATCH: i64 = 1000;
