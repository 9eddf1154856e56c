-- nifi_ops.start_validation_v2: The validation start (§4.9): the dispatch ACK and EXTRACTED_VALIDATED -> STAGE_VALIDATING
-- with STAGE_VALIDATION_STARTED, once. Its outcome is a nifi_ops.start_validation_outcome
-- (ledger::outcome::StartValidationOutcome).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.start_validation_v2(
    p_run_id uuid,
    p_dispatch_id uuid,
    p_node text,
    -- The run's advisory lock key (ledger::store::run_lock_key).
    p_lock_key1 integer,
    p_lock_key2 integer,
    -- The STAGE_VALIDATION_STARTED event's id (UUID v7, from the caller, the same on a repeat).
    p_event_id uuid,
    OUT outcome nifi_ops.start_validation_outcome,
    OUT run_status text,
    OUT job_key text,
    OUT business_key text,
    OUT snapshot_scn text,
    OUT hdfs_run_path text,
    OUT stage_table_name text,
    OUT source_count bigint,
    OUT extracted_count bigint,
    -- The run's SOURCE metrics, name → latest actual value.
    OUT source_metrics jsonb)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_owner uuid;
    v_type text;
    v_won boolean;
BEGIN
    -- The run, exclusively (§5.3 rule 2): the advisory lock, then the row FOR UPDATE, which
    -- follows the update chain, so the columns read are the newest.
    SELECT r.status, r.job_key, r.business_key, r.snapshot_scn::text, r.hdfs_run_path,
           r.stage_table_name, r.source_count, r.extracted_count
      INTO run_status, job_key, business_key, snapshot_scn, hdfs_run_path, stage_table_name,
           source_count, extracted_count
      FROM nifi_ops.load_run r, pg_advisory_xact_lock(p_lock_key1, p_lock_key2)
     WHERE r.run_id = p_run_id FOR UPDATE OF r;
    IF NOT FOUND THEN
        outcome := 'RUN_NOT_FOUND';
        RETURN;
    END IF;
    SELECT d.run_id, d.dispatch_type INTO v_owner, v_type
      FROM nifi_ops.load_dispatch d WHERE d.dispatch_id = p_dispatch_id FOR UPDATE;
    IF v_owner IS DISTINCT FROM p_run_id OR v_type IS DISTINCT FROM 'VALIDATE_RUN' THEN
        outcome := 'DISPATCH_MISMATCH';
        RETURN;
    END IF;
    -- The ACK commits whatever the start decides (a duplicate delivery is acknowledged too).
    UPDATE nifi_ops.load_dispatch SET status = 'ACKED', acked_at = clock_timestamp()
     WHERE dispatch_id = p_dispatch_id AND status <> 'ACKED';
    IF run_status = 'EXTRACTED_VALIDATED' THEN
        SELECT t.changed INTO v_won
          FROM nifi_ops.transition(p_run_id, 'EXTRACTED_VALIDATED', 'STAGE_VALIDATING', 'keep',
                                   NULL, NULL, NULL) t;
        IF NOT v_won THEN
            RAISE EXCEPTION 'run % changed under FOR UPDATE', p_run_id;
        END IF;
        PERFORM nifi_ops.record_event(p_event_id, 'INFO', 'STAGE_VALIDATION_STARTED', NULL, p_run_id,
                                      job_key, business_key, NULL, NULL, NULL, NULL, NULL, NULL,
                                      jsonb_build_object('dispatchId', p_dispatch_id, 'node', p_node));
    ELSIF NOT EXISTS (SELECT 1 FROM nifi_ops.load_event e
                       WHERE e.event_id = p_event_id AND e.run_id = p_run_id
                         AND e.event_name = 'STAGE_VALIDATION_STARTED') THEN
        outcome := 'REFUSED';
        RETURN;
    END IF;
    -- Started here, or by this call's first attempt, whose answer was lost.
    outcome := 'STARTED';
    run_status := 'STAGE_VALIDATING';
    SELECT COALESCE(jsonb_object_agg(m.metric_name, m.actual_value), '{}'::jsonb) INTO source_metrics
      FROM (SELECT DISTINCT ON (v.metric_name) v.metric_name, v.actual_value
              FROM nifi_ops.load_validation v
             WHERE v.run_id = p_run_id AND v.stage = 'SOURCE'
             ORDER BY v.metric_name, v.measured_at DESC, v.validation_id DESC) m;
END
$$;
