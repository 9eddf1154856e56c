-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY, so that NiFi's
-- writes to the table never wait for it; an index a failed build left INVALID is dropped by the
-- migration runner (ledger/src/migrate.rs) before this runs again.
-- contract: unused since schema version 0: the index ix_load_file_partition_status (run_id, partition_id, status), which no statement of any release names
-- Split from migration 20261203000006 (one CONCURRENTLY statement per migration): it leads with
-- load_file's primary key columns, which serve every lookup it served.
DROP INDEX CONCURRENTLY IF EXISTS nifi_ops.ix_load_file_partition_status;
