-- nifi_ops.load_run_success_recount: success_partition_count from a recount whenever a run leaves EXTRACTING or a 0.1.0 pod
-- writes the count (the trigger is in migrations/; the shim success-recount-trigger of docs/architecture.md).
--
-- The current definition, applied by `migrate` when its hash changes (docs/architecture.md,
-- "Server-side functions"). Released: never edited; a new behaviour is a new name.
CREATE OR REPLACE FUNCTION nifi_ops.load_run_success_recount() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    NEW.success_partition_count := nifi_ops.run_success_count(NEW.run_id);
    RETURN NEW;
END
$$;
