-- The privileges of the role load-control's pods connect as (`database.runtime_role`), granted by
-- every `migrate` after the migrations so that the role may have any name. `{role}` is the role,
-- quoted. The migrations grant the same to a role named `load_control_api` when one exists (their
-- history); ledger/tests/runtime_role.rs holds the two equal. One statement per `;` line end.
GRANT USAGE ON SCHEMA nifi_ops TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON nifi_ops.load_run, nifi_ops.load_partition, nifi_ops.load_file,
    nifi_ops.load_validation, nifi_ops.load_dispatch TO {role};
GRANT SELECT, INSERT, UPDATE ON nifi_ops.load_job, nifi_ops.leader_epoch, nifi_ops.ledger_owner,
    nifi_ops.ledger_clock TO {role};
GRANT SELECT, INSERT, DELETE ON nifi_ops.load_event TO {role};
GRANT SELECT ON nifi_ops.schema_version, nifi_ops.run_transition TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA nifi_ops TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.record_chunk(uuid, text, uuid, integer, integer, text, text, bigint,
    bigint, integer, integer, boolean, boolean) TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.claim_partition(uuid, text, uuid, text, integer, integer, uuid) TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.partition_success(uuid, text, uuid, bigint, integer, bigint, uuid, text,
    text) TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.complete_extraction(uuid, uuid, uuid) TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.report_chunk(uuid, text, uuid, integer, integer, text, text, bigint,
    bigint, integer, integer, boolean, uuid, uuid, uuid) TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.transition(uuid, text, text, text, text, text, text) TO {role};
-- The overload before migration 19's, still defined and no longer called: granted as the
-- migrations granted it, until a migration drops it.
GRANT EXECUTE ON FUNCTION nifi_ops.transition(uuid, text, text, text, text, text, text, boolean, boolean,
    text) TO {role};
GRANT EXECUTE ON FUNCTION nifi_ops.start_validation(uuid, uuid, text, integer, integer, uuid) TO {role};
