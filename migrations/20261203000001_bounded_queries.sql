-- [v1-ext] Indexes that bound every periodic and listing query of a ledger with a year of history
-- (issue 26): each serves one selection that read the whole table before. Only adds; idempotent.
-- ledger/tests/plans.rs proves from EXPLAIN that the queries of ledger/src/ops use them.

-- GET /v1/runs without a jobKey: newest first, LIMIT served by the index (§4.4).
CREATE INDEX IF NOT EXISTS ix_load_run_started ON nifi_ops.load_run (started_at DESC, run_id);
-- … and with a businessKey but no jobKey (a business date across jobs).
CREATE INDEX IF NOT EXISTS ix_load_run_business_started ON nifi_ops.load_run (business_key, started_at DESC, run_id);

-- The planner's estimate of an end-time window: expression statistics (those of the partial
-- indexes below are not used for estimates), so that a 24-hour window is known to be small.
CREATE STATISTICS IF NOT EXISTS nifi_ops.st_load_run_end ON (COALESCE(completed_at, heartbeat_at)) FROM nifi_ops.load_run;

-- Final runs by end time: the monitor's recentRuns and RUN_FAILED (last 24 h, §4.20). Active rows
-- (the ones whose heartbeat moves) are not in it.
CREATE INDEX IF NOT EXISTS ix_load_run_final_end ON nifi_ops.load_run ((COALESCE(completed_at, heartbeat_at)), status)
    WHERE status NOT IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED',
                         'PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN');

-- A job's final runs by end time: the LoadJob status's last run and its counts of the last 24 h.
CREATE INDEX IF NOT EXISTS ix_load_run_job_final_end ON nifi_ops.load_run (job_key, (COALESCE(completed_at, heartbeat_at)))
    WHERE status NOT IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED',
                         'PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN');

-- lca_active_runs counts every status over all history (§9.1): the final ones by an index-only
-- scan of this narrow index (deduplicated: a few pages for tens of thousands of runs).
CREATE INDEX IF NOT EXISTS ix_load_run_final_status ON nifi_ops.load_run (status)
    WHERE status NOT IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED',
                         'PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN');

-- Cleanup candidates (§4.18) in end-time order, with and without a jobKey: only runs that can
-- become due (not cleaned, in the SUCCESS or failed cleanup class).
CREATE INDEX IF NOT EXISTS ix_load_run_cleanup_end ON nifi_ops.load_run ((COALESCE(completed_at, heartbeat_at)), run_id)
    WHERE cleaned_at IS NULL AND status IN ('SUCCESS','FAILED_MANIFEST','FAILED_EXTRACT','FAILED_STAGE_VALIDATION',
                                            'FAILED_PUBLISH','FAILED_TARGET_VALIDATION','FAILED_SNAPSHOT_EXPIRED',
                                            'TIMED_OUT','CANCELLED');
CREATE INDEX IF NOT EXISTS ix_load_run_cleanup_job_end ON nifi_ops.load_run (job_key, (COALESCE(completed_at, heartbeat_at)), run_id)
    WHERE cleaned_at IS NULL AND status IN ('SUCCESS','FAILED_MANIFEST','FAILED_EXTRACT','FAILED_STAGE_VALIDATION',
                                            'FAILED_PUBLISH','FAILED_TARGET_VALIDATION','FAILED_SNAPSHOT_EXPIRED',
                                            'TIMED_OUT','CANCELLED');

-- Cleaned runs: event retention (§7.2 rule 6) and history retention (rule 7, which adds the same
-- index under the same name).
CREATE INDEX IF NOT EXISTS ix_load_run_cleaned_end ON nifi_ops.load_run ((COALESCE(completed_at, heartbeat_at)), run_id)
    WHERE cleaned_at IS NOT NULL;

-- DEAD dispatches: the raw count of lca_dispatch_backlog and the monitor (index-only), and the
-- ones that raise DISPATCH_DEAD (not settled because their run ended).
CREATE INDEX IF NOT EXISTS ix_load_dispatch_dead ON nifi_ops.load_dispatch (run_id) WHERE status = 'DEAD';
CREATE INDEX IF NOT EXISTS ix_load_dispatch_dead_alert ON nifi_ops.load_dispatch (next_attempt_at, run_id)
    WHERE status = 'DEAD' AND COALESCE(last_error, '') NOT LIKE 'run ended: %';

-- The lease scan's second branch (§6.3): PENDING rows leased by a deposed epoch.
CREATE INDEX IF NOT EXISTS ix_load_dispatch_leased ON nifi_ops.load_dispatch (leased_epoch, next_attempt_at)
    WHERE status = 'PENDING' AND leased_epoch IS NOT NULL;

-- The monitor's CLEANUP_FAILED alert (last 24 h): a handful of rows among millions of events.
CREATE INDEX IF NOT EXISTS ix_load_event_cleanup_failed ON nifi_ops.load_event (event_time DESC, run_id)
    WHERE event_name = 'CLEANUP_FAILED';
