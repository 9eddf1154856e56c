package lc.nifi;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.apache.nifi.attribute.expression.language.Query;
import org.apache.nifi.attribute.expression.language.StandardEvaluationContext;
import org.apache.nifi.processor.Relationship;
import org.apache.nifi.processors.standard.EvaluateJsonPath;
import org.apache.nifi.processors.standard.InvokeHTTP;
import org.apache.nifi.processors.standard.ReplaceText;
import org.apache.nifi.processors.standard.RouteOnAttribute;
import org.apache.nifi.processors.standard.SplitJson;
import org.apache.nifi.util.MockFlowFile;
import org.apache.nifi.util.TestRunner;
import org.apache.nifi.util.TestRunners;

/**
 * The flow's processors, one step at a time: each step is a NiFi 2.6.0 processor, configured as
 * the flow configures it, run through nifi-mock's TestRunner on the FlowFile the previous step
 * produced (content and attributes). The attributes carry the run's state from call to call, as
 * they do in the flow.
 */
final class Flow {
    /** A FlowFile between two processors. */
    record FF(byte[] content, Map<String, String> attrs) {
        static FF empty(Map<String, String> attrs) {
            return new FF(new byte[0], new HashMap<>(attrs));
        }

        static FF of(MockFlowFile f) {
            Map<String, String> a = new HashMap<>(f.getAttributes());
            a.remove("uuid");
            return new FF(f.toByteArray(), a);
        }

        String text() {
            return new String(content, StandardCharsets.UTF_8);
        }

        String attr(String k) {
            return attrs.get(k);
        }

        @Override
        public String toString() {
            return "FlowFile{content=" + text() + ", attributes=" + new java.util.TreeMap<>(attrs) + "}";
        }
    }

    /** The flow's settings: the api-server's base URL and the nifi role's token. */
    final String api;
    private final String token;

    Flow(String api, String token) {
        this.api = api.replaceAll("/+$", "");
        this.token = token;
    }

    /** Runs `p` once on `in` and returns what each relationship received. */
    static Map<String, List<MockFlowFile>> run(TestRunner runner, FF in) {
        runner.enqueue(in.content(), in.attrs());
        runner.run(1);
        Map<String, List<MockFlowFile>> out = new LinkedHashMap<>();
        for (Relationship r : runner.getProcessor().getRelationships()) {
            List<MockFlowFile> got = runner.getFlowFilesForRelationship(r);
            if (!got.isEmpty()) {
                out.put(r.getName(), new ArrayList<>(got));
            }
        }
        return out;
    }

    /** The one FlowFile `rel` received, failing with everything that happened otherwise. */
    static FF only(Map<String, List<MockFlowFile>> out, String rel, String step) {
        List<MockFlowFile> got = out.get(rel);
        if (got == null || got.size() != 1) {
            fail(step + ": expected one FlowFile on '" + rel + "', got " + describe(out));
        }
        return FF.of(got.get(0));
    }

    static String describe(Map<String, List<MockFlowFile>> out) {
        StringBuilder s = new StringBuilder();
        out.forEach((rel, ffs) -> {
            s.append("\n  ").append(rel).append(": ");
            for (MockFlowFile f : ffs) {
                s.append(FF.of(f)).append(' ');
            }
        });
        return s.length() == 0 ? "nothing" : s.toString();
    }

    /**
     * UpdateAttribute: every rule's value is NiFi Expression Language evaluated against the
     * FlowFile's attributes (the UpdateAttribute bundle itself is not published; its evaluation
     * is nifi-expression-language's, used here directly). Rules see the attributes as they were
     * before the step, as UpdateAttribute's do.
     */
    static FF update(FF in, Map<String, String> rules) {
        Map<String, String> before = Map.copyOf(in.attrs());
        Map<String, String> attrs = new HashMap<>(in.attrs());
        rules.forEach((k, expr) -> attrs.put(k,
                Query.prepare(expr).evaluateExpressions(new StandardEvaluationContext(before), null)));
        return new FF(in.content(), attrs);
    }

    /** ReplaceText, Always Replace, Entire text: the request body from the flow's template. */
    static FF replaceText(FF in, String template) {
        TestRunner r = TestRunners.newTestRunner(new ReplaceText());
        r.setProperty("Replacement Strategy", "Always Replace");
        r.setProperty("Evaluation Mode", "Entire text");
        r.setProperty("Replacement Value", template);
        return only(run(r, in), "success", "ReplaceText");
    }

    /** EvaluateJsonPath to attributes (scalars; a missing path leaves the attribute empty). */
    static FF evaluateJsonPath(FF in, Map<String, String> paths) {
        TestRunner r = TestRunners.newTestRunner(new EvaluateJsonPath());
        r.setProperty("Destination", "flowfile-attribute");
        r.setProperty("Return Type", "auto-detect");
        r.setProperty("Path Not Found Behavior", "ignore");
        paths.forEach(r::setProperty);
        return only(run(r, in), "matched", "EvaluateJsonPath " + paths);
    }

    /** SplitJson: one FlowFile per element of the array at `path`. */
    static List<FF> splitJson(FF in, String path) {
        TestRunner r = TestRunners.newTestRunner(new SplitJson());
        r.setProperty("JsonPath Expression", path);
        Map<String, List<MockFlowFile>> out = run(r, in);
        return out.getOrDefault("split", List.of()).stream().map(FF::of).toList();
    }

    /**
     * RouteOnAttribute, Route to Property name: the relationships (rule names) the FlowFile went
     * to, "unmatched" when none.
     */
    static Set<String> route(FF in, Map<String, String> rules) {
        TestRunner r = TestRunners.newTestRunner(new RouteOnAttribute());
        r.setProperty("Routing Strategy", "Route to Property name");
        rules.forEach(r::setProperty);
        return new TreeSet<>(run(r, in).keySet());
    }

    /** Asserts RouteOnAttribute sends `in` to `expected` (and nowhere else). */
    static FF routeTo(FF in, String expected, Map<String, String> rules) {
        Set<String> to = route(in, rules);
        assertEquals(Set.of(expected), to, "RouteOnAttribute " + rules + " on " + in);
        return in;
    }

    /**
     * InvokeHTTP as the flow configures it for the calls to load-control: the bearer token (a
     * sensitive parameter in the flow), `Content-Type: application/json`, `X-Run-Id` once the run
     * is known and a fresh `X-Request-Id`, connect 5 s and read `readTimeout`, HTTP/2 off, and
     * Response Generation Required so that a 4xx's JSON answer reaches EvaluateJsonPath (the
     * flow routes on `$.code`). The Retry (5xx) and Failure relationships are retried by NiFi's
     * framework (5 times, Penalize FlowFile, Max Back Off Period 1 min); here they fail the step.
     * Returns the Response FlowFile: the answer's body, with the request's attributes and
     * `invokehttp.status.code`.
     */
    FF invoke(String method, String urlExpression, FF in, String readTimeout) {
        TestRunner r = TestRunners.newTestRunner(new InvokeHTTP());
        r.setProperty("HTTP Method", method);
        r.setProperty("HTTP URL", urlExpression);
        r.setProperty("Request Content-Type", "application/json");
        r.setProperty("Connection Timeout", "5 secs");
        r.setProperty("Socket Read Timeout", readTimeout);
        r.setProperty("HTTP/2 Disabled", "True");
        r.setProperty("Response Generation Required", "true");
        r.setProperty("Authorization", "Bearer " + token);
        r.setProperty("X-Request-Id", "${UUID()}");
        if (in.attr("lca.runId") != null) {
            r.setProperty("X-Run-Id", "${lca.runId}");
        }
        Map<String, List<MockFlowFile>> out = run(r, in);
        if (out.containsKey("Failure") || out.containsKey("Retry")) {
            fail("InvokeHTTP " + method + " " + urlExpression + " went to " + out.keySet()
                    + " (NiFi would retry it): " + describe(out));
        }
        String original = out.containsKey("Original") ? "Original" : "No Retry";
        only(out, original, "InvokeHTTP " + method + " " + urlExpression);
        return only(out, "Response", "InvokeHTTP " + method + " " + urlExpression);
    }

    FF invoke(String method, String urlExpression, FF in) {
        return invoke(method, urlExpression, in, "30 secs");
    }

    /** A POST of the body ReplaceText builds from `template`. */
    FF post(String urlExpression, FF in, String template) {
        return invoke("POST", urlExpression, replaceText(in, template));
    }
}
