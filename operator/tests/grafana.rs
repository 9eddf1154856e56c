//! The Grafana dashboard the chart ships: valid JSON, every panel queries Prometheus, and every
//! lca_* metric it queries exists in the /metrics of the api-server or of the operator.
mod common;
use common::*;

const NIFI: &str = "grafana-nifi-token";
use std::collections::BTreeSet;

/// Metric names a /metrics text exposes (sample names, and the families of `# TYPE` lines with
/// their counter and histogram sample names).
fn exposed(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(name.to_string());
            match kind {
                "counter" => {
                    names.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{s}"));
                    }
                }
                _ => {}
            }
        } else if !line.starts_with('#') {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_exists() {
    let path = format!(
        "{}/../charts/load-control/dashboards/load-control.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
    let re = regex::Regex::new(r"lca_[a-z_]+").unwrap();
    let mut queried = BTreeSet::new();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for p in panels {
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {} has no targets", p["title"]));
        assert!(!targets.is_empty(), "panel {} queries nothing", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("a PromQL expression");
            queried.extend(re.find_iter(expr).map(|m| m.as_str().to_string()));
        }
    }
    let have = exposed_by_both().await;
    let missing: Vec<_> = queried.iter().filter(|m| !have.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics nobody exposes: {missing:?}\nexposed: {have:?}"
    );
    assert!(queried.len() >= 8, "{queried:?}");
}

/// Every metric name the api-server's and the operator's /metrics expose, each family with a
/// sample as a working installation has them.
async fn exposed_by_both() -> BTreeSet<String> {
    // The api-server's /metrics after a chunk report (families appear with their first sample).
    let env = Env::start(|_| {}).await;
    let mut config = env.config.clone();
    config.auth.tokens = vec![lcconfig::config::TokenEntry {
        name: "nifi".into(),
        role: "nifi".into(),
        sha256: load_control_api::auth::sha256_hex(NIFI),
    }];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(load_control_api::server::serve(
        config,
        env.ledger.clone(),
        listener,
        std::future::pending(),
    ));
    let http = reqwest::Client::new();
    // A run whose partition 0000 is already claimed with tokens[0].
    let (run, tokens) = env.extracting("G", &[5]).await;
    let token = tokens[0];
    for (path, body) in [(
        "chunks",
        serde_json::json!({"claimToken": token, "chunkIndex": 0, "chunkCount": 2,
            "hdfsPath": format!("/data/JOB/run_id={run}/p/0.parquet"), "recordCount": 1}),
    )] {
        let r = http
            .post(format!("{base}/v1/runs/{run}/partitions/0000/{path}"))
            .bearer_auth(NIFI)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status().as_u16(),
            200,
            "{path}: {}",
            r.text().await.unwrap()
        );
    }
    let api_text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The operator's, with one observation of each family, as a leading operator makes them.
    let m = lcoperator::metrics::Metrics::default();
    m.dispatch("VALIDATE_RUN", "sent");
    m.sweeper_actions("reissue_partition", 1);
    m.gauges(&[("DEAD".into(), 0)], &[("PUBLISH_UNKNOWN".into(), 0)]);
    m.database_age(0, 0);
    m.monitor_alerts(&env.ledger.alert_counts().await.unwrap());
    m.leading(true);
    m.task_restarted("loadrun_mirror");
    m.kubernetes_access(true);
    m.reconciled("loadrun_mirror", "transient", 0.1);
    m.certificate_reloaded("nifi_client", Some(1_893_456_000));
    m.certificate_reload_failed("nifi_client");
    let operator_text = m.render();
    // The api-server's certificate series, as an installation with TLS has them.
    let tls = load_control_api::metrics::Metrics::default();
    tls.certificate_loaded("api", 0);
    tls.certificate_reload_failed("api");
    tls.unavailable("DATABASE_UNAVAILABLE");
    tls.unavailable("SERVICE_UNAVAILABLE");
    let mut have = exposed(&api_text);
    have.extend(exposed(&operator_text));
    have.extend(exposed(&tls.render()));
    have
}

/// The chart's PrometheusRule: every alert queries only series the binaries expose (with label
/// values they use), and links a section of the runbook that exists.
#[tokio::test]
async fn every_alert_queries_exposed_metrics_and_links_its_runbook_section() {
    let chart = format!("{}/../charts/load-control", env!("CARGO_MANIFEST_DIR"));
    let out = kubetest::helm_offline()
        .args([
            "template",
            "lc",
            &chart,
            "-n",
            "ns",
            "--set",
            "prometheusRule.enabled=true",
        ])
        .args(["-f", &kubetest::required_values()])
        .args([
            "--set",
            "prometheusRule.labels.release=kube-prometheus-stack",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8_lossy(&out.stdout);
    let rule: serde_yaml::Value = rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok())
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let runbook = std::fs::read_to_string(format!(
        "{}/../docs/operations.md",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    // GitHub's anchors: lower case, spaces to '-', punctuation other than '-' and '_' dropped.
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let have = exposed_by_both().await;
    let metric = regex::Regex::new(r"lca_[a-z_]+").unwrap();
    let rules = rule["spec"]["groups"][0]["rules"].as_sequence().unwrap();
    assert!(rules.len() >= 10, "{rules:?}");
    for r in rules {
        let (name, expr) = (r["alert"].as_str().unwrap(), r["expr"].as_str().unwrap());
        // Routable by the installation it is about, whatever the expression aggregates away.
        assert_eq!(
            (&r["labels"]["namespace"], &r["labels"]["release"]),
            (&"ns".into(), &"lc".into()),
            "{name}: {:?}",
            r["labels"]
        );
        assert_eq!(
            expr.matches('(').count(),
            expr.matches(')').count(),
            "{name}: {expr}"
        );
        assert_eq!(
            expr.matches('{').count(),
            expr.matches('}').count(),
            "{name}: {expr}"
        );
        let used: Vec<&str> = metric.find_iter(expr).map(|m| m.as_str()).collect();
        assert!(!used.is_empty(), "{name} queries no lca_ series");
        for m in used {
            assert!(have.contains(m), "{name} queries {m}, which nobody exposes");
        }
        let url = r["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url.split_once('#').map(|(_, a)| a).unwrap_or_default();
        assert!(
            anchors.contains(anchor),
            "{name}: no section #{anchor} in the runbook ({anchors:?})"
        );
        assert!(
            r["labels"]["severity"].as_str().is_some(),
            "{name} has a severity"
        );
    }
}
