-- Every chunk report in one round trip, the deciding one included (issue 30 item 1).
--
-- A report that decides nothing was already one statement (`nifi_ops.record_chunk`, migration
-- 20261203000011). The report that completes a partition's chunks was not: the one-statement try
-- found the gate due and wrote nothing, then the ledger ran the decision as a transaction of its
-- own (BEGIN, the run lock, the chunk statement, the SUCCESS with its pin, COMMIT: six statements;
-- ten for the one that completes the run), because the gate and the completion lived in Rust.
-- Both now live here, once:
--
-- * `chunk_gate`: the chunk gate (CONTRACT §5.3), the only copy. NULL when the partition passes,
--   else the mismatch's message (the contract's `ROW_COUNT_MISMATCH` text).
-- * `complete_extraction`: the completion CAS (§5.4), the only copy, which the manifest's
--   registration calls too: the run to EXTRACTED_VALIDATED, its VALIDATE_RUN outbox row, its
--   EXTRACT_VALIDATED event and both NOTIFYs (sent at commit, only when the CAS won).
-- * `report_chunk`: a whole report. It runs `record_chunk` without writing (the locks taken: the
--   run shared, the partition FOR UPDATE), judges the gate on the aggregate that call returns,
--   then records the chunk and runs `partition_success` (the SUCCESS, its event, the pin);
--   a success that pins nothing takes the run row's write lock in a statement of its own and
--   recounts in `complete_extraction`, a statement after that wait. The steps and their order
--   are the transaction's, each a statement with its own snapshot under READ COMMITTED (VOLATILE
--   functions), so spec/model/completion.pml checks this function as it checked the transaction.
--
-- A gate mismatch fails the run, which is decided under the run's exclusive lock only (§5.3 rule
-- 6): called without the run (p_run_locked false), `report_chunk` then answers ESCALATE having
-- written nothing, and the ledger runs the report again in a transaction under FOR UPDATE, which
-- calls it with p_run_locked true: it records the chunk, answers MISMATCH with the message, and
-- the ledger fails the partition and the run in that transaction.
--
-- Called alone, the report is one statement, hence one transaction; a connection lost before its
-- answer arrived is repeated (ledger/src/ops/chunk.rs), and the repeat of a decision that had
-- committed finds the partition SUCCESS with its chunk stored as sent. The caller passes the ids
-- of the events a decision writes and passes the same ids again on the repeat: when the
-- partition's PARTITION_SUCCESS is the one with p_success_event_id, the repeat is answered as the
-- decision was (PARTITION_SUCCESS, or RUN_COMPLETE when p_extracted_event_id is stored too) and
-- not as a late report (Ignored). A NiFi replay carries fresh ids and is answered Ignored.
--
-- Outcomes: RUN_NOT_FOUND, PARTITION_NOT_FOUND, CLAIM_MISMATCH, HDFS_PATH_OUTSIDE_RUN and
-- CONFLICT (a changed chunk of a SUCCESS partition): nothing written. RECORDED (progress, or
-- recorded only), ESCALATE (nothing written), MISMATCH (p_run_locked only), PARTITION_SUCCESS,
-- RUN_COMPLETE. SQLSTATE LC001 (nothing written): the run left EXTRACTING under the shared lock,
-- decide under the exclusive one.

CREATE OR REPLACE FUNCTION nifi_ops.chunk_gate(
    p_files bigint,
    p_lo integer,
    p_hi integer,
    p_rows numeric,
    p_distinct_counts bigint,
    p_chunk_count integer,
    p_expected_rows bigint)
    RETURNS text LANGUAGE sql IMMUTABLE AS $$
    -- Every index 0 … chunkCount−1 once (the aggregate is over the chunk index, the primary key),
    -- all with this chunkCount, and the rows add up. Any NULL is a mismatch.
    SELECT CASE
        WHEN p_files = p_chunk_count AND p_lo = 0 AND p_hi::bigint + 1 = p_chunk_count
             AND p_distinct_counts = 1 AND p_rows = p_expected_rows
        THEN NULL
        ELSE format('files=%s chunkCount=%s distinctCounts=%s rows=%s expected=%s',
                    p_files, p_chunk_count, p_distinct_counts, p_rows, p_expected_rows)
    END
$$;

-- Must run while the caller's transaction holds the run row's write lock (the manifest's FOR
-- UPDATE, or a possibly-last success's FOR NO KEY UPDATE), in a statement after the one that
-- waited for it, so that the recount sees every committed success. Release 0.1.0's copy of this
-- CAS runs after its `success_partition_count + 1`, whose value the trigger of migration
-- 20261203000010 recounts.
CREATE OR REPLACE FUNCTION nifi_ops.complete_extraction(
    p_run_id uuid,
    p_dispatch_id uuid,
    p_event_id uuid)
    RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_job_key text;
    v_business_key text;
    v_source_count bigint;
BEGIN
    UPDATE nifi_ops.load_run r
       SET status = 'EXTRACTED_VALIDATED', success_partition_count = p.ok, extracted_count = p.rows,
           extract_completed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
           version_no = r.version_no + 1
      FROM (SELECT count(*) AS n, count(*) FILTER (WHERE status = 'SUCCESS') AS ok,
                   COALESCE(sum(actual_row_count), 0) AS rows
              FROM nifi_ops.load_partition WHERE run_id = p_run_id) p
     WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING'
       AND p.n = r.expected_partition_count AND p.ok = r.expected_partition_count
       AND p.rows = r.source_count
    RETURNING r.job_key, r.business_key, r.source_count INTO v_job_key, v_business_key, v_source_count;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Delivered at commit: the dispatcher takes the VALIDATE_RUN row, the mirror the status.
    PERFORM pg_notify('load_dispatch', p_run_id::text), pg_notify('load_run', p_run_id::text);
    INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type)
    VALUES (p_dispatch_id, p_run_id, 'VALIDATE_RUN')
    ON CONFLICT (run_id) WHERE dispatch_type = 'VALIDATE_RUN' DO NOTHING;
    INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, job_key, business_key,
                                     process_group, processor_name, row_count, details)
    VALUES (p_event_id, 'INFO', 'EXTRACT_VALIDATED', p_run_id, v_job_key, v_business_key,
            'LOAD_CONTROL_API', 'extract_validated', v_source_count, '{}'::jsonb);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION nifi_ops.report_chunk(
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
    OUT outcome text,
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
    outcome := rec.outcome;
    partition_status := rec.partition_status;
    run_status := rec.run_status;
    files := rec.files;
    lock_wait_seconds := rec.lock_wait_seconds;
    IF outcome = 'RECORDED' THEN
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
    IF outcome <> 'DECIDE' THEN
        RETURN;
    END IF;
    IF partition_status = 'SUCCESS' THEN
        -- record_chunk decides a SUCCESS partition only for a chunk that differs from the stored
        -- one (§4.7 step 6).
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
          LEAST(rec.bytes_sum::numeric, 9223372036854775807)::bigint, p_success_event_id,
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

-- Only the api-server runs them (§1.9: they write with the api role's own table grants; NiFi's
-- runtime role may not). The manifest's registration calls complete_extraction too, also from
-- the api-server.
REVOKE ALL ON FUNCTION nifi_ops.complete_extraction(uuid, uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION nifi_ops.report_chunk(uuid, text, uuid, integer, integer, text, text, bigint, bigint,
                                             integer, integer, boolean, uuid, uuid, uuid) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT EXECUTE ON FUNCTION nifi_ops.complete_extraction(uuid, uuid, uuid) TO load_control_api;
        GRANT EXECUTE ON FUNCTION nifi_ops.report_chunk(uuid, text, uuid, integer, integer, text, text, bigint,
                                                        bigint, integer, integer, boolean, uuid, uuid, uuid)
            TO load_control_api;
    END IF;
END
$$;
