-- The schema version contract (docs/operations.md, "Schema versions, upgrades and rollbacks").
-- One row: the highest schema version a `migrate` has written (ledger::schema::SCHEMA_VERSION of
-- the binary that ran it). `migrate` raises it and never lowers it; every binary reads it at start,
-- on each readiness probe and at most every 30 s before a write, and neither serves nor writes
-- when its supported range does not contain it. No row (or no table) is schema version 0: the
-- unversioned schema of release 0.1.0.
CREATE TABLE IF NOT EXISTS nifi_ops.schema_version (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version    integer NOT NULL CHECK (version >= 0),
    written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The binary that wrote it, e.g. "load-control 0.2.0".
    written_by text NOT NULL
);

-- Grants (§1.9), only for a role that exists: the processes read the version, `migrate` writes it.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT SELECT ON nifi_ops.schema_version TO load_control_api;
    END IF;
END
$$;
