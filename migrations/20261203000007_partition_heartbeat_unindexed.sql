-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY, so that NiFi's
-- writes to the table never wait for it; an index a failed build left INVALID is dropped by the
-- migration runner (ledger/src/migrate.rs) before this runs again.
-- Issue 30 item 2 (the old index is dropped by migration 20261205000021): a partition's heartbeat (written by chunk reports, at most once a second) is a
-- HOT update only if no index holds heartbeat_at; ix_load_partition_recovery did, so every refresh
-- inserted into all of the table's indexes. Its replacement keeps what bounds the sweeper's
-- recovery scan, the live partitions only (RUNNING, RETRY: those of active runs, as many as are
-- being extracted), and leaves the heartbeat to be checked on the row. The sweeper's statements
-- are unchanged; tests/plans.rs keeps them bounded.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_load_partition_live ON nifi_ops.load_partition (status, run_id)
    WHERE status IN ('RUNNING', 'RETRY');
