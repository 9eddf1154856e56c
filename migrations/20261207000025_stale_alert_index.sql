-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY; an index a failed
-- build left INVALID is dropped by the migration runner before this runs again.
-- Sweeper rule 4 (issue 43 item 3): the stuck runs alerted within their window are one range of
-- this index (the alerts of the longest window, a few pages, read without the table once vacuum
-- has marked them visible), not a probe of each stuck run's events on every tick: at 100,000 runs
-- with 400 stuck, the probes were 1,600 of the tick's 2,029 buffer pages.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_load_event_stale_alert ON nifi_ops.load_event (event_time) INCLUDE (run_id)
    WHERE event_name = 'RUN_STALE_ALERT';
