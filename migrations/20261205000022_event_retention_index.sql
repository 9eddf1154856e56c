-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY, so that NiFi's
-- writes to the table never wait for it; an index a failed build left INVALID is dropped by the
-- migration runner (ledger/src/migrate.rs) before this runs again.
-- Split from migration 20261203000008 (a column and its index never in one transaction): the due
-- cleaned runs, oldest bound first, a range of this partial index (uncleaned runs, the majority,
-- are not in it).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_load_run_events_due ON nifi_ops.load_run (events_kept_from, run_id)
    WHERE cleaned_at IS NOT NULL;
