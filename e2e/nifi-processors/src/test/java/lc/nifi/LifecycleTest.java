package lc.nifi;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Whole runs through NiFi 2.6.0's own processors against a running load-control: the calls of
 * PG-10, PG-20, PG-05, PG-40, PG-50 and PG-60 (docs/nifi.md), each body built by ReplaceText
 * with NiFi Expression Language, sent by InvokeHTTP, read by EvaluateJsonPath and routed by
 * RouteOnAttribute on exactly the answers the flow routes on; PG-05 is HandleHttpRequest and
 * HandleHttpResponse receiving the dispatcher's VALIDATE_RUN and REISSUE_PARTITION.
 *
 * <p>Started by e2e/suite/tests/nifi_processors.rs, which runs load-control (api-server and
 * operators on a private PostgreSQL) and passes LC_API_URL, LC_NIFI_TOKEN, LC_RECEIVER_PORT and
 * LC_JOB_KEY.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class LifecycleTest {
    static Flow flow;
    static Pg05 pg05;
    static String jobKey;

    static String env(String name) {
        String v = System.getenv(name);
        assertNotNull(v, name + " is not set: run this module through "
                + "`cargo test -p load-control-e2e --test nifi_processors` (docs/nifi.md)");
        return v;
    }

    @BeforeAll
    static void start() throws Exception {
        flow = new Flow(env("LC_API_URL"), env("LC_NIFI_TOKEN"));
        jobKey = env("LC_JOB_KEY");
        pg05 = new Pg05(Integer.parseInt(env("LC_RECEIVER_PORT")));
    }

    @AfterAll
    static void stop() {
        if (pg05 != null) {
            pg05.close();
        }
    }

    // ---- the flow's templates (ReplaceText's Replacement Value) ----

    static final String CREATE = """
            {"jobKey":"${lca.jobKey:escapeJson()}","businessKey":"${lca.businessKey:escapeJson()}",\
            "hdfsRoot":"${lca.hdfsRoot:escapeJson()}","stageTablePrefix":"tmp_nifi_","allowEmptySource":"false",\
            "parameters":{"trigger":"${lca.trigger:escapeJson()}"}}""";

    /** AttributesToJSON's style: every number and boolean a string. */
    static final String MANIFEST = """
            {"snapshotScn":"${lca.snapshotScn}","sourceCount":"${lca.rowsPerPartition:multiply(2)}",\
            "plannedPartitionCount":"2","sourceMetrics":{"AMOUNT_SUM":"123.45"},"partitions":[\
            {"partitionId":"0000","lowerBound":"0","upperBound":"1000","upperInclusive":"false",\
            "isNullPartition":"false","expectedRowCount":"${lca.rowsPerPartition}"},\
            {"partitionId":"0001","lowerBound":"1000","upperBound":"2000","upperInclusive":"true",\
            "isNullPartition":"false","expectedRowCount":"${lca.rowsPerPartition}"}]}""";

    static final String CLAIM = """
            {"claimToken":"${lca.claimToken}","workerNode":"${lca.workerNode}"}""";

    static final String CHUNK = """
            {"claimToken":"${lca.claimToken}","chunkIndex":"${lca.chunkIndex}","chunkCount":"${lca.chunkCount}",\
            "fragmentIdentifier":"${lca.fragment}","hdfsPath":"${lca.hdfsPath:escapeJson()}",\
            "recordCount":"${lca.recordCount}","byteCount":"${lca.byteCount}"}""";

    static final String VALIDATION_START = """
            {"dispatchId":"${lca.dispatchId}","node":"${lca.workerNode}"}""";

    static final String STAGING = """
            {"stage":"STAGING","queryVersion":"v1","metrics":[\
            {"metricName":"STAGE_COUNT","expectedValue":"${lca.extractedCount}","actualValue":"${lca.extractedCount}","result":"PASS"},\
            {"metricName":"DUP_PK_COUNT","expectedValue":"0","actualValue":"0","result":"PASS"}]}""";

    static final String PUBLISH_CLAIM = """
            {"publishToken":"${lca.publishToken}"}""";

    static final String PUBLISH_RESULT = """
            {"publishToken":"${lca.publishToken}","outcome":"PUBLISHED"}""";

    static final String TARGET = """
            {"stage":"TARGET","metrics":[\
            {"metricName":"TARGET_COUNT","expectedValue":"${lca.extractedCount}","actualValue":"${lca.extractedCount}","result":"PASS"}]}""";

    static final String RUN = "${lca.api}/v1/runs/${lca.runId}";
    static final String PARTITION = RUN + "/partitions/${lca.partitionId}";

    /** RouteOnAttribute's rule: answered 200 and the JSON flag read into `attr` is true. */
    static String okAnd(String attr) {
        return "${invokehttp.status.code:equals('200'):and(${" + attr + ":equals('true')})}";
    }

    static String refused(String code) {
        return "${invokehttp.status.code:equals('409'):and(${lca.code:equals('" + code + "')})}";
    }

    // ---- PG-10 ----

    Flow.FF createRun(String businessKey) {
        Flow.FF ff = Flow.update(Flow.FF.empty(Map.of()), Map.of(
                "lca.jobKey", jobKey,
                "lca.businessKey", businessKey,
                "lca.hdfsRoot", "/data/nifi/stage/",
                "lca.trigger", "nifi-${literal('processors')}",
                "lca.snapshotScn", "${now():toNumber()}",
                "lca.rowsPerPartition", "100",
                "lca.workerNode", "nifi-01"));
        ff = new Flow.FF(ff.content(), withApi(ff.attrs()));
        Flow.FF created = flow.post("${lca.api}/v1/runs", ff, CREATE);
        created = Flow.evaluateJsonPath(created, Map.of("lca.runId", "$.runId",
                "lca.hdfsRunPath", "$.hdfsRunPath", "lca.runStatus", "$.status", "lca.code", "$.code"));
        Flow.routeTo(created, "created", Map.of(
                "created", "${invokehttp.status.code:equals('200'):and(${lca.runStatus:equals('CREATED')})}",
                "duplicate", refused("DUPLICATE_ACTIVE_RUN")));
        assertTrue(created.attr("lca.hdfsRunPath").contains(created.attr("lca.runId")), created.toString());
        return created;
    }

    static Map<String, String> withApi(Map<String, String> attrs) {
        Map<String, String> a = new HashMap<>(attrs);
        a.put("lca.api", flow.api);
        return a;
    }

    /** The manifest, then SplitJson over `dispatchPartitions`: one FlowFile per partition. */
    List<Flow.FF> manifest(Flow.FF run) {
        Flow.FF answer = flow.post(RUN + "/manifest", run, MANIFEST);
        answer = Flow.evaluateJsonPath(answer, Map.of("lca.runStatus", "$.status"));
        Flow.routeTo(answer, "extracting", Map.of(
                "extracting", "${invokehttp.status.code:equals('200'):and(${lca.runStatus:equals('EXTRACTING')})}"));
        List<Flow.FF> parts = Flow.splitJson(answer, "$.dispatchPartitions");
        assertEquals(2, parts.size(), "dispatchPartitions of " + answer);
        return parts.stream().map(p -> Flow.evaluateJsonPath(p, Map.of(
                "lca.partitionId", "$.partitionId", "lca.expectedRowCount", "$.expectedRowCount"))).toList();
    }

    // ---- PG-20 ----

    /** UpdateAttribute (a claim token per claim attempt), then the claim. */
    Flow.FF claim(Flow.FF part) {
        Flow.FF ff = Flow.update(part, Map.of("lca.claimToken", "${UUID()}", "lca.fragment", "f-${UUID()}"));
        Flow.FF answer = flow.post(PARTITION + "/claim", ff, CLAIM);
        answer = Flow.evaluateJsonPath(answer, Map.of("lca.claimed", "$.claimed", "lca.attempt", "$.attempt",
                "lca.code", "$.code"));
        Flow.routeTo(answer, "claimed", Map.of("claimed", okAnd("lca.claimed"),
                "lost", "${invokehttp.status.code:equals('200'):and(${lca.claimed:equals('false')})}"));
        return answer;
    }

    /** Chunk `index` of two: UpdateAttribute computes its path and counts, then the report. */
    Flow.FF chunk(Flow.FF claimed, int index) {
        Flow.FF ff = Flow.update(claimed, Map.of(
                "lca.chunkIndex", Integer.toString(index),
                "lca.chunkCount", "2",
                "lca.recordCount", "${lca.expectedRowCount:divide(2)}",
                "lca.byteCount", "${lca.expectedRowCount:divide(2):multiply(64)}",
                "lca.hdfsPath", "${lca.hdfsRunPath}/p=${lca.partitionId}/part-" + String.format("%05d", index)
                        + "-${lca.claimToken:substring(0,8)}.parquet"));
        Flow.FF answer = flow.post(PARTITION + "/chunks", ff, CHUNK);
        return Flow.evaluateJsonPath(answer, Map.of("lca.recorded", "$.recorded",
                "lca.partitionStatus", "$.partitionStatus", "lca.runStatus", "$.runStatus",
                "lca.validationScheduled", "$.validationScheduled", "lca.code", "$.code"));
    }

    /** Both chunks of a claimed partition; the last one completes it. Returns the last answer. */
    Flow.FF extract(Flow.FF claimed) {
        Flow.FF first = chunk(claimed, 0);
        Flow.routeTo(first, "recorded", Map.of("recorded",
                okAnd("lca.recorded"), "refused", "${invokehttp.status.code:ge(400)}"));
        assertEquals("RUNNING", first.attr("lca.partitionStatus"), first.toString());
        Flow.FF last = chunk(first, 1);
        Flow.routeTo(last, "partitionDone", Map.of("partitionDone",
                "${invokehttp.status.code:equals('200'):and(${lca.recorded:equals('true')})"
                        + ":and(${lca.partitionStatus:equals('SUCCESS')})}",
                "refused", "${invokehttp.status.code:ge(400)}"));
        return last;
    }

    // ---- PG-05 → PG-40 → PG-50 → PG-60 ----

    /**
     * PG-05's signature check (docs/nifi.md, "What PG-05 does"), on what HandleHttpRequest hands
     * the flow: the headers as `http.headers.X-Lca-Key-Id`, `…X-Lca-Timestamp` and
     * `…X-Lca-Signature`, spelt as load-control sends them; the HMAC-SHA256 of
     * `<timestamp>.<body bytes>` with the key of that id, lower-case hex, compared in constant
     * time; the timestamp within 300 s.
     */
    static void checkSignature(Flow.FF d) throws Exception {
        String keyId = env("LC_SIGNING_KEY_ID");
        String secret = env("LC_SIGNING_SECRET");
        assertEquals(keyId, d.attr("http.headers.X-Lca-Key-Id"), "key id, " + d);
        String ts = d.attr("http.headers.X-Lca-Timestamp");
        String sig = d.attr("http.headers.X-Lca-Signature");
        assertNotNull(ts, "X-Lca-Timestamp, " + d);
        assertNotNull(sig, "X-Lca-Signature, " + d);
        assertTrue(Math.abs(System.currentTimeMillis() / 1000 - Long.parseLong(ts)) <= 300, "timestamp " + ts);
        javax.crypto.Mac mac = javax.crypto.Mac.getInstance("HmacSHA256");
        mac.init(new javax.crypto.spec.SecretKeySpec(
                secret.getBytes(java.nio.charset.StandardCharsets.UTF_8), "HmacSHA256"));
        mac.update((ts + ".").getBytes(java.nio.charset.StandardCharsets.UTF_8));
        String expected = java.util.HexFormat.of().formatHex(mac.doFinal(d.content()));
        assertTrue(java.security.MessageDigest.isEqual(
                expected.getBytes(java.nio.charset.StandardCharsets.US_ASCII),
                sig.getBytes(java.nio.charset.StandardCharsets.US_ASCII)),
                "X-Lca-Signature " + sig + " is not HMAC-SHA256(" + ts + ".<body>): " + d);
    }

    /** PG-05: the VALIDATE_RUN dispatch for the run, as HandleHttpRequest hands it to the flow. */
    Flow.FF receiveValidate(Flow.FF run) throws Exception {
        String runId = run.attr("lca.runId");
        Flow.FF d = pg05.await(f -> runId.equals(f.attr("http.headers.X-Run-Id"))
                && f.attr("http.request.uri").startsWith("/validate/"), 60);
        assertEquals("POST", d.attr("http.method"));
        assertEquals("/validate/" + jobKey, d.attr("http.request.uri"));
        assertEquals("HTTP/1.1", d.attr("http.protocol"));
        checkSignature(d);
        assertTrue(d.attr("mime.type").startsWith("application/json"), d.toString());
        d = Flow.evaluateJsonPath(d, Map.of("lca.runId", "$.runId", "lca.dispatchId", "$.dispatchId"));
        assertEquals(d.attr("http.headers.X-Dispatch-Id"), d.attr("lca.dispatchId"), d.toString());
        assertEquals(runId, d.attr("lca.runId"));
        return routed(d, "validate");
    }

    /** PG-05's RouteOnAttribute on the dispatch's path, then the attributes the flow carries on. */
    Flow.FF routed(Flow.FF d, String route) {
        Flow.routeTo(d, route, Map.of(
                "validate", "${http.request.uri:startsWith('/validate/')}",
                "reissue", "${http.request.uri:startsWith('/reissue/')}"));
        Map<String, String> attrs = new HashMap<>(d.attrs());
        attrs.put("lca.api", flow.api);
        attrs.put("lca.workerNode", "nifi-02");
        return Flow.FF.empty(attrs);
    }

    Flow.FF validateAndPublish(Flow.FF dispatch) {
        // PG-40: a generous read timeout (docs/nifi.md: its replay cannot carry the first answer).
        Flow.FF start = flow.invoke("POST", RUN + "/validation/start", Flow.replaceText(dispatch, VALIDATION_START),
                "60 secs");
        start = Flow.evaluateJsonPath(start, Map.of("lca.started", "$.started", "lca.runStatus", "$.runStatus",
                "lca.extractedCount", "$.extractedCount"));
        Flow.routeTo(start, "started", Map.of("started", okAnd("lca.started"),
                "duplicate", "${invokehttp.status.code:equals('200'):and(${lca.started:equals('false')})}"));
        assertEquals("200", start.attr("lca.extractedCount"), start.toString());
        Flow.FF metrics = Flow.evaluateJsonPath(flow.post(RUN + "/validations", start, STAGING),
                Map.of("lca.recorded", "$.recorded", "lca.failCount", "$.failCount"));
        Flow.routeTo(metrics, "stored", Map.of("stored",
                "${invokehttp.status.code:equals('200'):and(${lca.failCount:equals('0')})}"));
        Flow.FF verdict = Flow.evaluateJsonPath(flow.post(RUN + "/stage-validated", metrics, "{}"),
                Map.of("lca.stageValidated", "$.stageValidated"));
        Flow.routeTo(verdict, "validated", Map.of("validated", okAnd("lca.stageValidated")));
        // PG-50
        Flow.FF pub = Flow.update(verdict, Map.of("lca.publishToken", "${UUID()}"));
        Flow.FF claim = Flow.evaluateJsonPath(flow.post(RUN + "/publish/claim", pub, PUBLISH_CLAIM),
                Map.of("lca.claimed", "$.claimed", "lca.runStatus", "$.runStatus"));
        Flow.routeTo(claim, "claimed", Map.of("claimed", okAnd("lca.claimed")));
        Flow.FF result = Flow.evaluateJsonPath(flow.post(RUN + "/publish/result", claim, PUBLISH_RESULT),
                Map.of("lca.runStatus", "$.runStatus"));
        Flow.routeTo(result, "published", Map.of("published",
                "${invokehttp.status.code:equals('200'):and(${lca.runStatus:equals('PUBLISHED')})}"));
        // PG-60
        Flow.FF target = flow.post(RUN + "/validations", result, TARGET);
        Flow.routeTo(target, "stored", Map.of("stored", "${invokehttp.status.code:equals('200')}"));
        Flow.FF success = Flow.evaluateJsonPath(flow.post(RUN + "/success", target, "{}"),
                Map.of("lca.success", "$.success", "lca.runStatus", "$.runStatus"));
        Flow.routeTo(success, "success", Map.of("success", okAnd("lca.success")));
        return success;
    }

    /** The run as a dashboard reads it: GET /v1/runs/{runId}. */
    Flow.FF runDetail(Flow.FF ff) {
        Flow.FF detail = flow.invoke("GET", RUN, Flow.FF.empty(ff.attrs()));
        return Flow.evaluateJsonPath(detail, Map.of("lca.runStatus", "$.status",
                "lca.extractedCount", "$.extractedCount"));
    }

    @Test
    @Order(1)
    void a_whole_run_goes_through_nifis_processors() throws Exception {
        Flow.FF run = createRun("nifi-proc-" + System.currentTimeMillis());
        // A second create for the same key while the first is active: 409 DUPLICATE_ACTIVE_RUN.
        Flow.FF dup = flow.post("${lca.api}/v1/runs", run, CREATE);
        dup = Flow.evaluateJsonPath(dup, Map.of("lca.code", "$.code"));
        Flow.routeTo(dup, "duplicate", Map.of("duplicate", refused("DUPLICATE_ACTIVE_RUN"),
                "created", "${invokehttp.status.code:equals('200')}"));

        List<Flow.FF> parts = manifest(run);
        Flow.FF last = null;
        for (Flow.FF part : parts) {
            Flow.FF claimed = claim(part);
            assertEquals("1", claimed.attr("lca.attempt"), claimed.toString());
            // The same claim again (a retry with the same token): claimed again.
            Flow.FF again = Flow.evaluateJsonPath(flow.post(PARTITION + "/claim", claimed, CLAIM),
                    Map.of("lca.claimed", "$.claimed"));
            Flow.routeTo(again, "claimed", Map.of("claimed", okAnd("lca.claimed")));
            last = extract(claimed);
            // A replay of the last chunk (its answer lost): the same answer, nothing changed.
            Flow.FF replay = chunk(claimed, 1);
            assertEquals("200", replay.attr("invokehttp.status.code"), replay.toString());
            assertEquals("SUCCESS", replay.attr("lca.partitionStatus"), replay.toString());
            // Another claimant's report: 409 CLAIM_MISMATCH, routed on $.code to PG-90.
            Flow.FF stranger = chunk(Flow.update(claimed, Map.of("lca.claimToken", "${UUID()}")), 0);
            Flow.routeTo(stranger, "mismatch", Map.of("mismatch", refused("CLAIM_MISMATCH"),
                    "recorded", okAnd("lca.recorded")));
        }
        assertEquals("true", last.attr("lca.validationScheduled"), last.toString());

        Flow.FF dispatch = receiveValidate(run);
        Flow.FF done = validateAndPublish(dispatch);
        assertEquals("SUCCESS", done.attr("lca.runStatus"), done.toString());

        // A second delivery of the same dispatch id: validation/start answers started=false.
        Flow.FF second = Flow.evaluateJsonPath(flow.invoke("POST", RUN + "/validation/start",
                        Flow.replaceText(dispatch, VALIDATION_START)),
                Map.of("lca.started", "$.started"));
        Flow.routeTo(second, "duplicate", Map.of("started", okAnd("lca.started"),
                "duplicate", "${invokehttp.status.code:equals('200'):and(${lca.started:equals('false')})}"));

        Flow.FF detail = runDetail(run);
        Flow.routeTo(detail, "final", Map.of("final", "${lca.runStatus:equals('SUCCESS')}"));
        assertEquals("200", detail.attr("lca.extractedCount"), detail.toString());
        System.out.println("LCA_RUN " + run.attr("lca.runId") + " SUCCESS");
    }

    /** PG-05: the REISSUE_PARTITION dispatch for the run, read as PG-20's input. */
    Flow.FF receiveReissue(Flow.FF run) throws Exception {
        String runId = run.attr("lca.runId");
        Flow.FF d = pg05.await(f -> runId.equals(f.attr("http.headers.X-Run-Id"))
                && f.attr("http.request.uri").startsWith("/reissue/"), 90);
        assertEquals("/reissue/" + jobKey, d.attr("http.request.uri"));
        checkSignature(d);
        d = Flow.evaluateJsonPath(d, Map.of("lca.runId", "$.runId", "lca.dispatchId", "$.dispatchId",
                "lca.partitionId", "$.partitionId", "lca.hdfsRunPath", "$.hdfsRunPath",
                "lca.expectedRowCount", "$.expectedRowCount", "lca.snapshotScn", "$.snapshotScn",
                "lca.lowerBound", "$.lowerBound", "lca.upperBound", "$.upperBound"));
        assertEquals(d.attr("http.headers.X-Dispatch-Id"), d.attr("lca.dispatchId"), d.toString());
        return routed(d, "reissue");
    }

    @Test
    @Order(2)
    void a_partition_whose_node_died_is_reissued_to_pg05_and_the_run_completes() throws Exception {
        Flow.FF run = createRun("nifi-proc-reissue-" + System.currentTimeMillis());
        List<Flow.FF> parts = manifest(run);
        // Partition 0001 goes through; 0000's node claims it and dies before its first chunk.
        Flow.FF p0 = parts.stream().filter(p -> "0000".equals(p.attr("lca.partitionId"))).findFirst().orElseThrow();
        Flow.FF p1 = parts.stream().filter(p -> "0001".equals(p.attr("lca.partitionId"))).findFirst().orElseThrow();
        extract(claim(p1));
        Flow.FF dead = claim(p0);

        // The sweeper finds it stale and the dispatcher sends REISSUE_PARTITION to PG-05.
        Flow.FF reissue = receiveReissue(run);
        assertEquals("0000", reissue.attr("lca.partitionId"), reissue.toString());
        assertEquals(run.attr("lca.hdfsRunPath"), reissue.attr("lca.hdfsRunPath"), reissue.toString());
        assertEquals("100", reissue.attr("lca.expectedRowCount"), reissue.toString());
        assertEquals(run.attr("lca.snapshotScn"), reissue.attr("lca.snapshotScn"), reissue.toString());

        // PG-20 from the dispatch: a new claim (attempt 2), then the chunks.
        Flow.FF claimed = claim(reissue);
        assertEquals("2", claimed.attr("lca.attempt"), claimed.toString());
        // The dead node's late report is refused: 409 CLAIM_MISMATCH, routed to PG-90.
        Flow.FF late = chunk(dead, 0);
        Flow.routeTo(late, "mismatch", Map.of("mismatch", refused("CLAIM_MISMATCH"),
                "recorded", okAnd("lca.recorded")));
        Flow.FF last = extract(claimed);
        assertEquals("true", last.attr("lca.validationScheduled"), last.toString());

        Flow.FF done = validateAndPublish(receiveValidate(run));
        assertEquals("SUCCESS", done.attr("lca.runStatus"), done.toString());
        Flow.FF detail = runDetail(run);
        Flow.routeTo(detail, "final", Map.of("final", "${lca.runStatus:equals('SUCCESS')}"));
        assertEquals("200", detail.attr("lca.extractedCount"), detail.toString());
    }

    /**
     * What PG-05 answers to what it must not take, as the dispatcher's §6.5 classification relies
     * on: a path under a prefix (a receiver URL with a path, `…/lca/validate/…`) gets 404, which
     * makes a dispatch DEAD at once (hence load-control refuses such URLs, docs/nifi.md), and a
     * method other than POST gets 405.
     */
    @Test
    @Order(3)
    void pg05_refuses_a_prefixed_path_and_other_methods() throws Exception {
        java.net.http.HttpClient http = java.net.http.HttpClient.newBuilder()
                .version(java.net.http.HttpClient.Version.HTTP_1_1).build();
        String base = "http://127.0.0.1:" + env("LC_RECEIVER_PORT");
        String body = "{\"runId\":\"00000000-0000-4000-8000-000000000000\"}";
        java.util.function.BiFunction<String, String, Integer> send = (method, path) -> {
            try {
                return http.send(java.net.http.HttpRequest.newBuilder(java.net.URI.create(base + path))
                                .method(method, java.net.http.HttpRequest.BodyPublishers.ofString(body))
                                .header("Content-Type", "application/json").build(),
                        java.net.http.HttpResponse.BodyHandlers.discarding()).statusCode();
            } catch (Exception e) {
                throw new AssertionError(method + " " + path, e);
            }
        };
        assertEquals(404, send.apply("POST", "/lca/validate/" + jobKey));
        assertEquals(404, send.apply("POST", "/validate/" + jobKey + "/"));
        assertEquals(405, send.apply("PUT", "/validate/" + jobKey));
        assertEquals(405, send.apply("GET", "/reissue/" + jobKey));
    }
}
