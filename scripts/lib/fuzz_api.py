"""Fuzzing of a running load-control API that reaches every handler, from its own OpenAPI document.

Run by scripts/fuzz-api, which starts PostgreSQL and the api-server binary. Three phases:

1. **Lifecycles** (a state machine of our own): runs are driven through whole lifecycles with
   live claim tokens, dispatch ids and publish tokens, taking every branch (success, partition
   failure, run failure, cancel and resend, invalid manifest, two publish claimants, each publish
   outcome, PUBLISH_UNKNOWN resolved both ways, cleanup). Before each step is taken:
   * its valid request is mutated into data the document or the contract declares invalid, one
     change each, drawn from every property of the body's schema whether the valid body has it
     or not (optional fields, nested items and free-form maps such as `sourceMetrics`,
     `details`, `parameters` included): removed required field, unknown field, camelCase and
     snake_case together, wrong type, out of range, too long or too short, pattern broken, null
     where not nullable; plus the limits only the contract states (§3.3: a chunk `hdfsPath`
     over 2000 UTF-8 bytes, `queryVersion`/`sourceMetricsVersion` over 50 chars, `attempt`
     over 2147483647, integers outside 64 bits), a malformed body, a wrong content type,
     malformed path and query parameters and a body over `server.max_body_bytes`. Each must get
     the exact refusal §3.7 names: 422 `REQUEST_INVALID` whose `details.errors` names the field
     (413 `PAYLOAD_TOO_LARGE` for the oversized body); any other status or code is a
     **wrong refusal**, an acceptance a **negative-data failure**;
   * stale and foreign inputs the schema allows (another claim or publish token, a chunk index
     out of range, a path outside the run, another run's dispatch, an unknown run) must get the
     refusal the contract names;
   * the valid request with no, unknown, Basic or the other role's credentials must get 401/403.
   Then the step itself must be accepted with the decision the contract gives, and its replay must
   give what CONTRACT §3.8 says.
2. **Schema fuzzing** (schemathesis, positive and negative generation, `negative_data_rejection`
   on: a negative case answered 2xx fails): path parameters point at
   the runs of phase 1 (every state), and claim tokens, publish tokens, dispatch ids and chunk
   paths are replaced by live ones half of the time, so generated bodies reach the chunk gate and
   the publish CAS instead of stopping at a 409 (never the invalid part of a negative case).
3. **Coverage, asserted**: every operation that takes input must have had accepted (2xx) and
   refused (4xx) requests past authentication, at least MIN_EACH of each.

Every response, in every phase, is checked: no 5xx; status, content type and body as the document
declares; a refused request (4xx) changed nothing in the ledger (rows digested before and after
whenever a transaction id was taken), except the one refusal the contract says commits (an invalid
manifest fails its run, §4.2 step 4); and so did a refusal answered 200 (`claimed:false`,
`started:false`, `changed:false`), except the dispatch ACK a refused validation start commits
(§4.9 step 3).

Every random choice derives from --seed (a new one per run, printed first), hypothesis's seeds
for each operation and mode included: the same seed replays the same requests.

Prints one JSON line per operation and a summary line; exits 1 when any check failed.
"""

import argparse
import copy
import json
import random
import re
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
    negative_data_rejection,
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

# Operations without input (no parameters, no body, no authentication): they cannot refuse
# anything, so only acceptance is asserted for them.
NO_INPUT = {"GET /healthz", "GET /readyz", "GET /metrics", "GET /openapi.json"}
MIN_EACH = 5

CREATE = "POST /v1/runs"
LIST = "GET /v1/runs"
DETAIL = "GET /v1/runs/{run_id}"
MANIFEST = "POST /v1/runs/{run_id}/manifest"
RUN_FAIL = "POST /v1/runs/{run_id}/fail"
CLAIM = "POST /v1/runs/{run_id}/partitions/{partition_id}/claim"
CHUNK = "POST /v1/runs/{run_id}/partitions/{partition_id}/chunks"
PART_FAIL = "POST /v1/runs/{run_id}/partitions/{partition_id}/fail"
START = "POST /v1/runs/{run_id}/validation/start"
METRICS = "POST /v1/runs/{run_id}/validations"
LIST_METRICS = "GET /v1/runs/{run_id}/validations"
EVENTS = "GET /v1/runs/{run_id}/events"
STAGE_OK = "POST /v1/runs/{run_id}/stage-validated"
PUB_CLAIM = "POST /v1/runs/{run_id}/publish/claim"
PUB_RESULT = "POST /v1/runs/{run_id}/publish/result"
SUCCESS = "POST /v1/runs/{run_id}/success"
RESEND = "POST /v1/runs/{run_id}/dispatches/{dispatch_id}/resend"
RESOLVE = "POST /v1/runs/{run_id}/publish-unknown/resolve"
CANCEL = "POST /v1/runs/{run_id}/cancel"
CANDIDATES = "GET /v1/cleanup/candidates"
CLEANUP = "POST /v1/runs/{run_id}/cleanup"
SUMMARY = "GET /v1/monitor/summary"

# A refusal the contract says commits: the invalid manifest fails its run (§4.2 step 4).
COMMITTING_REFUSALS = {(MANIFEST, "MANIFEST_INVALID")}
UNSET = object()

# Every random choice of a run derives from its seed (--seed, else a fresh one, printed first):
# the lifecycle branches, the UUIDs and tokens sent, the mutants picked and hypothesis's own
# seed for each operation and generation mode. The same seed against a fresh database sends
# the same requests.
SEEDED = random.Random(0)


def new_uuid():
    """A version-4 UUID drawn from the run's seed."""
    return uuid.UUID(int=SEEDED.getrandbits(128), version=4)


def derived_seed(seed, *names):
    """A seed for one part of the run (string seeding hashes with SHA-512: stable across runs)."""
    return random.Random(":".join([str(seed), *names])).getrandbits(64)


class Ledger:
    """Reads the ledger directly: a digest of every row, the next transaction id, dispatch ids."""

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

    def dispatch(self, run_id, kind="VALIDATE_RUN"):
        """The run's dispatch id and status: what PG-05 receives in X-Dispatch-Id."""
        row = self.conn.execute(
            "SELECT dispatch_id::text, status FROM nifi_ops.load_dispatch "
            "WHERE run_id = %s AND dispatch_type = %s ORDER BY created_at DESC LIMIT 1",
            (run_id, kind),
        ).fetchone()
        return row if row else (None, None)


def snake(name):
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


class Document:
    """The OpenAPI document: resolves references and derives invalid variants of valid input."""

    def __init__(self, raw):
        self.raw = raw

    def resolve(self, schema):
        while isinstance(schema, dict) and "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            schema = self.raw["components"]["schemas"][name]
        return schema

    def body_schema(self, operation):
        body = operation.definition.raw.get("requestBody")
        if not body:
            return None
        return self.resolve(body["content"]["application/json"]["schema"])

    def invalid_values(self, schema, value):
        """Values the document declares invalid for a field of this schema (contract leniency
        kept in mind: strings accept JSON numbers, integers accept decimal strings, booleans
        accept a few words and 0/1)."""
        schema = self.resolve(schema)
        types = schema.get("type", "string")
        types = types if isinstance(types, list) else [types]
        out = []
        if "null" not in types:
            out.append(("null", None))
        if "enum" in schema:
            out.append(("enum", str(value).lower() + "x"))
        if "integer" in types:
            out += [("type", "x7"), ("type", True), ("fraction", 1.5), ("range", 2**63)]
            if "minimum" in schema:
                out.append(("minimum", schema["minimum"] - 1))
            if "maximum" in schema:
                out.append(("maximum", schema["maximum"] + 1))
        elif "boolean" in types:
            out += [("type", "maybe"), ("type", 2), ("type", [])]
        elif "array" in types:
            out.append(("type", "x"))
            if schema.get("minItems", 0) >= 1:
                out.append(("minItems", []))
        elif "object" in types:
            out += [("type", "x"), ("type", [])]
        elif "string" in types:
            out += [("type", True), ("type", {}), ("type", [])]
            if schema.get("format") == "uuid":
                out.append(("format", "not-a-uuid"))
            if "maxLength" in schema:
                out.append(("maxLength", "a" * (schema["maxLength"] + 1)))
            if schema.get("minLength", 0) > 0:
                out.append(("minLength", "a" * (schema["minLength"] - 1)))
            if "pattern" in schema and isinstance(value, str):
                pattern = re.compile(schema["pattern"])
                for candidate in (value.lower(), value + "!", "!", "a b", ""):
                    if candidate != value and not pattern.search(candidate):
                        out.append(("pattern", candidate))
                        break
        return out

    def body_mutants(self, schema, body, path=""):
        """(description, body, field) for every invalid variant of a valid body, one change each:
        every property of the schema, present in the valid body or not (an absent one is set to
        each invalid value), nested items and free-form maps included. `field` is the path §3.7
        names in `details.errors` (camelCase, `$.list[0].name`, `$.map.key`)."""
        schema = self.resolve(schema)
        out = []
        if path == "":
            out.append(("unknown field", {**body, "fuzzUnknownField": 1}, "$.fuzzUnknownField"))
        else:
            out.append(("unknown field", {**body, "fuzzUnknownField": 1}, f"$.{path}fuzzUnknownField"))
        required = set(schema.get("required", []))
        for name, field in schema.get("properties", {}).items():
            field = self.resolve(field)
            where = f"{path}{name}"
            value = body.get(name, UNSET)
            if name in required and "default" not in field and value is not UNSET:
                out.append((f"{where}: required, removed",
                            {k: v for k, v in body.items() if k != name}, f"$.{where}"))
            if snake(name) != name:
                both = value if value is not UNSET else self.sample(field)
                if both is not UNSET:
                    out.append((f"{where}: under both names", {**body, name: both, snake(name): both},
                                {f"$.{where}", f"$.{path}{snake(name)}"}))
            for why, bad in self.invalid_values(field, value if value is not UNSET else None):
                out.append((f"{where}{'' if value is not UNSET else ' (absent)'}: {why} "
                            f"{json.dumps(bad)[:40]}", {**body, name: bad}, f"$.{where}"))
            items = self.resolve(field.get("items", {}))
            if items.get("properties"):
                item = value[0] if isinstance(value, list) and value and isinstance(value[0], dict) else None
                if item is not None:
                    for why, bad_item, f in self.body_mutants(items, item, f"{where}[0]."):
                        out.append((why, {**body, name: [bad_item] + value[1:]}, f))
            extra = field.get("additionalProperties")
            if "object" in str(field.get("type", "")) and isinstance(extra, dict):
                # A free-form map: its entries' values have their own schema (§3.7: `$.map.key`).
                entries = value if isinstance(value, dict) else {}
                for why, bad in self.invalid_values(extra, None):
                    if bad is None and "null" in str(self.resolve(extra).get("type", "")):
                        continue
                    out.append((f"{where}.fuzzKey: {why} {json.dumps(bad)[:40]}",
                                {**body, name: {**entries, "fuzzKey": bad}}, f"$.{where}.fuzzKey"))
        return out

    def sample(self, schema):
        """A valid value for a field absent from the valid body, when one is easy to name."""
        schema = self.resolve(schema)
        if "enum" in schema:
            return schema["enum"][0]
        types = schema.get("type", "string")
        types = types if isinstance(types, list) else [types]
        if "boolean" in types:
            return True
        if "integer" in types:
            return max(schema.get("minimum", 1), 1)
        if "object" in types:
            return {}
        if "string" in types and "pattern" not in schema and "format" not in schema:
            return "x"
        return UNSET

    def query_mutants(self, operation, query):
        out = []
        for param in operation.definition.raw.get("parameters", []):
            if param["in"] != "query":
                continue
            for why, bad in self.invalid_values(param["schema"], query.get(param["name"], "")):
                if bad is None or isinstance(bad, (dict, list, bool)):
                    continue  # a query string has no null, object or boolean
                out.append((f"?{param['name']}: {why}", {**query, param["name"]: bad},
                            f"query.{param['name']}"))
        return out


class Run:
    """What the fuzzer knows of one run: its status and the live tokens its callers hold."""

    def __init__(self, created):
        self.id = created["runId"]
        self.path = created["hdfsRunPath"]
        self.status = created["status"]
        self.partitions = {}  # pid -> {"expected": rows, "token": uuid or None, "done": bool}
        self.publish_token = None
        self.dispatch = None
        self.cleaned = False


# A negative case whose only invalid part is a JSON number where the document says string is
# valid by the contract (§3: a number is taken as its literal text, then the field's pattern and
# length apply), so answering it 200 is right (seen: a cancel `reason` of 0.99999; a cleanup
# `droppedTable`, declared "string or null", of -3.461822895359084e+16).
LENIENT_STRING = re.compile(
    r"Schema-violating request accepted.*violates `type` at \S+ "
    r"\(was (?:null \| )?string(?: \| null)?, became (?:number|integer)\)"
)


# schemathesis's negative_data_rejection lists the statuses it takes as a refusal and 413 is not
# among them, yet a negative body larger than server.max_body_bytes is refused 413
# PAYLOAD_TOO_LARGE before it is read (§3.2; seen: a manifest past `maxItems` partitions). That
# refusal is still checked (JSON error body, ledger unchanged) by `account`.
NEGATIVE_REJECTION = re.compile(r"^Schema-violating request accepted")


class Fuzzer:
    def __init__(self, args, ledger, schema, document):
        self.api = args.api
        self.tokens = {"nifi": args.nifi_token, "operator": args.operator_token}
        self.sent_tokens = set(self.tokens.values())
        self.other_values = set()
        self.ledger = ledger
        self.document = document
        self.operations = {op.label: op for op in (r.ok() for r in schema.get_all_operations())}
        self.session = requests.Session()
        self.seed = args.seed
        self.rng = random.Random(derived_seed(args.seed, "lifecycles"))
        self.stats = {label: {"operation": label, "cases": 0, "accepted": 0, "refused": 0,
                              "frontDoor": 0, "negativeRefused": 0, "statuses": {}}
                      for label in self.operations}
        self.failures = []
        self.mutants = 0  # invalid requests whose exact refusal (status, code, field) was checked
        self.mismatches = 0
        self.rejection_checked = 0  # negative cases of phase 2 under negative_data_rejection
        self.refusals_checked = 0  # 200 refusals (claimed/started/changed false) digested
        self.mutants_per_step = args.mutants_per_step
        self.max_body = args.max_body_bytes
        self.state = {"xid": ledger.next_xid(), "digest": ledger.digest()}
        self.runs = []
        self.serial = 0

    # ---- sending and checking ------------------------------------------------------------------

    def roles(self, label):
        return self.operations[label].definition.raw.get("x-roles", [])

    def headers(self, cred):
        if cred == "none":
            return {}
        if cred == "basic":
            return {"Authorization": "Basic dXNlcjpwYXNz"}
        if cred == "unknown":
            return {"Authorization": f"Bearer {new_uuid()}"}
        return {"Authorization": f"Bearer {self.tokens[cred]}"}

    def role_for(self, label):
        roles = self.roles(label)
        return roles[0] if roles else "none"

    def too_large(self, response):
        """Whether the response is §3.2's refusal of a body over server.max_body_bytes."""
        sent = response.request.body or b""
        try:
            code = response.json().get("code")
        except (ValueError, AttributeError):
            code = None
        return (response.status_code == 413 and code == "PAYLOAD_TOO_LARGE"
                and len(sent if isinstance(sent, bytes) else sent.encode()) > self.max_body)

    def fail(self, label, problem, request, response=None):
        shown = json.dumps(request.get("body"), default=repr)
        if len(shown) > 2000:  # a body of megabytes makes an unreadable report; its start suffices
            request = {**request, "body": shown[:2000] + f"… ({len(shown)} characters)"}
        self.failures.append({
            "operation": label, "problem": problem, "request": request,
            "status": None if response is None else response.status_code,
            "response": None if response is None else response.text[:300],
        })

    def send(self, label, path=None, body=UNSET, query=None, cred=None, raw=None, why="valid"):
        """Sends one request and runs every check on its response; returns the response."""
        operation = self.operations[label]
        cred = cred or self.role_for(label)
        headers = self.headers(cred)
        before = self.ledger.next_xid()
        if self.state["digest"] is None or before != self.state["xid"]:
            self.state["digest"] = self.ledger.digest()
        request = {"why": why, "path": path, "query": query, "cred": cred,
                   "body": (raw[0], raw[1][:200].decode(errors="replace"), len(raw[1])) if raw is not None
                   else (None if body is UNSET else body)}
        problems = []
        if raw is not None:  # a body schemathesis cannot express: raw bytes and a content type
            url = self.api + operation.path.format(**(path or {}))
            response = self.session.request(operation.method.upper(), url, data=raw[1], timeout=30,
                                         headers={**headers, "Content-Type": raw[0]})
            if response.status_code >= 500:
                problems.append("server error")
        else:
            kwargs = {"path_parameters": path or {}, "query": query or {}}
            if body is not UNSET:
                kwargs["body"] = body
                kwargs["media_type"] = "application/json"
            case = operation.Case(**kwargs)
            response = case.call(base_url=self.api, session=self.session, headers=headers)
            problems += self.conformance(case, response, headers)
        self.account(label, response, cred, problems, request, before)
        self.last_request = request
        return response

    def sent(self, *args, **kwargs):
        """`send`, answering the response with the request it answered."""
        response = self.send(*args, **kwargs)
        return response, self.last_request

    def conformance(self, case, response, headers, checks=CHECKS):
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except BaseExceptionGroup as group:  # schemathesis: one group, every failure
            return [" ".join(str(e).split())[:400] for e in group.exceptions]
        except AssertionError as error:
            return [" ".join(str(error).split())[:400]]
        return []

    def remember_tokens(self, value, key=""):
        """Every `*token` value a request carried, for the log scan (§9.2): long enough that its
        appearance in a log line cannot be a coincidence."""
        if isinstance(value, dict):
            for k, v in value.items():
                # A generated key may repeat a string sent elsewhere as a token (seen: the
                # 18-character "--mutants-per-step" as a claimToken and as a key): a key is
                # logged as sent, and is no token.
                self.other_values.add(str(k))
                self.remember_tokens(v, str(k))
        elif isinstance(value, list):
            for v in value:
                self.remember_tokens(v, key)
        elif isinstance(value, str) and key.lower().endswith("token") and len(value) >= 16:
            self.sent_tokens.add(value)
        elif isinstance(value, str):
            # Generated cases reuse values across fields: one sent as a dispatch id or in a path
            # may be logged there, and is no token.
            self.other_values.add(value)

    def account(self, label, response, cred, problems, request, before):
        self.remember_tokens(request.get("body"))
        self.remember_tokens({"path": request.get("path"), "query": request.get("query")})
        status = response.status_code
        stats = self.stats[label]
        stats["cases"] += 1
        stats["statuses"][str(status)] = stats["statuses"].get(str(status), 0) + 1
        if status in (401, 403):
            stats["frontDoor"] += 1
        elif cred in self.roles(label) or not self.roles(label):
            if 200 <= status < 300:
                stats["accepted"] += 1
            elif 400 <= status < 500:
                stats["refused"] += 1
        after = self.ledger.next_xid()
        self.state["xid"] = after
        if 400 <= status < 500:
            code = None
            try:
                code = response.json().get("code")
            except ValueError:
                problems.append("a refusal without a JSON error body")
            if after != before:
                now = self.ledger.digest()
                if now != self.state["digest"] and (label, code) not in COMMITTING_REFUSALS:
                    problems.append("a refused request changed the ledger")
                self.state["digest"] = now
        elif 200 <= status < 300 and (refusal := self.refusal_in(response)) is not None:
            # A refusal answered 200 (§3.4, §3.8): nothing changed, except what the contract
            # says commits anyway (a refused validation start still ACKs its dispatch, §4.9).
            flag, allowed = refusal
            self.refusals_checked += 1
            if after != before:
                now = self.ledger.digest()
                changed = [t for t, (a, b) in zip(LEDGER_TABLES, zip(self.state["digest"].split(";"),
                                                                     now.split(";")))
                           if a != b and t not in allowed]
                if changed:
                    problems.append(f"a refusal answered 200 ({flag}) changed the ledger: {changed}")
                self.state["digest"] = now
        elif after != before:
            self.state["digest"] = None  # written: the next request needs a new digest
        for problem in problems:
            self.fail(label, problem, request, response)

    @staticmethod
    def refusal_in(response):
        """(flag, tables allowed to change) when a 200 answers a refusal, else None."""
        try:
            body = response.json()
        except Exception:  # noqa: BLE001 — /metrics answers text
            return None
        if not isinstance(body, dict):
            return None
        for flag, allowed in (("claimed", ()), ("started", ("load_dispatch",)), ("changed", ())):
            if body.get(flag) is False:
                return f"{flag}:false", set(allowed)
        return None

    def expect(self, response, label, why, statuses, **fields):
        """The response has one of `statuses` and, when 200, the given body fields."""
        ok = response.status_code in statuses
        body = {}
        if ok and response.status_code == 200:
            body = response.json()
            ok = all(body.get(k) == v for k, v in fields.items())
        elif ok and fields.get("code"):
            ok = response.json().get("code") == fields["code"]
        if not ok:
            self.fail(label, f"{why}: expected {statuses} {fields}", self.last_request, response)
        return body

    def check_refusal(self, label, response, request, status, code, field):
        """The refusal §3.7 names: this status, this code, and (for REQUEST_INVALID) the field."""
        self.mutants += 1
        got_code, fields = None, []
        try:
            answer = response.json()
            got_code = answer.get("code")
            fields = [e.get("field") for e in (answer.get("details") or {}).get("errors", [])]
        except (ValueError, AttributeError):
            pass
        wanted = {field} if isinstance(field, str) else field
        if response.status_code != status or got_code != code or (wanted and not wanted & set(fields)):
            self.mismatches += 1
            self.fail(label, f"wrong refusal: expected {status} {code}"
                      + (f" naming {sorted(wanted)}" if wanted else "")
                      + f", got {response.status_code} {got_code} naming {fields[:4]}", request, response)

    def contract_limits(self, label, body):
        """Limits that live only in the contract (§3.3, §4), not in the document."""
        out = []
        if label == CHUNK and isinstance(body.get("hdfsPath"), str):
            base = body["hdfsPath"].rsplit("/", 1)[0] + "/"
            # 1500 chars but 2001 UTF-8 bytes (§3.3: uq_load_file_path's entry limit)
            wide = base + "é" * ((2001 - len(base.encode())) // 2 + 1)
            wide = wide[:1500] if len(wide) > 1500 else wide
            if len(wide.encode()) > 2000 and len(wide) <= 1500:
                out.append(("hdfsPath over 2000 UTF-8 bytes", {**body, "hdfsPath": wide}, "$.hdfsPath"))
        if label == METRICS:
            out.append(("queryVersion over 50 chars", {**body, "queryVersion": "v" * 51}, "$.queryVersion"))
        if label == MANIFEST:
            out.append(("sourceMetricsVersion over 50 chars",
                        {**body, "sourceMetricsVersion": "v" * 51}, "$.sourceMetricsVersion"))
            # §4.2: sourceMetrics maps 1..150-char keys to Message (≤ 2000 chars), ≤ 200 entries;
            # the document calls it free-form, so these live only in the contract.
            metrics = body.get("sourceMetrics") or {}
            for why, key, value in (("a value over 2000 chars", "FUZZ_M", "9" * 2001),
                                    ("a boolean value", "FUZZ_M", True),
                                    ("an object value", "FUZZ_M", {}),
                                    ("a key over 150 chars", "K" * 151, "1"),
                                    ("an empty key", "", "1")):
                out.append((f"sourceMetrics: {why}", {**body, "sourceMetrics": {**metrics, key: value}},
                            f"$.sourceMetrics.{key}"))
            many = {f"M{i}": "1" for i in range(201)}
            out.append(("sourceMetrics: 201 entries", {**body, "sourceMetrics": many}, "$.sourceMetrics"))
        if label == PART_FAIL:
            out.append(("attempt over 2147483647", {**body, "attempt": 2**31}, "$.attempt"))
        for name, value in body.items():
            if isinstance(value, int) and not isinstance(value, bool):
                out.append((f"{name} outside signed 64 bits", {**body, name: 2**63}, f"$.{name}"))
                out.append((f"{name} below signed 64 bits", {**body, name: -2**63 - 1}, f"$.{name}"))
                break
        return out

    # ---- one lifecycle step: its invalid variants, its foreign inputs, its credentials ---------

    def step(self, label, path=None, body=UNSET, query=None, expect=None, foreign=(), replay=None):
        """Sends the invalid variants of a valid request, then the foreign ones, then the valid
        request with wrong credentials, then the request itself (which must be accepted with
        `expect` fields), then its replay (`replay`: the fields a repeat must answer)."""
        operation = self.operations[label]
        path = path or {}
        query = query or {}
        # (response, request, expected status, expected code, fields one of which §3.7's
        # details.errors must name; None: any)
        refused = []
        invalid = (422, "REQUEST_INVALID")
        if body is not UNSET:
            schema = self.document.body_schema(operation)
            mutants = self.document.body_mutants(schema, body)
            self.rng.shuffle(mutants)
            for why, bad, field in mutants[:self.mutants_per_step]:
                refused.append((*self.sent(label, path, bad, query, why="negative: " + why), *invalid, field))
            refused.append((*self.sent(label, path, raw=("application/json", b'{"claimToken":'),
                                       why="negative: malformed JSON"), *invalid, "$"))
            refused.append((*self.sent(label, path, raw=("text/plain", json.dumps(body).encode()),
                                       why="negative: text/plain"), *invalid, None))
            refused.append((*self.sent(label, path, ["not", "an", "object"], query,
                                       why="negative: an array body"), *invalid, "$"))
            for why, bad, field in self.contract_limits(label, body):
                refused.append((*self.sent(label, path, bad, query, why="contract limit: " + why),
                                *invalid, field))
        if self.rng.random() < 0.25:  # §3.2: larger than server.max_body_bytes, on every route
            refused.append((*self.sent(label, path, raw=("application/json", b" " * (self.max_body + 1)),
                                       why="negative: body over max_body_bytes"),
                            413, "PAYLOAD_TOO_LARGE", None))
        for why, bad, field in self.document.query_mutants(operation, query)[:6]:
            refused.append((*self.sent(label, path, body, bad, why="negative: " + why), *invalid, field))
        for name, bad in (("run_id", "not-a-uuid"), ("partition_id", "12"), ("dispatch_id", "zz")):
            if name in path:
                refused.append((*self.sent(label, {**path, name: bad}, body, query,
                                           why=f"negative: path {name}"), *invalid, f"path.{name}"))
        for response, request, status, code, field in refused:
            self.stats[label]["negativeRefused"] += 1
            if field:  # which fields were mutated, per operation (shown in its stats line)
                named = field if isinstance(field, str) else min(field)
                fields = self.stats[label].setdefault("fieldsMutated", [])
                if named not in fields:
                    fields.append(named)
            self.check_refusal(label, response, request, status, code, field)
        for why, fpath, fbody, statuses, fields in foreign:
            response = self.send(label, fpath if fpath is not None else path,
                                 fbody if fbody is not None else body, query, why="foreign: " + why)
            self.expect(response, label, "foreign: " + why, statuses, **fields)
        if self.rng.random() < 0.3:
            for cred in ("none", "basic", "unknown") + tuple(
                    r for r in ("nifi", "operator") if self.roles(label) and r not in self.roles(label)):
                response = self.send(label, path, body, query, cred=cred, why="credentials " + cred)
                wanted = 401 if cred in ("none", "basic") else 403  # §3.6: unknown token → 403
                if response.status_code != wanted:
                    self.fail(label, f"credentials {cred}: expected {wanted}", None, response)
        response = self.send(label, path, body, query)
        result = self.expect(response, label, "valid", {200}, **(expect or {}))
        if replay is not None:
            again = self.send(label, path, body, query, why="replay")
            self.expect(again, label, "replay", {200}, **replay)
        return result

    # ---- lifecycles ------------------------------------------------------------------------------

    def create(self):
        self.serial += 1
        body = {"jobKey": "FUZZ_JOB", "businessKey": f"fuzz-{self.serial}-{new_uuid().hex[:8]}",
                "hdfsRoot": "/data/fuzz/", "stageTablePrefix": "tmp_fuzz_",
                "parameters": {"trigger": "FUZZ"}}
        created = self.step(CREATE, body=body, expect={"status": "CREATED"})
        if not created:
            return None
        dup = self.send(CREATE, body=body, why="duplicate active run")
        self.expect(dup, CREATE, "duplicate active run", {409}, code="DUPLICATE_ACTIVE_RUN")
        run = Run(created)
        self.runs.append(run)
        return run

    def manifest(self, run, invalid=False):
        parts = {"0000": 3, "0001": 2, "0002": 0}
        body = {"snapshotScn": "42", "sourceCount": 5 if not invalid else 6,
                "plannedPartitionCount": 3, "sourceMetrics": {"AMOUNT_SUM": "12.5"},
                "partitions": [{"partitionId": p, "lowerBound": str(i * 10),
                                "upperBound": str(i * 10 + 10), "upperInclusive": p == "0002",
                                "expectedRowCount": n}
                               for i, (p, n) in enumerate(parts.items())]}
        if invalid:
            response = self.send(MANIFEST, {"run_id": run.id}, body, why="invalid manifest")
            self.expect(response, MANIFEST, "invalid manifest", {422}, code="MANIFEST_INVALID")
            run.status = "FAILED_MANIFEST"
            return
        foreign = [("unknown run", {"run_id": str(new_uuid())}, None, {404}, {"code": "RUN_NOT_FOUND"})]
        self.step(MANIFEST, {"run_id": run.id}, body, expect={"status": "EXTRACTING"},
                  foreign=foreign, replay={"status": "EXTRACTING", "validationScheduled": False})
        run.status = "EXTRACTING"
        run.partitions = {p: {"expected": n, "token": None, "done": n == 0} for p, n in parts.items()}

    def claim(self, run, pid):
        token = str(new_uuid())
        body = {"claimToken": token, "workerNode": "fuzz-01"}
        path = {"run_id": run.id, "partition_id": pid}
        foreign = [("unknown partition", {**path, "partition_id": "0999"}, None, {404},
                    {"code": "PARTITION_NOT_FOUND"})]
        self.step(CLAIM, path, body, expect={"claimed": True, "partitionStatus": "RUNNING"},
                  foreign=foreign, replay={"claimed": True, "attempt": 1})
        rival = self.send(CLAIM, path, {**body, "claimToken": str(new_uuid())}, why="second claimant")
        self.expect(rival, CLAIM, "second claimant", {200}, claimed=False)
        run.partitions[pid]["token"] = token

    def chunk_body(self, run, pid, index, count, records):
        return {"claimToken": run.partitions[pid]["token"], "chunkIndex": index, "chunkCount": count,
                "hdfsPath": f"{run.path}/p={pid}/part-{index}.parquet", "recordCount": records,
                "byteCount": 100 * records}

    def chunks(self, run, pid):
        expected = run.partitions[pid]["expected"]
        path = {"run_id": run.id, "partition_id": pid}
        split = [expected - 1, 1] if expected > 1 else [expected]
        for index, records in enumerate(split):
            body = self.chunk_body(run, pid, index, len(split), records)
            foreign = [
                ("another claim token", None, {**body, "claimToken": str(new_uuid())}, {409},
                 {"code": "CLAIM_MISMATCH"}),
                ("index out of range", None, {**body, "chunkIndex": len(split)}, {422},
                 {"code": "CHUNK_INDEX_OUT_OF_RANGE"}),
                ("path outside the run", None, {**body, "hdfsPath": "/data/other/part-0.parquet"},
                 {422}, {"code": "HDFS_PATH_OUTSIDE_RUN"}),
                ("a .. segment", None, {**body, "hdfsPath": f"{run.path}/../x/part.parquet"}, {422},
                 {"code": "HDFS_PATH_OUTSIDE_RUN"}),
            ]
            last = index == len(split) - 1
            result = self.step(CHUNK, path, body, foreign=foreign,
                               expect={"recorded": True, "partitionStatus": "SUCCESS" if last else "RUNNING"},
                               replay={"recorded": True})
            if last and result.get("partitionStatus") == "SUCCESS":
                run.partitions[pid]["done"] = True
                run.status = result.get("runStatus", run.status)
        if run.partitions[pid]["done"]:
            body = self.chunk_body(run, pid, 0, len(split), split[0] + 1)
            conflict = self.send(CHUNK, path, body, why="changed content after success")
            self.expect(conflict, CHUNK, "changed content after success", {409}, code="CHUNK_CONFLICT")

    def fail_partition(self, run, pid, snapshot):
        body = {"claimToken": run.partitions[pid]["token"], "errorStage": "EXTRACT",
                "errorClass": "SNAPSHOT" if snapshot else "JDBC",
                "errorCode": "ORA-01555" if snapshot else "ORA-00028", "message": "fuzz", "attempt": 1}
        path = {"run_id": run.id, "partition_id": pid}
        foreign = [("another claim token", None, {**body, "claimToken": str(new_uuid())}, {409},
                    {"code": "CLAIM_MISMATCH"})]
        wanted = "FAILED_SNAPSHOT_EXPIRED" if snapshot else "FAILED_EXTRACT"
        self.step(PART_FAIL, path, body, foreign=foreign,
                  expect={"partitionStatus": "FAILED", "runStatus": wanted, "changed": True},
                  replay={"changed": False})
        run.status = wanted

    def fail_run(self, run):
        pairs = {"CREATED": "FAILED_MANIFEST", "EXTRACTING": "FAILED_EXTRACT",
                 "STAGE_VALIDATING": "FAILED_STAGE_VALIDATION", "STAGING_VALIDATED": "FAILED_PUBLISH",
                 "PUBLISHED": "FAILED_TARGET_VALIDATION"}
        body = {"expectedStatus": run.status, "failStatus": pairs[run.status],
                "errorStage": "FUZZ", "errorCode": "FUZZ_FAILED", "message": "fuzzed failure"}
        foreign = [
            ("a pair not allowed", None, {**body, "failStatus": "CANCELLED"}, {422},
             {"code": "FAIL_TRANSITION_NOT_ALLOWED"}),
            ("another expected status", None,
             {**body, "expectedStatus": "PUBLISHED" if run.status != "PUBLISHED" else "CREATED",
              "failStatus": "FAILED_TARGET_VALIDATION" if run.status != "PUBLISHED" else "FAILED_MANIFEST"},
             {409}, {"code": "RUN_STATUS_MISMATCH"}),
        ]
        self.step(RUN_FAIL, {"run_id": run.id}, body, foreign=foreign,
                  expect={"runStatus": pairs[run.status], "changed": True}, replay={"changed": False})
        run.status = pairs[run.status]

    def cancel(self, run):
        self.step(CANCEL, {"run_id": run.id}, {"reason": "fuzzed cancel"},
                  expect={"runStatus": "CANCELLED", "changed": True}, replay={"changed": False})
        run.status = "CANCELLED"
        dispatch, status = self.ledger.dispatch(run.id)
        if dispatch and status == "DEAD":
            path = {"run_id": run.id, "dispatch_id": dispatch}
            other = next((r for r in self.runs if r is not run), None)
            foreign = [("another run's dispatch", {"run_id": other.id, "dispatch_id": dispatch},
                        None, {404}, {"code": "DISPATCH_NOT_FOUND"})] if other else []
            foreign.append(("an unknown dispatch", {**path, "dispatch_id": str(new_uuid())},
                            None, {404}, {"code": "DISPATCH_NOT_FOUND"}))
            self.step(RESEND, path, foreign=foreign, expect={"status": "PENDING"})
            again = self.send(RESEND, path, why="resend replay")
            self.expect(again, RESEND, "resend replay", {409}, code="DISPATCH_STATUS_MISMATCH")

    def start_validation(self, run):
        dispatch, _ = self.ledger.dispatch(run.id)
        if dispatch is None:
            self.fail(START, "a completed run has no VALIDATE_RUN dispatch", {"run": run.id})
            return
        run.dispatch = dispatch
        body = {"dispatchId": dispatch, "node": "fuzz-02"}
        foreign = [("an unknown dispatch", None, {**body, "dispatchId": str(new_uuid())}, {409},
                    {"code": "DISPATCH_MISMATCH"})]
        self.step(START, {"run_id": run.id}, body, foreign=foreign,
                  expect={"started": True, "runStatus": "STAGE_VALIDATING"},
                  replay={"started": False})
        run.status = "STAGE_VALIDATING"

    def metrics(self, run, stage, fail):
        body = {"stage": stage, "queryVersion": "v1", "metrics": [
            {"metricName": f"{stage}_COUNT", "expectedValue": "5", "actualValue": "5",
             "result": "PASS", "details": {"sql": "q1"}},
            {"metricName": "DUP_PK_COUNT", "expectedValue": "0", "actualValue": "1" if fail else "0",
             "result": "FAIL" if fail else "PASS"}]}
        other = "TARGET" if stage == "STAGING" else "STAGING"
        foreign = [("the other stage", None, {**body, "stage": other}, {409}, {"code": "RUN_STATUS_MISMATCH"})]
        self.step(METRICS, {"run_id": run.id}, body, foreign=foreign,
                  expect={"recorded": 2, "failCount": 1 if fail else 0})

    def stage_validated(self, run, fail):
        self.metrics(run, "STAGING", fail)
        if fail:
            response = self.send(STAGE_OK, {"run_id": run.id}, why="failing metrics")
            self.expect(response, STAGE_OK, "failing metrics", {200}, stageValidated=False,
                        reasons=["FAIL DUP_PK_COUNT"])
            self.metrics(run, "STAGING", False)
        self.step(STAGE_OK, {"run_id": run.id}, expect={"stageValidated": True},
                  replay={"stageValidated": True})
        run.status = "STAGING_VALIDATED"

    def publish_claim(self, run):
        token = str(new_uuid())
        self.step(PUB_CLAIM, {"run_id": run.id}, {"publishToken": token},
                  expect={"claimed": True, "runStatus": "PUBLISHING"}, replay={"claimed": True})
        rival = self.send(PUB_CLAIM, {"run_id": run.id}, {"publishToken": str(new_uuid())},
                          why="second publish claimant")
        self.expect(rival, PUB_CLAIM, "second publish claimant", {200}, claimed=False)
        run.publish_token = token
        run.status = "PUBLISHING"

    def publish_result(self, run, outcome):
        body = {"publishToken": run.publish_token, "outcome": outcome, "errorCode": None,
                "message": "fuzzed outcome"}
        foreign = [("another publish token", None, {**body, "publishToken": str(new_uuid())}, {409},
                    {"code": "PUBLISH_TOKEN_MISMATCH"})]
        self.step(PUB_RESULT, {"run_id": run.id}, body, foreign=foreign,
                  expect={"runStatus": outcome, "changed": True}, replay={"changed": False})
        run.status = outcome
        if outcome == "PUBLISH_UNKNOWN":
            late = self.send(PUB_RESULT, {"run_id": run.id}, {**body, "outcome": "PUBLISHED"},
                             why="a late PUBLISHED after PUBLISH_UNKNOWN")
            self.expect(late, PUB_RESULT, "late PUBLISHED", {409}, code="RUN_STATUS_MISMATCH")

    def resolve(self, run, resolution):
        foreign = [("unknown run", {"run_id": str(new_uuid())}, None, {404}, {"code": "RUN_NOT_FOUND"})]
        self.step(RESOLVE, {"run_id": run.id}, {"resolution": resolution, "reason": "checked the table"},
                  foreign=foreign, expect={"runStatus": resolution, "changed": True},
                  replay={"changed": False})
        run.status = resolution

    def succeed(self, run):
        self.metrics(run, "TARGET", False)
        self.step(SUCCESS, {"run_id": run.id}, {"targetCount": 5},
                  expect={"success": True, "runStatus": "SUCCESS"}, replay={"success": True})
        run.status = "SUCCESS"

    def cleanup(self, run):
        deadline = time.time() + 10
        while time.time() < deadline:  # retention is 1 s in the fuzzer's configuration
            listed = self.send(CANDIDATES, query={"jobKey": "FUZZ_JOB", "limit": 500})
            if listed.status_code == 200 and any(r["runId"] == run.id for r in listed.json()["runs"]):
                break
            time.sleep(0.2)
        else:
            self.fail(CANDIDATES, "a finished run never became a cleanup candidate", {"run": run.id})
            return
        self.step(CLEANUP, {"run_id": run.id},
                  {"droppedTable": "tmp_fuzz_x", "deletedPath": run.path},
                  expect={"changed": True}, replay={"changed": False})
        run.cleaned = True

    def reads(self, run):
        self.step(DETAIL, {"run_id": run.id}, expect={"status": run.status})
        self.step(EVENTS, {"run_id": run.id}, query={"limit": 50})
        self.step(LIST_METRICS, {"run_id": run.id})
        self.step(LIST, query={"jobKey": "FUZZ_JOB", "limit": 20})
        self.step(SUMMARY, query={"alertLimit": 20})
        self.step(CANDIDATES, query={"jobKey": "FUZZ_JOB", "limit": 10})
        for label in (DETAIL, EVENTS, LIST_METRICS):
            missing = self.send(label, {"run_id": str(new_uuid())}, why="unknown run")
            self.expect(missing, label, "unknown run", {404}, code="RUN_NOT_FOUND")

    def lifecycle(self, walk):
        """One run, from creation to its end, down branches chosen by the walk number."""
        rng = self.rng
        run = self.create()
        if run is None:
            return
        if walk % 11 == 3:
            self.manifest(run, invalid=True)
        elif walk % 11 == 4:
            self.fail_run(run)
        elif walk % 11 == 5:
            self.cancel(run)
        else:
            self.manifest(run)
        if run.status == "EXTRACTING":
            for pid, part in run.partitions.items():
                if not part["done"]:
                    self.claim(run, pid)
            for pid, part in run.partitions.items():
                if run.status != "EXTRACTING" or part["done"]:
                    continue
                if walk % 11 == 6:
                    self.fail_partition(run, pid, snapshot=walk % 2 == 0)
                elif walk % 11 == 7:
                    self.fail_run(run)
                else:
                    self.chunks(run, pid)
        if run.status == "EXTRACTED_VALIDATED":
            if walk % 11 in (0, 8):
                self.cancel(run)  # its VALIDATE_RUN dispatch dies with it: resent, then refused
            else:
                self.start_validation(run)
        if run.status == "STAGE_VALIDATING":
            if walk % 11 == 9:
                self.fail_run(run)
            else:
                self.stage_validated(run, fail=rng.random() < 0.3)
        if run.status == "STAGING_VALIDATED":
            self.publish_claim(run)
        if run.status == "PUBLISHING":
            outcome = ["PUBLISHED", "PUBLISH_UNKNOWN", "PUBLISHED", "FAILED_PUBLISH", "PUBLISH_UNKNOWN"][walk % 5]
            self.publish_result(run, outcome)
        if run.status == "PUBLISH_UNKNOWN":
            self.resolve(run, "PUBLISHED" if rng.random() < 0.5 else "FAILED_PUBLISH")
        if run.status == "PUBLISHED":
            if walk % 11 == 10:
                self.fail_run(run)
            else:
                self.succeed(run)
        self.reads(run)
        if run.status not in ("CREATED", "EXTRACTING", "PUBLISH_UNKNOWN") and walk % 3 == 0:
            self.cleanup(run)

    def parked(self):
        """Runs left in every state with live tokens, for the schema phase to aim at: each one
        taken along the happy path until it reaches its state."""
        def unfinished(run, step):
            for pid, part in run.partitions.items():
                if not part["done"]:
                    step(run, pid)

        path = [
            lambda run: (self.manifest(run), unfinished(run, self.claim)),
            lambda run: unfinished(run, self.chunks),
            self.start_validation,
            lambda run: self.stage_validated(run, False),
            self.publish_claim,
        ]
        for stop in ("CREATED", "EXTRACTING", "EXTRACTED_VALIDATED", "STAGE_VALIDATING",
                     "STAGING_VALIDATED", "PUBLISHING", "PUBLISH_UNKNOWN", "PUBLISHED"):
            run = self.create()
            if run is None:
                continue
            for step in path:
                if run.status == stop:
                    break
                step(run)
            if stop in ("PUBLISH_UNKNOWN", "PUBLISHED"):
                self.publish_result(run, stop)

    # ---- schema fuzzing aimed at live runs -----------------------------------------------------

    @staticmethod
    def negative_components(case):
        """Where a generated case is invalid: {"path", "query", "header", "body"} (some of)."""
        meta = case.meta
        return {str(getattr(location, "name", location)).lower()
                for location, component in ((meta.components or {}).items() if meta else ())
                if component.mode.is_negative}

    @staticmethod
    def query_names(operation):
        return {p["name"] for p in operation.definition.raw.get("parameters", []) if p["in"] == "query"}

    def aim(self, case, pick):
        """Points a generated case at a live run half of the time, with the tokens its callers
        hold, so that generated bodies reach the gate and the CAS behind the token checks."""
        params = case.path_parameters or {}
        negative = self.negative_components(case)
        if "run_id" not in params or "path" in negative or pick.random() < 0.3:
            return
        run = pick.choice(self.runs)
        params["run_id"] = run.id
        pid = None
        if "partition_id" in params and run.partitions and pick.random() < 0.8:
            pid = pick.choice(sorted(run.partitions))
            params["partition_id"] = pid
        if "dispatch_id" in params and run.dispatch and pick.random() < 0.8:
            params["dispatch_id"] = run.dispatch
        body = case.body
        if not isinstance(body, dict) or "body" in negative or pick.random() < 0.2:
            return  # a live token must not replace the one invalid value of a negative body
        if "claimToken" in body and pid and run.partitions[pid]["token"]:
            body["claimToken"] = run.partitions[pid]["token"]
            if "hdfsPath" in body and isinstance(body["hdfsPath"], str) and pick.random() < 0.7:
                leaf = re.sub(r"[^A-Za-z0-9_.=-]", "", body["hdfsPath"])[:40] or "x"
                body["hdfsPath"] = f"{run.path}/p={pid}/{leaf}"
        if "publishToken" in body and run.publish_token:
            body["publishToken"] = run.publish_token
        if "dispatchId" in body and run.dispatch:
            body["dispatchId"] = run.dispatch

    def schema_phase(self, cases):
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        per_mode = max(1, -(-cases // (len(self.operations) * len(modes))))
        for label, operation in self.operations.items():
            cred = self.role_for(label)
            headers = self.headers(cred)
            for mode in modes:
                @hypothesis.seed(derived_seed(self.seed, label, mode.value))  # --seed replays it
                @hypothesis.settings(
                    max_examples=per_mode, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(hypothesis.HealthCheck),
                    phases=[hypothesis.Phase.generate],
                )
                @hypothesis.given(case=operation.as_strategy(generation_mode=mode),
                                  pick=st.randoms(use_true_random=False))
                def one(case, pick):
                    self.aim(case, pick)
                    before = self.ledger.next_xid()
                    if self.state["digest"] is None or before != self.state["xid"]:
                        self.state["digest"] = self.ledger.digest()
                    response = case.call(base_url=self.api, session=self.session, headers=headers)
                    # Phase 2 adds negative_data_rejection: an invalid case answered 2xx fails;
                    # except when the one invalid part was the Authorization header, which the
                    # fuzzer's own credentials replaced (that negation never reached the server).
                    negative = self.negative_components(case)
                    # (Unknown query parameters are ignored: with a header negation
                    # beside them, schemathesis no longer sees that only they were invalid.)
                    moot = "header" in negative and (negative <= {"header"} or (
                        negative - {"header"} <= {"query"}
                        and set(case.query or {}) - self.query_names(operation)))
                    checks = CHECKS if moot else CHECKS + [negative_data_rejection]
                    self.rejection_checked += checks is not CHECKS and mode is GenerationMode.NEGATIVE
                    problems = [p for p in self.conformance(case, response, headers, checks)
                                if not LENIENT_STRING.search(p)
                                and not (NEGATIVE_REJECTION.search(p) and self.too_large(response))]
                    request = {"why": f"schema {mode.value}", "path": case.formatted_path,
                               "query": case.query, "cred": cred,
                               "body": case.body if not isinstance(case.body, bytes) else repr(case.body[:200])}
                    self.remember_tokens({"path": case.path_parameters or {}})
                    self.account(label, response, cred, problems, request, before)

                try:
                    one()
                except hypothesis.errors.Unsatisfiable:
                    pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--nifi-token", required=True)
    parser.add_argument("--operator-token", required=True)
    parser.add_argument("--cases", type=int, default=10000, help="total requests, at least")
    parser.add_argument("--walks", type=int, default=33, help="lifecycles driven in phase 1")
    parser.add_argument("--log", help="the api-server's log, scanned for every token sent (§9.2)")
    parser.add_argument("--mutants-per-step", type=int, default=12)
    parser.add_argument("--max-body-bytes", type=int, default=262144,
                        help="the server's server.max_body_bytes (a body one byte over → 413)")
    parser.add_argument("--seed", type=int, help="replay the run of this seed (default: a new one)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**63)
    SEEDED.seed(derived_seed(args.seed, "uuids"))
    print(json.dumps({"seed": args.seed, "replay": f"scripts/fuzz-api --seed {args.seed}"}), flush=True)

    started = time.time()
    ledger = Ledger(args.db)
    schema = schemathesis.openapi.from_url(args.api + "/openapi.json")
    document = Document(requests.get(args.api + "/openapi.json", timeout=30).json())
    fuzzer = Fuzzer(args, ledger, schema, document)

    for walk in range(args.walks):
        fuzzer.lifecycle(walk)
    # The end of a run is reached down random branches (a stage validation fails at random, a
    # PUBLISH_UNKNOWN is resolved either way), so a seed can leave its operations short of
    # accepted cases: walks down the branches that end in SUCCESS (walk 2) and in a resolved
    # PUBLISH_UNKNOWN (walk 1) top them up, a bounded number of times.
    late = (SUCCESS, RESOLVE, PUB_RESULT)
    for extra in range(24):
        if all(fuzzer.stats.get(label, {}).get("accepted", 0) >= MIN_EACH for label in late):
            break
        fuzzer.lifecycle(2 if extra % 2 == 0 else 1)
    fuzzer.parked()
    lifecycle_cases = sum(s["cases"] for s in fuzzer.stats.values())
    # At least 20 cases per operation and generation mode; operations without parameters run
    # out of distinct examples early, hence the 30 % more.
    fuzzer.schema_phase(max(40 * len(fuzzer.operations), (args.cases - lifecycle_cases) * 13 // 10))

    uncovered = []
    for label, stats in fuzzer.stats.items():
        stats["fieldsMutated"] = sorted(stats.get("fieldsMutated", []))
        print(json.dumps(stats), flush=True)
        if label in NO_INPUT:
            if stats["accepted"] < 1:
                uncovered.append(label)
        elif stats["accepted"] < MIN_EACH or stats["refused"] < MIN_EACH:
            uncovered.append(label)
    totals = {
        "cases": sum(s["cases"] for s in fuzzer.stats.values()),
        "lifecycleCases": lifecycle_cases,
        "walks": args.walks,
        "runs": len(fuzzer.runs),
        "accepted": sum(s["accepted"] for s in fuzzer.stats.values()),
        "refused": sum(s["refused"] for s in fuzzer.stats.values()),
        "frontDoor": sum(s["frontDoor"] for s in fuzzer.stats.values()),
        "negativeRefused": sum(s["negativeRefused"] for s in fuzzer.stats.values()),
        "mutantsChecked": fuzzer.mutants,
        "fieldsMutated": sum(len(s["fieldsMutated"]) for s in fuzzer.stats.values()),
        "wrongRefusals": fuzzer.mismatches,
        "refusals200Checked": fuzzer.refusals_checked,
        "schemaNegativeChecked": fuzzer.rejection_checked,
        "failures": len(fuzzer.failures),
        "uncovered": uncovered,
        "digests": ledger.digests,
        "operations": len(fuzzer.operations),
        "seconds": round(time.time() - started, 1),
        "seed": args.seed,
    }
    if args.log:
        # Every claim, publish and bearer token the fuzzer sent, searched for in the server's
        # whole log, access bodies included (they are on, as by default).
        with open(args.log, encoding="utf-8", errors="replace") as f:
            log = f.read()
        if "api_request" not in log or '"***' not in log:
            fuzzer.failures.append({"operation": "log scan", "problem": "no access log with masked bodies to scan"})
        leaked = sorted(t for t in fuzzer.sent_tokens - fuzzer.other_values if t in log)
        for token in leaked[:20]:
            line = next(l for l in log.splitlines() if token in l)
            # Where in the line: the field around the token says which rule missed it.
            at = line.index(token)
            fuzzer.failures.append({"operation": "log scan", "problem": "a token is in the log",
                                    "line": line[:200], "around": line[max(0, at - 300):at + len(token) + 60]})
        totals_scan = {"tokensSent": len(fuzzer.sent_tokens - fuzzer.other_values), "tokensInLog": len(leaked), "logBytes": len(log)}
        totals["logScan"] = totals_scan
        totals["failures"] = len(fuzzer.failures)
    kinds = {}
    for failure in fuzzer.failures:  # every failure counted by kind; the first 50 printed
        kind = f"{failure['operation']}: {re.sub(r'[0-9a-f-]{36}', '…', str(failure['problem']))[:70]}"
        kinds[kind] = kinds.get(kind, 0) + 1
    if kinds:
        totals["failureKinds"] = dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:20])
    for failure in fuzzer.failures[:50]:
        print(json.dumps({"failure": failure}, default=str), flush=True)
    print(json.dumps({"summary": totals}), flush=True)
    if fuzzer.failures or uncovered or totals["cases"] < args.cases:
        if uncovered:
            print(f"fuzz-api: fewer than {MIN_EACH} accepted or refused requests past "
                  f"authentication for: {', '.join(uncovered)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
