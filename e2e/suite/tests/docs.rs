//! What a user reads (README, SECURITY, CHANGELOG, docs/, the chart, examples/) refers to nothing
//! outside the repository: no contract section ("§", "CONTRACT") of a file the user does not
//! have, and every relative link names a file of the repository.
use regex::Regex;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every text file a user reads, relative to the repository.
fn read_by_users() -> Vec<PathBuf> {
    let root = repo();
    let mut out: Vec<PathBuf> = ["README.md", "SECURITY.md", "CHANGELOG.md"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let mut dirs: Vec<PathBuf> = ["docs", "charts", "examples"]
        .iter()
        .map(PathBuf::from)
        .collect();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for e in entries {
            let e = e.unwrap();
            let rel = dir.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|x| {
                ["md", "yaml", "yml", "json", "tpl", "txt"].contains(&x.to_str().unwrap())
            }) {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_docs_refer_to_nothing_outside_the_repository() {
    let root = repo();
    let outside = Regex::new(r"§|\bCONTRACT\b|CONTRACT\.md|\.\./shared|spec/CONTRACT").unwrap();
    let link = Regex::new(r"\]\(([^)#\s]+)(?:#[^)]*)?\)").unwrap();
    let files = read_by_users();
    assert!(files.len() > 20, "{files:?}");
    let mut bad = vec![];
    for rel in &files {
        let text = std::fs::read_to_string(root.join(rel)).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(m) = outside.find(line) {
                bad.push(format!(
                    "{}:{}: {:?} refers to a file users do not have: {line}",
                    rel.display(),
                    n + 1,
                    m.as_str()
                ));
            }
            if rel.extension().is_some_and(|x| x == "md") {
                for c in link.captures_iter(line) {
                    let target = &c[1];
                    if target.contains("://") || target.starts_with("mailto:") {
                        continue;
                    }
                    let path = root.join(rel).parent().unwrap().join(target);
                    let inside = path
                        .canonicalize()
                        .is_ok_and(|p| p.starts_with(root.canonicalize().unwrap()));
                    if !inside {
                        bad.push(format!(
                            "{}:{}: the link {target} names no file of the repository",
                            rel.display(),
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The tree says which release it is, in one version everywhere (the crates, the chart's version
/// and appVersion, hence the image tag), and that version is not one `RELEASES` lists unless the
/// tree is that release's commit: a node holding the released image would otherwise run it under
/// this chart.
#[test]
fn the_tree_says_which_release_it_is() {
    let root = repo();
    let version = env!("CARGO_PKG_VERSION");
    let chart = std::fs::read_to_string(root.join("charts/load-control/Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("\nversion: {version}\n"))
            && chart.contains(&format!("\nappVersion: \"{version}\"\n")),
        "charts/load-control/Chart.yaml's version and appVersion are not the crates' {version}"
    );
    let releases = std::fs::read_to_string(root.join("RELEASES")).unwrap();
    let released = releases
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .find(|(v, _)| *v == version);
    if let Some((_, commit)) = released {
        let same = std::process::Command::new("git")
            .current_dir(&root)
            .args([
                "diff",
                "--quiet",
                commit.trim(),
                "--",
                ".",
                ":(exclude)RELEASES",
            ])
            .status()
            .expect("git");
        assert!(
            same.success(),
            "this tree says {version}, which RELEASES gives as commit {commit}, but it ships \
             something else: raise the version in Cargo.toml and charts/load-control/Chart.yaml"
        );
    }
    // The schemas the chart says its binaries run on (its refusal of a rollback reads them).
    for (key, value) in [
        ("schema-version", ledger::schema::SCHEMA_VERSION),
        (
            "supported-schema-max",
            *ledger::schema::SUPPORTED_SCHEMA.end(),
        ),
    ] {
        assert!(
            chart.contains(&format!("\n  load-control.io/{key}: \"{value}\"\n")),
            "charts/load-control/Chart.yaml's annotation load-control.io/{key} is not {value} \
             (ledger/src/schema.rs)"
        );
    }
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    assert!(
        changelog.contains(&format!("\n## {version} ")),
        "CHANGELOG.md has no section for {version}"
    );
}

/// The chart's README is generated from values.schema.json and values.yaml
/// (`scripts/chart-readme`), and every value has a description: a value added, renamed or
/// re-described without regenerating it fails here, naming what differs.
#[test]
fn the_chart_readme_is_generated_from_the_values_schema() {
    let out = std::process::Command::new(repo().join("scripts/chart-readme"))
        .arg("--check")
        .output()
        .expect("python3 runs scripts/chart-readme");
    assert!(
        out.status.success(),
        "charts/load-control/README.md is stale or a value lacks a description (run \
         scripts/chart-readme):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
