-- nifi_ops.record_event: Every row of load_event (CONTRACT §8), in the transaction of the change it
-- records, with the conventions of rows load-control writes: process group LOAD_CONTROL_API, and
-- the processor named after the event unless one is given. The one writer of event rows, for
-- Rust's `Event::insert` and the server-side functions alike.
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
--
-- plpgsql, not sql: PostgreSQL 15 plans a SQL function's statement at every call, plpgsql once per
-- session, and this runs on the hot path of every claim and partition success.
CREATE OR REPLACE FUNCTION nifi_ops.record_event(
    p_event_id uuid,
    p_level text,
    p_name text,
    p_processor_name text,
    p_run_id uuid,
    p_job_key text,
    p_business_key text,
    p_partition_id text,
    p_attempt_no integer,
    p_row_count bigint,
    p_error_class text,
    p_error_code text,
    p_message text,
    p_details jsonb)
    RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, job_key, business_key,
                                     partition_id, process_group, processor_name, attempt_no,
                                     row_count, error_class, error_code, message, details)
    VALUES (p_event_id, p_level, p_name, p_run_id, p_job_key, p_business_key, p_partition_id,
            'LOAD_CONTROL_API', COALESCE(p_processor_name, lower(p_name)), p_attempt_no, p_row_count,
            p_error_class, p_error_code, p_message, COALESCE(p_details, '{}'::jsonb));
END
$$;
