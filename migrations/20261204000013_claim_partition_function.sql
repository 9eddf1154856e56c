-- One round trip for a partition claim (issue 30 item 1).
--
-- A claim (CONTRACT §4.6) was seven statements inside BEGIN … COMMIT: the run lock, the partition
-- lock, the claim, the REISSUE acknowledgement, the event, the run heartbeat. A claim never decides
-- anything beyond its own partition, so the whole of it runs here, in the same order and under the
-- same locks, as one statement: called on its own (autocommit), a claim is one round trip, and
-- still one transaction with its event.
--
-- Each step is its own statement in a VOLATILE function, so under READ COMMITTED each takes a
-- snapshot of its own after the waits before it. That is what the answer relies on: the run row
-- read with the run lock may be older than the waits (`FOR KEY SHARE` locks the version it saw
-- when the newer one came from a non-key update, which is how the report that completes the
-- extraction changes the status, §5.3 rule 3), so the run's status is read again by the statement
-- that locks the partition, after the run locks were granted, and once more after that lock when
-- the claim is refused for the partition's status (the partition may have been waited for behind
-- the report that completed the run). A claim decides on, and answers, the status as the locks
-- left it (issue 30 item 4).
--
-- Outcomes: RUN_NOT_FOUND, PARTITION_NOT_FOUND (nothing written), ANSWERED (claimed says whether
-- the caller owns the partition now). Repeating a claim is safe: the same token finds its partition
-- RUNNING, refreshes its heartbeat and answers the same attempt, which is what lets the ledger
-- repeat this statement when its connection was lost before the answer came back.
CREATE OR REPLACE FUNCTION nifi_ops.claim_partition(
    p_run_id uuid,
    p_partition_id text,
    p_claim_token uuid,
    p_worker_node text,
    -- The run's advisory lock key (ledger::store::run_lock_key).
    p_lock_key1 integer,
    p_lock_key2 integer,
    -- The id of the PARTITION_STARTED event, time-ordered, from the caller (UUID v7).
    p_event_id uuid,
    OUT outcome text,
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
    INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, job_key, business_key,
                                     partition_id, process_group, processor_name, details)
    VALUES (p_event_id, 'INFO', 'PARTITION_STARTED', p_run_id, v_job_key, v_business_key,
            p_partition_id, 'LOAD_CONTROL_API', 'partition_started',
            jsonb_build_object('workerNode', p_worker_node, 'attempt', attempt));
    -- §4.6 step 5 and §5.3 rule 5, last: taken earlier, the run row's lock would be held across
    -- the REISSUE acknowledgement (which can wait behind a sweeper tick), and the run's other
    -- reports behind it. Never waits: skipped when fresh or when another transaction holds it.
    UPDATE nifi_ops.load_run SET heartbeat_at = clock_timestamp()
     WHERE run_id IN (SELECT r.run_id FROM nifi_ops.load_run r
                       WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING'
                         AND r.heartbeat_at < clock_timestamp() - interval '1 second'
                         FOR NO KEY UPDATE SKIP LOCKED);
    partition_status := 'RUNNING';
    claimed := true;
END
$$;

-- Only the api-server runs it (§1.9: it writes with the api role's own table grants; NiFi's
-- runtime role may not).
REVOKE ALL ON FUNCTION nifi_ops.claim_partition(uuid, text, uuid, text, integer, integer, uuid) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT EXECUTE ON FUNCTION nifi_ops.claim_partition(uuid, text, uuid, text, integer, integer, uuid)
            TO load_control_api;
    END IF;
END
$$;
