//! docs/architecture.md's "Rule → place" table names, for each rule, the file and the function that
//! decides it. This test reads the table and fails when a named place does not exist, when an SQL
//! function's named migration is not its current definition (a later migration replaces it), or
//! when an SQL function of the schema or a sweeper rule is missing from the table.
use regex::Regex;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

struct Place {
    rule: String,
    file: String,
    name: String,
}

fn table() -> Vec<Place> {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("## Rule → place")
        .nth(1)
        .expect("docs/architecture.md has a \"Rule → place\" section");
    let row = Regex::new(r"^\| (.+?) \| `([^`]+)` \| `([^`]+)` \|$").unwrap();
    let places: Vec<Place> = section
        .lines()
        .filter_map(|l| row.captures(l))
        .map(|c| Place {
            rule: c[1].to_string(),
            file: c[2].to_string(),
            name: c[3].to_string(),
        })
        .collect();
    assert!(places.len() >= 40, "{} rows", places.len());
    places
}

/// Migrations, oldest first, with their text.
fn migrations() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(repo().join("migrations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            (
                format!("migrations/{}", p.file_name().unwrap().to_string_lossy()),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

fn defines_function(sql: &str, name: &str) -> bool {
    Regex::new(&format!(
        r"(?i)CREATE (OR REPLACE )?FUNCTION nifi_ops\.{name}\("
    ))
    .unwrap()
    .is_match(sql)
}

#[test]
fn every_named_place_exists_and_is_current() {
    let migrations = migrations();
    let mut problems = vec![];
    for p in table() {
        let path = repo().join(&p.file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            problems.push(format!("{}: no file {}", p.rule, p.file));
            continue;
        };
        if p.file.ends_with(".rs") {
            let def = Regex::new(&format!(
                r"(?m)^\s*(pub(\([a-z]+\))? )?(async )?(fn|const|static|macro_rules!) {}\b",
                regex::escape(&p.name)
            ))
            .unwrap();
            if !def.is_match(&text) {
                problems.push(format!("{}: {} defines no `{}`", p.rule, p.file, p.name));
            }
        } else if p.file.ends_with(".sql") {
            if !defines_function(&text, &p.name) {
                problems.push(format!(
                    "{}: {} defines no function nifi_ops.{}",
                    p.rule, p.file, p.name
                ));
                continue;
            }
            let later: Vec<&str> = migrations
                .iter()
                .filter(|(f, sql)| f.as_str() > p.file.as_str() && defines_function(sql, &p.name))
                .map(|(f, _)| f.as_str())
                .collect();
            if !later.is_empty() {
                problems.push(format!(
                    "{}: nifi_ops.{} is defined again by {later:?}: name the newest",
                    p.rule, p.name
                ));
            }
        } else {
            problems.push(format!("{}: {} is neither Rust nor SQL", p.rule, p.file));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_function_of_the_schema_and_every_sweeper_rule_is_listed() {
    let listed: BTreeSet<String> = table().into_iter().map(|p| p.name).collect();
    let function =
        Regex::new(r"(?i)CREATE (?:OR REPLACE )?FUNCTION nifi_ops\.([a-z_]+)\(").unwrap();
    let mut missing = vec![];
    for (file, sql) in migrations() {
        for c in function.captures_iter(&sql) {
            let name = &c[1];
            // Helpers of migrations that ran once, and definitions later replaced, count by name.
            if !listed.contains(name) && !RETIRED.contains(&name) {
                missing.push(format!("nifi_ops.{name} ({file})"));
            }
        }
    }
    let sweeper = std::fs::read_to_string(repo().join("ledger/src/ops/sweeper.rs")).unwrap();
    let rule = Regex::new(r"async fn (rule_[a-z_]+)\(").unwrap();
    for c in rule.captures_iter(&sweeper) {
        if !listed.contains(&c[1]) {
            missing.push(format!("sweeper {}", &c[1]));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "not in docs/architecture.md's \"Rule → place\": {missing:?}"
    );
}

/// SQL functions no rule is decided by any more: dropped, or never called by this release.
const RETIRED: &[&str] = &[];
