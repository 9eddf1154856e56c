-- contract: unused since schema version 0: the index ix_load_partition_recovery (status, heartbeat_at) WHERE status IN ('RUNNING','RETRY'), which no statement of any release names
-- Issue 30 item 2: a partition's heartbeat (written by chunk reports, at most once a second) is a
-- HOT update only if no index holds heartbeat_at; ix_load_partition_recovery did, so every refresh
-- inserted into all of the table's indexes. Its replacement keeps what bounds the sweeper's
-- recovery scan, the live partitions only (RUNNING, RETRY: those of active runs, as many as are
-- being extracted), and leaves the heartbeat to be checked on the row. The sweeper's statements
-- are unchanged; tests/plans.rs keeps them bounded.
CREATE INDEX IF NOT EXISTS ix_load_partition_live ON nifi_ops.load_partition (status, run_id)
    WHERE status IN ('RUNNING', 'RETRY');
DROP INDEX IF EXISTS nifi_ops.ix_load_partition_recovery;
