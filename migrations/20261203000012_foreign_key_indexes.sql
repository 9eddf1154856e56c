-- no-transaction
-- Online (issue 40 item 1): one statement, outside a transaction, CONCURRENTLY, so that NiFi's
-- writes to the table never wait for it; an index a failed build left INVALID is dropped by the
-- migration runner (ledger/src/migrate.rs) before this runs again.
-- Every foreign key has an index that leads with its columns (issue 26): deleting or re-keying a
-- referenced row makes PostgreSQL look for referencing rows, once per row, and without such an
-- index that look is a sequential scan of the referencing table.
--
-- `load_run.retry_of_run_id` (a retry's original run) had none: each run deleted by history
-- retention (§7.2 rule 7) read the whole run table to find retries of it. Measured on the
-- one-year ledger of the aged benchmark (100,000 runs), `DELETE FROM nifi_ops.load_run WHERE
-- run_id = $1` took 36 ms of the run's 46 ms deletion. Few runs are retries, so the index is
-- partial: the check's `retry_of_run_id = $1` implies the predicate.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_load_run_retry_of ON nifi_ops.load_run (retry_of_run_id)
    WHERE retry_of_run_id IS NOT NULL;
