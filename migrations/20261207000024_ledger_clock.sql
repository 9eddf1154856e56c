-- A ledger restored from backup is noticed (issue 40 item 6). One row, a counter the leader
-- advances (fenced) every few seconds and at every epoch acquisition. A process remembers the
-- highest value it saw committed (and a Kubernetes leader also writes it on its Lease, which a
-- restore of the database does not touch): finding the counter lower than that means the ledger
-- went back (a restore to an earlier point, or a failover to a standby that lacked commits). The
-- epoch acquisition also takes a floor from that memory, so a fencing epoch is never issued twice.
-- Add-only: the binary of the release before ignores it.
CREATE TABLE IF NOT EXISTS nifi_ops.ledger_clock (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    tick       bigint NOT NULL,
    ticked_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api') THEN
        GRANT SELECT, INSERT, UPDATE ON nifi_ops.ledger_clock TO load_control_api;
    END IF;
END
$$;
