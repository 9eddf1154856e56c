-- nifi_ops.chunk_gate: The chunk gate (CONTRACT §5.3): every chunk in, one count, rows and files as the manifest
-- expects; NULL when the partition passes, else the mismatch's message. STABLE: format() is.
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.chunk_gate(
    p_files bigint,
    p_lo integer,
    p_hi integer,
    p_rows numeric,
    p_distinct_counts bigint,
    p_chunk_count integer,
    p_expected_rows bigint)
    RETURNS text LANGUAGE sql STABLE AS $$
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
