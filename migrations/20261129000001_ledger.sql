-- The load-control ledger, CONTRACT §1. Idempotent on purpose: it also runs against a ledger that the
-- first version of the API created (no _sqlx_migrations row, tables already there), and must bring
-- that up to date without touching existing rows. Only CHECK widening drops anything (§1.9).
CREATE SCHEMA IF NOT EXISTS nifi_ops;

CREATE TABLE IF NOT EXISTS nifi_ops.load_run (
    run_id                   uuid PRIMARY KEY,
    job_key                  varchar(200) NOT NULL,
    business_key             varchar(200) NOT NULL,
    status                   varchar(40)  NOT NULL,
    snapshot_scn             numeric(38,0),
    source_count             bigint,
    source_null_split_count  bigint,
    source_min_split         numeric(38,0),
    source_max_split         numeric(38,0),
    expected_partition_count integer,
    success_partition_count  integer NOT NULL DEFAULT 0,
    failed_partition_count   integer NOT NULL DEFAULT 0,
    extracted_count          bigint  NOT NULL DEFAULT 0,
    staging_count            bigint,
    target_count             bigint,
    hdfs_run_path            varchar(1000),
    stage_table_name         varchar(255),
    publish_token            uuid,
    retry_of_run_id          uuid REFERENCES nifi_ops.load_run (run_id),
    version_no               integer NOT NULL DEFAULT 0,
    parameters               jsonb   NOT NULL DEFAULT '{}'::jsonb,
    started_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    extract_completed_at     timestamptz,
    publish_started_at       timestamptz,
    published_at             timestamptz,
    completed_at             timestamptz,
    error_stage              varchar(80),
    error_code               varchar(100),
    error_message            varchar(2000),
    cleaned_at               timestamptz,
    CONSTRAINT ck_load_run_counts CHECK (
        COALESCE(source_count, 0) >= 0 AND COALESCE(expected_partition_count, 0) >= 0
        AND success_partition_count >= 0 AND failed_partition_count >= 0 AND extracted_count >= 0)
);

CREATE TABLE IF NOT EXISTS nifi_ops.load_partition (
    run_id             uuid NOT NULL REFERENCES nifi_ops.load_run (run_id) ON DELETE RESTRICT,
    partition_id       varchar(40) NOT NULL,
    lower_bound        numeric(38,0),
    upper_bound        numeric(38,0),
    upper_inclusive    boolean NOT NULL DEFAULT false,
    is_null_partition  boolean NOT NULL DEFAULT false,
    status             varchar(20) NOT NULL DEFAULT 'PENDING',
    expected_row_count bigint NOT NULL,
    actual_row_count   bigint,
    fragment_count     integer,
    file_count         integer,
    byte_count         bigint,
    attempt_count      integer NOT NULL DEFAULT 0,
    claim_token        uuid,
    worker_node        varchar(200),
    started_at         timestamptz,
    heartbeat_at       timestamptz,
    completed_at       timestamptz,
    error_code         varchar(100),
    error_message      varchar(2000),
    PRIMARY KEY (run_id, partition_id),
    CONSTRAINT ck_load_partition_counts CHECK (
        expected_row_count >= 0 AND COALESCE(actual_row_count, 0) >= 0
        AND COALESCE(fragment_count, 0) >= 0 AND COALESCE(file_count, 0) >= 0
        AND COALESCE(byte_count, 0) >= 0 AND attempt_count >= 0),
    CONSTRAINT ck_load_partition_bounds CHECK (
        is_null_partition OR (lower_bound IS NOT NULL AND upper_bound IS NOT NULL AND lower_bound <= upper_bound))
);

CREATE TABLE IF NOT EXISTS nifi_ops.load_file (
    run_id              uuid NOT NULL,
    partition_id        varchar(40) NOT NULL,
    chunk_index         integer NOT NULL,
    fragment_identifier varchar(100),
    fragment_count      integer NOT NULL,
    hdfs_path           varchar(1500) NOT NULL,
    record_count        bigint NOT NULL,
    byte_count          bigint,
    checksum            varchar(128),
    status              varchar(20) NOT NULL DEFAULT 'WRITTEN',
    written_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, partition_id, chunk_index),
    FOREIGN KEY (run_id, partition_id) REFERENCES nifi_ops.load_partition (run_id, partition_id) ON DELETE RESTRICT,
    CONSTRAINT uq_load_file_path UNIQUE (hdfs_path),
    CONSTRAINT ck_load_file_status CHECK (status IN ('WRITTEN', 'VERIFIED', 'FAILED')),
    CONSTRAINT ck_load_file_counts CHECK (
        chunk_index >= 0 AND fragment_count > 0 AND record_count >= 0 AND COALESCE(byte_count, 0) >= 0)
);

CREATE TABLE IF NOT EXISTS nifi_ops.load_validation (
    validation_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id         uuid NOT NULL REFERENCES nifi_ops.load_run (run_id) ON DELETE RESTRICT,
    stage          varchar(30) NOT NULL,
    metric_name    varchar(150) NOT NULL,
    expected_value text,
    actual_value   text,
    tolerance      text,
    result         varchar(10) NOT NULL,
    query_version  varchar(50) NOT NULL,
    details        jsonb NOT NULL DEFAULT '{}'::jsonb,
    measured_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT ck_load_validation_stage CHECK (stage IN ('SOURCE', 'PARTITION', 'HDFS', 'STAGING', 'TARGET')),
    CONSTRAINT ck_load_validation_result CHECK (result IN ('PASS', 'FAIL', 'WARN'))
);

CREATE TABLE IF NOT EXISTS nifi_ops.load_dispatch (
    dispatch_id      uuid PRIMARY KEY,
    run_id           uuid NOT NULL REFERENCES nifi_ops.load_run (run_id) ON DELETE RESTRICT,
    dispatch_type    varchar(30) NOT NULL,
    partition_id     varchar(40),
    status           varchar(20) NOT NULL DEFAULT 'PENDING',
    attempt_count    integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_http_status integer,
    last_error       varchar(2000),
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_at          timestamptz,
    acked_at         timestamptz,
    CONSTRAINT ck_load_dispatch_type CHECK (dispatch_type IN ('VALIDATE_RUN', 'REISSUE_PARTITION')),
    CONSTRAINT ck_load_dispatch_status CHECK (status IN ('PENDING', 'SENT', 'ACKED', 'DEAD')),
    CONSTRAINT ck_load_dispatch_partition CHECK (
        (dispatch_type = 'VALIDATE_RUN' AND partition_id IS NULL)
        OR (dispatch_type = 'REISSUE_PARTITION' AND partition_id IS NOT NULL))
);

CREATE TABLE IF NOT EXISTS nifi_ops.load_event (
    event_id       uuid PRIMARY KEY,
    event_time     timestamptz NOT NULL DEFAULT clock_timestamp(),
    event_level    varchar(10) NOT NULL,
    event_name     varchar(80) NOT NULL,
    run_id         uuid,
    job_key        varchar(200),
    business_key   varchar(200),
    partition_id   varchar(40),
    chunk_index    integer,
    process_group  varchar(100),
    processor_name varchar(150),
    processor_id   varchar(100),
    node_id        varchar(200),
    attempt_no     integer,
    row_count      bigint,
    byte_count     bigint,
    duration_ms    bigint,
    error_class    varchar(40),
    error_code     varchar(100),
    message        varchar(2000),
    details        jsonb NOT NULL DEFAULT '{}'::jsonb,
    CONSTRAINT ck_load_event_level CHECK (event_level IN ('TRACE', 'DEBUG', 'INFO', 'WARN', 'ERROR')),
    CONSTRAINT ck_load_event_values CHECK (
        COALESCE(attempt_no, 0) >= 0 AND COALESCE(row_count, 0) >= 0
        AND COALESCE(byte_count, 0) >= 0 AND COALESCE(duration_ms, 0) >= 0)
);

-- [v1-ext] tables.
CREATE TABLE IF NOT EXISTS nifi_ops.load_job (
    job_key    varchar(200) PRIMARY KEY,
    suspended  boolean NOT NULL DEFAULT false,
    settings   jsonb   NOT NULL DEFAULT '{}'::jsonb,
    source     text,
    generation bigint,
    removed_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT ck_load_job_settings CHECK (jsonb_typeof(settings) = 'object')
);

CREATE TABLE IF NOT EXISTS nifi_ops.leader_epoch (
    name        text PRIMARY KEY,
    epoch       bigint NOT NULL,
    holder      text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Bring an existing (v1) ledger up to date: every column and named constraint above, added when
-- missing. Existing rows are kept; nothing is dropped.
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS run_id uuid;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS job_key varchar(200) NOT NULL;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS business_key varchar(200) NOT NULL;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS status varchar(40) NOT NULL;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS snapshot_scn numeric(38,0);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS source_count bigint;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS source_null_split_count bigint;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS source_min_split numeric(38,0);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS source_max_split numeric(38,0);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS expected_partition_count integer;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS success_partition_count integer NOT NULL DEFAULT 0;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS failed_partition_count integer NOT NULL DEFAULT 0;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS extracted_count bigint NOT NULL DEFAULT 0;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS staging_count bigint;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS target_count bigint;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS hdfs_run_path varchar(1000);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS stage_table_name varchar(255);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS publish_token uuid;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS retry_of_run_id uuid;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS version_no integer NOT NULL DEFAULT 0;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS parameters jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS started_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS extract_completed_at timestamptz;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS publish_started_at timestamptz;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS published_at timestamptz;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS completed_at timestamptz;
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS error_stage varchar(80);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS error_code varchar(100);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS error_message varchar(2000);
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS cleaned_at timestamptz;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS run_id uuid NOT NULL;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS partition_id varchar(40) NOT NULL;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS lower_bound numeric(38,0);
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS upper_bound numeric(38,0);
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS upper_inclusive boolean NOT NULL DEFAULT false;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS is_null_partition boolean NOT NULL DEFAULT false;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS status varchar(20) NOT NULL DEFAULT 'PENDING';
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS expected_row_count bigint NOT NULL;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS actual_row_count bigint;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS fragment_count integer;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS file_count integer;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS byte_count bigint;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS attempt_count integer NOT NULL DEFAULT 0;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS claim_token uuid;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS worker_node varchar(200);
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS started_at timestamptz;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS heartbeat_at timestamptz;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS completed_at timestamptz;
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS error_code varchar(100);
ALTER TABLE nifi_ops.load_partition ADD COLUMN IF NOT EXISTS error_message varchar(2000);
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS run_id uuid NOT NULL;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS partition_id varchar(40) NOT NULL;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS chunk_index integer NOT NULL;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS fragment_identifier varchar(100);
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS fragment_count integer NOT NULL;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS hdfs_path varchar(1500) NOT NULL;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS record_count bigint NOT NULL;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS byte_count bigint;
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS checksum varchar(128);
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS status varchar(20) NOT NULL DEFAULT 'WRITTEN';
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS written_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_file ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS run_id uuid NOT NULL;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS stage varchar(30) NOT NULL;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS metric_name varchar(150) NOT NULL;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS expected_value text;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS actual_value text;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS tolerance text;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS result varchar(10) NOT NULL;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS query_version varchar(50) NOT NULL;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS details jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE nifi_ops.load_validation ADD COLUMN IF NOT EXISTS measured_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS dispatch_id uuid;
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS run_id uuid NOT NULL;
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS dispatch_type varchar(30) NOT NULL;
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS partition_id varchar(40);
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS status varchar(20) NOT NULL DEFAULT 'PENDING';
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS attempt_count integer NOT NULL DEFAULT 0;
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS last_http_status integer;
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS last_error varchar(2000);
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS sent_at timestamptz;
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS acked_at timestamptz;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS event_id uuid;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS event_time timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS event_level varchar(10) NOT NULL;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS event_name varchar(80) NOT NULL;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS run_id uuid;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS job_key varchar(200);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS business_key varchar(200);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS partition_id varchar(40);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS chunk_index integer;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS process_group varchar(100);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS processor_name varchar(150);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS processor_id varchar(100);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS node_id varchar(200);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS attempt_no integer;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS row_count bigint;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS byte_count bigint;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS duration_ms bigint;
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS error_class varchar(40);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS error_code varchar(100);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS message varchar(2000);
ALTER TABLE nifi_ops.load_event ADD COLUMN IF NOT EXISTS details jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS job_key varchar(200);
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS suspended boolean NOT NULL DEFAULT false;
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS settings jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS source text;
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS generation bigint;
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS removed_at timestamptz;
ALTER TABLE nifi_ops.load_job ADD COLUMN IF NOT EXISTS updated_at timestamptz NOT NULL DEFAULT clock_timestamp();
ALTER TABLE nifi_ops.leader_epoch ADD COLUMN IF NOT EXISTS name text;
ALTER TABLE nifi_ops.leader_epoch ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL;
ALTER TABLE nifi_ops.leader_epoch ADD COLUMN IF NOT EXISTS holder text NOT NULL;
ALTER TABLE nifi_ops.leader_epoch ADD COLUMN IF NOT EXISTS acquired_at timestamptz NOT NULL DEFAULT clock_timestamp();
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_run_counts' AND conrelid = 'nifi_ops.load_run'::regclass) THEN
        ALTER TABLE nifi_ops.load_run ADD CONSTRAINT ck_load_run_counts CHECK ( COALESCE(source_count, 0) >= 0 AND COALESCE(expected_partition_count, 0) >= 0 AND success_partition_count >= 0 AND failed_partition_count >= 0 AND extracted_count >= 0);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_partition_counts' AND conrelid = 'nifi_ops.load_partition'::regclass) THEN
        ALTER TABLE nifi_ops.load_partition ADD CONSTRAINT ck_load_partition_counts CHECK ( expected_row_count >= 0 AND COALESCE(actual_row_count, 0) >= 0 AND COALESCE(fragment_count, 0) >= 0 AND COALESCE(file_count, 0) >= 0 AND COALESCE(byte_count, 0) >= 0 AND attempt_count >= 0);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_partition_bounds' AND conrelid = 'nifi_ops.load_partition'::regclass) THEN
        ALTER TABLE nifi_ops.load_partition ADD CONSTRAINT ck_load_partition_bounds CHECK ( is_null_partition OR (lower_bound IS NOT NULL AND upper_bound IS NOT NULL AND lower_bound <= upper_bound));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'uq_load_file_path' AND conrelid = 'nifi_ops.load_file'::regclass) THEN
        ALTER TABLE nifi_ops.load_file ADD CONSTRAINT uq_load_file_path UNIQUE (hdfs_path);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_file_status' AND conrelid = 'nifi_ops.load_file'::regclass) THEN
        ALTER TABLE nifi_ops.load_file ADD CONSTRAINT ck_load_file_status CHECK (status IN ('WRITTEN', 'VERIFIED', 'FAILED'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_file_counts' AND conrelid = 'nifi_ops.load_file'::regclass) THEN
        ALTER TABLE nifi_ops.load_file ADD CONSTRAINT ck_load_file_counts CHECK ( chunk_index >= 0 AND fragment_count > 0 AND record_count >= 0 AND COALESCE(byte_count, 0) >= 0);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_validation_stage' AND conrelid = 'nifi_ops.load_validation'::regclass) THEN
        ALTER TABLE nifi_ops.load_validation ADD CONSTRAINT ck_load_validation_stage CHECK (stage IN ('SOURCE', 'PARTITION', 'HDFS', 'STAGING', 'TARGET'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_validation_result' AND conrelid = 'nifi_ops.load_validation'::regclass) THEN
        ALTER TABLE nifi_ops.load_validation ADD CONSTRAINT ck_load_validation_result CHECK (result IN ('PASS', 'FAIL', 'WARN'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_dispatch_type' AND conrelid = 'nifi_ops.load_dispatch'::regclass) THEN
        ALTER TABLE nifi_ops.load_dispatch ADD CONSTRAINT ck_load_dispatch_type CHECK (dispatch_type IN ('VALIDATE_RUN', 'REISSUE_PARTITION'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_dispatch_status' AND conrelid = 'nifi_ops.load_dispatch'::regclass) THEN
        ALTER TABLE nifi_ops.load_dispatch ADD CONSTRAINT ck_load_dispatch_status CHECK (status IN ('PENDING', 'SENT', 'ACKED', 'DEAD'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_dispatch_partition' AND conrelid = 'nifi_ops.load_dispatch'::regclass) THEN
        ALTER TABLE nifi_ops.load_dispatch ADD CONSTRAINT ck_load_dispatch_partition CHECK ( (dispatch_type = 'VALIDATE_RUN' AND partition_id IS NULL) OR (dispatch_type = 'REISSUE_PARTITION' AND partition_id IS NOT NULL));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_event_level' AND conrelid = 'nifi_ops.load_event'::regclass) THEN
        ALTER TABLE nifi_ops.load_event ADD CONSTRAINT ck_load_event_level CHECK (event_level IN ('TRACE', 'DEBUG', 'INFO', 'WARN', 'ERROR'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_event_values' AND conrelid = 'nifi_ops.load_event'::regclass) THEN
        ALTER TABLE nifi_ops.load_event ADD CONSTRAINT ck_load_event_values CHECK ( COALESCE(attempt_no, 0) >= 0 AND COALESCE(row_count, 0) >= 0 AND COALESCE(byte_count, 0) >= 0 AND COALESCE(duration_ms, 0) >= 0);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'ck_load_job_settings' AND conrelid = 'nifi_ops.load_job'::regclass) THEN
        ALTER TABLE nifi_ops.load_job ADD CONSTRAINT ck_load_job_settings CHECK (jsonb_typeof(settings) = 'object');
    END IF;
END
$$;

-- Widened status sets (CANCELLED, ABORTED are [v1-ext]); same names, one transaction (§1.9).
ALTER TABLE nifi_ops.load_run DROP CONSTRAINT IF EXISTS ck_load_run_status;
ALTER TABLE nifi_ops.load_run ADD CONSTRAINT ck_load_run_status CHECK (status IN (
    'CREATED', 'EXTRACTING', 'EXTRACTED_VALIDATED', 'STAGE_VALIDATING', 'STAGING_VALIDATED',
    'PUBLISHING', 'PUBLISHED', 'SUCCESS', 'FAILED_MANIFEST', 'FAILED_EXTRACT',
    'FAILED_STAGE_VALIDATION', 'FAILED_PUBLISH', 'PUBLISH_UNKNOWN', 'FAILED_TARGET_VALIDATION',
    'FAILED_SNAPSHOT_EXPIRED', 'TIMED_OUT', 'CANCELLED'));
ALTER TABLE nifi_ops.load_partition DROP CONSTRAINT IF EXISTS ck_load_partition_status;
ALTER TABLE nifi_ops.load_partition ADD CONSTRAINT ck_load_partition_status CHECK (status IN (
    'PENDING', 'RUNNING', 'RETRY', 'SUCCESS', 'FAILED', 'TIMED_OUT', 'ABORTED'));

CREATE UNIQUE INDEX IF NOT EXISTS uq_load_run_active ON nifi_ops.load_run (job_key, business_key)
    WHERE status IN ('CREATED', 'EXTRACTING', 'EXTRACTED_VALIDATED', 'STAGE_VALIDATING',
                     'STAGING_VALIDATED', 'PUBLISHING', 'PUBLISHED', 'PUBLISH_UNKNOWN');
CREATE INDEX IF NOT EXISTS ix_load_run_status_heartbeat ON nifi_ops.load_run (status, heartbeat_at);
CREATE INDEX IF NOT EXISTS ix_load_run_job_started ON nifi_ops.load_run (job_key, started_at DESC);
CREATE INDEX IF NOT EXISTS ix_load_run_cleanup ON nifi_ops.load_run (job_key, completed_at) WHERE cleaned_at IS NULL;

CREATE INDEX IF NOT EXISTS ix_load_partition_status ON nifi_ops.load_partition (run_id, status);
CREATE INDEX IF NOT EXISTS ix_load_partition_recovery ON nifi_ops.load_partition (status, heartbeat_at)
    WHERE status IN ('RUNNING', 'RETRY');

CREATE INDEX IF NOT EXISTS ix_load_file_partition_status ON nifi_ops.load_file (run_id, partition_id, status);

CREATE INDEX IF NOT EXISTS ix_load_validation_run_stage ON nifi_ops.load_validation (run_id, stage, result);
CREATE UNIQUE INDEX IF NOT EXISTS uq_load_validation_metric
    ON nifi_ops.load_validation (run_id, stage, metric_name, query_version);

CREATE UNIQUE INDEX IF NOT EXISTS uq_load_dispatch_validate ON nifi_ops.load_dispatch (run_id)
    WHERE dispatch_type = 'VALIDATE_RUN';
CREATE INDEX IF NOT EXISTS ix_load_dispatch_due ON nifi_ops.load_dispatch (status, next_attempt_at)
    WHERE status IN ('PENDING', 'SENT');
-- Not in the contract's list: lets a run's dispatches be found without a scan (detail, settling).
CREATE INDEX IF NOT EXISTS ix_load_dispatch_run ON nifi_ops.load_dispatch (run_id, created_at);

CREATE INDEX IF NOT EXISTS ix_load_event_run_time ON nifi_ops.load_event (run_id, event_time DESC);
CREATE INDEX IF NOT EXISTS ix_load_event_job_time ON nifi_ops.load_event (job_key, event_time DESC);
CREATE INDEX IF NOT EXISTS ix_load_event_error ON nifi_ops.load_event (event_time DESC, event_name)
    WHERE event_level IN ('WARN', 'ERROR');
CREATE INDEX IF NOT EXISTS ix_load_event_time_brin ON nifi_ops.load_event USING brin (event_time);

-- Grants, only for roles that exist (§1.9).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT USAGE ON SCHEMA nifi_ops TO load_control_api;
        GRANT SELECT, INSERT, UPDATE ON nifi_ops.load_run, nifi_ops.load_partition, nifi_ops.load_file,
            nifi_ops.load_validation, nifi_ops.load_dispatch, nifi_ops.load_job, nifi_ops.leader_epoch
            TO load_control_api;
        GRANT SELECT, INSERT, DELETE ON nifi_ops.load_event TO load_control_api;
        GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA nifi_ops TO load_control_api;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'nifi_runtime') THEN
        GRANT USAGE ON SCHEMA nifi_ops TO nifi_runtime;
        GRANT INSERT ON nifi_ops.load_event TO nifi_runtime;
    END IF;
END
$$;
