-- nifi_ops.beat_run: A NiFi report's run heartbeat (CONTRACT §5.3 rule 5, [v1-ext]): at most once a
-- second, only while the run is EXTRACTING, and never waiting: skipped when another transaction
-- holds the run row's write lock (a decision on the run is under way, and writes it). The one
-- place of this rule for the claim, the chunk report and the partition success.
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
--
-- plpgsql, not sql: PostgreSQL 15 plans a SQL function's statement at every call, plpgsql once per
-- session, and this runs on the hot path of every chunk report.
CREATE OR REPLACE FUNCTION nifi_ops.beat_run(p_run_id uuid)
    RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE nifi_ops.load_run SET heartbeat_at = clock_timestamp()
     WHERE run_id IN (SELECT r.run_id FROM nifi_ops.load_run r
                       WHERE r.run_id = p_run_id AND r.status = 'EXTRACTING'
                         AND r.heartbeat_at < clock_timestamp() - interval '1 second'
                         FOR NO KEY UPDATE SKIP LOCKED);
END
$$;
