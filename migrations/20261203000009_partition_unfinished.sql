-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY, so that NiFi's
-- writes to the table never wait for it; an index a failed build left INVALID is dropped by the
-- migration runner (ledger/src/migrate.rs) before this runs again.
-- Issue 30 item 3: a partition success no longer increments load_run.success_partition_count (which
-- queued every success of a run on the run row); it pins one unfinished sibling partition, the
-- first after its own (`… AND partition_id > $2 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP
-- LOCKED`, then before it), and only when it finds none locks the run row and recounts. This index
-- holds the unfinished partitions only (PENDING, RUNNING, RETRY), so that search reads a handful
-- of index entries however many of the run's partitions have succeeded; a heartbeat refresh
-- (unindexed column) stays a HOT update.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_load_partition_unfinished ON nifi_ops.load_partition (run_id, partition_id)
    WHERE status IN ('PENDING', 'RUNNING', 'RETRY');
