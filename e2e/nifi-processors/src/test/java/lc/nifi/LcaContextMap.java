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
 * HandleHttpRequest), and one left unanswered past the request timeout is answered 503, as NiFi's
 * map does (here when the next request is registered, instead of on a timer).
 */
public class LcaContextMap extends AbstractControllerService implements HttpContextMap {
    static final int MAX_OUTSTANDING = 50;
    static final long REQUEST_TIMEOUT_MS = 60_000;

    private record Held(HttpServletResponse response, AsyncContext async, long registeredNanos) {}

    private final ConcurrentMap<String, Held> held = new ConcurrentHashMap<>();

    @Override
    public boolean register(String id, HttpServletRequest request, HttpServletResponse response, AsyncContext async) {
        expire();
        if (held.size() >= MAX_OUTSTANDING) {
            return false;
        }
        return held.putIfAbsent(id, new Held(response, async, System.nanoTime())) == null;
    }

    private void expire() {
        long now = System.nanoTime();
        held.forEach((id, h) -> {
            if (now - h.registeredNanos() > TimeUnit.MILLISECONDS.toNanos(REQUEST_TIMEOUT_MS) && held.remove(id, h)) {
                try {
                    h.response().sendError(HttpServletResponse.SC_SERVICE_UNAVAILABLE, "Request expired");
                } catch (java.io.IOException | IllegalStateException e) {
                    // the client is gone
                }
                h.async().complete();
            }
        });
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
