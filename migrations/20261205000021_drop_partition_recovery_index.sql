-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY, so that NiFi's
-- writes to the table never wait for it; an index a failed build left INVALID is dropped by the
-- migration runner (ledger/src/migrate.rs) before this runs again.
-- contract: unused since schema version 0: the index ix_load_partition_recovery (status, heartbeat_at) WHERE status IN ('RUNNING','RETRY'), which no statement of any release names
-- Split from migration 20261203000007, which builds its replacement ix_load_partition_live.
DROP INDEX CONCURRENTLY IF EXISTS nifi_ops.ix_load_partition_recovery;
