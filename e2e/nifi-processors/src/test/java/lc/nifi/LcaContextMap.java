package lc.nifi;

import jakarta.servlet.AsyncContext;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import java.util.concurrent.TimeUnit;
import org.apache.nifi.controller.AbstractControllerService;
import org.apache.nifi.http.HttpContextMap;

/**
 * The HTTP Context Map PG-05's HandleHttpRequest and HandleHttpResponse share. NiFi's own
 * StandardHttpContextMap (nifi-http-context-map) is not published to Maven Central, so this is
 * the same contract written against its interface: a request is held until HandleHttpResponse
 * answers it (at most {@link #MAX_OUTSTANDING} at once; more are refused with 503 by
 * HandleHttpRequest), and an unanswered one expires after the request timeout (the async context
 * answers it then, as NiFi's map answers 503).
 */
public class LcaContextMap extends AbstractControllerService implements HttpContextMap {
    static final int MAX_OUTSTANDING = 50;
    static final long REQUEST_TIMEOUT_MS = 60_000;

    private record Held(HttpServletRequest request, HttpServletResponse response, AsyncContext async) {}

    private final ConcurrentMap<String, Held> held = new ConcurrentHashMap<>();

    @Override
    public boolean register(String id, HttpServletRequest request, HttpServletResponse response, AsyncContext async) {
        if (held.size() >= MAX_OUTSTANDING) {
            return false;
        }
        async.setTimeout(REQUEST_TIMEOUT_MS);
        return held.putIfAbsent(id, new Held(request, response, async)) == null;
    }

    @Override
    public HttpServletResponse getResponse(String id) {
        Held h = held.get(id);
        return h == null ? null : h.response();
    }

    @Override
    public void complete(String id) {
        Held h = held.remove(id);
        if (h == null) {
            throw new IllegalStateException("no request held for context " + id);
        }
        h.async().complete();
    }

    @Override
    public long getRequestTimeout(TimeUnit unit) {
        return unit.convert(REQUEST_TIMEOUT_MS, TimeUnit.MILLISECONDS);
    }
}
