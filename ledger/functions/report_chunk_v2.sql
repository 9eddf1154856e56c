-- nifi_ops.report_chunk_v2: A chunk report (§4.7), decided in one statement: record_chunk, the gate, the partition's
-- success and the completion. Its outcome is a nifi_ops.report_chunk_outcome
-- (ledger::outcome::ReportChunkOutcome).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.report_chunk_v2(
    p_run_id uuid,
    p_partition_id text,
    p_claim_token uuid,
    p_chunk_index integer,
    p_chunk_count integer,
    p_fragment_identifier text,
    p_hdfs_path text,
    p_record_count bigint,
    p_byte_count bigint,
    -- The run's advisory lock key (ledger::store::run_lock_key).
    p_lock_key1 integer,
    p_lock_key2 integer,
    -- The caller holds the run exclusively (advisory lock, row FOR UPDATE) and fails the
    -- partition itself on MISMATCH, in the same transaction.
    p_run_locked boolean,
    -- The ids of the events a decision writes (UUID v7, from the caller): PARTITION_SUCCESS,
    -- the VALIDATE_RUN dispatch, EXTRACT_VALIDATED.
    p_success_event_id uuid,
    p_dispatch_id uuid,
    p_extracted_event_id uuid,
    OUT outcome nifi_ops.report_chunk_outcome,
    OUT partition_status text,
    OUT run_status text,
    -- The partition's WRITTEN chunks with this one.
    OUT files bigint,
    OUT gate_message text,
    -- How long the run lock took, when this function took it.
    OUT lock_wait_seconds double precision)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    rec record;
    v_job_key text;
    v_business_key text;
    v_won boolean;
    v_pinned boolean;
BEGIN
    -- §4.7 steps 2–8 without writing: the locks, the checks, the aggregate with this chunk.
    SELECT * INTO rec FROM nifi_ops.record_chunk(
        p_run_id, p_partition_id, p_claim_token, p_chunk_index, p_chunk_count, p_fragment_identifier,
        p_hdfs_path, p_record_count, p_byte_count, p_lock_key1, p_lock_key2, p_run_locked, false);
    partition_status := rec.partition_status;
    run_status := rec.run_status;
    files := rec.files;
    lock_wait_seconds := rec.lock_wait_seconds;
    IF rec.outcome = 'RECORDED' THEN
        outcome := 'RECORDED';
        -- The repeat of this report's own decision, whose answer was lost: answered as decided.
        IF partition_status = 'SUCCESS' AND EXISTS (
               SELECT 1 FROM nifi_ops.load_event e
                WHERE e.event_id = p_success_event_id AND e.run_id = p_run_id
                  AND e.partition_id = p_partition_id AND e.event_name = 'PARTITION_SUCCESS') THEN
            outcome := 'PARTITION_SUCCESS';
            IF EXISTS (SELECT 1 FROM nifi_ops.load_event e
                        WHERE e.event_id = p_extracted_event_id AND e.run_id = p_run_id
                          AND e.event_name = 'EXTRACT_VALIDATED') THEN
                outcome := 'RUN_COMPLETE';
            END IF;
        END IF;
        RETURN;
    END IF;
    IF rec.outcome <> 'DECIDE' THEN
        -- A refusal: RUN_NOT_FOUND, PARTITION_NOT_FOUND, CLAIM_MISMATCH, HDFS_PATH_OUTSIDE_RUN.
        outcome := rec.outcome;
        RETURN;
    END IF;
    IF partition_status = 'SUCCESS' THEN
        -- record_chunk decides a SUCCESS partition only for a chunk that differs from the stored
        -- one. §4.7 step 5 (the path recorded by another chunk row: UNIQUE_VIOLATION) comes before
        -- step 6 (CHUNK_CONFLICT), as the upsert would have raised it.
        IF EXISTS (SELECT 1 FROM nifi_ops.load_file f
                    WHERE f.hdfs_path = p_hdfs_path
                      AND (f.run_id, f.partition_id, f.chunk_index) <> (p_run_id, p_partition_id, p_chunk_index)) THEN
            RAISE unique_violation USING CONSTRAINT = 'uq_load_file_path', TABLE = 'load_file',
                  SCHEMA = 'nifi_ops', MESSAGE = 'duplicate key value violates unique constraint "uq_load_file_path"';
        END IF;
        outcome := 'CONFLICT';
        RETURN;
    END IF;
    -- §4.7 step 9: the run EXTRACTING, the partition RUNNING, every chunk in.
    gate_message := nifi_ops.chunk_gate(rec.files, rec.lo, rec.hi, rec.rows_sum::numeric,
                                        rec.distinct_counts, p_chunk_count, rec.expected_row_count);
    IF gate_message IS NOT NULL AND NOT p_run_locked THEN
        outcome := 'ESCALATE';
        RETURN;
    END IF;
    -- The report decides: its chunk is recorded whatever the gate says (late and failing chunks
    -- still count for cleanup), under the locks this statement holds.
    SELECT * INTO rec FROM nifi_ops.record_chunk(
        p_run_id, p_partition_id, p_claim_token, p_chunk_index, p_chunk_count, p_fragment_identifier,
        p_hdfs_path, p_record_count, p_byte_count, p_lock_key1, p_lock_key2, true, true);
    IF rec.outcome <> 'RECORDED' THEN
        RAISE EXCEPTION 'record_chunk answered % under the locks of its first call', rec.outcome;
    END IF;
    files := rec.files;
    IF gate_message IS NOT NULL THEN
        outcome := 'MISMATCH';
        RETURN;
    END IF;
    SELECT r.job_key, r.business_key INTO v_job_key, v_business_key
      FROM nifi_ops.load_run r WHERE r.run_id = p_run_id;
    SELECT s.won, s.pinned INTO v_won, v_pinned
      FROM nifi_ops.partition_success(
          p_run_id, p_partition_id, p_claim_token, rec.rows_sum::numeric::bigint, rec.files::integer,
          -- NULL when no chunk carried bytes (§5.3; LEAST alone would ignore the NULL), else the
          -- sum, capped where bigint ends.
          CASE WHEN rec.bytes_sum IS NOT NULL
               THEN LEAST(rec.bytes_sum::numeric, 9223372036854775807)::bigint END,
          p_success_event_id,
          v_job_key, v_business_key) s;
    IF NOT v_won THEN
        RAISE EXCEPTION 'partition % of run % changed under its row lock', p_partition_id, p_run_id;
    END IF;
    outcome := 'PARTITION_SUCCESS';
    partition_status := 'SUCCESS';
    IF v_pinned THEN
        -- Not the last: the pinned sibling's report waits for this commit and sees this success.
        RETURN;
    END IF;
    -- None pinned: this success may be the last. The run row's write lock serializes the
    -- successes that may be last (and only those) without upgrading the KEY SHARE lock (§5.3
    -- rule 3); the recount runs in a statement after this one's wait and sees every success
    -- committed before it (two last successes each skip the other's partition, held FOR UPDATE,
    -- and the second to get the run row sees the first).
    PERFORM 1 FROM nifi_ops.load_run r
      WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING' FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        -- The run left EXTRACTING although held FOR KEY SHARE: undo all of it, and decide under
        -- the exclusive lock.
        RAISE EXCEPTION 'run % left EXTRACTING under its shared lock', p_run_id USING ERRCODE = 'LC001';
    END IF;
    IF nifi_ops.complete_extraction(p_run_id, p_dispatch_id, p_extracted_event_id) THEN
        outcome := 'RUN_COMPLETE';
        run_status := 'EXTRACTED_VALIDATED';
    END IF;
END
$$;
