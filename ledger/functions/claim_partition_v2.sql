-- nifi_ops.claim_partition_v2: A partition claim (§4.6): the run's shared lock, the partition's row lock, the token, the
-- attempt, the REISSUE acknowledgement, PARTITION_STARTED and the run heartbeat, in one statement.
-- Its outcome is a nifi_ops.claim_partition_outcome (ledger::outcome::ClaimPartitionOutcome).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.claim_partition_v2(
    p_run_id uuid,
    p_partition_id text,
    p_claim_token uuid,
    p_worker_node text,
    -- The run's advisory lock key (ledger::store::run_lock_key).
    p_lock_key1 integer,
    p_lock_key2 integer,
    -- The id of the PARTITION_STARTED event, time-ordered, from the caller (UUID v7).
    p_event_id uuid,
    OUT outcome nifi_ops.claim_partition_outcome,
    OUT claimed boolean,
    OUT run_status text,
    OUT partition_status text,
    OUT attempt integer,
    -- How long the run lock took.
    OUT lock_wait_seconds double precision)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_started timestamptz := clock_timestamp();
    v_job_key text;
    v_business_key text;
    v_claim_token uuid;
BEGIN
    claimed := false;
    -- §5.3 rule 2: the run's shared lock, the advisory lock then the row FOR KEY SHARE, so that
    -- claims and reports of sibling partitions never wait for each other.
    SELECT r.job_key, r.business_key INTO v_job_key, v_business_key
      FROM nifi_ops.load_run r, pg_advisory_xact_lock_shared(p_lock_key1, p_lock_key2)
     WHERE r.run_id = p_run_id FOR KEY SHARE OF r;
    IF NOT FOUND THEN
        outcome := 'RUN_NOT_FOUND';
        RETURN;
    END IF;
    lock_wait_seconds := extract(epoch FROM clock_timestamp() - v_started);
    -- §4.6 step 2: the partition's row lock decides ownership.
    SELECT p.status, p.claim_token, p.attempt_count,
           (SELECT r.status FROM nifi_ops.load_run r WHERE r.run_id = p_run_id)
      INTO partition_status, v_claim_token, attempt, run_status
      FROM nifi_ops.load_partition p
     WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'PARTITION_NOT_FOUND';
        RETURN;
    END IF;
    outcome := 'ANSWERED';
    IF run_status <> 'EXTRACTING' THEN
        RETURN;
    END IF;
    IF partition_status = 'RUNNING' AND v_claim_token = p_claim_token THEN
        -- The same worker again: its previous answer was lost.
        UPDATE nifi_ops.load_partition p SET heartbeat_at = clock_timestamp()
         WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id;
        claimed := true;
        RETURN;
    END IF;
    IF partition_status NOT IN ('PENDING', 'RETRY') THEN
        -- Answered as the report that finished the partition left the run (while this claim holds
        -- an unfinished partition no completion can happen, so the other answers are EXTRACTING).
        SELECT r.status INTO run_status FROM nifi_ops.load_run r WHERE r.run_id = p_run_id;
        RETURN;
    END IF;
    UPDATE nifi_ops.load_partition p
       SET status = 'RUNNING', claim_token = p_claim_token, worker_node = p_worker_node,
           attempt_count = p.attempt_count + 1, started_at = COALESCE(p.started_at, clock_timestamp()),
           heartbeat_at = clock_timestamp(), error_code = NULL, error_message = NULL
     WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id
    RETURNING p.attempt_count INTO attempt;
    IF partition_status = 'RETRY' THEN
        -- The reissue reached a worker: its dispatches are acknowledged (§6.6).
        UPDATE nifi_ops.load_dispatch d SET status = 'ACKED', acked_at = clock_timestamp()
         WHERE d.run_id = p_run_id AND d.partition_id = p_partition_id
           AND d.dispatch_type = 'REISSUE_PARTITION' AND d.status <> 'ACKED';
    END IF;
    PERFORM nifi_ops.record_event(p_event_id, 'INFO', 'PARTITION_STARTED', NULL, p_run_id, v_job_key,
                                  v_business_key, p_partition_id, NULL, NULL, NULL, NULL, NULL,
                                  jsonb_build_object('workerNode', p_worker_node, 'attempt', attempt));
    -- §4.6 step 5 and §5.3 rule 5, last: taken earlier, the run row's lock would be held across
    -- the REISSUE acknowledgement (which can wait behind a sweeper tick), and the run's other
    -- reports behind it.
    PERFORM nifi_ops.beat_run(p_run_id);
    partition_status := 'RUNNING';
    claimed := true;
END
$$;
