-- [v1-ext] Housekeeping for a busy ledger (issue 26 item 4; docs/operations.md "Ledger growth and
-- vacuum"). Storage parameters only: nothing is dropped, running it again changes nothing, and
-- ALTER TABLE … SET takes a SHARE UPDATE EXCLUSIVE lock (reads and writes go on).
--
-- Why: PostgreSQL's defaults vacuum a table once 20 % of it is dead (autovacuum_vacuum_scale_factor
-- 0.2) and after 20 % new rows (…_insert_scale_factor 0.2). On a ledger with a year of history
-- that is hundreds of thousands of dead partition and dispatch versions, or millions of events,
-- before autovacuum looks: the hot rows (the runs, partitions and outbox rows of today) sit among
-- dead versions, index scans fetch them, and the visibility map that index-only scans and the
-- gauges' counts rely on (tests/plans.rs) lags behind. Thresholds in rows (plus a small fraction)
-- keep the vacuum work per pass proportional to the day's activity, not to the history.
--
-- fillfactor: runs, partitions and outbox rows are updated several times each (claim, heartbeat,
-- chunk counts, status, lease); free space on their page lets the new version stay there
-- (HOT when no indexed column changed), so updates do not scatter the hot rows across the table.
-- It applies to pages written from now on.
ALTER TABLE nifi_ops.load_run SET (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_insert_threshold = 1000);
ALTER TABLE nifi_ops.load_partition SET (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_insert_threshold = 10000);
ALTER TABLE nifi_ops.load_dispatch SET (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_insert_threshold = 1000);
-- Files are written once and verified once; events are only inserted (and deleted by retention).
ALTER TABLE nifi_ops.load_file SET (
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_insert_threshold = 50000);
ALTER TABLE nifi_ops.load_event SET (
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_insert_threshold = 50000);
