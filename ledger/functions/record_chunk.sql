-- nifi_ops.record_chunk: §4.7 steps 2-8 of a chunk report: the locks, the claim and path checks, the chunk's row and
-- the partition heartbeat, and the aggregate of the partition's WRITTEN chunks with this one.
-- Called only by report_chunk_v2, so its outcome stays text (RECORDED and DECIDE never leave it).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.record_chunk(
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
    -- The caller already holds the run (advisory lock and row lock, shared or exclusive).
    p_run_locked boolean,
    -- The caller decides on the answer in the same transaction: record whatever the gate says.
    p_decide boolean,
    OUT outcome text,
    OUT partition_status text,
    OUT run_status text,
    OUT expected_row_count bigint,
    -- The chunk is new or differs from the stored one (§4.7 step 5).
    OUT changed boolean,
    -- The partition's WRITTEN chunks with this one (§4.7 step 8).
    OUT files bigint,
    OUT lo integer,
    OUT hi integer,
    OUT rows_sum text,
    OUT bytes_sum text,
    OUT distinct_counts bigint,
    -- How long the run lock took, when this function took it.
    OUT lock_wait_seconds double precision)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_started timestamptz := clock_timestamp();
    v_run_path text;
    v_claim_token uuid;
    v_relative text;
    v_same boolean;
BEGIN
    lock_wait_seconds := 0;
    -- §4.7 step 2, under the run's shared lock (§5.3 rule 2): the advisory lock, then the row
    -- FOR KEY SHARE, so that reports of sibling partitions never wait for each other.
    IF p_run_locked THEN
        SELECT r.hdfs_run_path INTO v_run_path FROM nifi_ops.load_run r WHERE r.run_id = p_run_id;
    ELSE
        SELECT r.hdfs_run_path INTO v_run_path
          FROM nifi_ops.load_run r, pg_advisory_xact_lock_shared(p_lock_key1, p_lock_key2)
         WHERE r.run_id = p_run_id FOR KEY SHARE OF r;
        lock_wait_seconds := extract(epoch FROM clock_timestamp() - v_started);
    END IF;
    IF NOT FOUND THEN
        outcome := 'RUN_NOT_FOUND';
        RETURN;
    END IF;
    SELECT p.status, p.claim_token, p.expected_row_count
      INTO partition_status, v_claim_token, expected_row_count
      FROM nifi_ops.load_partition p
     WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'PARTITION_NOT_FOUND';
        RETURN;
    END IF;
    -- §4.7 step 3: the claim token (NULL after a reissue reset matches no report).
    IF v_claim_token IS DISTINCT FROM p_claim_token THEN
        outcome := 'CLAIM_MISMATCH';
        RETURN;
    END IF;
    -- §4.7 step 4: below `<hdfs_run_path>/`, one spelling per file: no empty, `.` or `..`
    -- segment (`p//f`, `p/./f` and a trailing `/` would record one file as several chunks).
    IF starts_with(p_hdfs_path, v_run_path || '/') THEN
        v_relative := substr(p_hdfs_path, length(v_run_path) + 2);
    END IF;
    IF v_relative IS NULL OR v_relative = ''
       OR string_to_array(v_relative, '/') && ARRAY['', '.', '..'] THEN
        outcome := 'HDFS_PATH_OUTSIDE_RUN';
        RETURN;
    END IF;
    -- The run's status as the waits left it (this statement's snapshot follows them; the run row
    -- read above may be older: `claim::run_status_after_locks`).
    SELECT r.status INTO run_status FROM nifi_ops.load_run r WHERE r.run_id = p_run_id;
    SELECT EXISTS (SELECT 1 FROM nifi_ops.load_file f
                    WHERE f.run_id = p_run_id AND f.partition_id = p_partition_id AND f.chunk_index = p_chunk_index
                      AND (f.fragment_identifier, f.fragment_count, f.hdfs_path, f.record_count, f.byte_count, f.status)
                          IS NOT DISTINCT FROM (p_fragment_identifier, p_chunk_count, p_hdfs_path, p_record_count, p_byte_count, 'WRITTEN')),
           NOT EXISTS (SELECT 1 FROM nifi_ops.load_file f
                        WHERE f.run_id = p_run_id AND f.partition_id = p_partition_id AND f.chunk_index = p_chunk_index
                          AND f.fragment_count = p_chunk_count AND f.hdfs_path = p_hdfs_path
                          AND f.record_count = p_record_count AND f.byte_count IS NOT DISTINCT FROM p_byte_count)
      INTO v_same, changed;
    -- The aggregate as it is with this chunk: the other WRITTEN chunks, which the partition row
    -- lock keeps still, plus this one.
    SELECT count(*), min(c.chunk_index), max(c.chunk_index), COALESCE(sum(c.record_count), 0)::text,
           sum(c.byte_count)::text, count(DISTINCT c.fragment_count)
      INTO files, lo, hi, rows_sum, bytes_sum, distinct_counts
      FROM (SELECT f.chunk_index, f.fragment_count, f.record_count, f.byte_count FROM nifi_ops.load_file f
             WHERE f.run_id = p_run_id AND f.partition_id = p_partition_id AND f.status = 'WRITTEN'
               AND f.chunk_index <> p_chunk_index
            UNION ALL SELECT p_chunk_index, p_chunk_count, p_record_count, p_byte_count) c;
    IF NOT p_decide
       AND ((run_status = 'EXTRACTING' AND partition_status = 'RUNNING' AND files >= p_chunk_count)
            OR (partition_status = 'SUCCESS' AND changed)) THEN
        outcome := 'DECIDE';
        RETURN;
    END IF;
    -- §4.7 step 5. An identical replay writes nothing: no upsert (ON CONFLICT DO UPDATE locks the
    -- row even when nothing changes), no new partition row version.
    IF NOT v_same THEN
        INSERT INTO nifi_ops.load_file (run_id, partition_id, chunk_index, fragment_identifier, fragment_count,
                                        hdfs_path, record_count, byte_count)
        VALUES (p_run_id, p_partition_id, p_chunk_index, p_fragment_identifier, p_chunk_count,
                p_hdfs_path, p_record_count, p_byte_count)
        ON CONFLICT (run_id, partition_id, chunk_index) DO UPDATE SET
            fragment_identifier = EXCLUDED.fragment_identifier, fragment_count = EXCLUDED.fragment_count,
            hdfs_path = EXCLUDED.hdfs_path, record_count = EXCLUDED.record_count, byte_count = EXCLUDED.byte_count,
            status = 'WRITTEN', updated_at = clock_timestamp();
    END IF;
    -- §4.7 step 7: every accepted report refreshes the partition's heartbeat (a HOT update: no
    -- index holds it), an identical replay and a report after the partition or the run ended
    -- included. The one exception writes the same value: a report that reaches the chunk gate,
    -- whose decision (SUCCESS or FAILED) sets it in this transaction.
    IF NOT (p_decide AND run_status = 'EXTRACTING' AND partition_status = 'RUNNING'
            AND files >= p_chunk_count) THEN
        UPDATE nifi_ops.load_partition p SET heartbeat_at = clock_timestamp()
         WHERE p.run_id = p_run_id AND p.partition_id = p_partition_id;
    END IF;
    -- §5.3 rule 5: the run's, but not by a chunk that completes the set, whose decision writes it
    -- (the success's).
    IF files < p_chunk_count THEN
        PERFORM nifi_ops.beat_run(p_run_id);
    END IF;
    outcome := 'RECORDED';
END
$$;
