-- Two releases, one ledger (issue 27 item 5): sharing is refused. One row: the installation that
-- owns this ledger (under Kubernetes "<namespace>/<lease name>", standalone the configured name),
-- written by its leader in the transaction that bumps the leader epoch and refreshed while it
-- leads. A leader of another installation that finds a claim refreshed within its staleness window
-- does not bump the epoch and does not lead; once the claim is stale (that release uninstalled) it
-- takes the ledger over. Add-only: the binary of the release before ignores it.
CREATE TABLE IF NOT EXISTS nifi_ops.ledger_owner (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    installation text NOT NULL,
    -- The process (leader identity) that last claimed or refreshed it.
    holder       text NOT NULL,
    claimed_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT SELECT, INSERT, UPDATE ON nifi_ops.ledger_owner TO load_control_api;
    END IF;
END
$$;
