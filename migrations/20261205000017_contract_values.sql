-- Values the ledger writes, held to the contract (issue 38).
--
-- * `report_chunk` (§4.7, the current definition; migration 20261204000015 has the first):
--   a partition whose chunks carried no `byteCount` stores `byte_count` NULL and PARTITION_SUCCESS
--   `{"bytes": null}` (§5.3), where `LEAST(NULL, …)` stored 9223372036854775807; and a changed chunk
--   of a SUCCESS partition whose path another chunk row already records is refused as the upsert
--   refuses it, 409 UNIQUE_VIOLATION on `uq_load_file_path` (§4.7 step 5), before CHUNK_CONFLICT
--   (step 6).
-- * `chunk_gate` is STABLE: it calls `format()`, which is STABLE (an IMMUTABLE function may be
--   evaluated once at plan time and its result cached).
-- * The recount trigger also fires when a run leaves EXTRACTING. This release's partition
--   successes do not write `success_partition_count` (§5.4), and every transition out of
--   EXTRACTING must store the exact count; release 0.1.0's transitions (a cancel, a `/fail`, a
--   sweeper timeout, running beside this release during an upgrade or after a rollback) do not
--   recount, so the trigger does it for them, and for this release's too: `transition` (the
--   current definition; migration 20261204000016 has the first) no longer recounts itself, so the
--   rule has one home. `complete_extraction` stores its CAS's own recount, which the trigger
--   repeats under the same lock (the same value).

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
           -- Leaving EXTRACTING, tr_load_run_success_recount stores success_partition_count
           -- from a recount (for every release's transitions, so only there).
           heartbeat_at = clock_timestamp(), version_no = version_no + 1
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

ALTER FUNCTION nifi_ops.chunk_gate(bigint, integer, integer, numeric, bigint, integer, bigint) STABLE;

-- Replaced in place (PostgreSQL 14 and newer), under the same name.
CREATE OR REPLACE TRIGGER tr_load_run_success_recount
    BEFORE UPDATE OF success_partition_count, status ON nifi_ops.load_run
    FOR EACH ROW
    WHEN ((NEW.success_partition_count IS DISTINCT FROM OLD.success_partition_count
           AND NEW.status = 'EXTRACTING')
          OR (OLD.status = 'EXTRACTING' AND NEW.status IS DISTINCT FROM 'EXTRACTING'))
    EXECUTE FUNCTION nifi_ops.load_run_success_recount();
