package lc.nifi;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import lc.nifi.FlowDefinition.Exit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Whole runs through the flow users import, `examples/nifi/load-control.flow.json`, executed with
 * NiFi 2.6.0's own processors ({@link FlowDefinition}) against a running load-control: PG-10's
 * create and manifest, SplitJson's fan-out to PG-20's claims, the chunks, PG-05's HandleHttpRequest
 * receiving the dispatcher's VALIDATE_RUN and REISSUE_PARTITION, PG-40, PG-50, PG-60, and PG-90
 * for refusals and a failed manifest. The test does only what the file leaves to fill in (the
 * Oracle, HDFS and Hive work and PG-05's signature check) and reads where each FlowFile ended.
 *
 * <p>Started by e2e/suite/tests/nifi_processors.rs, which runs load-control (api-server and
 * operators on a private PostgreSQL) and passes LC_API_URL, LC_NIFI_TOKEN, LC_RECEIVER_PORT,
 * LC_JOB_KEY and the signing key; LC_FLOW_DEFINITION names another flow file.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class LifecycleTest {
    static final String PG10 = "PG-10 Run & manifest";
    static final String PG20 = "PG-20 Partition extract";
    static final String PG90 = "PG-90 Failure handling";

    static FlowDefinition def;
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
        jobKey = env("LC_JOB_KEY");
        String file = System.getenv().getOrDefault("LC_FLOW_DEFINITION", "../../examples/nifi/load-control.flow.json");
        def = FlowDefinition.load(Path.of(file), Map.of(
                "lca.api.url", env("LC_API_URL").replaceAll("/+$", ""),
                "lca.api.authorization", "Bearer " + env("LC_NIFI_TOKEN"),
                "lca.job.key", jobKey,
                "lca.hdfs.root", "/data/nifi/stage/",
                "lca.receiver.host", "127.0.0.1",
                "lca.receiver.port", env("LC_RECEIVER_PORT")));
        pg05 = new Pg05(def);
    }

    @AfterAll
    static void stop() {
        if (pg05 != null) {
            pg05.close();
        }
    }

    /** Two partitions of 100 rows, as the Oracle planning step would describe them. */
    static final String PARTITIONS = """
            [{"partitionId":"0000","lowerBound":"0","upperBound":"1000","upperInclusive":"false",\
            "isNullPartition":"false","expectedRowCount":"100"},\
            {"partitionId":"0001","lowerBound":"1000","upperBound":"2000","upperInclusive":"true",\
            "isNullPartition":"false","expectedRowCount":"100"}]""";

    /** PG-10 from its trigger: the run is created and stops where its partitions are planned. */
    Exit create(String businessKey) {
        List<Exit> out = def.from(PG10, "trigger", Flow.FF.empty(Map.of(
                "lca.businessKey", businessKey, "lca.trigger", "nifi-processors")));
        Exit plan = FlowDefinition.stoppedAt(out, "FILL IN: plan partitions (Oracle)");
        assertEquals("CREATED", plan.ff().attr("lca.runStatus"), plan.toString());
        assertTrue(plan.ff().attr("lca.hdfsRunPath").contains(plan.ff().attr("lca.runId")), plan.toString());
        return plan;
    }

    /** The planning step's work: the SCN, the counts and the partitions. */
    static Flow.FF planned(Exit plan, String partitions) {
        return Flow.update(plan.ff(), Map.of("lca.snapshotScn", "${now():toNumber()}", "lca.sourceCount", "200",
                "lca.plannedPartitionCount", "2", "lca.sourceMetrics", "{\"AMOUNT_SUM\":\"123.45\"}",
                "lca.partitionsJson", partitions));
    }

    /** The manifest, fanned out to PG-20: each partition claimed, stopped where it is extracted. */
    Map<String, Exit> manifest(Exit plan) {
        List<Exit> out = def.after(plan, planned(plan, PARTITIONS));
        List<Exit> claimed = out.stream().filter(e -> e.at(EXTRACT)).toList();
        assertEquals(2, claimed.size(), "both partitions claimed: " + out);
        Map<String, Exit> byId = new java.util.TreeMap<>();
        for (Exit e : claimed) {
            assertEquals("true", e.ff().attr("lca.claimed"), e.toString());
            byId.put(e.ff().attr("lca.partitionId"), e);
        }
        assertEquals(List.of("0000", "0001"), List.copyOf(byId.keySet()));
        return byId;
    }

    static final String EXTRACT = "FILL IN: extract partition (Oracle → Parquet on HDFS)";

    /** Chunk `index` of two, as PutHDFS would describe it, reported by PG-20; where it ended. */
    List<Exit> chunk(Exit claimed, Flow.FF from, int index) {
        Flow.FF ff = Flow.update(from, Map.of(
                "lca.chunkIndex", Integer.toString(index),
                "lca.chunkCount", "2",
                "lca.fragment", "f-${lca.claimToken}",
                "lca.recordCount", "${lca.expectedRowCount:divide(2)}",
                "lca.byteCount", "${lca.expectedRowCount:divide(2):multiply(64)}",
                "lca.hdfsPath", "${lca.hdfsRunPath}/p=${lca.partitionId}/part-" + String.format("%05d", index)
                        + "-${lca.claimToken:substring(0,8)}.parquet"));
        return def.after(claimed, ff);
    }

    /** Both chunks of a claimed partition; the last completes it. Returns the last answer. */
    Flow.FF extract(Exit claimed) {
        Flow.FF first = FlowDefinition.ended(chunk(claimed, claimed.ff(), 0), "Route chunk", "recorded").ff();
        assertEquals("RUNNING", first.attr("lca.partitionStatus"), first.toString());
        Flow.FF last = FlowDefinition.ended(chunk(claimed, claimed.ff(), 1), "Route chunk", "recorded").ff();
        assertEquals("SUCCESS", last.attr("lca.partitionStatus"), last.toString());
        return last;
    }

    /** A FlowFile PG-90 logged as a refusal with `code`. */
    static Exit refusedWith(List<Exit> out, String code) {
        Exit e = FlowDefinition.ended(out, "Log refusal", "success");
        assertEquals(PG90, e.group());
        assertEquals(code, e.ff().attr("lca.code"), e.toString());
        return e;
    }

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

    /** PG-05: the dispatch of `kind` (validate, reissue) for the run, signature checked. */
    Flow.FF receive(Exit run, String kind, int seconds) throws Exception {
        String runId = run.ff().attr("lca.runId");
        Flow.FF d = pg05.await(f -> runId.equals(f.attr("http.headers.X-Run-Id"))
                && f.attr("http.request.uri").startsWith("/" + kind + "/"), seconds);
        assertEquals("POST", d.attr("http.method"));
        assertEquals("/" + kind + "/" + jobKey, d.attr("http.request.uri"));
        assertEquals("HTTP/1.1", d.attr("http.protocol"));
        assertTrue(d.attr("mime.type").startsWith("application/json"), d.toString());
        checkSignature(d);
        return d;
    }

    /** The flow after PG-05's answer: PG-40 from a VALIDATE_RUN, PG-20 from a REISSUE_PARTITION. */
    List<Exit> answered(Flow.FF dispatch) {
        return def.along(Pg05.GROUP, "Answer 202", "success", dispatch);
    }

    /** PG-40 → PG-50 → PG-60 from a VALIDATE_RUN, each Hive step done as the file asks. */
    Exit validateAndPublish(Flow.FF dispatch) {
        Exit staging = FlowDefinition.stoppedAt(answered(dispatch), "FILL IN: staging metrics (Hive)");
        assertEquals(staging.ff().attr("http.headers.X-Dispatch-Id"), staging.ff().attr("lca.dispatchId"));
        assertEquals("true", staging.ff().attr("lca.started"), staging.toString());
        assertEquals("200", staging.ff().attr("lca.extractedCount"), staging.toString());
        Exit hive = FlowDefinition.stoppedAt(def.after(staging, Flow.update(staging.ff(), Map.of("lca.stagingMetrics", """
                [{"metricName":"STAGE_COUNT","expectedValue":"${lca.extractedCount}","actualValue":"${lca.extractedCount}","result":"PASS"},\
                {"metricName":"DUP_PK_COUNT","expectedValue":"0","actualValue":"0","result":"PASS"}]"""))),
                "FILL IN: INSERT OVERWRITE (Hive)");
        assertEquals("true", hive.ff().attr("lca.stageValidated"), hive.toString());
        assertEquals("true", hive.ff().attr("lca.claimed"), hive.toString());
        Exit target = FlowDefinition.stoppedAt(def.after(hive, Flow.update(hive.ff(),
                Map.of("lca.publishOutcome", "PUBLISHED"))), "FILL IN: target metrics (Hive)");
        assertEquals("PUBLISHED", target.ff().attr("lca.runStatus"), target.toString());
        Exit done = FlowDefinition.ended(def.after(target, Flow.update(target.ff(), Map.of("lca.targetMetrics", """
                [{"metricName":"TARGET_COUNT","expectedValue":"${lca.extractedCount}","actualValue":"${lca.extractedCount}","result":"PASS"}]"""))),
                "Route success", "success");
        assertEquals("SUCCESS", done.ff().attr("lca.runStatus"), done.toString());
        return done;
    }

    @Test
    @Order(1)
    void a_whole_run_goes_through_the_imported_flow() throws Exception {
        String businessKey = "nifi-proc-" + System.currentTimeMillis();
        Exit plan = create(businessKey);
        // The trigger again while the run is active: 409 DUPLICATE_ACTIVE_RUN, logged by PG-90.
        refusedWith(def.from(PG10, "trigger", Flow.FF.empty(Map.of("lca.businessKey", businessKey,
                "lca.trigger", "again"))), "DUPLICATE_ACTIVE_RUN");

        Map<String, Exit> claimed = manifest(plan);
        Flow.FF last = null;
        for (Exit part : claimed.values()) {
            assertEquals("1", part.ff().attr("lca.attempt"), part.toString());
            // The same claim again (a retry with the same token): claimed again.
            Exit again = FlowDefinition.stoppedAt(def.from(PG20, "Claim body", part.ff()), EXTRACT);
            assertEquals("true", again.ff().attr("lca.claimed"), again.toString());
            last = extract(part);
            // A replay of the last chunk (its answer lost): the same answer, nothing changed.
            Flow.FF replay = FlowDefinition.ended(chunk(part, part.ff(), 1), "Route chunk", "recorded").ff();
            assertEquals("SUCCESS", replay.attr("lca.partitionStatus"), replay.toString());
            // Another claimant's report: 409 CLAIM_MISMATCH, routed to PG-90.
            refusedWith(chunk(part, Flow.update(part.ff(), Map.of("lca.claimToken", "${UUID()}")), 0), "CLAIM_MISMATCH");
        }
        assertEquals("true", last.attr("lca.validationScheduled"), last.toString());

        Flow.FF dispatch = receive(plan, "validate", 60);
        validateAndPublish(dispatch);

        // A second delivery of the same dispatch: validation/start answers started=false, and
        // the flow ends there.
        Exit second = FlowDefinition.ended(answered(dispatch), "Route validation start", "already started");
        assertEquals("SUCCESS", second.ff().attr("lca.runStatus"), second.toString());
        System.out.println("LCA_RUN " + plan.ff().attr("lca.runId") + " SUCCESS");
    }

    @Test
    @Order(2)
    void a_partition_whose_node_died_is_reissued_to_pg05_and_the_run_completes() throws Exception {
        Exit plan = create("nifi-proc-reissue-" + System.currentTimeMillis());
        Map<String, Exit> claimed = manifest(plan);
        // Partition 0001 goes through; 0000's node claimed it and dies before its first chunk.
        extract(claimed.get("0001"));
        Exit dead = claimed.get("0000");

        // The sweeper finds it stale; the dispatcher's REISSUE_PARTITION reaches PG-05, which
        // starts PG-20 for it: claimed again (attempt 2), from the dispatch's body.
        Flow.FF reissue = receive(plan, "reissue", 90);
        Exit again = FlowDefinition.stoppedAt(answered(reissue), EXTRACT);
        assertEquals("0000", again.ff().attr("lca.partitionId"), again.toString());
        assertEquals("2", again.ff().attr("lca.attempt"), again.toString());
        assertEquals(plan.ff().attr("lca.hdfsRunPath"), again.ff().attr("lca.hdfsRunPath"), again.toString());
        assertEquals("100", again.ff().attr("lca.expectedRowCount"), again.toString());
        assertEquals(claimed.get("0001").ff().attr("lca.snapshotScn"), again.ff().attr("lca.snapshotScn"));

        // The dead node's late report is refused: 409 CLAIM_MISMATCH, to PG-90.
        refusedWith(chunk(dead, dead.ff(), 0), "CLAIM_MISMATCH");
        Flow.FF last = extract(again);
        assertEquals("true", last.attr("lca.validationScheduled"), last.toString());
        validateAndPublish(receive(plan, "validate", 60));
    }

    /**
     * A manifest load-control refuses (a partition id outside its pattern: 422): PG-10 marks the
     * failure and PG-90 fails the run CREATED → FAILED_MANIFEST, one of the five allowed pairs.
     */
    @Test
    @Order(3)
    void a_refused_manifest_is_failed_by_pg90() {
        Exit plan = create("nifi-proc-refused-" + System.currentTimeMillis());
        List<Exit> out = def.after(plan, planned(plan, PARTITIONS.replace("\"0001\"", "\"bad id!\"")));
        Exit failed = FlowDefinition.ended(out, "Route run fail", "failed");
        assertEquals(PG90, failed.group());
        assertEquals("FAILED_MANIFEST", failed.ff().attr("lca.runStatus"), failed.toString());
        assertEquals("true", failed.ff().attr("lca.changed"), failed.toString());
    }

    /**
     * What PG-05 answers to what it must not take, as the dispatcher's §6.5 classification relies
     * on: a path under a prefix (a receiver URL with a path, `…/lca/validate/…`) gets 404, which
     * makes a dispatch DEAD at once (hence load-control refuses such URLs, docs/nifi.md), and a
     * method other than POST gets 405.
     */
    @Test
    @Order(4)
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
