-- nifi_ops.load_run_transition_allowed: Refuses, with SQLSTATE LC002, any UPDATE of load_run.status to a pair that
-- nifi_ops.run_transition does not list, a hand-written statement included.
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.load_run_transition_allowed() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM nifi_ops.run_transition t
                    WHERE t.from_status = OLD.status AND t.to_status = NEW.status) THEN
        RAISE EXCEPTION USING ERRCODE = 'LC002',
            MESSAGE = format('run %s: %s -> %s is not a run transition', OLD.run_id, OLD.status, NEW.status),
            HINT = 'nifi_ops.run_transition lists every status change a run may make';
    END IF;
    RETURN NEW;
END
$$;
