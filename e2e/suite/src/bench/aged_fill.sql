-- load-bench's aged ledger (issue 26 item 3): __RUNS__ runs of 40 jobs (one in 40 of job BENCH, the
-- lifecycle's job), started over __DAYS__ days, __PARTS__ partitions each, __FILES__ files per
-- finished partition, written set-based in one transaction with the columns the ledger's own
-- operations write (ledger/src/ops: create, manifest, claim, chunk, validation, publish, success,
-- transition, dispatch, cleanup). What the operator's sweeper would otherwise act on at once is
-- not there (no CREATED/EXTRACTING/PUBLISHING runs: it would have timed them out long ago; the
-- stuck ones alerted ten minutes ago), so the measurement sees the ledger as it is, not a flood.
--
-- Runs, by `i` (1 = newest): mostly SUCCESS; FAILED_EXTRACT, TIMED_OUT, CANCELLED, FAILED_PUBLISH
-- one in 20 each, FAILED_TARGET_VALIDATION one in 50; PUBLISH_UNKNOWN one in 200 (awaiting an
-- operator); stuck (heartbeat hours to months old) in STAGE_VALIDATING and PUBLISHED one in 500
-- each. A third of the final runs were cleaned (3 days after a success, 14 after a failure).
CREATE TEMP TABLE aged_run AS
SELECT i, md5('aged-run-' || i)::uuid AS run_id,
       CASE WHEN i % 40 = 0 THEN 'BENCH' ELSE 'AGED_' || lpad((i % 40)::text, 2, '0') END AS job_key,
       'aged-' || lpad(i::text, 7, '0') AS business_key, s.status,
       now() - interval '2 hours' - make_interval(secs => __DAYS__ * 86400.0 * (i - 1) / __RUNS__) AS started
  FROM generate_series(1, __RUNS__) i
 CROSS JOIN LATERAL (SELECT CASE
        WHEN i % 500 = 17 THEN 'STAGE_VALIDATING'
        WHEN i % 500 = 19 THEN 'PUBLISHED'
        WHEN i % 200 = 7 THEN 'PUBLISH_UNKNOWN'
        WHEN i % 20 = 3 THEN 'FAILED_EXTRACT'
        WHEN i % 20 = 5 THEN 'TIMED_OUT'
        WHEN i % 20 = 9 THEN 'CANCELLED'
        WHEN i % 20 = 11 THEN 'FAILED_PUBLISH'
        WHEN i % 50 = 13 THEN 'FAILED_TARGET_VALIDATION'
        ELSE 'SUCCESS' END AS status) s;

-- What follows from the status: partitions that succeeded, whether extraction completed, whether
-- publishing started / finished, whether the run is final.
CREATE TEMP TABLE aged_shape AS
SELECT r.*, o.n_ok,
       r.status NOT IN ('FAILED_EXTRACT', 'TIMED_OUT', 'CANCELLED') AS extracted,
       r.status IN ('SUCCESS', 'FAILED_PUBLISH', 'FAILED_TARGET_VALIDATION', 'PUBLISH_UNKNOWN', 'PUBLISHED') AS publish_started,
       r.status IN ('SUCCESS', 'FAILED_TARGET_VALIDATION', 'PUBLISHED') AS published,
       r.status NOT IN ('STAGE_VALIDATING', 'PUBLISHED', 'PUBLISH_UNKNOWN') AS final,
       '/data/aged/' || r.job_key || '/run_id=' || r.run_id AS path,
       r.status NOT IN ('STAGE_VALIDATING', 'PUBLISHED', 'PUBLISH_UNKNOWN') AND r.i % 3 = 0
         AND r.started + interval '1 hour' + CASE WHEN r.status = 'SUCCESS' THEN interval '3 days' ELSE interval '14 days' END < now()
         AS cleaned
  FROM aged_run r
 CROSS JOIN LATERAL (SELECT CASE
        WHEN r.status IN ('FAILED_EXTRACT', 'TIMED_OUT') THEN __PARTS__ - GREATEST(1, __PARTS__ / 10)
        WHEN r.status = 'CANCELLED' THEN __PARTS__ * 8 / 10
        ELSE __PARTS__ END AS n_ok) o;

INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status, snapshot_scn, source_count,
        source_null_split_count, source_min_split, source_max_split, expected_partition_count,
        success_partition_count, failed_partition_count, extracted_count, staging_count, target_count,
        hdfs_run_path, stage_table_name, publish_token, version_no, started_at, heartbeat_at,
        extract_completed_at, publish_started_at, published_at, completed_at, error_stage, error_code,
        error_message, cleaned_at)
SELECT s.run_id, s.job_key, s.business_key, s.status, 1234567890 + s.i, __PARTS__::bigint * __FILES__ * 500,
       0, 0, __PARTS__::bigint * 1000, __PARTS__,
       s.n_ok, CASE WHEN s.status IN ('FAILED_EXTRACT', 'TIMED_OUT') THEN __PARTS__ - s.n_ok ELSE 0 END,
       s.n_ok::bigint * __FILES__ * 500,
       CASE WHEN s.publish_started THEN s.n_ok::bigint * __FILES__ * 500 END,
       CASE WHEN s.status = 'SUCCESS' THEN s.n_ok::bigint * __FILES__ * 500
            WHEN s.status = 'FAILED_TARGET_VALIDATION' THEN s.n_ok::bigint * __FILES__ * 500 - 1 END,
       s.path, 'tmp_aged_' || replace(s.run_id::text, '-', ''),
       CASE WHEN s.publish_started THEN md5('aged-publish-' || s.i)::uuid END,
       CASE WHEN s.final THEN 9 ELSE 6 END,
       s.started,
       CASE WHEN s.status = 'PUBLISH_UNKNOWN' THEN s.started + interval '2 hours'
            ELSE s.started + interval '1 hour' END,
       CASE WHEN s.extracted THEN s.started + interval '40 minutes' END,
       CASE WHEN s.publish_started THEN s.started + interval '50 minutes' END,
       CASE WHEN s.published THEN s.started + interval '55 minutes' END,
       CASE WHEN s.final THEN s.started + interval '1 hour' END,
       CASE s.status WHEN 'FAILED_EXTRACT' THEN 'EXTRACT' WHEN 'TIMED_OUT' THEN 'EXTRACT'
                     WHEN 'FAILED_PUBLISH' THEN 'PUBLISH' WHEN 'FAILED_TARGET_VALIDATION' THEN 'TARGET_VALIDATION'
                     WHEN 'PUBLISH_UNKNOWN' THEN 'PUBLISH' END,
       CASE s.status WHEN 'FAILED_EXTRACT' THEN 'PARTITION_FAILED' WHEN 'TIMED_OUT' THEN 'RUN_TIMEOUT'
                     WHEN 'CANCELLED' THEN 'CANCELLED' WHEN 'FAILED_PUBLISH' THEN 'PUBLISH_FAILED'
                     WHEN 'FAILED_TARGET_VALIDATION' THEN 'TARGET_COUNT_MISMATCH' WHEN 'PUBLISH_UNKNOWN' THEN 'PUBLISH_STALE' END,
       CASE s.status WHEN 'FAILED_EXTRACT' THEN 'partition failed: ORA-01555 snapshot too old'
                     WHEN 'TIMED_OUT' THEN 'run exceeded recovery.run_timeout'
                     WHEN 'CANCELLED' THEN 'cancelled by an operator'
                     WHEN 'FAILED_PUBLISH' THEN 'partition exchange failed'
                     WHEN 'FAILED_TARGET_VALIDATION' THEN 'TARGET_COUNT: expected and actual differ'
                     WHEN 'PUBLISH_UNKNOWN' THEN 'no publish result within recovery.publish_stale' END,
       CASE WHEN s.cleaned THEN s.started + interval '1 hour' + CASE WHEN s.status = 'SUCCESS' THEN interval '3 days' ELSE interval '14 days' END END
  FROM aged_shape s;

-- Partitions: the first n_ok SUCCESS, the rest FAILED (a failed extraction), TIMED_OUT (a run
-- deadline) or ABORTED (a cancel).
INSERT INTO nifi_ops.load_partition (run_id, partition_id, lower_bound, upper_bound, upper_inclusive,
        status, expected_row_count, actual_row_count, fragment_count, file_count, byte_count, attempt_count,
        claim_token, worker_node, started_at, heartbeat_at, completed_at, error_code, error_message)
SELECT s.run_id, lpad(k::text, 4, '0'), (k - 1) * 1000, k * 1000, k = __PARTS__, p.status,
       __FILES__ * 500, CASE WHEN p.status = 'SUCCESS' THEN __FILES__ * 500 END,
       CASE WHEN p.status = 'SUCCESS' THEN __FILES__ END, CASE WHEN p.status = 'SUCCESS' THEN __FILES__ END,
       CASE WHEN p.status = 'SUCCESS' THEN __FILES__::bigint * 500 * 64 END,
       CASE WHEN p.status = 'FAILED' THEN 3 ELSE 1 END,
       md5('aged-claim-' || s.i || '-' || k)::uuid, 'nifi-0' || (1 + k % 3),
       s.started + make_interval(secs => k), s.started + interval '30 minutes',
       CASE WHEN p.status IN ('SUCCESS', 'FAILED') THEN s.started + interval '30 minutes' END,
       CASE WHEN p.status = 'FAILED' THEN 'ORA-01555' END,
       CASE WHEN p.status = 'FAILED' THEN 'snapshot too old' END
  FROM aged_shape s
 CROSS JOIN generate_series(1, __PARTS__) k
 CROSS JOIN LATERAL (SELECT CASE
        WHEN k <= s.n_ok THEN 'SUCCESS'
        WHEN s.status = 'FAILED_EXTRACT' THEN 'FAILED'
        WHEN s.status = 'TIMED_OUT' THEN 'TIMED_OUT'
        ELSE 'ABORTED' END AS status) p;

-- One file per chunk of every finished partition, as PG-20 records it.
INSERT INTO nifi_ops.load_file (run_id, partition_id, chunk_index, fragment_identifier, fragment_count,
        hdfs_path, record_count, byte_count, written_at, updated_at)
SELECT p.run_id, p.partition_id, c, 'f-' || p.claim_token, __FILES__,
       s.path || '/p=' || p.partition_id || '/part-' || lpad(c::text, 6, '0') || '.parquet', 500, 500 * 64,
       p.started_at + make_interval(secs => c), p.started_at + make_interval(secs => c)
  FROM nifi_ops.load_partition p
  JOIN aged_shape s ON s.run_id = p.run_id
 CROSS JOIN generate_series(0, __FILES__ - 1) c
 WHERE p.status = 'SUCCESS';

-- PG-50's metrics: SOURCE, PARTITION and HDFS once extracted, STAGING once staged, TARGET after
-- publishing (FAIL for a failed target validation).
INSERT INTO nifi_ops.load_validation (run_id, stage, metric_name, expected_value, actual_value, result,
        query_version, measured_at)
SELECT s.run_id, m.stage, m.metric, (s.n_ok::bigint * __FILES__ * 500)::text,
       (s.n_ok::bigint * __FILES__ * 500 - CASE WHEN m.stage = 'TARGET' AND s.status = 'FAILED_TARGET_VALIDATION' THEN 1 ELSE 0 END)::text,
       CASE WHEN m.stage = 'TARGET' AND s.status = 'FAILED_TARGET_VALIDATION' THEN 'FAIL' ELSE 'PASS' END,
       'v1', s.started + interval '45 minutes'
  FROM aged_shape s
 CROSS JOIN (VALUES ('SOURCE', 'SOURCE_COUNT'), ('PARTITION', 'PARTITION_ROW_SUM'), ('HDFS', 'HDFS_FILE_COUNT'),
                    ('STAGING', 'STAGE_COUNT'), ('TARGET', 'TARGET_COUNT')) m(stage, metric)
 WHERE s.extracted
   AND (m.stage NOT IN ('STAGING', 'TARGET') OR s.publish_started)
   AND (m.stage <> 'TARGET' OR s.published);

-- The outbox: VALIDATE_RUN for every extracted run (delivered and acknowledged); a REISSUE_PARTITION
-- for every failed extraction, DEAD: settled because the run ended, or (one in ten) after its
-- attempts, which the monitor's DISPATCH_DEAD reports.
INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id, status, attempt_count,
        next_attempt_at, last_http_status, last_error, created_at, sent_at, acked_at)
SELECT md5('aged-validate-' || s.i)::uuid, s.run_id, 'VALIDATE_RUN', NULL, 'ACKED', 1,
       s.started + interval '40 minutes', 202, NULL, s.started + interval '40 minutes',
       s.started + interval '40 minutes 1 second', s.started + interval '41 minutes'
  FROM aged_shape s WHERE s.extracted
UNION ALL
SELECT md5('aged-reissue-' || s.i)::uuid, s.run_id, 'REISSUE_PARTITION', lpad(__PARTS__::text, 4, '0'), 'DEAD', 20,
       s.started + interval '35 minutes', 503,
       CASE WHEN s.i % 200 = 23 THEN 'max attempts reached: HTTP 503' ELSE 'run ended: FAILED_EXTRACT' END,
       s.started + interval '20 minutes', s.started + interval '35 minutes', NULL
  FROM aged_shape s WHERE s.status = 'FAILED_EXTRACT';

-- Events as the ledger writes them: the run's start and manifest, each partition's start and end,
-- publishing, the run's end, its cleanup; the stuck runs' stale alert (ten minutes ago, so the
-- sweeper does not repeat it during the measurement). NiFi's own events without a run besides.
-- Not the ones event retention (§7.2 rule 6, `cleanup.event_retention`, 90 days by default) has
-- deleted over the year: events of a cleaned run older than that. Otherwise the operator's first
-- ticks would delete them during the aged measurement, which a ledger a year old is long past.
INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, run_id, job_key, business_key,
        message, details)
SELECT gen_random_uuid(), e.at, e.level, e.name, s.run_id, s.job_key, s.business_key, e.message, e.details
  FROM aged_shape s
 CROSS JOIN LATERAL (VALUES
        (s.started, 'INFO', 'RUN_STARTED', NULL::text, '{}'::jsonb, true),
        (s.started + interval '1 minute', 'INFO', 'MANIFEST_CREATED', NULL, jsonb_build_object('partitions', __PARTS__), true),
        (s.started + interval '50 minutes', 'INFO', 'PUBLISH_STARTED', NULL, '{}'::jsonb, s.publish_started),
        (s.started + interval '55 minutes', 'INFO', 'PUBLISH_FINISHED', NULL, '{}'::jsonb, s.published),
        (s.started + interval '1 hour', CASE WHEN s.status = 'SUCCESS' THEN 'INFO' ELSE 'ERROR' END,
         CASE s.status WHEN 'SUCCESS' THEN 'RUN_SUCCESS' WHEN 'TIMED_OUT' THEN 'RUN_TIMED_OUT'
                       WHEN 'CANCELLED' THEN 'RUN_CANCELLED' ELSE 'RUN_FAILED' END,
         NULL, jsonb_build_object('to', s.status), s.final),
        (s.started + interval '2 hours', 'ERROR', 'PUBLISH_UNKNOWN', 'no publish result', '{}'::jsonb, s.status = 'PUBLISH_UNKNOWN'),
        (now() - interval '10 minutes', 'WARN', 'RUN_STALE_ALERT', 'no change for a long time', '{}'::jsonb,
         s.status IN ('STAGE_VALIDATING', 'PUBLISHED')),
        (s.started + interval '1 hour' + CASE WHEN s.status = 'SUCCESS' THEN interval '3 days' ELSE interval '14 days' END,
         'INFO', 'RUN_CLEANED', NULL, '{}'::jsonb, s.cleaned)
    ) e(at, level, name, message, details, present)
 WHERE e.present AND NOT (s.cleaned AND e.at < now() - interval '90 days');
INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, run_id, job_key, business_key,
        partition_id, node_id, attempt_no, row_count, message, details)
SELECT gen_random_uuid(), e.at, e.level, e.name, p.run_id, s.job_key, s.business_key, p.partition_id,
       p.worker_node, p.attempt_count, e.rows, e.message, e.details
  FROM nifi_ops.load_partition p
  JOIN aged_shape s ON s.run_id = p.run_id
 CROSS JOIN LATERAL (VALUES
        (p.started_at, 'INFO', 'PARTITION_STARTED', NULL::bigint, NULL::text, '{}'::jsonb, true),
        (p.started_at + interval '30 minutes', CASE WHEN p.status = 'SUCCESS' THEN 'INFO' ELSE 'ERROR' END,
         CASE WHEN p.status = 'SUCCESS' THEN 'PARTITION_SUCCESS' ELSE 'PARTITION_FAILED' END, p.actual_row_count,
         p.error_message, CASE WHEN p.status = 'SUCCESS' THEN jsonb_build_object('files', __FILES__, 'bytes', p.byte_count)
                               ELSE '{}'::jsonb END, p.status IN ('SUCCESS', 'FAILED'))
    ) e(at, level, name, rows, message, details, present)
 WHERE e.present AND NOT (s.cleaned AND e.at < now() - interval '90 days');
INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, process_group, processor_name,
        node_id, message)
SELECT gen_random_uuid(), now() - make_interval(secs => __DAYS__ * 86400.0 * j / __RUNS__), 'WARN', 'NIFI_BULLETIN',
       'PG-10', 'ExecuteSQLRecord', 'nifi-0' || (1 + j % 3), 'bulletin: connection reset'
  FROM generate_series(1, __RUNS__) j;

-- And what event retention leaves behind on each cleaned run it has visited: the bound of its
-- events (`events_kept_from`, migration 20261203000008), its oldest event left, or, with none
-- left, a day before now. Left at its default (-infinity), every cleaned run of the year would be
-- due at once and rule 6 would spend the aged measurement's ticks catching up a thousand runs at
-- a time: the one-off cost of the upgrade that added the column, not a year's steady state.
-- A ledger of 0.1.0's schema (the upgrade at age) has no such column: the upgrade adds it at its
-- default, and the first ticks after it catch up, as they would on a real 0.1.0 ledger.
DO $fill$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'nifi_ops'
                  AND table_name = 'load_run' AND column_name = 'events_kept_from') THEN
        UPDATE nifi_ops.load_run r
           SET events_kept_from = COALESCE((SELECT min(e.event_time) FROM nifi_ops.load_event e WHERE e.run_id = r.run_id),
                                           now() - interval '1 day')
         WHERE r.cleaned_at IS NOT NULL;
    END IF;
END
$fill$;

DROP TABLE aged_shape;
DROP TABLE aged_run;
