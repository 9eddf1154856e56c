//! One installation of the chart on the real node, as the system tests drive it: its namespace,
//! Secrets and database, `helm` with the README's flags, `kubectl` in its namespace, and the NiFi
//! simulator run inside the cluster network against its Service.
use crate::node::{Node, wait_for};
use serde_json::Value;
use sqlx::Connection;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// PG-05 of the simulator listens here on the node address; the chart's receiver URL points at it.
pub const RECEIVER_PORT: u16 = 18090;
pub const NIFI_TOKEN: &str = "story-nifi-token";
pub const OPS_TOKEN: &str = "story-ops-token";

pub struct Release {
    pub node: Node,
    pub ns: String,
    pub name: String,
    db: String,
    /// The release's ledger, from the host.
    pub ledger_url: String,
    pub repo: PathBuf,
    /// The nifi-sim binary (tests pass `env!("CARGO_BIN_EXE_nifi-sim")`).
    sim: PathBuf,
    /// Set by [`Release::remove`]; otherwise dropping the release (a failed test) stops it.
    removed: bool,
}

impl Drop for Release {
    /// A test that fails leaves its release running: its dispatcher would send to the next
    /// test's PG-05 (one receiver port for every test) and its pods would share the node. Its
    /// pods go at once; its namespace follows (LoadRun finalizers cleared, as nobody serves them).
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let ns = self.ns.as_str();
        let _ = self
            .node
            .kubectl(&["-n", ns, "delete", "deployment", "--all", "--wait=false"]);
        for kind in ["loadruns", "loadjobs"] {
            let names = self
                .node
                .kubectl(&["-n", ns, "get", kind, "-o", "name"])
                .unwrap_or_default();
            for name in names.lines().filter(|l| !l.is_empty()) {
                let _ = self.node.kubectl(&[
                    "-n",
                    ns,
                    "patch",
                    name,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let _ = self
            .node
            .kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
}

fn must<T>(r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

impl Release {
    /// A namespace, a database and the two Secrets the chart expects; CRDs applied as the README
    /// says. Nothing installed yet.
    pub async fn prepare(prefix: &str, sim: &str) -> Release {
        let node = must(Node::from_env());
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let db = format!("{}_{suffix}", prefix.replace('-', "_"));
        let admin = node.pg_url().to_string();
        let mut pg = sqlx::PgConnection::connect(&admin)
            .await
            .expect("node PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .execute(&mut pg)
            .await
            .unwrap();
        let base = |url: &str| url.rsplit_once('/').unwrap().0.to_string();
        let r = Release {
            ledger_url: format!("{}/{db}", base(&admin)),
            ns: format!("{prefix}-{suffix}"),
            name: "lc".into(),
            db,
            repo,
            sim: PathBuf::from(sim),
            removed: false,
            node,
        };
        must(r.node.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            r.path("crds/").as_str(),
        ]));
        must(r.node.kubectl(&["create", "namespace", &r.ns]));
        let in_cluster = format!("{}/{}", base(r.node.pg_url_in_cluster()), r.db);
        r.k(&[
            "create",
            "secret",
            "generic",
            "lc-db",
            &format!("--from-literal=DATABASE_URL={in_cluster}"),
        ]);
        let tokens = format!(
            "[{{name: story-nifi, role: nifi, sha256: {}}}, {{name: story-ops, role: operator, sha256: {}}}]",
            r.digest(NIFI_TOKEN),
            r.digest(OPS_TOKEN)
        );
        r.k(&[
            "create",
            "secret",
            "generic",
            "lc-tokens",
            &format!("--from-literal=tokens.yaml={tokens}"),
        ]);
        // helm test reads with the operator token too.
        r.k(&[
            "create",
            "secret",
            "generic",
            "lc-test-token",
            &format!("--from-literal=token={OPS_TOKEN}"),
        ]);
        r
    }

    fn path(&self, rel: &str) -> String {
        self.repo.join(rel).to_string_lossy().into_owned()
    }

    /// The SHA-256 digest of `token` as a tokens file holds it (`load-control-api hash-token`).
    pub fn digest(&self, token: &str) -> String {
        use std::io::Write;
        let mut c = Command::new(self.path("target/debug/load-control-api"))
            .arg("hash-token")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("load-control-api hash-token");
        c.stdin.take().unwrap().write_all(token.as_bytes()).unwrap();
        String::from_utf8(c.wait_with_output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string()
    }

    /// `helm install|upgrade` with the README's flags and `--wait --wait-for-jobs`.
    pub fn helm_install(&self, verb: &str, tag: &str) -> String {
        self.helm_install_with(verb, tag, &[])
    }

    /// The same with more `--set` values (e.g. `config.recovery.sweeper_interval=2s`).
    pub fn helm_install_with(&self, verb: &str, tag: &str, sets: &[&str]) -> String {
        self.helm_install_chart(verb, &self.path("charts/load-control"), tag, sets)
    }

    /// The same with another tree's chart (a previous release's, for the upgrade test).
    pub fn helm_install_chart(&self, verb: &str, chart: &str, tag: &str, sets: &[&str]) -> String {
        self.helm_run(verb, chart, tag, sets, "--wait")
    }

    /// `helm install` that waits for its hooks only, not for Ready pods (a release that is
    /// expected not to be ready).
    pub fn helm_install_unready(&self, tag: &str, sets: &[&str]) -> String {
        let chart = self.path("charts/load-control");
        self.helm_run("install", &chart, tag, sets, "--wait=hookOnly")
    }

    /// This release's ledger replaced by `other`'s database (its Secret rewritten; before
    /// installing): two releases, one ledger.
    pub fn share_ledger_of(&mut self, other: &Release) {
        let base = |url: &str| url.rsplit_once('/').unwrap().0.to_string();
        let in_cluster = format!("{}/{}", base(self.node.pg_url_in_cluster()), other.db);
        self.k(&["delete", "secret", "lc-db"]);
        self.k(&[
            "create",
            "secret",
            "generic",
            "lc-db",
            &format!("--from-literal=DATABASE_URL={in_cluster}"),
        ]);
        self.ledger_url = other.ledger_url.clone();
    }

    fn helm_run(&self, verb: &str, chart: &str, tag: &str, sets: &[&str], wait: &str) -> String {
        let receiver = format!(
            "config.nifi.receiver_url=http://{}:{RECEIVER_PORT}",
            self.node.ip()
        );
        let image = format!("image.tag={tag}");
        let watch = format!("watchNamespaces={{{}}}", self.ns);
        let mut args = vec![
            verb,
            &self.name,
            chart,
            "-n",
            &self.ns,
            "--set",
            &image,
            "--set",
            "database.existingSecret=lc-db",
            "--set",
            "auth.existingSecret=lc-tokens",
            "--set",
            "tests.tokenSecret.existingSecret=lc-test-token",
            "--set",
            &receiver,
            // Namespace mode: this release never touches another installation's LoadJobs.
            "--set",
            &watch,
            wait,
            "--wait-for-jobs",
            "--timeout",
            "300s",
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        // The suites apply the CRDs themselves, as the README says (release 0.1.0's chart also
        // shipped them in crds/, older than the ones applied: never let helm apply those).
        if std::path::Path::new(chart).join("crds").is_dir() {
            args.push("--skip-crds");
        }
        self.node
            .helm(&args)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.diagnosis()))
    }

    /// What an on-call engineer would look at when a release does not come up: the namespace's
    /// pods and Jobs, its events, and the last log lines of every container (including the
    /// previous instance of a restarted one). Best effort: a failing command is reported, not
    /// fatal.
    pub fn diagnosis(&self) -> String {
        let ns = self.ns.as_str();
        let run = |args: &[&str]| {
            let mut a = vec!["-n", ns];
            a.extend_from_slice(args);
            let shown = a.join(" ");
            match self.node.kubectl(&a) {
                Ok(out) => format!("--- kubectl {shown}\n{out}"),
                Err(e) => format!("--- kubectl {shown}: {e:#}\n"),
            }
        };
        let mut out = String::from("=== diagnosis of the release's namespace\n");
        out += &run(&["get", "pods,jobs", "-o", "wide"]);
        out += &run(&["get", "events", "--sort-by=.lastTimestamp"]);
        let pods = self.node.kubectl(&["-n", ns, "get", "pods", "-o", "name"]);
        for pod in pods.unwrap_or_default().lines().filter(|l| !l.is_empty()) {
            out += &run(&["logs", pod, "--all-containers", "--tail=40"]);
            out += &run(&["logs", pod, "--all-containers", "--tail=20", "--previous"]);
        }
        out
    }

    pub fn helm(&self, args: &[&str]) -> String {
        let mut a = args.to_vec();
        a.extend(["-n", self.ns.as_str()]);
        must(self.node.helm(&a))
    }

    /// kubectl in the release's namespace.
    pub fn k(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", self.ns.as_str()];
        a.extend_from_slice(args);
        must(self.node.kubectl(&a))
    }

    pub fn kj(&self, args: &[&str]) -> Value {
        let mut a = vec!["-n", self.ns.as_str()];
        a.extend_from_slice(args);
        must(self.node.kubectl_json(&a))
    }

    pub fn apply(&self, yaml: &str) {
        must(
            self.node
                .kubectl_stdin(&["-n", &self.ns, "apply", "-f", "-"], yaml),
        );
    }

    pub fn service_ip(&self) -> String {
        self.k(&[
            "get",
            "svc",
            &format!("{}-load-control", self.name),
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
    }

    /// nifi-sim inside the cluster network, through the Service, in the background.
    pub fn start_simulation(&self, job: &str, extra: &[&str]) -> std::process::Child {
        let api = format!("http://{}:8080", self.service_ip());
        self.start_simulation_at(&api, &["--token", NIFI_TOKEN], job, extra)
    }

    /// The same against `api` (e.g. `https://…` with `--ca-file` in `extra`), authenticated by
    /// `auth` (`--token T` or `--token-file F`).
    pub fn start_simulation_at(
        &self,
        api: &str,
        auth: &[&str],
        job: &str,
        extra: &[&str],
    ) -> std::process::Child {
        // One simulator at a time holds PG-05's port: one left behind by a failed test goes.
        let _ = Command::new("pkill")
            .args(["-f", &format!("{} --api", self.sim.display())])
            .status();
        let receiver = format!("{}:{RECEIVER_PORT}", self.node.ip());
        let prefix = format!(
            "{}-{}",
            self.ns,
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        self.node
            .in_netns(self.sim.to_str().unwrap())
            .args(["--api", api])
            .args(auth)
            .args([
                // NiFi's retry schedule at the suites' scale (7.5 s of waits in all).
                "--retry-scale",
                &crate::nifi::api::RetrySchedule::TEST_SCALE.to_string(),
                "--receiver-listen",
                &receiver,
                "--job",
                job,
                "--business-key-prefix",
                &prefix,
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nifi-sim starts")
    }

    /// The simulator's summary, once it has finished.
    pub fn summary(child: std::process::Child) -> Value {
        let out = child.wait_with_output().expect("nifi-sim ends");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().last().unwrap_or(""))
            .unwrap_or_else(|_| panic!("nifi-sim printed no summary ({}): {text}", out.status))
    }

    pub fn simulate(&self, job: &str, extra: &[&str]) -> Value {
        Self::summary(self.start_simulation(job, extra))
    }

    /// The pod named by the leader Lease's holder identity (`<pod>:<pid>-<random>`).
    pub fn lease_holder_pod(&self) -> Option<String> {
        let lease = format!("{}-load-control-leader", self.name);
        let holder = self.k(&[
            "get",
            "lease",
            &lease,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        holder
            .split(':')
            .next()
            .filter(|p| !p.is_empty())
            .map(str::to_string)
    }

    pub fn server_pods(&self) -> Vec<Value> {
        self.kj(&["get", "pods", "-l", "app.kubernetes.io/component=server"])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub fn loadrun(&self, run_id: &str) -> Option<Value> {
        let runs = self.kj(&["get", "loadruns"]);
        runs["items"]
            .as_array()?
            .iter()
            .find(|r| r["spec"]["runId"] == run_id)
            .cloned()
    }

    pub fn wait_phase(&self, run_id: &str, phase: &str) -> Value {
        must(wait_for(
            &format!("LoadRun of {run_id} in phase {phase}"),
            Duration::from_secs(60),
            || {
                Ok(self
                    .loadrun(run_id)
                    .filter(|r| r["status"]["phase"] == phase))
            },
        ))
    }

    /// Uninstalls (if installed), deletes the namespace and drops the database.
    pub async fn remove(mut self) {
        let _ = self.node.helm(&[
            "uninstall",
            &self.name,
            "-n",
            &self.ns,
            "--wait",
            "--timeout",
            "120s",
        ]);
        let _ = self
            .node
            .kubectl(&["delete", "namespace", &self.ns, "--wait=false"]);
        let mut pg = sqlx::PgConnection::connect(self.node.pg_url())
            .await
            .unwrap();
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.db
        )))
        .execute(&mut pg)
        .await;
        self.removed = true;
    }
}

/// The condition of type `kind` in an object's status.
pub fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// While alive, the CRDs accept any spec (as an older or hand-edited CRD would), so objects the
/// operator cannot read can be written; dropped, the real CRDs are applied again. Objects written
/// meanwhile stay as they are: unreadable.
pub struct LooseCrds<'a> {
    node: &'a Node,
    repo: PathBuf,
}

impl Release {
    pub fn loosen_crds(&self) -> LooseCrds<'_> {
        for plural in ["loadjobs", "loadruns"] {
            let crd = crds::loosened_crd_json(plural);
            must(self.node.kubectl_stdin(
                &["apply", "--server-side", "--force-conflicts", "-f", "-"],
                &crd.to_string(),
            ));
        }
        LooseCrds {
            node: &self.node,
            repo: self.repo.clone(),
        }
    }

    /// `kubectl apply` of `yaml`, retried until the API server accepts it (a CRD change takes a
    /// moment to reach every handler).
    pub fn apply_eventually(&self, what: &str, yaml: &str) {
        must(wait_for(what, Duration::from_secs(30), || {
            Ok(self
                .node
                .kubectl_stdin(&["-n", &self.ns, "apply", "-f", "-"], yaml)
                .ok()
                .map(|_| ()))
        }));
    }

    /// Waits (bounded) until every run of `job_key` in the ledger has a LoadRun whose phase and
    /// ledgerVersion are the ledger's; returns how long that took.
    pub async fn wait_mirror_agrees(&self, job_key: &str, limit: Duration) -> Duration {
        let started = std::time::Instant::now();
        let mut conn = sqlx::PgConnection::connect(&self.ledger_url).await.unwrap();
        loop {
            let ledger: Vec<(uuid::Uuid, String, i32)> = sqlx::query_as(
                "SELECT run_id, status, version_no FROM nifi_ops.load_run WHERE job_key = $1",
            )
            .bind(job_key)
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let shown = self.kj(&["get", "loadruns"]);
            let mismatch: Vec<String> = ledger
                .iter()
                .filter(|(id, status, version)| {
                    !shown["items"].as_array().unwrap().iter().any(|lr| {
                        lr["spec"]["runId"] == id.to_string()
                            && lr["status"]["phase"] == status.as_str()
                            && lr["status"]["ledgerVersion"] == *version as i64
                    })
                })
                .map(|(id, status, version)| format!("{id} {status} v{version}"))
                .collect();
            if mismatch.is_empty() {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < limit,
                "LoadRuns disagree with the ledger after {limit:?}: {mismatch:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for LooseCrds<'_> {
    fn drop(&mut self) {
        let crds = self.repo.join("crds/");
        let _ = self.node.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().unwrap(),
        ]);
    }
}
