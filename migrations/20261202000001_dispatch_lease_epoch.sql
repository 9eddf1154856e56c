-- [v1-ext] The leadership epoch that leased a PENDING outbox row (§6.3). A lease of an epoch that is
-- no longer current belongs to a deposed (or restarted) leader that can record nothing any more:
-- the current leader takes the row at once instead of waiting out dispatch.lease. NULL when the
-- row is not leased (never leased, or its outcome was recorded).
ALTER TABLE nifi_ops.load_dispatch ADD COLUMN IF NOT EXISTS leased_epoch bigint;
