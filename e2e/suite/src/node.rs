//! The real single-node cluster that `scripts/cluster-up` starts, as the system tests use it:
//! `kubectl` and `helm` with its kubeconfig, programs started inside its network namespace (where
//! ClusterIPs and the node address are reachable, as they are for NiFi in a real cluster), and its
//! PostgreSQL.
use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Node {
    vars: HashMap<String, String>,
}

impl Node {
    /// Reads the env file cluster-up wrote: `$LC_NODE_ENV`, else
    /// `/var/lib/load-control-node/env`.
    pub fn from_env() -> anyhow::Result<Node> {
        let path = std::env::var_os("LC_NODE_ENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/lib/load-control-node/env"));
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no running node ({}): start one with scripts/cluster-up",
                path.display()
            )
        })?;
        let vars = text
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(Node { vars })
    }

    pub fn var(&self, key: &str) -> &str {
        self.vars.get(key).map(String::as_str).unwrap_or_default()
    }

    /// The node's address inside the namespace (pods reach it; so does PG-05 of the simulator).
    pub fn ip(&self) -> &str {
        self.var("LC_NODE_IP")
    }

    /// PostgreSQL admin URL from the host, and the same server as pods reach it.
    pub fn pg_url(&self) -> &str {
        self.var("LC_NODE_PG_URL")
    }

    pub fn pg_url_in_cluster(&self) -> &str {
        self.var("LC_NODE_PG_URL_IN_CLUSTER")
    }

    fn tool(&self, tool: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut cmd = Command::new(tool);
        cmd.args(args).env("KUBECONFIG", self.var("KUBECONFIG"));
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {tool}"))?;
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{} {} failed ({}): {}{}",
                tool.rsplit('/').next().unwrap_or(tool),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.tool(self.var("KUBECTL"), args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> anyhow::Result<String> {
        self.tool(self.var("KUBECTL"), args, Some(stdin))
    }

    pub fn kubectl_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&a)?)?)
    }

    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        self.tool(self.var("HELM"), args, None)
    }

    /// Follows a container's log (`kubectl logs -f`) into memory until dropped: what a pod said
    /// as it was deleted, which `kubectl logs` can no longer show once it is gone.
    pub fn follow_logs(&self, namespace: &str, pod: &str, container: &str) -> FollowedLog {
        let child = Command::new(self.var("KUBECTL"))
            .args([
                "-n", namespace, "logs", "-f", pod, "-c", container, "--tail=0",
            ])
            .env("KUBECONFIG", self.var("KUBECONFIG"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let child = child.ok().map(|mut child| {
            let out = child.stdout.take().expect("piped");
            let into = lines.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    into.lock().unwrap().push(line);
                }
            });
            child
        });
        FollowedLog { child, lines }
    }

    /// A command that runs inside the node's network namespace.
    pub fn in_netns(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.var("LC_NODE_NETNS_PATH")))
            .arg(program);
        cmd
    }
}

/// Polls `probe` every 250 ms until it yields a value or `limit` passes; the error names `what`
/// and the last thing the probe saw.
pub fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("nothing yet");
    loop {
        match probe() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {limit:?} waiting for {what} (last error: {last})");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A container's log as followed so far ([`Node::follow_logs`]); the follower ends when dropped.
pub struct FollowedLog {
    child: Option<std::process::Child>,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl FollowedLog {
    /// The lines so far that contain any of `words`.
    pub fn lines_with(&self, words: &[&str]) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| words.iter().any(|w| l.contains(w)))
            .cloned()
            .collect()
    }
}

impl Drop for FollowedLog {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
