-- [v1-ext] History retention (CONTRACT §7.2 rule 7): cleaned runs whose end time is older than
-- cleanup.history_retention are deleted with their rows, a bounded batch per sweeper tick.

-- The selection of due runs, oldest end time first, served by an index (the same definition as in
-- migration 20261203000001: whichever runs first creates it, the other finds it).
CREATE INDEX IF NOT EXISTS ix_load_run_cleaned_end
    ON nifi_ops.load_run ((COALESCE(completed_at, heartbeat_at)), run_id)
    WHERE cleaned_at IS NOT NULL;

-- Run-less events by time need no index of their own: `run_id IS NULL AND event_time < $1` is a
-- range of ix_load_event_run_time (run_id, event_time DESC), whose btree keeps the NULL run ids
-- together.

-- Grants (§1.9), only for a role that exists: the sweeper deletes a run with every row of it.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT DELETE ON nifi_ops.load_run, nifi_ops.load_partition, nifi_ops.load_file,
            nifi_ops.load_validation, nifi_ops.load_dispatch, nifi_ops.load_event
            TO load_control_api;
    END IF;
END
$$;
