-- nifi_ops.transition: Every run status change (§2.2): the CAS, heartbeat, version, NOTIFY, and what entering the
-- target does as nifi_ops.run_transition says (aborted partitions, settled dispatches).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.transition(
    p_run_id uuid,
    p_from text,
    p_to text,
    -- What happens to error_stage, error_code and error_message: keep, clear or set.
    p_error_mode text,
    p_error_stage text,
    p_error_code text,
    p_error_message text,
    OUT changed boolean,
    OUT aborted bigint)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_step nifi_ops.run_transition%ROWTYPE;
BEGIN
    aborted := 0;
    SELECT * INTO v_step FROM nifi_ops.run_transition t
     WHERE t.from_status = p_from AND t.to_status = p_to;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'LC002',
            MESSAGE = format('run %s: %s -> %s is not a run transition', p_run_id, p_from, p_to);
    END IF;
    UPDATE nifi_ops.load_run SET status = p_to,
           error_stage = CASE p_error_mode WHEN 'keep' THEN error_stage WHEN 'clear' THEN NULL ELSE p_error_stage END,
           error_code = CASE p_error_mode WHEN 'keep' THEN error_code WHEN 'clear' THEN NULL ELSE p_error_code END,
           error_message = CASE p_error_mode WHEN 'keep' THEN error_message WHEN 'clear' THEN NULL ELSE p_error_message END,
           completed_at = CASE WHEN v_step.terminal THEN clock_timestamp() ELSE completed_at END,
           -- Entering EXTRACTED_VALIDATED (the completion's only, §4.8): the rows extracted and
           -- when, in this one row version.
           extracted_count = CASE WHEN p_to = 'EXTRACTED_VALIDATED'
                                  THEN (SELECT COALESCE(sum(p.actual_row_count), 0)
                                          FROM nifi_ops.load_partition p WHERE p.run_id = p_run_id)
                                  ELSE extracted_count END,
           extract_completed_at = CASE WHEN p_to = 'EXTRACTED_VALIDATED' THEN clock_timestamp()
                                       ELSE extract_completed_at END,
           -- Leaving EXTRACTING, tr_load_run_success_recount stores success_partition_count
           -- from a recount (for every release's transitions, so only there).
           heartbeat_at = clock_timestamp(), version_no = version_no + 1
     WHERE run_id = p_run_id AND status = p_from;
    changed := FOUND;
    IF NOT changed THEN
        RETURN;
    END IF;
    PERFORM pg_notify('load_run', p_run_id::text);
    IF v_step.aborts_partitions THEN
        UPDATE nifi_ops.load_partition SET status = 'ABORTED', completed_at = clock_timestamp(),
               heartbeat_at = clock_timestamp(), error_code = p_to, error_message = 'run ended: ' || p_to
         WHERE run_id = p_run_id AND status IN ('PENDING', 'RUNNING', 'RETRY');
        GET DIAGNOSTICS aborted = ROW_COUNT;
    END IF;
    IF v_step.settled_dispatch_error IS NOT NULL THEN
        UPDATE nifi_ops.load_dispatch SET status = 'DEAD', last_error = v_step.settled_dispatch_error
         WHERE run_id = p_run_id AND status IN ('PENDING', 'SENT');
    END IF;
END
$$;
