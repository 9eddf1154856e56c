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
    -- Complete: every partition a SUCCESS and their rows the source count, read from one
    -- snapshot; the status change itself is nifi_ops.transition's CAS, which also stores the rows
    -- extracted, and the recount of successes (tr_load_run_success_recount), and wakes the mirror.
    SELECT r.job_key, r.business_key, r.source_count
      INTO v_job_key, v_business_key, v_source_count
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
    SELECT t.changed INTO v_changed
      FROM nifi_ops.transition(p_run_id, 'EXTRACTING', 'EXTRACTED_VALIDATED', 'keep',
                               NULL, NULL, NULL) t;
    IF NOT v_changed THEN
        RETURN false;
    END IF;
    -- Delivered at commit: the dispatcher takes the VALIDATE_RUN row.
    PERFORM pg_notify('load_dispatch', p_run_id::text);
    INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type)
    VALUES (p_dispatch_id, p_run_id, 'VALIDATE_RUN')
    ON CONFLICT (run_id) WHERE dispatch_type = 'VALIDATE_RUN' DO NOTHING;
    PERFORM nifi_ops.record_event(p_event_id, 'INFO', 'EXTRACT_VALIDATED', NULL, p_run_id, v_job_key,
                                  v_business_key, NULL, NULL, v_source_count, NULL, NULL, NULL,
                                  '{}'::jsonb);
    RETURN true;
END
$$;
