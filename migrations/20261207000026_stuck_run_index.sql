-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY; an index a failed
-- build left INVALID is dropped by the migration runner before this runs again.
-- Sweeper rule 4 (issue 43 item 3): the runs stuck in STAGE_VALIDATING or PUBLISHED, with what the
-- rule reads of them, so that the selection is an index-only scan rather than a page of the run
-- table per stuck run on every tick (404 of 2,029 pages at 100,000 runs with 400 stuck). Partial:
-- a run's heartbeat outside these two statuses (the hot path's) adds no entry to it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_load_run_stuck ON nifi_ops.load_run (heartbeat_at)
    INCLUDE (run_id, job_key, business_key, status) WHERE status IN ('STAGE_VALIDATING', 'PUBLISHED');
