package lc.nifi;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.nifi.attribute.expression.language.Query;
import org.apache.nifi.attribute.expression.language.StandardEvaluationContext;
import org.apache.nifi.processor.Relationship;
import org.apache.nifi.util.MockFlowFile;
import org.apache.nifi.util.TestRunner;

/**
 * FlowFiles between processors and one processor's run through nifi-mock's TestRunner; {@link
 * FlowDefinition} strings them together as the flow file connects them. The attributes carry the
 * run's state from call to call, as they do in NiFi.
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
}
