-- The validation start in one round trip (issue 30 item 1), and every run status change as one
-- call.
--
-- * `transition`: the CAS of every run status change (CONTRACT §2.1–§2.2), the only copy, which
--   the ledger calls for each one (ledger/src/ops/transition.rs decides which are allowed, terminal
--   and aborting, and passes that): the status on the expected one, the error fields,
--   `completed_at` on entering a terminal status, `heartbeat_at`, `version_no`, leaving
--   EXTRACTING storing `success_partition_count` from a recount, the NOTIFY of the LoadRun mirror
--   (sent at commit, only when the CAS won), then the [v1-ext] closing of unfinished partitions
--   and pending dispatches. It was up to three statements sent one by one.
-- * `start_validation`: §4.9, the dispatch's ACK and the one-time start of stage validation,
--   which was a transaction of eight statements (BEGIN, the run lock, the dispatch's lock, the
--   ACK, the CAS, the event, the SOURCE metrics, COMMIT), now one, in the same order under the same
--   locks (the run's exclusive advisory lock and its row FOR UPDATE, as every run-changing
--   operation takes them).
--
-- A start is not repeatable (a second one is refused, §4.9), so when the connection of the one
-- statement is lost before its answer, the ledger repeats it with the same event id: a repeat
-- that finds its own STAGE_VALIDATION_STARTED answers the start it made, not a refusal.
--
-- Outcomes of start_validation: RUN_NOT_FOUND, DISPATCH_MISMATCH (nothing written), REFUSED (the
-- ACK only: a duplicate delivery is acknowledged too), STARTED.

CREATE OR REPLACE FUNCTION nifi_ops.transition(
    p_run_id uuid,
    p_from text,
    p_to text,
    -- What happens to error_stage, error_code and error_message: keep, clear or set.
    p_error_mode text,
    p_error_stage text,
    p_error_code text,
    p_error_message text,
    -- `p_to` is terminal (completed_at; pending dispatches DEAD with p_dead_reason) and ends the
    -- run's unfinished partitions (ABORTED).
    p_terminal boolean,
    p_aborts_partitions boolean,
    p_dead_reason text,
    OUT changed boolean,
    OUT aborted bigint)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    aborted := 0;
    UPDATE nifi_ops.load_run SET status = p_to,
           error_stage = CASE p_error_mode WHEN 'keep' THEN error_stage WHEN 'clear' THEN NULL ELSE p_error_stage END,
           error_code = CASE p_error_mode WHEN 'keep' THEN error_code WHEN 'clear' THEN NULL ELSE p_error_code END,
           error_message = CASE p_error_mode WHEN 'keep' THEN error_message WHEN 'clear' THEN NULL ELSE p_error_message END,
           completed_at = CASE WHEN p_terminal THEN clock_timestamp() ELSE completed_at END,
           heartbeat_at = clock_timestamp(), version_no = version_no + 1,
           -- Partition successes do not write it (issue 30 item 3); every caller holds the run
           -- FOR UPDATE, so no success is in flight, and none comes after EXTRACTING.
           success_partition_count = CASE WHEN p_from = 'EXTRACTING'
               THEN (SELECT count(*) FROM nifi_ops.load_partition p
                      WHERE p.run_id = p_run_id AND p.status = 'SUCCESS')
               ELSE success_partition_count END
     WHERE run_id = p_run_id AND status = p_from;
    changed := FOUND;
    IF NOT changed THEN
        RETURN;
    END IF;
    PERFORM pg_notify('load_run', p_run_id::text);
    IF p_aborts_partitions THEN
        UPDATE nifi_ops.load_partition SET status = 'ABORTED', completed_at = clock_timestamp(),
               heartbeat_at = clock_timestamp(), error_code = p_to, error_message = 'run ended: ' || p_to
         WHERE run_id = p_run_id AND status IN ('PENDING', 'RUNNING', 'RETRY');
        GET DIAGNOSTICS aborted = ROW_COUNT;
    END IF;
    IF p_terminal THEN
        UPDATE nifi_ops.load_dispatch SET status = 'DEAD', last_error = p_dead_reason
         WHERE run_id = p_run_id AND status IN ('PENDING', 'SENT');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION nifi_ops.start_validation(
    p_run_id uuid,
    p_dispatch_id uuid,
    p_node text,
    -- The run's advisory lock key (ledger::store::run_lock_key).
    p_lock_key1 integer,
    p_lock_key2 integer,
    -- The STAGE_VALIDATION_STARTED event's id (UUID v7, from the caller, the same on a repeat).
    p_event_id uuid,
    OUT outcome text,
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
        -- STAGE_VALIDATING is neither terminal nor aborting (ledger/src/status.rs; a unit test of
        -- ops/validation.rs holds this to it).
        SELECT t.changed INTO v_won
          FROM nifi_ops.transition(p_run_id, 'EXTRACTED_VALIDATED', 'STAGE_VALIDATING', 'keep',
                                   NULL, NULL, NULL, false, false, NULL) t;
        IF NOT v_won THEN
            RAISE EXCEPTION 'run % changed under FOR UPDATE', p_run_id;
        END IF;
        INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, job_key, business_key,
                                         process_group, processor_name, details)
        VALUES (p_event_id, 'INFO', 'STAGE_VALIDATION_STARTED', p_run_id, job_key, business_key,
                'LOAD_CONTROL_API', 'stage_validation_started',
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

-- Only load-control's own role runs them (the api-server and the operator both connect as
-- `load_control_api`, §1.9; NiFi's runtime role may not).
REVOKE ALL ON FUNCTION nifi_ops.transition(uuid, text, text, text, text, text, text, boolean, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION nifi_ops.start_validation(uuid, uuid, text, integer, integer, uuid) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT EXECUTE ON FUNCTION nifi_ops.transition(uuid, text, text, text, text, text, text, boolean, boolean, text)
            TO load_control_api;
        GRANT EXECUTE ON FUNCTION nifi_ops.start_validation(uuid, uuid, text, integer, integer, uuid)
            TO load_control_api;
    END IF;
END
$$;
