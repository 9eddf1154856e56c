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
/// kube-state-metrics' series an alert may query besides load-control's own.
const KUBE_STATE_METRICS: &[&str] = &["kube_endpoint_info", "kube_endpoint_address"];

/// The chart's PrometheusRule for release `lc` in namespace `ns`.
fn rendered_rule() -> serde_yaml::Value {
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
    rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok())
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule")
}

#[tokio::test]
async fn every_alert_queries_exposed_metrics_and_links_its_runbook_section() {
    let rule = rendered_rule();
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
        assert!(
            !used.is_empty() || KUBE_STATE_METRICS.iter().any(|k| expr.contains(k)),
            "{name} queries no lca_ series"
        );
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

/// Where promtool is: `LC_PROMETHEUS_BIN`, else the cache scripts/prometheus-build fills for the
/// version e2e/prometheus/go.mod pins.
fn promtool() -> std::path::PathBuf {
    let dir = match std::env::var_os("LC_PROMETHEUS_BIN") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let go_mod = std::fs::read_to_string(format!(
                "{}/../e2e/prometheus/go.mod",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let version = go_mod
                .lines()
                .map(|l| l.trim_start_matches("require").trim())
                .find_map(|l| l.strip_prefix("github.com/prometheus/prometheus "))
                .expect("the pinned Prometheus")
                .trim()
                .to_string();
            std::path::PathBuf::from(std::env::var("HOME").unwrap())
                .join(".cache/load-control/prometheus")
                .join(version)
        }
    };
    let tool = dir.join("promtool");
    assert!(
        tool.is_file(),
        "no promtool at {}: run scripts/prometheus-build (scripts/test does)",
        tool.display()
    );
    tool
}

/// One unit test of an alert: the series Prometheus would scrape (promtool's notation, `{SEL}`
/// standing for this release's `namespace="ns", release="lc"`), and whether the alert fires at
/// `at`, with which labels besides the rule's and which `$value`.
struct AlertCase {
    alert: &'static str,
    why: &'static str,
    at: &'static str,
    series: &'static [(&'static str, &'static str)],
    fires: bool,
    labels: &'static [(&'static str, &'static str)],
    value: &'static str,
}

const fn fires(
    alert: &'static str,
    why: &'static str,
    at: &'static str,
    series: &'static [(&'static str, &'static str)],
) -> AlertCase {
    AlertCase {
        alert,
        why,
        at,
        series,
        fires: true,
        labels: &[],
        value: "",
    }
}

const fn quiet(
    alert: &'static str,
    why: &'static str,
    at: &'static str,
    series: &'static [(&'static str, &'static str)],
) -> AlertCase {
    AlertCase {
        fires: false,
        ..fires(alert, why, at, series)
    }
}

impl AlertCase {
    const fn with(
        mut self,
        labels: &'static [(&'static str, &'static str)],
        value: &'static str,
    ) -> AlertCase {
        self.labels = labels;
        self.value = value;
        self
    }
}

/// Every alert fires on the series that mean it, and stays quiet on their neighbours: another
/// release's series, the overload 503 beside the database's, a value under the threshold, a
/// condition not held for its `for`.
const ALERT_CASES: &[AlertCase] = &[
    fires(
        "LoadControlPublishUnknown",
        "a run held",
        "10m",
        &[("lca_active_runs{status=\"PUBLISH_UNKNOWN\", {SEL}}", "1x10")],
    ),
    quiet(
        "LoadControlPublishUnknown",
        "another release's run",
        "10m",
        &[(
            "lca_active_runs{status=\"PUBLISH_UNKNOWN\", namespace=\"ns\", release=\"other\"}",
            "1x10",
        )],
    ),
    quiet(
        "LoadControlPublishUnknown",
        "held for less than 5 minutes",
        "10m",
        &[(
            "lca_active_runs{status=\"PUBLISH_UNKNOWN\", {SEL}}",
            "0x7 1x3",
        )],
    ),
    fires(
        "LoadControlRunFailed",
        "two failed runs",
        "1m",
        &[("lca_monitor_alerts{kind=\"RUN_FAILED\", {SEL}}", "2x3")],
    )
    .with(&[], "2"),
    quiet(
        "LoadControlRunFailed",
        "stale runs only",
        "1m",
        &[("lca_monitor_alerts{kind=\"RUN_STALE\", {SEL}}", "2x3")],
    ),
    fires(
        "LoadControlRunStale",
        "a stale run for 20 minutes",
        "20m",
        &[("lca_monitor_alerts{kind=\"RUN_STALE\", {SEL}}", "1x20")],
    )
    .with(&[], "1"),
    quiet(
        "LoadControlRunStale",
        "another namespace's",
        "20m",
        &[(
            "lca_monitor_alerts{kind=\"RUN_STALE\", namespace=\"other\", release=\"lc\"}",
            "1x20",
        )],
    ),
    fires(
        "LoadControlDispatchDead",
        "a DEAD dispatch",
        "10m",
        &[("lca_dispatch_backlog{status=\"DEAD\", {SEL}}", "1x10")],
    ),
    quiet(
        "LoadControlDispatchDead",
        "pending dispatches only",
        "10m",
        &[("lca_dispatch_backlog{status=\"PENDING\", {SEL}}", "5x10")],
    ),
    fires(
        "LoadControlDispatchesStuck",
        "pending with no leader",
        "15m",
        &[
            ("lca_dispatch_backlog{status=\"PENDING\", {SEL}}", "3x15"),
            ("lca_leader{pod=\"a\", {SEL}}", "0x15"),
        ],
    ),
    quiet(
        "LoadControlDispatchesStuck",
        "pending under a leader",
        "15m",
        &[
            ("lca_dispatch_backlog{status=\"PENDING\", {SEL}}", "3x15"),
            ("lca_leader{pod=\"a\", {SEL}}", "1x15"),
        ],
    ),
    fires(
        "LoadControlNoLeader",
        "both operators standing by",
        "5m",
        &[
            ("lca_leader{pod=\"a\", {SEL}}", "0x5"),
            ("lca_leader{pod=\"b\", {SEL}}", "0x5"),
        ],
    ),
    fires(
        "LoadControlNoLeader",
        "no operator reporting, another release's leading",
        "5m",
        &[(
            "lca_leader{pod=\"a\", namespace=\"ns\", release=\"other\"}",
            "1x5",
        )],
    ),
    quiet(
        "LoadControlNoLeader",
        "one leads",
        "5m",
        &[
            ("lca_leader{pod=\"a\", {SEL}}", "0x5"),
            ("lca_leader{pod=\"b\", {SEL}}", "1x5"),
        ],
    ),
    fires(
        "LoadControlLedgerOwnedByOther",
        "refused by another release's claim",
        "10m",
        &[("lca_ledger_owned_by_other{{SEL}}", "1x10")],
    ),
    quiet(
        "LoadControlLedgerOwnedByOther",
        "owning its ledger",
        "10m",
        &[("lca_ledger_owned_by_other{{SEL}}", "0x10")],
    ),
    fires(
        "LoadControlKubernetesAccess",
        "one pod without access",
        "10m",
        &[
            ("lca_kubernetes_access{pod=\"a\", {SEL}}", "0x10"),
            ("lca_kubernetes_access{pod=\"b\", {SEL}}", "1x10"),
        ],
    ),
    quiet(
        "LoadControlKubernetesAccess",
        "access back within 5 minutes",
        "10m",
        &[("lca_kubernetes_access{pod=\"a\", {SEL}}", "1x5 0x3 1x2")],
    ),
    fires(
        "LoadControlLeaderTaskRestarting",
        "a task restarted",
        "5m",
        &[(
            "lca_task_restarts_total{task=\"dispatcher\", {SEL}}",
            "0 0 0 1 1 1",
        )],
    ),
    quiet(
        "LoadControlLeaderTaskRestarting",
        "restarts long ago",
        "30m",
        &[(
            "lca_task_restarts_total{task=\"dispatcher\", {SEL}}",
            "3x30",
        )],
    ),
    fires(
        "LoadControlOperatorProcessKilled",
        "killed ten times",
        "10m",
        &[(
            "lca_operator_process_restarts_total{pod=\"a\", {SEL}}",
            "0+1x10",
        )],
    )
    .with(&[("pod", "a")], ""),
    quiet(
        "LoadControlOperatorProcessKilled",
        "killed twice",
        "10m",
        &[(
            "lca_operator_process_restarts_total{pod=\"a\", {SEL}}",
            "0 1 2 2 2 2 2 2 2 2 2",
        )],
    ),
    fires(
        "LoadControlLeaderTaskCrashLooping",
        "a task failing every minute",
        "10m",
        &[("lca_task_restarts_total{task=\"sweeper\", {SEL}}", "0+1x10")],
    )
    .with(&[("task", "sweeper")], ""),
    quiet(
        "LoadControlLeaderTaskCrashLooping",
        "two restarts",
        "10m",
        &[(
            "lca_task_restarts_total{task=\"sweeper\", {SEL}}",
            "0 1 2 2 2 2 2 2 2 2 2",
        )],
    ),
    fires(
        "LoadControlMirrorFailing",
        "transient failures for 30 minutes",
        "30m",
        &[(
            "lca_reconcile_total{controller=\"loadrun_mirror\", result=\"transient\", {SEL}}",
            "0+1x30",
        )],
    ),
    quiet(
        "LoadControlMirrorFailing",
        "successful reconciles",
        "30m",
        &[(
            "lca_reconcile_total{controller=\"loadrun_mirror\", result=\"ok\", {SEL}}",
            "0+1x30",
        )],
    ),
    fires(
        "LoadControlCertificateExpiringSoon",
        "the API's certificate expired at day 1",
        "2h",
        &[(
            "lca_certificate_expiry_timestamp_seconds{cert=\"api\", {SEL}}",
            "86400x120",
        )],
    )
    .with(&[("cert", "api")], ""),
    quiet(
        "LoadControlCertificateExpiringSoon",
        "a certificate valid for years",
        "2h",
        &[(
            "lca_certificate_expiry_timestamp_seconds{cert=\"api\", {SEL}}",
            "100000000x120",
        )],
    ),
    fires(
        "LoadControlSecretReloadRefused",
        "a tokens file refused",
        "4m",
        &[("lca_tokens_reload_failures_total{{SEL}}", "0 0 1 1 1")],
    ),
    fires(
        "LoadControlSecretReloadRefused",
        "a certificate refused",
        "4m",
        &[(
            "lca_certificate_reload_failures_total{cert=\"api\", {SEL}}",
            "0 0 1 1 1",
        )],
    ),
    quiet(
        "LoadControlSecretReloadRefused",
        "refusals long ago",
        "30m",
        &[("lca_tokens_reload_failures_total{{SEL}}", "1x30")],
    ),
    fires(
        "LoadControlDatabaseUnavailable",
        "503 DATABASE_UNAVAILABLE for 15 minutes",
        "15m",
        &[(
            "lca_unavailable_total{code=\"DATABASE_UNAVAILABLE\", {SEL}}",
            "0+5x15",
        )],
    ),
    quiet(
        "LoadControlDatabaseUnavailable",
        "the overload's 503",
        "15m",
        &[(
            "lca_unavailable_total{code=\"SERVICE_UNAVAILABLE\", {SEL}}",
            "0+5x15",
        )],
    ),
    fires(
        "LoadControlOverloaded",
        "503 SERVICE_UNAVAILABLE for 20 minutes",
        "20m",
        &[(
            "lca_unavailable_total{code=\"SERVICE_UNAVAILABLE\", {SEL}}",
            "0+5x20",
        )],
    ),
    quiet(
        "LoadControlOverloaded",
        "the database's 503",
        "20m",
        &[(
            "lca_unavailable_total{code=\"DATABASE_UNAVAILABLE\", {SEL}}",
            "0+5x20",
        )],
    ),
    fires(
        "LoadControlApiErrors",
        "2 % INTERNAL_ERROR",
        "25m",
        &[
            ("lca_requests_total{status=\"500\", {SEL}}", "0+2x25"),
            ("lca_requests_total{status=\"200\", {SEL}}", "0+100x25"),
        ],
    ),
    quiet(
        "LoadControlApiErrors",
        "a third 503s, no other 5xx",
        "25m",
        &[
            ("lca_requests_total{status=\"503\", {SEL}}", "0+50x25"),
            ("lca_requests_total{status=\"200\", {SEL}}", "0+100x25"),
        ],
    ),
    quiet(
        "LoadControlApiErrors",
        "0.5 % INTERNAL_ERROR",
        "25m",
        &[
            ("lca_requests_total{status=\"500\", {SEL}}", "0+1x25"),
            ("lca_requests_total{status=\"200\", {SEL}}", "0+200x25"),
        ],
    ),
    fires(
        "LoadControlApiSlow",
        "90 % of /v1 calls over 1 s",
        "30m",
        &[
            (
                "lca_request_seconds_bucket{endpoint=\"/v1/runs\", le=\"0.1\", {SEL}}",
                "0+10x30",
            ),
            (
                "lca_request_seconds_bucket{endpoint=\"/v1/runs\", le=\"1\", {SEL}}",
                "0+10x30",
            ),
            (
                "lca_request_seconds_bucket{endpoint=\"/v1/runs\", le=\"5\", {SEL}}",
                "0+100x30",
            ),
            (
                "lca_request_seconds_bucket{endpoint=\"/v1/runs\", le=\"+Inf\", {SEL}}",
                "0+100x30",
            ),
        ],
    ),
    quiet(
        "LoadControlApiSlow",
        "slow /metrics, fast /v1",
        "30m",
        &[
            (
                "lca_request_seconds_bucket{endpoint=\"/v1/runs\", le=\"0.1\", {SEL}}",
                "0+100x30",
            ),
            (
                "lca_request_seconds_bucket{endpoint=\"/v1/runs\", le=\"+Inf\", {SEL}}",
                "0+100x30",
            ),
            (
                "lca_request_seconds_bucket{endpoint=\"/metrics\", le=\"0.1\", {SEL}}",
                "0x30",
            ),
            (
                "lca_request_seconds_bucket{endpoint=\"/metrics\", le=\"+Inf\", {SEL}}",
                "0+100x30",
            ),
        ],
    ),
    fires(
        "LoadControlNoReadyEndpoint",
        "the Service's only address not ready",
        "5m",
        &[
            (
                "kube_endpoint_info{namespace=\"ns\", endpoint=\"lc-load-control\"}",
                "1x5",
            ),
            (
                "kube_endpoint_address{namespace=\"ns\", endpoint=\"lc-load-control\", ip=\"10.0.0.1\", ready=\"false\"}",
                "1x5",
            ),
        ],
    ),
    quiet(
        "LoadControlNoReadyEndpoint",
        "one address ready",
        "5m",
        &[
            (
                "kube_endpoint_info{namespace=\"ns\", endpoint=\"lc-load-control\"}",
                "1x5",
            ),
            (
                "kube_endpoint_address{namespace=\"ns\", endpoint=\"lc-load-control\", ip=\"10.0.0.1\", ready=\"false\"}",
                "1x5",
            ),
            (
                "kube_endpoint_address{namespace=\"ns\", endpoint=\"lc-load-control\", ip=\"10.0.0.2\", ready=\"true\"}",
                "1x5",
            ),
        ],
    ),
    quiet(
        "LoadControlNoReadyEndpoint",
        "no kube-state-metrics",
        "5m",
        &[("lca_leader{pod=\"a\", {SEL}}", "1x5")],
    ),
    quiet(
        "LoadControlNoReadyEndpoint",
        "another release's Service without a ready address",
        "5m",
        &[(
            "kube_endpoint_info{namespace=\"ns\", endpoint=\"other-load-control\"}",
            "1x5",
        )],
    ),
    fires(
        "LoadControlOrphanSweepUndecided",
        "undecided for 40 minutes",
        "40m",
        &[("lca_orphan_sweep_undecided{{SEL}}", "1x40")],
    ),
    quiet(
        "LoadControlOrphanSweepUndecided",
        "undecided for 20 minutes",
        "40m",
        &[("lca_orphan_sweep_undecided{{SEL}}", "0x20 1x20")],
    ),
    fires(
        "LoadControlTransactionIdAge",
        "600 M for 80 minutes",
        "80m",
        &[("lca_database_xid_age{{SEL}}", "600000000x80")],
    ),
    quiet(
        "LoadControlTransactionIdAge",
        "400 M",
        "80m",
        &[("lca_database_xid_age{{SEL}}", "400000000x80")],
    ),
    fires(
        "LoadControlMultiXactAge",
        "600 M for 80 minutes",
        "80m",
        &[("lca_database_mxid_age{{SEL}}", "600000000x80")],
    ),
    quiet(
        "LoadControlMultiXactAge",
        "600 M for 30 minutes",
        "80m",
        &[("lca_database_mxid_age{{SEL}}", "0x50 600000000x30")],
    ),
];

/// Issue 41 item 3: the chart's alerting rules evaluated by Prometheus's own promtool (built from
/// its Go module by scripts/prometheus-build): `promtool check rules`, then a unit test per case of
/// [`ALERT_CASES`], each expecting exactly the labels (the rule's, with namespace and release, and
/// what the expression keeps) and annotations the alert carries when it fires, and nothing when it
/// must not. Every alert of the chart has a case that fires it and one that must not.
#[test]
fn every_alert_fires_on_its_series_and_only_there() {
    let rule = rendered_rule();
    let rules = rule["spec"]["groups"][0]["rules"].as_sequence().unwrap();
    let dir = std::env::temp_dir().join(format!("lc-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules_file = dir.join("rules.yaml");
    std::fs::write(
        &rules_file,
        serde_yaml::to_string(&serde_json::json!({"groups": rule["spec"]["groups"]})).unwrap(),
    )
    .unwrap();
    let tool = promtool();
    let checked = std::process::Command::new(&tool)
        .args(["check", "rules"])
        .arg(&rules_file)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    for r in rules {
        let name = r["alert"].as_str().unwrap();
        for want in [true, false] {
            assert!(
                ALERT_CASES
                    .iter()
                    .any(|c| c.alert == name && c.fires == want),
                "{name} has no case where it {}",
                if want { "fires" } else { "stays quiet" }
            );
        }
    }
    let mut tests = Vec::new();
    for case in ALERT_CASES {
        let r = rules
            .iter()
            .find(|r| r["alert"] == case.alert)
            .unwrap_or_else(|| panic!("the chart has no alert {}", case.alert));
        let mut exp_alerts = Vec::new();
        if case.fires {
            let mut labels: serde_json::Map<String, serde_json::Value> =
                serde_json::from_value(serde_json::to_value(&r["labels"]).unwrap()).unwrap();
            for (k, v) in case.labels {
                labels.insert(k.to_string(), (*v).into());
            }
            let annotations: serde_json::Map<String, serde_json::Value> = r["annotations"]
                .as_mapping()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().unwrap().to_string(),
                        v.as_str()
                            .unwrap()
                            .replace("{{ $value }}", case.value)
                            .into(),
                    )
                })
                .collect();
            exp_alerts
                .push(serde_json::json!({"exp_labels": labels, "exp_annotations": annotations}));
        }
        let series: Vec<serde_json::Value> = case
            .series
            .iter()
            .map(|(s, values)| {
                serde_json::json!({
                    "series": s.replace("{SEL}", "namespace=\"ns\", release=\"lc\""),
                    "values": values,
                })
            })
            .collect();
        tests.push(serde_json::json!({
            "name": format!("{} {}: {}", case.alert, if case.fires { "fires" } else { "quiet" }, case.why),
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": case.at, "alertname": case.alert, "exp_alerts": exp_alerts}],
        }));
    }
    let tests_file = dir.join("tests.yaml");
    std::fs::write(
        &tests_file,
        serde_yaml::to_string(&serde_json::json!({
            "rule_files": ["rules.yaml"],
            "evaluation_interval": "1m",
            "tests": tests,
        }))
        .unwrap(),
    )
    .unwrap();
    let tested = std::process::Command::new(&tool)
        .args(["test", "rules"])
        .arg(&tests_file)
        .output()
        .unwrap();
    assert!(
        tested.status.success(),
        "promtool test rules ({} cases): {}{}",
        ALERT_CASES.len(),
        String::from_utf8_lossy(&tested.stdout),
        String::from_utf8_lossy(&tested.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
