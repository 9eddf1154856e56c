-- Mixed releases and the completion (issue 30 item 3). This release's partition successes no
-- longer write load_run.success_partition_count while the run is EXTRACTING (the count is computed
-- when read, and stored on leaving EXTRACTING). Release 0.1.0 still increments it, in the
-- transaction that sets its partition SUCCESS:
--     UPDATE nifi_ops.load_run SET success_partition_count = success_partition_count + 1, …
--      WHERE run_id = $1 AND status = 'EXTRACTING' RETURNING success_partition_count, expected_partition_count
-- and runs its completion CAS only when the returned count equals the expected one. Once this
-- release's pods have handled some of a run's successes, that counter lags: a 0.1.0 pod handling
-- the last success (during a rolling upgrade, or after a rollback) would never complete the run.
--
-- This trigger makes 0.1.0's increment return the exact count. Whenever an update changes the
-- column while the run stays EXTRACTING (which only 0.1.0's increment and the manifest's move to
-- EXTRACTING do; this release changes it only when leaving EXTRACTING), the new value is replaced
-- by the count of the run's SUCCESS partitions. A BEFORE ROW trigger runs after the update has
-- won the run row's lock, and the function is VOLATILE: under READ COMMITTED its query takes a
-- snapshot of its own, after that wait, so it sees every success committed before (and the
-- updating transaction's own). Whoever of two possibly-last successes gets the run row second
-- (a 0.1.0 increment, or this release's `FOR NO KEY UPDATE` and recount) therefore sees the
-- first, whatever release each runs (spec/model/completion.pml, OLD reporters). It must stay
-- VOLATILE: a STABLE function would count from the update's snapshot, taken before the wait.
--
-- Cost: one primary-key range of the run per 0.1.0 success; nothing for this release's hot path
-- (its successes do not update the column, so the trigger does not fire). Drop it one release
-- after 0.1.0 can no longer run on this ledger.
CREATE OR REPLACE FUNCTION nifi_ops.load_run_success_recount() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    NEW.success_partition_count := (SELECT count(*) FROM nifi_ops.load_partition p
                                     WHERE p.run_id = NEW.run_id AND p.status = 'SUCCESS');
    RETURN NEW;
END
$$;

-- Created once (a re-run of the migration finds it); nothing is dropped.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = 'nifi_ops.load_run'::regclass AND tgname = 'tr_load_run_success_recount') THEN
        CREATE TRIGGER tr_load_run_success_recount
            BEFORE UPDATE OF success_partition_count ON nifi_ops.load_run
            FOR EACH ROW
            WHEN (NEW.success_partition_count IS DISTINCT FROM OLD.success_partition_count
                  AND NEW.status = 'EXTRACTING')
            EXECUTE FUNCTION nifi_ops.load_run_success_recount();
    END IF;
END
$$;
