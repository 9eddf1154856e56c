-- [v1-ext] Event retention (CONTRACT §7.2 rule 6) bounded by what is due, not by the history
-- (issue 26): each run keeps a lower bound of the event_time of every event it has or will get,
-- `events_kept_from`. The sweeper's rule 6 visits only cleaned runs whose bound is older than the
-- retention, deletes their due events, and sets the bound again: to the oldest event left, or,
-- when none is left, to the time of the visit less a margin (so events written meanwhile, whose
-- event_time is a little older than their commit, are still covered). A cleaned run with nothing
-- due is then not read again until its oldest event ages past the retention (at the most once per
-- half retention), where the rule used to read every cleaned run on every tick.
--
-- The default '-infinity' (no rewrite: a constant default is kept in the catalogue) makes every
-- existing and new run due at its first visit once cleaned, which is what the rule did before.
-- Binaries of the release before never name the column (their inserts take the default, their
-- rule 6 deletes without moving the bound, which only leaves it lower: still a lower bound).
ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS events_kept_from timestamptz NOT NULL DEFAULT '-infinity';

-- Its index is migration 20261205000022, outside this transaction (a column and its index are
-- never in one: the index build would hold the ADD COLUMN's ACCESS EXCLUSIVE lock for its scan).
