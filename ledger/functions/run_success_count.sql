-- nifi_ops.run_success_count: How many of a run's partitions are SUCCESS: the one rule of
-- success_partition_count, stored by tr_load_run_success_recount when a run leaves EXTRACTING and
-- read live (ledger/src/ops/read.rs) while it is EXTRACTING, when partition successes do not write
-- it.
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
--
-- VOLATILE, not STABLE: its count takes a snapshot of its own, as the recount did when it was
-- written in the trigger, so a transition that waited for the run row counts the successes
-- committed while it waited (a STABLE function would count from the waiting statement's snapshot).
-- plpgsql, not sql: PostgreSQL 15 plans a SQL function's statement at every call, plpgsql once per
-- session.
CREATE OR REPLACE FUNCTION nifi_ops.run_success_count(p_run_id uuid)
    RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*) FROM nifi_ops.load_partition p
             WHERE p.run_id = p_run_id AND p.status = 'SUCCESS');
END
$$;
