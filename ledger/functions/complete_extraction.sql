-- nifi_ops.complete_extraction: The completion (§4.8): the last partition success moves the run EXTRACTING ->
-- EXTRACTED_VALIDATED with one VALIDATE_RUN dispatch and EXTRACT_VALIDATED; true when it did.
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.complete_extraction(
    p_run_id uuid,
    p_dispatch_id uuid,
    p_event_id uuid)
    RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_job_key text;
    v_business_key text;
    v_source_count bigint;
    v_changed boolean;
BEGIN
    -- The caller holds the run row (FOR NO KEY UPDATE or FOR UPDATE): what is read here stays.
    SELECT r.job_key, r.business_key, r.source_count INTO v_job_key, v_business_key, v_source_count
      FROM nifi_ops.load_run r,
           (SELECT count(*) AS n, count(*) FILTER (WHERE status = 'SUCCESS') AS ok,
                   COALESCE(sum(actual_row_count), 0) AS rows
              FROM nifi_ops.load_partition WHERE run_id = p_run_id) p
     WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING'
       AND p.n = r.expected_partition_count AND p.ok = r.expected_partition_count
       AND p.rows = r.source_count;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Every partition succeeded with the source's rows: extracted_count is source_count.
    UPDATE nifi_ops.load_run SET extracted_count = v_source_count, extract_completed_at = clock_timestamp()
     WHERE run_id = p_run_id;
    -- The status change, its heartbeat, version and NOTIFY, as every status change makes it
    -- (tr_load_run_success_recount stores success_partition_count on leaving EXTRACTING).
    SELECT t.changed INTO v_changed
      FROM nifi_ops.transition(p_run_id, 'EXTRACTING', 'EXTRACTED_VALIDATED', 'keep', NULL, NULL, NULL) t;
    IF NOT v_changed THEN
        RAISE EXCEPTION 'run % left EXTRACTING under its row lock', p_run_id;
    END IF;
    -- Delivered at commit: the dispatcher takes the VALIDATE_RUN row.
    PERFORM pg_notify('load_dispatch', p_run_id::text);
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
