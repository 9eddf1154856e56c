-- Server-side functions as current definitions, and typed outcomes (issues 39 item 2, 40 item 5).
--
-- * `server_function`: what `migrate` applied of ledger/functions/ (one file per function, its
--   current definition), by the file's sha256. `migrate` applies a file after the migrations
--   when the hash differs, and leaves a function recorded by a newer schema version as it is.
-- * The outcome of every function whose answer the binary reads is an enum, the same values as
--   its Rust enum (ledger/src/functions.rs; ledger/tests/schema_version.rs holds them equal).
--   Those functions are new names (`claim_partition_v2`, `report_chunk_v2`,
--   `start_validation_v2`, defined by their files): a function the previous release may call is
--   never changed under it. `claim_partition`, `report_chunk` and `start_validation` stay, unused
--   from this schema version on, until a contract migration drops them.
CREATE TABLE nifi_ops.server_function (
    function_name text PRIMARY KEY,
    sha256 text NOT NULL,
    -- The schema version of the binary that applied it.
    schema_version integer NOT NULL,
    written_by text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON nifi_ops.server_function FROM PUBLIC;

CREATE TYPE nifi_ops.claim_partition_outcome AS ENUM ('RUN_NOT_FOUND', 'PARTITION_NOT_FOUND', 'ANSWERED');

CREATE TYPE nifi_ops.report_chunk_outcome AS ENUM (
    'RUN_NOT_FOUND', 'PARTITION_NOT_FOUND', 'CLAIM_MISMATCH', 'HDFS_PATH_OUTSIDE_RUN', 'CONFLICT',
    'RECORDED', 'ESCALATE', 'MISMATCH', 'PARTITION_SUCCESS', 'RUN_COMPLETE');

CREATE TYPE nifi_ops.start_validation_outcome AS ENUM ('RUN_NOT_FOUND', 'DISPATCH_MISMATCH', 'REFUSED', 'STARTED');
