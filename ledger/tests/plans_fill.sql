-- A ledger one year old, filled in SQL for the plan tests (tests/plans.rs): 2,000 runs of 40 jobs
-- (LoadJobs)
-- spread over 365 days (most final, a third of the final ones cleaned, some active, some
-- PUBLISH_UNKNOWN), 50 partitions each (100,000), two files per finished partition, ten
-- validations, a VALIDATE_RUN dispatch per run (ACKED, DEAD settled because the run ended, a few
-- DEAD that alert), a few PENDING reissues, 75 events per run and some without a run.
INSERT INTO nifi_ops.load_job (job_key, settings, source, generation)
SELECT 'JOB_' || j, CASE WHEN j = 1 THEN '{"cleanup": {"success_retention": "P2D"}}'::jsonb ELSE '{}'::jsonb END,
       'LoadJob/etl/job-' || j, 1
  FROM generate_series(0, 39) j;

INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status, expected_partition_count,
        success_partition_count, extracted_count, hdfs_run_path, stage_table_name, started_at,
        heartbeat_at, completed_at, error_code, error_message, cleaned_at, publish_started_at)
SELECT md5('run' || i)::uuid, 'JOB_' || (i % 40), 'BK_' || i, s.status,
       CASE WHEN s.status = 'CREATED' THEN NULL ELSE 50 END,
       CASE WHEN s.status = 'SUCCESS' THEN 50 ELSE 0 END, 100000,
       '/data/nifi/stage/JOB_' || (i % 40) || '/run_id=' || md5('run' || i)::uuid, 'tmp_' || i,
       t.started, t.heartbeat, t.completed,
       CASE WHEN s.status LIKE 'FAILED%' OR s.status = 'TIMED_OUT' THEN 'E_' || s.status END,
       CASE WHEN s.status LIKE 'FAILED%' OR s.status = 'TIMED_OUT' THEN 'it failed' END,
       CASE WHEN t.completed IS NOT NULL AND i % 3 = 0 AND t.completed < now() - interval '10 days'
            THEN t.completed + interval '8 days' END,
       CASE WHEN s.status IN ('PUBLISHING', 'PUBLISH_UNKNOWN', 'SUCCESS') THEN t.started + interval '50 minutes' END
  FROM generate_series(1, 2000) i
 CROSS JOIN LATERAL (SELECT CASE
        WHEN i <= 10 THEN 'EXTRACTING'
        WHEN i <= 13 THEN 'CREATED'
        WHEN i <= 16 THEN 'EXTRACTED_VALIDATED'
        WHEN i <= 19 THEN 'STAGE_VALIDATING'
        WHEN i <= 21 THEN 'STAGING_VALIDATED'
        WHEN i <= 24 THEN 'PUBLISHING'
        WHEN i <= 27 THEN 'PUBLISHED'
        WHEN i % 200 = 7 THEN 'PUBLISH_UNKNOWN'
        WHEN i % 20 = 3 THEN 'FAILED_EXTRACT'
        WHEN i % 20 = 5 THEN 'TIMED_OUT'
        WHEN i % 20 = 9 THEN 'CANCELLED'
        WHEN i % 20 = 11 THEN 'FAILED_PUBLISH'
        ELSE 'SUCCESS' END AS status) s
 CROSS JOIN LATERAL (SELECT
        CASE WHEN i <= 27 THEN now() - i * interval '10 minutes' ELSE now() - i * interval '263 minutes' END AS started,
        CASE WHEN i <= 27 THEN now() - interval '1 minute'
             WHEN s.status = 'PUBLISH_UNKNOWN' THEN now() - i * interval '263 minutes' + interval '2 hours'
             ELSE now() - i * interval '263 minutes' + interval '1 hour' END AS heartbeat,
        CASE WHEN i <= 27 OR s.status = 'PUBLISH_UNKNOWN' THEN NULL
             ELSE now() - i * interval '263 minutes' + interval '1 hour' END AS completed) t;

INSERT INTO nifi_ops.load_partition (run_id, partition_id, lower_bound, upper_bound, status,
        expected_row_count, actual_row_count, file_count, attempt_count, started_at, heartbeat_at, completed_at)
SELECT r.run_id, 'P' || lpad(k::text, 3, '0'), k * 1000, k * 1000 + 999, p.status, 1000,
       CASE WHEN p.status = 'SUCCESS' THEN 1000 END, CASE WHEN p.status = 'SUCCESS' THEN 2 END,
       CASE WHEN p.status = 'PENDING' THEN 0 ELSE 1 END, r.started_at,
       CASE WHEN p.status = 'RUNNING' THEN now() - interval '5 minutes' ELSE r.heartbeat_at END,
       CASE WHEN p.status = 'SUCCESS' THEN r.heartbeat_at END
  FROM nifi_ops.load_run r
 CROSS JOIN generate_series(1, 50) k
 CROSS JOIN LATERAL (SELECT CASE
        WHEN r.status = 'EXTRACTING' AND k > 30 THEN 'PENDING'
        WHEN r.status = 'EXTRACTING' AND k > 20 THEN 'RUNNING'
        WHEN r.status IN ('FAILED_EXTRACT', 'TIMED_OUT') AND k > 45 THEN 'FAILED'
        WHEN r.status = 'CANCELLED' AND k > 40 THEN 'ABORTED'
        ELSE 'SUCCESS' END AS status) p
 WHERE r.status <> 'CREATED';

INSERT INTO nifi_ops.load_file (run_id, partition_id, chunk_index, fragment_count, hdfs_path, record_count,
        byte_count, status, written_at, updated_at)
SELECT p.run_id, p.partition_id, c, 2, '/data/' || p.run_id || '/' || p.partition_id || '/' || c, 500, 65536,
       'VERIFIED', p.completed_at, p.completed_at
  FROM nifi_ops.load_partition p CROSS JOIN generate_series(0, 1) c
 WHERE p.status = 'SUCCESS';

INSERT INTO nifi_ops.load_validation (run_id, stage, metric_name, expected_value, actual_value, result,
        query_version, measured_at)
SELECT r.run_id, (ARRAY['SOURCE','PARTITION','HDFS','STAGING','TARGET'])[1 + j % 5], 'metric_' || j, '100000',
       '100000', 'PASS', 'v1', r.heartbeat_at
  FROM nifi_ops.load_run r CROSS JOIN generate_series(1, 10) j
 WHERE r.status <> 'CREATED';

-- One VALIDATE_RUN per run past extraction: ACKED, or DEAD settled because the run ended, or (one
-- run in 250) DEAD after its attempts (an alert); PENDING/SENT for the runs that wait for it.
INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, status, attempt_count, next_attempt_at,
        last_error, created_at, sent_at, acked_at)
SELECT md5('dispatch' || r.run_id)::uuid, r.run_id, 'VALIDATE_RUN', d.status, 1,
       CASE WHEN d.status = 'PENDING' THEN now() + interval '30 seconds' ELSE r.started_at + interval '40 minutes' END,
       CASE WHEN d.status = 'DEAD' AND r.status IN ('FAILED_EXTRACT', 'TIMED_OUT', 'CANCELLED') THEN 'run ended: ' || r.status
            WHEN d.status = 'DEAD' THEN 'max attempts reached: 503' END,
       r.started_at + interval '40 minutes',
       CASE WHEN d.status <> 'PENDING' THEN r.started_at + interval '41 minutes' END,
       CASE WHEN d.status = 'ACKED' THEN r.started_at + interval '42 minutes' END
  FROM nifi_ops.load_run r
 CROSS JOIN LATERAL (SELECT CASE
        WHEN r.status = 'EXTRACTED_VALIDATED' THEN 'SENT'
        WHEN r.status IN ('FAILED_EXTRACT', 'TIMED_OUT', 'CANCELLED') THEN 'DEAD'
        WHEN hashtext(r.run_id::text) % 250 = 0 THEN 'DEAD'
        ELSE 'ACKED' END AS status) d
 WHERE r.status NOT IN ('CREATED', 'EXTRACTING');
-- Reissues of the EXTRACTING runs, waiting out a backoff; some leased by the current epoch.
INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id, status, attempt_count,
        next_attempt_at, leased_epoch)
SELECT md5('reissue' || p.run_id || p.partition_id)::uuid, p.run_id, 'REISSUE_PARTITION', p.partition_id, 'PENDING', 1,
       now() + interval '2 minutes', CASE WHEN p.partition_id < 'P025' THEN 7 END
  FROM nifi_ops.load_partition p JOIN nifi_ops.load_run r USING (run_id)
 WHERE r.status = 'EXTRACTING' AND p.status = 'RUNNING';

INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, run_id, job_key, business_key,
        partition_id, message)
SELECT md5('event' || r.run_id || j)::uuid, r.started_at + j * interval '45 seconds',
       CASE WHEN j % 25 = 0 THEN 'WARN' ELSE 'INFO' END,
       CASE WHEN j % 25 = 0 THEN 'PARTITION_RETRY' WHEN j = 1 THEN 'RUN_CREATED' ELSE 'CHUNK_RECORDED' END,
       r.run_id, r.job_key, r.business_key, 'P' || lpad((1 + j % 50)::text, 3, '0'), 'chunk ' || j
  FROM nifi_ops.load_run r CROSS JOIN generate_series(1, 75) j;
-- PG-70 reported a failed cleanup for one uncleaned run in 50.
INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, run_id, job_key, business_key, message)
SELECT md5('cleanup' || r.run_id)::uuid, r.completed_at + interval '8 days', 'WARN', 'CLEANUP_FAILED', r.run_id,
       r.job_key, r.business_key, 'permission denied'
  FROM nifi_ops.load_run r
 WHERE r.completed_at IS NOT NULL AND r.cleaned_at IS NULL AND hashtext(r.run_id::text) % 50 = 0;
-- NiFi's own events without a run.
INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, process_group, message)
SELECT md5('orphan' || j)::uuid, now() - j * interval '1 hour', 'ERROR', 'NIFI_BULLETIN', 'PG-10', 'bulletin'
  FROM generate_series(1, 5000) j;
