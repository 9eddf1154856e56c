"""Schema-driven fuzzing of a running load-control API from its own OpenAPI document.

Run by scripts/fuzz-api, which starts PostgreSQL and the api-server binary. For every operation of
/openapi.json, schemathesis generates requests (valid and invalid against the schema) and sends
each with one of several credentials: the right token, the other role's token, none, a Basic
header and an unknown bearer token. Path parameters point at real runs, partitions and dispatches
half of the time, so requests reach the ledger instead of stopping at 404.

Every response is checked:
  * no 5xx;
  * the status code is one the document declares for the operation, the content type is the
    declared one, and the body matches the declared schema;
  * a rejected request (4xx) changed nothing in the ledger. Rejected requests that took no
    transaction id are unchanged by construction; for those that did (a write rolled back), the
    ledger's digest is compared before and after.

Prints one JSON line per operation and a summary line; exits 1 when any check failed.
"""

import argparse
import json
import sys
import time
import uuid

import hypothesis
import hypothesis.strategies as st
import psycopg
import requests
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

LEDGER_TABLES = [
    "load_run",
    "load_partition",
    "load_file",
    "load_validation",
    "load_dispatch",
    "load_event",
    "load_job",
    "leader_epoch",
]


class Ledger:
    """Reads the ledger directly: a digest of every row, and the next transaction id."""

    def __init__(self, url):
        self.conn = psycopg.connect(url, autocommit=True)
        self.digests = 0

    def next_xid(self):
        return self.conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text"
        ).fetchone()[0]

    def digest(self):
        self.digests += 1
        parts = []
        for table in LEDGER_TABLES:
            row = self.conn.execute(
                f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
                f"FROM nifi_ops.{table} t"
            ).fetchone()
            parts.append(f"{table}:{row[0]}:{row[1]}")
        return ";".join(parts)


def post(api, token, path, body):
    response = requests.post(
        api + path,
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    if response.status_code >= 300:
        raise SystemExit(f"setup: POST {path}: {response.status_code} {response.text}")
    return response.json()


def seed(api, nifi, ledger):
    """Runs in three states, so that fuzzed path parameters reach real rows: CREATED, EXTRACTING
    with a claimed partition, and EXTRACTED_VALIDATED with its VALIDATE_RUN dispatch."""
    partitions = ["0000", "0001"]
    created = [
        post(api, nifi, "/v1/runs", {
            "jobKey": "FUZZ_JOB",
            "businessKey": f"fuzz-{i}-{uuid.uuid4()}",
            "hdfsRoot": "/data/fuzz/",
            "stageTablePrefix": "tmp_fuzz_",
        })
        for i in range(3)
    ]
    manifest = {
        "snapshotScn": "42",
        "sourceCount": "10",
        "plannedPartitionCount": "2",
        "partitions": [
            {"partitionId": "0000", "lowerBound": "0", "upperBound": "5", "upperInclusive": "false",
             "expectedRowCount": "5"},
            {"partitionId": "0001", "lowerBound": "5", "upperBound": "10", "upperInclusive": "true",
             "expectedRowCount": "5"},
        ],
    }
    for run in created[1:]:
        run_id = run["runId"]
        post(api, nifi, f"/v1/runs/{run_id}/manifest", manifest)
        claimed = partitions if run is created[2] else partitions[:1]
        for p in claimed:
            token = str(uuid.uuid4())
            post(api, nifi, f"/v1/runs/{run_id}/partitions/{p}/claim",
                 {"claimToken": token, "workerNode": "fuzz-01"})
            if run is created[2]:
                post(api, nifi, f"/v1/runs/{run_id}/partitions/{p}/chunks", {
                    "claimToken": token, "chunkIndex": 0, "chunkCount": 1,
                    "hdfsPath": f"{run['hdfsRunPath']}/p={p}/part-0.parquet",
                    "recordCount": 5, "byteCount": 100})
    dispatches = [
        str(row[0])
        for row in ledger.conn.execute("SELECT dispatch_id FROM nifi_ops.load_dispatch")
    ]
    if not dispatches:
        raise SystemExit("setup: the completed run has no VALIDATE_RUN dispatch")
    return {"run_id": [r["runId"] for r in created], "partition_id": partitions,
            "dispatch_id": dispatches}


def credentials(nifi, operator, roles):
    """(name, headers) for one operation: each role's token (allowed or not), none, a Basic header
    and an unknown bearer token."""
    variants = [
        ("none", {}),
        ("basic", {"Authorization": "Basic dXNlcjpwYXNz"}),
        ("unknown", {"Authorization": f"Bearer {uuid.uuid4()}"}),
    ]
    if roles:
        variants += [
            ("nifi" + ("" if "nifi" in roles else "-wrong-role"), {"Authorization": f"Bearer {nifi}"}),
            ("operator" + ("" if "operator" in roles else "-wrong-role"),
             {"Authorization": f"Bearer {operator}"}),
        ]
    return variants


def roles_of(operation):
    """The roles the document grants an operation (`x-roles`; empty: no authentication)."""
    return operation.definition.raw.get("x-roles", [])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--nifi-token", required=True)
    parser.add_argument("--operator-token", required=True)
    parser.add_argument("--cases", type=int, default=10000, help="total requests, at least")
    args = parser.parse_args()

    ledger = Ledger(args.db)
    schema = schemathesis.openapi.from_url(args.api + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    known = seed(args.api, args.nifi_token, ledger)
    session = requests.Session()

    plan = []
    for operation in operations:
        for cred in credentials(args.nifi_token, args.operator_token, roles_of(operation)):
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                plan.append((operation, cred, mode))
    # Operations without parameters run out of distinct examples early: aim 20 % higher.
    per_plan = max(1, -(-args.cases * 6 // (5 * len(plan))))

    totals = {"cases": 0, "failures": 0, "rejected": 0, "digests": 0}
    failures = []
    state = {"xid": ledger.next_xid(), "digest": ledger.digest()}
    started = time.time()
    for operation in operations:
        stats = {"operation": operation.label, "cases": 0, "statuses": {}}
        for (op, (cred_name, headers), mode) in [p for p in plan if p[0] is operation]:
            strategy = op.as_strategy(generation_mode=mode)

            @hypothesis.settings(
                max_examples=per_plan,
                deadline=None,
                database=None,
                derandomize=True,  # the same cases on every run: a failure reproduces
                suppress_health_check=list(hypothesis.HealthCheck),
                phases=[hypothesis.Phase.generate],
            )
            @hypothesis.given(case=strategy, pick=st.randoms(use_true_random=False))
            def one(case, pick):
                for name in ("run_id", "partition_id", "dispatch_id"):
                    if case.path_parameters and name in case.path_parameters and known[name] \
                            and pick.random() < 0.5:
                        case.path_parameters[name] = pick.choice(known[name])
                before = ledger.next_xid()
                if state["digest"] is None or before != state["xid"]:
                    state["digest"] = ledger.digest()
                response = case.call(base_url=args.api, session=session, headers=headers)
                status = response.status_code
                stats["cases"] += 1
                stats["statuses"][str(status)] = stats["statuses"].get(str(status), 0) + 1
                problems = []
                try:
                    case.validate_response(response, checks=CHECKS, headers=headers)
                except BaseExceptionGroup as group:  # schemathesis: one group, every failure
                    problems += [" ".join(str(e).split())[:400] for e in group.exceptions]
                except AssertionError as error:
                    problems.append(" ".join(str(error).split())[:400])
                after = ledger.next_xid()
                state["xid"] = after
                if 400 <= status < 500:
                    totals["rejected"] += 1
                    if after != before:
                        now = ledger.digest()
                        if now != state["digest"]:
                            problems.append("a rejected request changed the ledger")
                        state["digest"] = now
                elif after != before:
                    state["digest"] = None  # written: the next request needs a new digest
                if problems:
                    failures.append({
                        "operation": op.label, "credentials": cred_name, "mode": mode.value,
                        "status": status, "problems": problems,
                        "request": {"path": case.formatted_path, "query": case.query,
                                    "body": case.body if not isinstance(case.body, bytes)
                                    else repr(case.body[:200])},
                        "response": response.text[:300],
                    })

            try:
                one()
            except hypothesis.errors.Unsatisfiable:
                pass
        totals["cases"] += stats["cases"]
        print(json.dumps(stats), flush=True)

    totals["failures"] = len(failures)
    totals["digests"] = ledger.digests
    totals["operations"] = len(operations)
    totals["seconds"] = round(time.time() - started, 1)
    for failure in failures[:50]:
        print(json.dumps({"failure": failure}, default=str), flush=True)
    print(json.dumps({"summary": totals}), flush=True)
    if failures or totals["cases"] < args.cases:
        sys.exit(1)


if __name__ == "__main__":
    main()
