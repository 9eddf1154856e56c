package lc.nifi;

import static org.junit.jupiter.api.Assertions.fail;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Predicate;
import org.apache.nifi.processors.standard.HandleHttpRequest;
import org.apache.nifi.processors.standard.HandleHttpResponse;
import org.apache.nifi.reporting.InitializationException;
import org.apache.nifi.util.MockFlowFile;
import org.apache.nifi.util.TestRunner;
import org.apache.nifi.util.TestRunners;

/**
 * PG-05, the control receiver, as the flow builds it: HandleHttpRequest on the receiver port,
 * POST only, Allowed Paths `/(validate|reissue)/[A-Za-z0-9_.-]+` (the dispatcher's
 * `{receiver_url}/validate/{jobKey}` and `/reissue/{jobKey}`), and HandleHttpResponse answering
 * 202 with the request's body, through one HTTP Context Map.
 */
final class Pg05 implements AutoCloseable {
    static final String ALLOWED_PATHS = "/(validate|reissue)/[A-Za-z0-9_.-]+";

    private final TestRunner request;
    private final TestRunner response;
    private final List<Flow.FF> received = new ArrayList<>();

    Pg05(int port) throws InitializationException {
        LcaContextMap map = new LcaContextMap();
        request = TestRunners.newTestRunner(new HandleHttpRequest());
        request.addControllerService("lca-context-map", map);
        request.enableControllerService(map);
        request.setProperty("HTTP Context Map", "lca-context-map");
        request.setProperty("Listening Port", Integer.toString(port));
        request.setProperty("Hostname", "127.0.0.1");
        request.setProperty("Allowed Paths", ALLOWED_PATHS);
        for (String m : List.of("Allow GET", "Allow PUT", "Allow DELETE", "Allow HEAD", "Allow OPTIONS")) {
            request.setProperty(m, "false");
        }
        request.setProperty("Allow POST", "true");
        response = TestRunners.newTestRunner(new HandleHttpResponse());
        response.addControllerService("lca-context-map", map);
        response.enableControllerService(map);
        response.setProperty("HTTP Context Map", "lca-context-map");
        response.setProperty("HTTP Status Code", "202");
        // Starts Jetty (HandleHttpRequest's @OnScheduled) and keeps it up between triggers.
        request.run(1, false, true);
    }

    /**
     * Triggers HandleHttpRequest until a dispatch `wanted` accepts arrives (every request is
     * answered 202 by HandleHttpResponse as it arrives, as the flow does), at most `seconds`.
     */
    Flow.FF await(Predicate<Flow.FF> wanted, int seconds) throws InterruptedException {
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        while (System.nanoTime() < deadline) {
            for (Flow.FF f : received) {
                if (wanted.test(f)) {
                    received.remove(f);
                    return f;
                }
            }
            request.run(1, false, false);
            List<MockFlowFile> got = new ArrayList<>(request.getFlowFilesForRelationship("success"));
            request.clearTransferState();
            for (MockFlowFile m : got) {
                Flow.FF f = Flow.FF.of(m);
                response.enqueue(f.content(), f.attrs());
                response.run(1);
                List<MockFlowFile> answered = response.getFlowFilesForRelationship("success");
                if (answered.size() != 1) {
                    fail("HandleHttpResponse did not answer " + f + ": failure="
                            + response.getFlowFilesForRelationship("failure"));
                }
                response.clearTransferState();
                received.add(f);
            }
            if (got.isEmpty()) {
                Thread.sleep(50);
            }
        }
        fail("PG-05 received no matching dispatch within " + seconds + " s; received: " + received);
        return null;
    }

    @Override
    public void close() {
        // @OnStopped: stops Jetty.
        request.run(1, true, false);
    }
}
