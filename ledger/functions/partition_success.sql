-- nifi_ops.partition_success: A partition's success (§4.7 step 9): the CAS RUNNING -> SUCCESS under the claim token, its
-- PARTITION_SUCCESS event, and whether an unfinished sibling is pinned (then this is not the last).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.partition_success(
    p_run_id uuid,
    p_partition_id text,
    p_claim_token uuid,
    p_rows bigint,
    p_files integer,
    p_bytes bigint,
    -- The PARTITION_SUCCESS event: its id, time-ordered, from the caller (UUID v7), and the
    -- run's keys the caller read with the run lock.
    p_event_id uuid,
    p_job_key text,
    p_business_key text,
    OUT won boolean,
    OUT pinned boolean)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    pinned := false;
    UPDATE nifi_ops.load_partition
       SET status = 'SUCCESS', actual_row_count = p_rows, file_count = p_files,
           fragment_count = p_files, byte_count = p_bytes, completed_at = clock_timestamp(),
           heartbeat_at = clock_timestamp()
     WHERE run_id = p_run_id AND partition_id = p_partition_id AND status = 'RUNNING'
       AND claim_token = p_claim_token;
    won := FOUND;
    IF NOT won THEN
        RETURN;
    END IF;
    PERFORM nifi_ops.record_event(p_event_id, 'INFO', 'PARTITION_SUCCESS', NULL, p_run_id, p_job_key,
                                  p_business_key, p_partition_id, NULL, p_rows, NULL, NULL, NULL,
                                  jsonb_build_object('files', p_files, 'bytes', p_bytes));
    -- The pin: the first unfinished sibling after this partition (then before it) that no other
    -- transaction holds. `FOR KEY SHARE SKIP LOCKED` skips a row a report or a claim holds FOR
    -- UPDATE and re-checks a row updated since this statement's snapshot on its newest version.
    -- The pinned sibling cannot be decided before this transaction commits (its report takes it
    -- FOR UPDATE and waits), so its success will see this one.
    WITH after AS (
        SELECT 1 FROM nifi_ops.load_partition
         WHERE run_id = p_run_id AND partition_id > p_partition_id
           AND status IN ('PENDING', 'RUNNING', 'RETRY')
         ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED),
    before AS (
        SELECT 1 FROM nifi_ops.load_partition
         WHERE run_id = p_run_id AND partition_id < p_partition_id
           AND status IN ('PENDING', 'RUNNING', 'RETRY')
           AND NOT EXISTS (SELECT 1 FROM after)
         ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED)
    SELECT EXISTS (SELECT 1 FROM after) OR EXISTS (SELECT 1 FROM before) INTO pinned;
    -- §5.3 rule 5: the chunk statement left the run heartbeat to the decision.
    PERFORM nifi_ops.beat_run(p_run_id);
END
$$;
