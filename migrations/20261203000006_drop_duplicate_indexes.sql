-- contract: unused since schema version 0: the indexes ix_load_partition_status (run_id, status) and ix_load_file_partition_status (run_id, partition_id, status), which no statement of any release names
-- Issue 30 item 2: both lead with their table's primary key columns (load_partition (run_id,
-- partition_id), load_file (run_id, partition_id, chunk_index)), so the primary key serves every
-- lookup they served (a run's partitions, a partition's chunks, a handful of rows each with the
-- status checked on the row); they only cost an index insert per row and per non-HOT update, and
-- keep a chunk's status change (WRITTEN → VERIFIED/FAILED) from being a HOT update.
-- tests/plans.rs keeps every periodic and listing statement bounded without them, and
-- tests/schema_version.rs fails if either comes back.
DROP INDEX IF EXISTS nifi_ops.ix_load_partition_status;
DROP INDEX IF EXISTS nifi_ops.ix_load_file_partition_status;
