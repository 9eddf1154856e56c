//! `/openapi.json` describes every route the server has, and `/metrics` counts what happened.
mod common;
use common::*;
use regex::Regex;
use std::collections::BTreeSet;
use uuid::Uuid;

/// Every `(method, path)` the router registers, read from the router's own source.
fn routed() -> BTreeSet<(String, String)> {
    let src = include_str!("../src/app.rs");
    let route = Regex::new(
        r#"\.route\(\s*"([^"]+)",\s*((?:get|post)\([a-z_]+\)(?:\s*\.(?:get|post)\([a-z_]+\))*)"#,
    )
    .unwrap();
    let method = Regex::new(r"(get|post)\(").unwrap();
    let mut out = BTreeSet::new();
    for c in route.captures_iter(src) {
        for m in method.captures_iter(&c[2]) {
            out.insert((m[1].to_string(), c[1].to_string()));
        }
    }
    out
}

#[tokio::test]
async fn the_document_lists_every_route_with_roles_and_schemas() {
    let api = Api::start_with(|c| c.server.root_path = "/lca".into()).await;
    let doc = api.send("GET", "/openapi.json", None, None).await;
    assert_eq!(doc.status, 200);
    let d = &doc.body;
    assert!(d["openapi"].as_str().unwrap().starts_with("3."));
    assert_eq!(d["servers"][0]["url"], "/lca");
    let routes = routed();
    assert_eq!(routes.len(), 26, "{routes:?}");
    let mut documented = BTreeSet::new();
    for (path, item) in d["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            documented.insert((method.clone(), path.clone()));
            let roles = op["x-roles"]
                .as_array()
                .unwrap_or_else(|| panic!("{method} {path} has no x-roles"));
            if path.starts_with("/v1") {
                assert!(!roles.is_empty(), "{method} {path}");
                assert!(
                    op["description"].as_str().unwrap().contains("Roles: "),
                    "{method} {path}"
                );
                assert_eq!(
                    op["security"][0]["bearer"],
                    serde_json::json!([]),
                    "{method} {path}"
                );
            }
        }
    }
    assert_eq!(routes, documented, "router and document differ");
    assert_eq!(
        d["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(d["components"]["schemas"]["ErrorDoc"].is_object());
    assert_eq!(
        d["components"]["schemas"]["CreateRunBody"]["properties"]["jobKey"]["pattern"],
        "^[A-Z0-9_]{1,200}$"
    );
    assert_eq!(
        d["paths"]["/v1/runs/{run_id}/cancel"]["post"]["x-roles"],
        serde_json::json!(["operator"])
    );
    // Every documented route is really routed: unauthenticated calls get 401 or 200, never 404/405.
    for (method, path) in &documented {
        let concrete = path
            .replace("{run_id}", &Uuid::new_v4().to_string())
            .replace("{partition_id}", "0000")
            .replace("{dispatch_id}", &Uuid::new_v4().to_string());
        let r = api
            .raw(&method.to_uppercase(), &concrete, &[], b"{}".to_vec())
            .await;
        assert!(
            matches!(r.status.as_u16(), 200 | 401),
            "{method} {path} -> {}",
            r.status
        );
    }
}

/// `docs/openapi.json` is the document a server with the default `server.root_path` serves, so a
/// flow author has it without a running instance. `LC_REGENERATE=1` rewrites it.
#[tokio::test]
async fn the_committed_document_is_the_served_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    let api = Api::start().await;
    let served = api.send("GET", "/openapi.json", None, None).await;
    assert_eq!(served.status, 200);
    let want = format!("{}\n", serde_json::to_string_pretty(&served.body).unwrap());
    if std::env::var_os("LC_REGENERATE").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "docs/openapi.json is not what the server serves: LC_REGENERATE=1 cargo test -p load-control-api \
         --test openapi_metrics the_committed_document_is_the_served_one"
    );
}

#[tokio::test]
async fn metrics_count_requests_chunk_outcomes_and_lock_waits() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "M", &[4, 4]).await;
    let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
    api.claim(run, "0000", t0).await;
    api.claim(run, "0001", t1).await;
    api.chunk(run, "0000", t0, 0, 2, 2).await;
    api.chunk(run, "0000", t0, 1, 2, 2).await;
    api.chunk(run, "0001", t1, 0, 1, 4).await;
    api.chunk(run, "0001", t1, 0, 1, 4).await;
    assert_eq!(
        api.chunk(run, "0001", Uuid::new_v4(), 0, 1, 4).await.status,
        409
    );
    let m = api.send("GET", "/metrics", None, None).await;
    assert_eq!(m.status, 200);
    let text = m.body.as_str().unwrap().to_string();
    let chunks = r#"endpoint="/v1/runs/{run_id}/partitions/{partition_id}/chunks""#;
    for line in [
        format!("lca_requests_total{{{chunks},status=\"200\"}} 4"),
        format!("lca_requests_total{{{chunks},status=\"409\"}} 1"),
        "lca_chunk_reports_total{result=\"progress\"} 1".to_string(),
        "lca_chunk_reports_total{result=\"partition_success\"} 1".to_string(),
        "lca_chunk_reports_total{result=\"run_complete\"} 1".to_string(),
        "lca_chunk_reports_total{result=\"ignored\"} 1".to_string(),
        "lca_run_lock_wait_seconds_count 7".to_string(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    assert!(text.contains("lca_request_seconds_bucket{le="));
}

/// Issue 41 item 8: `/metrics` negotiates on `Accept` as client_golang does. Prometheus's own
/// scrape header gets OpenMetrics (ending in `# EOF`); no `Accept`, `*/*` or `text/plain` get the
/// classic text format, a counter's family named by its `_total` samples.
#[tokio::test]
async fn metrics_are_negotiated_on_accept() {
    let api = Api::start().await;
    let scrape = |accept: Option<&'static str>| {
        let mut req = api.client.get(format!("{}/metrics", api.base));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        async move {
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 200);
            let ct = res.headers()["content-type"].to_str().unwrap().to_string();
            (ct, res.text().await.unwrap())
        }
    };
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (ct, om) = scrape(Some(prometheus)).await;
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains("# TYPE lca_db_connections_retired counter"),
        "{om}"
    );
    for accept in [None, Some("*/*"), Some("text/plain;version=0.0.4")] {
        let (ct, text) = scrape(accept).await;
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8", "{accept:?}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE lca_db_connections_retired_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE lca_run_lock_wait_seconds histogram"),
            "{text}"
        );
    }
}
