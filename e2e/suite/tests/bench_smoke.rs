//! load-bench (issue 12) as shipped: its `main`, on the debug binaries, with `--quick` sizes. It
//! asserts that every scenario ran and that what it measured is a real outcome (runs finished,
//! the run completed exactly once, every dispatch arrived, the cancel and the failure applied,
//! the MultiXact figure read, every mirrored change seen on its LoadRun, the rows each kind of chunk
//! report writes) — never the figures themselves, which scripts/bench produces.
use serde_json::Value;
use std::collections::BTreeMap;

const BENCH: &str = env!("CARGO_BIN_EXE_load-bench");

/// `load-bench <args> --bin-dir <the debug binaries>`, which must succeed: its JSON lines and its
/// whole output (for the failure messages).
fn load_bench(args: &[&str]) -> (Vec<Value>, String) {
    let bin_dir = e2e::standalone::bin("load-control-api")
        .expect("debug binaries (cargo build)")
        .parent()
        .unwrap()
        .to_path_buf();
    let out = std::process::Command::new(BENCH)
        .args(args)
        .arg("--bin-dir")
        .arg(&bin_dir)
        .output()
        .expect("load-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "load-bench failed ({}): {}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (lines, stdout)
}

#[test]
fn load_bench_quick_runs_every_scenario_and_prints_json_lines() {
    let (lines, stdout) = load_bench(&["--quick"]);
    let mut by: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for v in lines {
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
    // The scale scenario: --quick's 4 and 8 workers over 1 and 2 api-servers, every point
    // finished without an error, every replica took work, and the connections were seen.
    let scale = &by["scale"];
    let points: Vec<(u64, u64)> = scale
        .iter()
        .map(|l| {
            (
                l["replicas"].as_u64().unwrap(),
                l["clients"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(points, [(1, 4), (1, 8), (2, 4), (2, 8)], "{scale:?}");
    for l in scale {
        assert_eq!(l["finished"], true, "{l}");
        assert_eq!(l["errors"], 0, "{l}");
        // Each point counts its own requests only: 4 runs × 2 partitions × 2 chunks.
        assert_eq!(l["latency_ms"]["chunk"]["n"], 16, "{l}");
        let by_replica = l["work_items_by_replica"].as_array().unwrap();
        assert_eq!(
            by_replica.len() as u64,
            l["replicas"].as_u64().unwrap(),
            "{l}"
        );
        assert!(by_replica.iter().all(|n| n.as_u64().unwrap() > 0), "{l}");
        assert!(l["pg_connections"]["open_max"].as_i64().unwrap() > 0, "{l}");
        assert!(l["pgbench_tps"].as_f64().unwrap() > 0.0, "{l}");
    }
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
    // The cost of one chunk report (--quick: 3 runs × 3 partitions × 3 chunks), by phase: the
    // rows each kind of report must write, as the contract says, read from PostgreSQL's counters.
    let cost = &by["cost"];
    let phases: Vec<(&str, u64)> = cost
        .iter()
        .map(|l| (l["phase"].as_str().unwrap(), l["reports"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        phases,
        [("recording", 18), ("deciding", 6), ("completing", 3)],
        "{cost:?}"
    );
    for l in cost {
        let rows = &l["rows_per_report"];
        // Every report records its chunk: one file row, in its key and its unique path.
        assert_eq!(rows["load_file"]["inserted"], 1.0, "{l}");
        assert_eq!(rows["load_file"]["index_entries"], 2.0, "{l}");
        assert_eq!(
            l["statements_inside_first_pass"], 0.0,
            "measured as in production: {l}"
        );
        assert!(
            l["statements_inside_per_report"].as_f64().unwrap() >= 5.0,
            "the function's own statements counted: {l}"
        );
        assert!(
            l["wal_per_report"]["statement_bytes"].as_f64().unwrap() > 0.0,
            "{l}"
        );
    }
    // Recording refreshes the partition's heartbeat, a HOT update; deciding writes its
    // PARTITION_SUCCESS event and the partition's status (not HOT: the status is indexed);
    // completing adds the run's EXTRACT_VALIDATED event and one VALIDATE_RUN dispatch.
    let rows =
        |phase: &str| cost.iter().find(|l| l["phase"] == phase).unwrap()["rows_per_report"].clone();
    let recording = rows("recording");
    assert_eq!(recording["load_partition"]["updated"], 1.0, "{recording}");
    assert_eq!(recording["load_partition"]["hot"], 1.0, "{recording}");
    assert!(recording["load_event"].is_null(), "no event: {recording}");
    let deciding = rows("deciding");
    assert_eq!(deciding["load_event"]["inserted"], 1.0, "{deciding}");
    assert_eq!(deciding["load_partition"]["hot"], 0.0, "{deciding}");
    assert!(deciding["load_dispatch"].is_null(), "{deciding}");
    let completing = rows("completing");
    assert_eq!(completing["load_event"]["inserted"], 2.0, "{completing}");
    assert_eq!(completing["load_dispatch"]["inserted"], 1.0, "{completing}");
}

/// `--only aged` at a tiny size: both phases, the fill, the ratios and the retention catch-up
/// print their lines, every figure was measured, the fill wrote what it was asked to, and
/// retention deleted what was due and nothing else.
#[test]
fn load_bench_aged_quick_prints_fresh_aged_ratio_and_retention() {
    let (runs, partitions, files) = (40u64, 3u64, 2u64);
    let (runs_s, partitions_s, files_s) =
        (runs.to_string(), partitions.to_string(), files.to_string());
    let (lines, stdout) = load_bench(&[
        "--quick",
        "--only",
        "aged",
        "--aged-clients",
        "2",
        "--aged-samples",
        "3",
        "--aged-runs",
        &runs_s,
        "--aged-partitions",
        &partitions_s,
        "--aged-files",
        &files_s,
        "--aged-days",
        "30",
        "--aged-retention-days",
        "10",
    ]);
    let of =
        |name: &str| -> Vec<&Value> { lines.iter().filter(|v| v["scenario"] == name).collect() };
    let phases = of("aged_phase");
    assert_eq!(phases.len(), 2, "a fresh and an aged phase:\n{stdout}");
    assert_eq!(
        (&phases[0]["phase"], &phases[1]["phase"]),
        (&"fresh".into(), &"aged".into())
    );
    let figures = [
        "lifecycle_chunk",
        "lifecycle_claim",
        "lifecycle_create",
        "lifecycle_manifest",
        "lifecycle_success",
        "monitor_summary",
        "runs_list",
        "runs_list_of_job",
        "cleanup_candidates",
        "sweeper_tick",
        "lease_scan",
    ];
    for p in &phases {
        for f in figures {
            assert!(
                p["latency_ms"][f]["n"].as_u64().unwrap_or(0) > 0,
                "{f} not measured in {p}"
            );
        }
        // --quick lifecycle: 4 runs × 2 partitions × 2 chunks.
        assert_eq!(p["latency_ms"]["lifecycle_chunk"]["n"], 16, "{p}");
    }
    let fill = of("aged_fill");
    assert_eq!(fill.len(), 1, "one fill line:\n{stdout}");
    let fill = fill[0];
    let statuses = fill["statuses"].as_object().expect("statuses");
    assert_eq!(
        statuses.values().map(|n| n.as_u64().unwrap()).sum::<u64>(),
        runs,
        "every aged run written: {fill}"
    );
    assert!(
        statuses["SUCCESS"].as_u64().unwrap() > runs / 2,
        "mostly final: {fill}"
    );
    for s in [
        "PUBLISH_UNKNOWN",
        "STAGE_VALIDATING",
        "FAILED_EXTRACT",
        "CANCELLED",
    ] {
        assert!(statuses.contains_key(s), "no {s} run: {fill}");
    }
    assert!(fill["cleaned"].as_u64().unwrap() > 0, "{fill}");
    let before = &phases[0]["size"]["rows"];
    let after = &fill["after"]["rows"];
    let grew = |t: &str| after[t].as_u64().unwrap() - before[t].as_u64().unwrap();
    assert_eq!(grew("load_run"), runs, "{fill}");
    assert_eq!(grew("load_partition"), runs * partitions, "{fill}");
    // Every partition of a SUCCESS run has its files; failed runs have fewer.
    assert!(
        grew("load_file") >= statuses["SUCCESS"].as_u64().unwrap() * partitions * files,
        "{fill}"
    );
    assert!(grew("load_event") > runs * 2 * partitions, "{fill}");
    assert!(
        grew("load_dispatch") > 0 && grew("load_validation") > 0,
        "{fill}"
    );
    let ratio = of("aged_ratio");
    assert_eq!(ratio.len(), 1, "one ratio line:\n{stdout}");
    for f in figures {
        assert!(
            ratio[0]["figures"][f]["p50_ratio"].as_f64().is_some(),
            "no ratio of {f}: {}",
            ratio[0]
        );
    }
    let retention = of("aged_retention");
    assert_eq!(retention.len(), 1, "one retention line:\n{stdout}");
    let r = retention[0];
    assert_eq!(r["caught_up"], true, "{r}");
    assert!(r["runs_deleted"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["cleaned_runs_older_than_retention_left"], 0, "{r}");
    assert_eq!(
        r["before"]["rows"]["load_run"].as_u64().unwrap()
            - r["after"]["rows"]["load_run"].as_u64().unwrap(),
        r["runs_deleted"].as_u64().unwrap(),
        "{r}"
    );
}
