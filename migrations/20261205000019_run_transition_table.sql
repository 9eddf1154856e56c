-- The run state machine as one table, enforced by the database (issue 39 item 1).
--
-- * `run_transition`: every status change of CONTRACT §2.2 and what entering its target does
--   (terminal: `completed_at`; aborting: unfinished partitions ABORTED; the `last_error` of the
--   dispatches it settles as DEAD). Its rows are generated from ledger/src/machine.rs
--   (`RUN_TRANSITIONS`, `sql_rows`); ledger/tests/run_machine.rs holds the table, this file and the
--   spin model's RUN_TRANSITION to it.
-- * `tr_load_run_transition_allowed`: any UPDATE that changes `load_run.status` to a pair not in
--   the table is refused with SQLSTATE LC002, a hand-written statement included.
-- * `transition`: the CAS of every run status change, now reading what entering the status does
--   from the table instead of taking it as arguments. The 10-argument form of migration
--   20261205000017 stays, unused, because migrations only add within a release (expand/contract,
--   ledger/tests/expand_contract.rs); the first contracting migration of schema version 2 drops it.
--   `start_validation` is the same as in migration 20261204000016 but for its call of the new
--   form.
CREATE TABLE nifi_ops.run_transition (
    from_status text NOT NULL,
    to_status text NOT NULL,
    terminal boolean NOT NULL,
    aborts_partitions boolean NOT NULL,
    settled_dispatch_error text,
    PRIMARY KEY (from_status, to_status),
    CHECK (terminal = (settled_dispatch_error IS NOT NULL))
);

INSERT INTO nifi_ops.run_transition (from_status, to_status, terminal, aborts_partitions,
                                     settled_dispatch_error)
VALUES
    ('CREATED', 'EXTRACTING', false, false, NULL),
    ('CREATED', 'FAILED_MANIFEST', true, true, 'run ended: FAILED_MANIFEST'),
    ('CREATED', 'TIMED_OUT', true, false, 'run ended: TIMED_OUT'),
    ('EXTRACTING', 'TIMED_OUT', true, false, 'run ended: TIMED_OUT'),
    ('EXTRACTING', 'EXTRACTED_VALIDATED', false, false, NULL),
    ('EXTRACTING', 'FAILED_EXTRACT', true, true, 'run ended: FAILED_EXTRACT'),
    ('EXTRACTING', 'FAILED_SNAPSHOT_EXPIRED', true, true, 'run ended: FAILED_SNAPSHOT_EXPIRED'),
    ('EXTRACTED_VALIDATED', 'STAGE_VALIDATING', false, false, NULL),
    ('STAGE_VALIDATING', 'STAGING_VALIDATED', false, false, NULL),
    ('STAGE_VALIDATING', 'FAILED_STAGE_VALIDATION', true, true, 'run ended: FAILED_STAGE_VALIDATION'),
    ('STAGING_VALIDATED', 'PUBLISHING', false, false, NULL),
    ('STAGING_VALIDATED', 'FAILED_PUBLISH', true, true, 'run ended: FAILED_PUBLISH'),
    ('PUBLISHING', 'PUBLISHED', false, false, NULL),
    ('PUBLISHING', 'FAILED_PUBLISH', true, true, 'run ended: FAILED_PUBLISH'),
    ('PUBLISHING', 'PUBLISH_UNKNOWN', false, false, NULL),
    ('PUBLISH_UNKNOWN', 'PUBLISHED', false, false, NULL),
    ('PUBLISH_UNKNOWN', 'FAILED_PUBLISH', true, true, 'run ended: FAILED_PUBLISH'),
    ('PUBLISHED', 'SUCCESS', true, false, 'run ended: SUCCESS'),
    ('PUBLISHED', 'FAILED_TARGET_VALIDATION', true, true, 'run ended: FAILED_TARGET_VALIDATION'),
    ('CREATED', 'CANCELLED', true, true, 'run cancelled'),
    ('EXTRACTING', 'CANCELLED', true, true, 'run cancelled'),
    ('EXTRACTED_VALIDATED', 'CANCELLED', true, true, 'run cancelled'),
    ('STAGE_VALIDATING', 'CANCELLED', true, true, 'run cancelled'),
    ('STAGING_VALIDATED', 'CANCELLED', true, true, 'run cancelled'),
    ('CREATED', 'PUBLISH_UNKNOWN', false, false, NULL),
    ('EXTRACTING', 'PUBLISH_UNKNOWN', false, false, NULL),
    ('EXTRACTED_VALIDATED', 'PUBLISH_UNKNOWN', false, false, NULL),
    ('STAGE_VALIDATING', 'PUBLISH_UNKNOWN', false, false, NULL),
    ('STAGING_VALIDATED', 'PUBLISH_UNKNOWN', false, false, NULL);

CREATE FUNCTION nifi_ops.load_run_transition_allowed() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM nifi_ops.run_transition t
                    WHERE t.from_status = OLD.status AND t.to_status = NEW.status) THEN
        RAISE EXCEPTION USING ERRCODE = 'LC002',
            MESSAGE = format('run %s: %s -> %s is not a run transition', OLD.run_id, OLD.status, NEW.status),
            HINT = 'nifi_ops.run_transition lists every status change a run may make';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER tr_load_run_transition_allowed
    BEFORE UPDATE OF status ON nifi_ops.load_run
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION nifi_ops.load_run_transition_allowed();

CREATE FUNCTION nifi_ops.transition(
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
        SELECT t.changed INTO v_won
          FROM nifi_ops.transition(p_run_id, 'EXTRACTED_VALIDATED', 'STAGE_VALIDATING', 'keep',
                                   NULL, NULL, NULL) t;
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

-- Only load-control's own role runs them and reads the table (the api-server and the operator
-- both connect as `load_control_api`, §1.9); nobody but the migration writes the table.
REVOKE ALL ON nifi_ops.run_transition FROM PUBLIC;
REVOKE ALL ON FUNCTION nifi_ops.transition(uuid, text, text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION nifi_ops.start_validation(uuid, uuid, text, integer, integer, uuid) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT SELECT ON nifi_ops.run_transition TO load_control_api;
        GRANT EXECUTE ON FUNCTION nifi_ops.transition(uuid, text, text, text, text, text, text)
            TO load_control_api;
        GRANT EXECUTE ON FUNCTION nifi_ops.start_validation(uuid, uuid, text, integer, integer, uuid)
            TO load_control_api;
    END IF;
END
$$;
