package lc.nifi;

import static org.junit.jupiter.api.Assertions.fail;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Predicate;
import java.util.Map;
import org.apache.nifi.controller.ControllerService;
import org.apache.nifi.util.MockFlowFile;
import org.apache.nifi.util.TestRunner;

/**
 * PG-05, the control receiver, from the flow definition: its HandleHttpRequest ("Receive
 * dispatch") and HandleHttpResponse ("Answer 202") with the file's properties (POST only, Allowed
 * Paths `/(validate|reissue)/[A-Za-z0-9_.-]+`, 202), through one HTTP Context Map, wired as the
 * file wires them: Receive dispatch → the signature check to fill in → Answer 202. The test stands
 * in for the signature check ({@link LifecycleTest#checkSignature}); what follows "Answer 202" is
 * run by {@link FlowDefinition}.
 */
final class Pg05 implements AutoCloseable {
    static final String GROUP = "PG-05 Control receiver";

    private final TestRunner request;
    private final TestRunner response;
    private final List<Flow.FF> received = new ArrayList<>();

    Pg05(FlowDefinition def) {
        FlowDefinition.Component receive = def.component(GROUP, "Receive dispatch");
        FlowDefinition.Component check = def.next(receive, "success");
        FlowDefinition.Component answer = def.next(check, "success");
        if (!check.placeholder() || !answer.type().endsWith(".HandleHttpResponse")) {
            fail("PG-05 is not Receive dispatch → the signature check → HandleHttpResponse: " + check + ", " + answer);
        }
        LcaContextMap map = new LcaContextMap();
        Map<String, ControllerService> services = Map.of(receive.properties().get("HTTP Context Map"), map);
        request = def.runner(receive, services);
        response = def.runner(answer, services);
        def.checkWired(receive, FlowDefinition.relationships(request));
        def.checkWired(answer, FlowDefinition.relationships(response));
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
