//! load-bench (issue 12) as shipped: its `main`, on the debug binaries, with `--quick` sizes. It
//! asserts that every scenario ran and that what it measured is a real outcome (runs finished,
//! the run completed exactly once, every dispatch arrived, the cancel and the failure applied,
//! the MultiXact figure read, every mirrored change seen on its LoadRun) — never the figures themselves, which scripts/bench produces.
use serde_json::Value;
use std::collections::BTreeMap;

const BENCH: &str = env!("CARGO_BIN_EXE_load-bench");

#[test]
fn load_bench_quick_runs_every_scenario_and_prints_json_lines() {
    let bin_dir = e2e::standalone::bin("load-control-api")
        .expect("debug binaries (cargo build)")
        .parent()
        .unwrap()
        .to_path_buf();
    let out = std::process::Command::new(BENCH)
        .args(["--quick", "--bin-dir"])
        .arg(&bin_dir)
        .output()
        .expect("load-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "load-bench failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut by: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in stdout.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        by.entry(v["scenario"].as_str().unwrap().to_string())
            .or_default()
            .push(v);
    }
    let one = |name: &str| -> &Value {
        by.get(name)
            .and_then(|v| v.first())
            .unwrap_or_else(|| panic!("no {name} line in:\n{stdout}"))
    };
    assert!(one("pgbench")["tps"].as_f64().unwrap() > 0.0);
    let life = one("lifecycle");
    assert_eq!(life["finished"], true, "{life}");
    assert_eq!(life["errors"], 0, "{life}");
    assert_eq!(life["runs_done"], life["runs"]);
    assert_eq!(
        life["latency_ms"]["chunk"]["n"].as_u64().unwrap(),
        (life["runs"].as_u64().unwrap()) * 2 * 2,
        "every chunk report of 4 runs × 2 partitions × 2 chunks"
    );
    assert_eq!(life["dispatch_latency_ms"]["n"], life["runs"]);
    for c in &by["completion"] {
        assert_eq!(c["finished"], true, "{c}");
        assert_eq!(
            c["run_completed_by"], 1,
            "exactly one report completes the run: {c}"
        );
        assert_eq!(c["partition_completing_report_ms"]["n"], c["partitions"]);
    }
    assert!(one("completion_ratio")["p50_ratio"].as_f64().unwrap() > 0.0);
    assert_eq!(one("manifest")["manifest_ms"]["n"], 1);
    let d = one("dispatch_idle");
    assert_eq!(d["dispatch_latency_ms"]["n"], d["runs"]);
    let storm = one("cancel_and_fail_under_storm");
    for action in ["cancel", "partition_fail"] {
        assert_eq!(storm[action]["ok"], true, "{storm}");
        assert!(
            storm[action]["storm_reports_before"].as_u64().unwrap() > 0,
            "{storm}"
        );
    }
    let rss = &by["rss"];
    assert_eq!(rss.len(), 2, "idle and after load");
    assert!(rss[1]["api_server"]["peak_kib"].as_u64().unwrap() > 0);
    let mirror = one("mirror");
    assert_eq!(
        mirror["changes_seen"], mirror["changes"],
        "every change reached its LoadRun: {mirror}"
    );
    assert!(
        mirror["api_requests_per_change"].as_f64().unwrap() > 0.0,
        "{mirror}"
    );
    let hostile = one("hostile_bodies");
    assert_eq!(
        hostile["statuses"],
        serde_json::json!([422, 422, 422, 422]),
        "{hostile}"
    );
    let mx = one("multixact");
    assert_eq!(mx["failed"], 0, "{mx}");
    assert!(mx["multixacts_consumed"].as_i64().unwrap() >= 0);
}
