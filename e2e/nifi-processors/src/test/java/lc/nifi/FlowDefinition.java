package lc.nifi;

import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import org.apache.nifi.components.PropertyDescriptor;
import org.apache.nifi.controller.ControllerService;
import org.apache.nifi.processor.Processor;
import org.apache.nifi.processor.Relationship;
import org.apache.nifi.reporting.InitializationException;
import org.apache.nifi.util.MockFlowFile;
import org.apache.nifi.util.TestRunner;
import org.apache.nifi.util.TestRunners;

/**
 * The flow users import, `examples/nifi/load-control.flow.json` (NiFi 2.x "Download flow
 * definition" format), run as NiFi runs it: every processor is created from its `type` with the
 * file's properties (parameters `#{…}` resolved from the file's parameter context, a few
 * overridden by the test: where load-control and PG-05 are), and every FlowFile it emits follows
 * the file's connections, through ports and across process groups, until it reaches a place to
 * fill in (a processor named `FILL IN: …`, whose work the test does), PG-05's HTTP processors
 * (run by {@link Pg05}), or the end of the flow (an auto-terminated relationship).
 *
 * <p>What NiFi would refuse to start is refused here too: a property that is neither one of the
 * processor's nor declared dynamic (a typo, a renamed property), a processor that is not valid, a
 * relationship neither connected nor auto-terminated, a parameter the context lacks, a sensitive
 * property whose parameter is not sensitive (or the reverse): every processor of the file is
 * checked when it is loaded, whether a run reaches it or not. UpdateAttribute
 * (not published to Maven Central) is evaluated with NiFi's Expression Language, as {@link
 * Flow#update} does.
 */
final class FlowDefinition {
    static final String UPDATE_ATTRIBUTE = "org.apache.nifi.processors.attributes.UpdateAttribute";
    static final String FILL_IN = "FILL IN: ";

    record Component(String id, String name, String kind, String type, String group,
                     Map<String, String> properties, Set<String> dynamic, Set<String> serviceRefs,
                     Set<String> sensitive, Set<String> autoTerminated, Set<String> retried) {
        boolean placeholder() {
            return name.startsWith(FILL_IN);
        }

        @Override
        public String toString() {
            return group + " / " + name;
        }
    }

    record Connection(String source, String destination, Set<String> relationships) {}

    /**
     * Where a FlowFile stopped: at `component` (a place to fill in, PG-05's HTTP processors, an
     * unconnected port), or leaving it by an auto-terminated `relationship` (non-null).
     */
    record Exit(String group, String component, String relationship, Flow.FF ff) {
        boolean at(String name) {
            return component.equals(name) && relationship == null;
        }

        boolean ended(String name, String rel) {
            return component.equals(name) && rel.equals(relationship);
        }

        @Override
        public String toString() {
            return group + " / " + component + (relationship == null ? "" : " → " + relationship) + ": " + ff;
        }
    }

    final Path file;
    private final Map<String, Component> components = new LinkedHashMap<>();
    private final Map<String, JsonNode> services = new HashMap<>();
    private final List<Connection> connections = new ArrayList<>();
    private final Map<String, String> parameters = new HashMap<>();
    private final Set<String> sensitiveParameters = new TreeSet<>();

    private FlowDefinition(Path file) {
        this.file = file;
    }

    /** Reads the flow definition; `overrides` replace parameter values (where things are). */
    static FlowDefinition load(Path file, Map<String, String> overrides) throws IOException {
        JsonNode root = new ObjectMapper().readTree(file.toFile());
        FlowDefinition def = new FlowDefinition(file);
        for (JsonNode ctx : root.path("parameterContexts")) {
            for (JsonNode p : ctx.path("parameters")) {
                def.parameters.put(p.path("name").asText(), p.path("value").isNull() ? null : p.path("value").asText());
                if (p.path("sensitive").asBoolean()) {
                    def.sensitiveParameters.add(p.path("name").asText());
                }
            }
        }
        overrides.forEach((k, v) -> {
            if (!def.parameters.containsKey(k)) {
                fail("the test sets parameter " + k + ", which the flow's parameter context lacks");
            }
            def.parameters.put(k, v);
        });
        def.read(root.path("flowContents"), "");
        def.checkEveryProcessor();
        return def;
    }

    /**
     * What NiFi checks before it starts a processor, for every processor of the file, whether a
     * test reaches it or not: valid with the file's properties, and each relationship connected or
     * auto-terminated. PG-05's HTTP processors need the test's HTTP Context Map: {@link Pg05}
     * checks them.
     */
    private void checkEveryProcessor() {
        for (JsonNode s : services.values()) {
            Map<String, String> props = new LinkedHashMap<>();
            Set<String> sensitive = new TreeSet<>();
            s.path("properties").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
            s.path("propertyDescriptors").fields().forEachRemaining(e -> {
                if (e.getValue().path("sensitive").asBoolean()) {
                    sensitive.add(e.getKey());
                }
            });
            checkSensitivity("controller service " + s.path("name").asText(), props, sensitive);
        }
        for (Component c : components.values()) {
            checkSensitivity(c.toString(), c.properties(), c.sensitive());
            if (!c.kind().equals("PROCESSOR") || isHttp(c)) {
                continue;
            }
            if (c.type().equals(UPDATE_ATTRIBUTE)) {
                checkWired(c, Set.of("success"));
            } else {
                checkWired(c, relationships(runner(c, Map.of())));
            }
        }
    }

    /**
     * NiFi's rule for parameters: a sensitive property refers to sensitive parameters only (and
     * nothing else: its whole value is the reference), a property that is not sensitive never to a
     * sensitive one; a flow that breaks it does not import.
     */
    private void checkSensitivity(String c, Map<String, String> properties, Set<String> sensitive) {
        properties.forEach((name, value) -> {
            if (value == null) {
                return;
            }
            Matcher m = PARAMETER.matcher(value);
            while (m.find()) {
                boolean secret = sensitiveParameters.contains(m.group(1));
                if (sensitive.contains(name) != secret) {
                    fail(c + ": property '" + name + "' (" + (sensitive.contains(name) ? "" : "not ")
                            + "sensitive) refers to parameter #{" + m.group(1) + "} (" + (secret ? "" : "not ")
                            + "sensitive)");
                }
            }
            if (sensitive.contains(name) && !PARAMETER.matcher(value).matches()) {
                fail(c + ": sensitive property '" + name + "' must be one parameter reference, not " + value);
            }
        });
    }

    static boolean isHttp(Component c) {
        return c.type().endsWith(".HandleHttpRequest") || c.type().endsWith(".HandleHttpResponse");
    }

    static Set<String> relationships(TestRunner runner) {
        return runner.getProcessor().getRelationships().stream().map(Relationship::getName)
                .collect(Collectors.toSet());
    }

    private void read(JsonNode group, String name) {
        for (JsonNode s : group.path("controllerServices")) {
            services.put(s.path("identifier").asText(), s);
        }
        for (String kind : List.of("processors", "inputPorts", "outputPorts", "funnels")) {
            for (JsonNode c : group.path(kind)) {
                Map<String, String> props = new LinkedHashMap<>();
                c.path("properties").fields().forEachRemaining(e -> props.put(e.getKey(),
                        e.getValue().isNull() ? null : e.getValue().asText()));
                Set<String> dynamic = new TreeSet<>();
                Set<String> refs = new TreeSet<>();
                Set<String> sensitive = new TreeSet<>();
                c.path("propertyDescriptors").fields().forEachRemaining(e -> {
                    if (e.getValue().path("dynamic").asBoolean()) {
                        dynamic.add(e.getKey());
                    }
                    if (e.getValue().path("identifiesControllerService").asBoolean()) {
                        refs.add(e.getKey());
                    }
                    if (e.getValue().path("sensitive").asBoolean()) {
                        sensitive.add(e.getKey());
                    }
                });
                components.put(c.path("identifier").asText(), new Component(c.path("identifier").asText(),
                        c.path("name").asText(), c.path("componentType").asText(), c.path("type").asText(), name,
                        props, dynamic, refs, sensitive, strings(c.path("autoTerminatedRelationships")),
                        strings(c.path("retriedRelationships"))));
            }
        }
        for (JsonNode c : group.path("connections")) {
            connections.add(new Connection(c.path("source").path("id").asText(),
                    c.path("destination").path("id").asText(), strings(c.path("selectedRelationships"))));
        }
        for (JsonNode g : group.path("processGroups")) {
            read(g, g.path("name").asText());
        }
    }

    private static Set<String> strings(JsonNode array) {
        Set<String> out = new TreeSet<>();
        array.forEach(n -> out.add(n.asText()));
        return out;
    }

    /** The component named `name` in process group `group`. */
    Component component(String group, String name) {
        List<Component> found = components.values().stream()
                .filter(c -> c.group().equals(group) && c.name().equals(name)).toList();
        if (found.size() != 1) {
            fail(found.size() + " components named '" + name + "' in '" + group + "' of " + file + "; there are "
                    + components.values().stream().filter(c -> c.group().equals(group)).map(Component::name).toList());
        }
        return found.get(0);
    }

    /** The controller service a property refers to (by identifier), as the file defines it. */
    JsonNode service(String id) {
        JsonNode s = services.get(id);
        if (s == null) {
            fail("no controller service " + id + " in " + file);
        }
        return s;
    }

    private static final Pattern PARAMETER = Pattern.compile("#\\{([^}]+)}");

    /** A property value with its parameter references replaced by the context's values. */
    String resolve(String value) {
        if (value == null) {
            return null;
        }
        Matcher m = PARAMETER.matcher(value);
        StringBuilder out = new StringBuilder();
        while (m.find()) {
            String name = m.group(1);
            if (!parameters.containsKey(name)) {
                fail("parameter #{" + name + "} is not in the flow's parameter context (" + file + ")");
            }
            String v = parameters.get(name);
            if (v == null) {
                fail("parameter #{" + name + "} has no value: the test must set it");
            }
            m.appendReplacement(out, Matcher.quoteReplacement(v));
        }
        m.appendTail(out);
        return out.toString();
    }

    private List<Connection> from(Component c, String relationship) {
        return connections.stream().filter(k -> k.source().equals(c.id())
                && (k.relationships().isEmpty() || k.relationships().contains(relationship))).toList();
    }

    /** The one component `rel` of `c` leads to. */
    Component next(Component c, String rel) {
        List<Connection> to = from(c, rel);
        if (to.size() != 1) {
            fail(c + " → " + rel + " leads to " + to.size() + " components, expected one");
        }
        return components.get(to.get(0).destination());
    }

    /** Runs `name` of `group` on `ff`, then everything downstream; returns where FlowFiles stopped. */
    List<Exit> from(String group, String name, Flow.FF ff) {
        return flow(component(group, name), ff);
    }

    /** Goes on past a place to fill in (or a PG-05 step) with the FlowFile its work produced. */
    List<Exit> after(Exit exit, Flow.FF ff) {
        return along(exit.group(), exit.component(), "success", ff);
    }

    /** Sends `ff` down relationship `rel` of `name` in `group`, and everything downstream. */
    List<Exit> along(String group, String name, String rel, Flow.FF ff) {
        return flow(next(component(group, name), rel), ff);
    }

    private record Pending(Component at, Flow.FF ff, boolean first) {}

    private List<Exit> flow(Component start, Flow.FF ff) {
        List<Exit> exits = new ArrayList<>();
        Deque<Pending> queue = new ArrayDeque<>();
        queue.add(new Pending(start, ff, true));
        int steps = 0;
        while (!queue.isEmpty()) {
            if (++steps > 10_000) {
                fail("the flow did not settle within 10,000 steps (a loop?) from " + start);
            }
            Pending p = queue.poll();
            Component c = p.at();
            if (!p.first() && (c.placeholder() || isHttp(c))) {
                exits.add(new Exit(c.group(), c.name(), null, p.ff()));
                continue;
            }
            Map<String, List<Flow.FF>> out;
            if (c.kind().equals("PROCESSOR")) {
                out = execute(c, p.ff());
            } else {
                out = Map.of("", List.of(p.ff()));
            }
            out.forEach((rel, ffs) -> {
                List<Connection> to = from(c, rel);
                for (Flow.FF f : ffs) {
                    if (to.isEmpty()) {
                        if (!c.kind().equals("PROCESSOR")) {
                            exits.add(new Exit(c.group(), c.name(), null, f));
                        } else if (c.autoTerminated().contains(rel)) {
                            exits.add(new Exit(c.group(), c.name(), rel, f));
                        } else {
                            fail(c + ": relationship '" + rel + "' is neither connected nor auto-terminated "
                                    + "(NiFi would not start the processor)");
                        }
                    }
                    for (Connection k : to) {
                        queue.add(new Pending(components.get(k.destination()), f, false));
                    }
                }
            });
        }
        return exits;
    }

    /** Runs one processor as the file configures it; its output by relationship. */
    private Map<String, List<Flow.FF>> execute(Component c, Flow.FF in) {
        if (c.type().equals(UPDATE_ATTRIBUTE)) {
            Map<String, String> rules = new LinkedHashMap<>();
            c.properties().forEach((k, v) -> {
                if (!c.dynamic().contains(k)) {
                    fail(c + ": UpdateAttribute's property '" + k + "' is not emulated here (only its rules are)");
                }
                rules.put(k, resolve(v));
            });
            checkWired(c, Set.of("success"));
            return Map.of("success", List.of(Flow.update(in, rules)));
        }
        TestRunner runner = runner(c, Map.of());
        checkWired(c, relationships(runner));
        Map<String, List<MockFlowFile>> raw = Flow.run(runner, in);
        Map<String, List<Flow.FF>> out = new LinkedHashMap<>();
        raw.forEach((rel, ffs) -> {
            if (c.retried().contains(rel)) {
                fail(c + " sent a FlowFile to '" + rel + "', which NiFi retries (docs/nifi.md): " + Flow.describe(raw));
            }
            out.put(rel, ffs.stream().map(Flow.FF::of).toList());
        });
        return out;
    }

    /**
     * A TestRunner of `c`'s processor type, configured and validated as the file says; `provided`
     * are the controller services the test supplies, by the identifier the file gives them.
     */
    TestRunner runner(Component c, Map<String, ControllerService> provided) {
        Processor processor;
        try {
            processor = (Processor) Class.forName(c.type()).getDeclaredConstructor().newInstance();
        } catch (ReflectiveOperationException e) {
            throw new AssertionError(c + ": no processor of type " + c.type() + " on the class path", e);
        }
        TestRunner runner = TestRunners.newTestRunner(processor);
        Set<String> supported = processor.getPropertyDescriptors().stream().map(PropertyDescriptor::getName)
                .collect(Collectors.toCollection(TreeSet::new));
        c.properties().forEach((name, value) -> {
            if (!c.dynamic().contains(name) && !supported.contains(name)) {
                fail(c + ": property '" + name + "' is not one of " + c.type() + "'s " + supported
                        + " and not declared dynamic");
            }
            if (c.serviceRefs().contains(name)) {
                return; // controller services: see serviceProperty
            }
            if (value != null) {
                runner.setProperty(name, resolve(value));
            }
        });
        for (String name : c.serviceRefs()) {
            serviceProperty(c, name, runner, provided);
        }
        runner.assertValid();
        return runner;
    }

    /**
     * A property naming a controller service: the service must exist in the file. The SSL Context
     * Service of the calls to load-control is only used for https URLs; the suite's api-server
     * speaks plain HTTP, so it is left unset here (and a https URL is refused: this module does
     * not exercise TLS). Other services are supplied by the test (PG-05's HTTP Context Map).
     */
    private void serviceProperty(Component c, String name, TestRunner runner, Map<String, ControllerService> provided) {
        String id = c.properties().get(name);
        String type = service(id).path("type").asText();
        if (type.endsWith("SSLContextService")) {
            if (resolve("#{lca.api.url}").startsWith("https:")) {
                fail("this module does not exercise TLS: set lca.api.url to an http URL");
            }
            return;
        }
        ControllerService supplied = provided.get(id);
        if (supplied == null) {
            fail(c + ": controller service " + id + " (" + type + ") is not supplied by the test");
        }
        try {
            runner.addControllerService(id, supplied);
        } catch (InitializationException e) {
            throw new AssertionError(c + ": " + type, e);
        }
        runner.enableControllerService(supplied);
        runner.setProperty(name, id);
    }

    void checkWired(Component c, Set<String> relationships) {
        for (String rel : relationships) {
            if (from(c, rel).isEmpty() && !c.autoTerminated().contains(rel)) {
                fail(c + ": relationship '" + rel + "' is neither connected nor auto-terminated "
                        + "(NiFi would not start the processor)");
            }
        }
    }

    /** The one exit `name` (a place to fill in), failing with all of them otherwise. */
    static Exit stoppedAt(List<Exit> exits, String name) {
        return one(exits, e -> e.at(name), "stopped at '" + name + "'");
    }

    /** The one exit through auto-terminated `rel` of `name`. */
    static Exit ended(List<Exit> exits, String name, String rel) {
        return one(exits, e -> e.ended(name, rel), "ended at '" + name + "' → " + rel);
    }

    static Exit one(List<Exit> exits, java.util.function.Predicate<Exit> wanted, String what) {
        List<Exit> found = exits.stream().filter(wanted).toList();
        if (found.size() != 1) {
            fail("expected one FlowFile " + what + ", got " + found.size() + "; all exits:\n  "
                    + exits.stream().map(Exit::toString).collect(Collectors.joining("\n  ")));
        }
        return found.get(0);
    }
}
