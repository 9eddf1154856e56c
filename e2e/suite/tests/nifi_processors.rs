//! Apache NiFi 2.6.0's own processors against the real load-control (issue 29, item 7): the Maven
//! module `e2e/nifi-processors` runs InvokeHTTP, ReplaceText, EvaluateJsonPath, RouteOnAttribute,
//! SplitJson and HandleHttpRequest/HandleHttpResponse (PG-05) through nifi-mock's TestRunner,
//! against an api-server and two operators (the dispatcher) started here on a private
//! PostgreSQL. The dispatcher's receiver URL is the port the module's HandleHttpRequest listens
//! on. Passes when Maven exits 0, Surefire ran tests and none failed, and the ledger shows each
//! run SUCCESS with its VALIDATE_RUN dispatch delivered (202 from HandleHttpResponse) and
//! acknowledged.
//!
//! Needs Maven and a JDK 21 or newer (`.ci/run` installs them): `LC_JAVA_HOME`, else the
//! Temurin 25 JDK at /usr/lib/jvm/temurin-25-jdk-amd64, else any JDK ≥ 21 under /usr/lib/jvm.
//! `LC_SKIP_NIFI_PROCESSORS=1` skips it (say so in a report: the module then did not run).
use e2e::standalone::{NIFI_TOKEN, System, repo};
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const JOB: &str = "NIFI_PROCESSORS";
/// The dispatcher signs every dispatch (`nifi.signing_keys`); PG-05 checks each signature from
/// HandleHttpRequest's `http.headers.X-Lca-*` attributes as docs/nifi.md tells it to.
const KEY_ID: &str = "k-nifi.2026";
const KEY_SECRET: &str = "nifi-processors-signing-s3cret";

/// The major version a JDK's `release` file gives.
fn jdk_major(home: &Path) -> Option<u32> {
    let release = std::fs::read_to_string(home.join("release")).ok()?;
    let line = release.lines().find(|l| l.starts_with("JAVA_VERSION="))?;
    line.trim_start_matches("JAVA_VERSION=")
        .trim_matches('"')
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// A JDK ≥ 21: `LC_JAVA_HOME`, else Temurin 25, else the newest ≥ 21 under /usr/lib/jvm.
fn java_home() -> Result<PathBuf, String> {
    let version = jdk_major;
    if let Ok(home) = std::env::var("LC_JAVA_HOME") {
        let home = PathBuf::from(home);
        return match version(&home) {
            Some(v) if v >= 21 => Ok(home),
            v => Err(format!(
                "LC_JAVA_HOME={} is Java {v:?}, not ≥ 21",
                home.display()
            )),
        };
    }
    let temurin = PathBuf::from("/usr/lib/jvm/temurin-25-jdk-amd64");
    if version(&temurin).is_some_and(|v| v >= 21) {
        return Ok(temurin);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/jvm")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join("bin/javac").exists())
                .filter_map(|p| version(&p).map(|v| (v, p)))
                .filter(|(v, _)| *v >= 21)
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().map(|(_, p)| p).ok_or_else(|| {
        "no JDK 21 or newer: NiFi 2.6.0's processors need one. Install the Temurin 25 JDK at \
         /usr/lib/jvm/temurin-25-jdk-amd64 or Debian's openjdk-21-jdk (.ci/run does), or set \
         LC_JAVA_HOME; LC_SKIP_NIFI_PROCESSORS=1 skips this test"
            .to_string()
    })
}

fn mvn(module: &Path, java: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
    Command::new("mvn")
        .current_dir(module)
        .env("JAVA_HOME", java)
        // Maven's own Guava warns about sun.misc.Unsafe from Java 24 on (the option: 23 on).
        .env(
            "MAVEN_OPTS",
            if jdk_major(java).is_some_and(|v| v >= 23) {
                "--sun-misc-unsafe-memory-access=allow"
            } else {
                ""
            },
        )
        .args(["-B", "-ntp", "-Dstyle.color=never"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap_or_else(|e| {
            panic!("mvn cannot be run ({e}): install Maven (.ci/run installs Debian's maven)")
        })
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// (tests, failures + errors, skipped) summed over Surefire's XML reports.
fn surefire_counts(module: &Path) -> (u64, u64, u64) {
    let dir = module.join("target/surefire-reports");
    let mut counts = (0, 0, 0);
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "xml") {
            continue;
        }
        let xml = std::fs::read_to_string(&path).unwrap_or_default();
        let Some(start) = xml.find("<testsuite ") else {
            continue;
        };
        let head = &xml[start..start + xml[start..].find('>').unwrap_or(0)];
        let attr = |name: &str| -> u64 {
            head.split_once(&format!(" {name}=\""))
                .and_then(|(_, rest)| rest.split('"').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        counts.0 += attr("tests");
        counts.1 += attr("failures") + attr("errors");
        counts.2 += attr("skipped");
    }
    counts
}

#[tokio::test(flavor = "multi_thread")]
async fn nifis_own_processors_drive_whole_runs() {
    if std::env::var("LC_SKIP_NIFI_PROCESSORS").is_ok_and(|v| v == "1") {
        eprintln!("LC_SKIP_NIFI_PROCESSORS=1: NiFi's processors were NOT run");
        return;
    }
    let java = java_home().unwrap_or_else(|e| panic!("{e}"));
    let module = repo().join("e2e/nifi-processors");
    // Dependencies and compilation first (Maven Central the first time; .ci/run fetches them
    // all beforehand with dependency:go-offline), so that the timed part below is the run itself.
    let t = Instant::now();
    let prep = mvn(&module, &java, &["-q", "test-compile"], &[]);
    assert!(
        prep.status.success(),
        "mvn test-compile failed:\n{}",
        text(&prep)
    );
    eprintln!(
        "nifi-processors: prepared in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let sys = System::start_with_nifi(
        "nifiproc",
        &format!(", signing_keys: [{{id: {KEY_ID}, secret: \"{KEY_SECRET}\"}}]"),
    )
    .await
    .expect("standalone system");
    let _ = std::fs::remove_dir_all(module.join("target/surefire-reports"));
    let t = Instant::now();
    let out = mvn(
        &module,
        &java,
        &["surefire:test"],
        &[
            ("LC_API_URL", sys.base.clone()),
            ("LC_NIFI_TOKEN", NIFI_TOKEN.to_string()),
            ("LC_RECEIVER_PORT", sys.receiver_port.to_string()),
            ("LC_JOB_KEY", JOB.to_string()),
            ("LC_SIGNING_KEY_ID", KEY_ID.to_string()),
            ("LC_SIGNING_SECRET", KEY_SECRET.to_string()),
        ],
    );
    let took = t.elapsed();
    let log = text(&out);
    let (tests, failed, skipped) = surefire_counts(&module);
    eprintln!(
        "nifi-processors: {tests} tests, {failed} failed, {skipped} skipped in {:.1} s",
        took.as_secs_f64()
    );
    assert!(
        out.status.success() && tests > 0 && failed == 0 && skipped == 0,
        "mvn surefire:test: {} ({tests} tests, {failed} failed, {skipped} skipped)\n{log}\n\
         api-server log:\n{}",
        out.status,
        sys.api.log_tail(40)
    );

    // What the ledger says: the runs ended as the flow drove them, and every dispatch (a VALIDATE_RUN per
    // run, the REISSUE_PARTITION of the dead node's partition) delivered to HandleHttpRequest,
    // answered 202 by HandleHttpResponse and acknowledged by the flow it started.
    let mut conn = sqlx::PgConnection::connect(&sys.db_url).await.unwrap();
    let runs: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT run_id, status FROM nifi_ops.load_run WHERE job_key = $1")
            .bind(JOB)
            .fetch_all(&mut conn)
            .await
            .unwrap();
    // Two runs through to SUCCESS, and the refused manifest's run failed by PG-90.
    let mut statuses = std::collections::BTreeMap::new();
    for (_, status) in &runs {
        *statuses.entry(status.as_str()).or_insert(0) += 1;
    }
    assert_eq!(
        statuses,
        [("FAILED_MANIFEST", 1), ("SUCCESS", 2)].into(),
        "one run per Java test:\n{log}"
    );
    let mut kinds = std::collections::BTreeMap::new();
    for (run, _) in runs.iter().filter(|(_, status)| status == "SUCCESS") {
        let dispatches: Vec<(String, String, Option<i32>, i32)> = sqlx::query_as(
            "SELECT dispatch_type, status, last_http_status, attempt_count \
             FROM nifi_ops.load_dispatch WHERE run_id = $1",
        )
        .bind(run)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        for (kind, status, http, attempts) in &dispatches {
            // The flow acknowledges as soon as HandleHttpResponse has answered, so the ACK often
            // lands before the dispatcher records the 202 (CONTRACT §2.5 records a send's outcome
            // only while the row is PENDING): no HTTP status then, never another one.
            assert!(
                status == "ACKED" && matches!(http, Some(202) | None) && *attempts >= 1,
                "run {run}: a {kind} dispatch is {status} (last HTTP status {http:?}, \
                 {attempts} attempts): {dispatches:?}"
            );
            *kinds.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    assert_eq!(
        kinds,
        [
            ("REISSUE_PARTITION".to_string(), 1),
            ("VALIDATE_RUN".to_string(), 2)
        ]
        .into(),
        "dispatches delivered"
    );
    // Anything NiFi's requests made the servers warn about (none expected).
    for service in std::iter::once(&sys.api).chain(sys.ops.iter()) {
        let warned: Vec<String> = service
            .log_tail(100_000)
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(str::to_string)
            .collect();
        eprintln!("{}: {} warnings/errors", service.name, warned.len());
        for line in warned.iter().take(20) {
            eprintln!("  {line}");
        }
    }
    assert!(took < Duration::from_secs(600));
    sys.stop();
}
