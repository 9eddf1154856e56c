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

/// The `.sql` files of `dir` (relative to the repository), sorted, with their text.
fn sql_files(dir: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            (
                format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Migrations, oldest first, with their text.
fn migrations() -> Vec<(String, String)> {
    sql_files("migrations")
}

/// The server-side functions' current definitions, one file per function.
fn function_files() -> Vec<(String, String)> {
    sql_files("ledger/functions")
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
    let functions = function_files();
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
            // A function's current definition is its file; a migration's only until one exists.
            let own_file = format!("ledger/functions/{}.sql", p.name);
            let later: Vec<&str> = migrations
                .iter()
                .chain(&functions)
                .filter(|(f, sql)| {
                    let newer = if p.file.starts_with("migrations/") {
                        f.starts_with("ledger/functions/") || f.as_str() > p.file.as_str()
                    } else {
                        f.starts_with("ledger/functions/") && f.as_str() != p.file.as_str()
                    };
                    newer && defines_function(sql, &p.name)
                })
                .map(|(f, _)| f.as_str())
                .collect();
            if p.file.starts_with("ledger/functions/") && p.file != own_file {
                problems.push(format!(
                    "{}: nifi_ops.{} lives in {own_file}, not {}",
                    p.rule, p.name, p.file
                ));
            }
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
    for (file, sql) in migrations().into_iter().chain(function_files()) {
        for c in function.captures_iter(&sql) {
            let name = &c[1];
            // Helpers of migrations that ran once, and definitions later replaced, count by name.
            if !listed.contains(name) && !RETIRED.contains(&name) {
                missing.push(format!("nifi_ops.{name} ({file})"));
            }
        }
    }
    let sweeper: String = std::fs::read_dir(repo().join("ledger/src/ops/sweeper"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    let rule = Regex::new(r"async fn (rule_[a-z_]+)\(").unwrap();
    assert!(
        rule.is_match(&sweeper),
        "the sweeper's rules are in ledger/src/ops/sweeper/"
    );
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
const RETIRED: &[&str] = &[
    // Superseded by their `_v2` (typed outcomes, ledger/src/functions.rs); nothing calls them, and
    // a contract migration drops them.
    "claim_partition",
    "report_chunk",
    "start_validation",
];

/// The crates of the product (e2e/ is the test bench, not product code).
const PRODUCT_CRATES: &[&str] = &[
    "ledger",
    "config",
    "api-server",
    "operator",
    "loadctl",
    "crds",
    "exposition",
];

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A file's product code: its lines before its unit tests (`#[cfg(test)]` at the margin).
fn product_lines(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .collect()
}

/// Issue 39: a reader holds one file at a time. Seen failing on the tree before the splits:
/// config/src/config.rs (1,070 lines), ledger/src/store.rs (721) and ledger/src/ops/sweeper.rs (751).
#[test]
fn no_file_of_product_code_is_over_600_lines() {
    const MOST: usize = 600;
    let mut big = vec![];
    for krate in PRODUCT_CRATES {
        for f in rust_files(&repo().join(krate).join("src")) {
            let n = product_lines(&std::fs::read_to_string(&f).unwrap()).len();
            if n > MOST {
                big.push(format!(
                    "{} ({n} lines)",
                    f.strip_prefix(repo()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        big.is_empty(),
        "split by concern, to at most {MOST} lines of product code: {big:?}"
    );
}

/// One writer of event rows: `nifi_ops.record_event` holds their conventions (process group,
/// processor), and `Event::insert` and every server-side function call it. Seen failing with
/// `Event::insert`'s former INSERT put back.
#[test]
fn every_event_row_is_written_by_record_event() {
    let by_hand = |text: &str| {
        text.to_lowercase()
            .contains("insert into nifi_ops.load_event")
    };
    assert!(by_hand(
        "INSERT INTO nifi_ops.load_event (event_id) VALUES ($1)"
    ));
    let mut writers = vec![];
    for krate in PRODUCT_CRATES {
        for f in rust_files(&repo().join(krate).join("src")) {
            if by_hand(&product_lines(&std::fs::read_to_string(&f).unwrap()).join("\n")) {
                writers.push(f.strip_prefix(repo()).unwrap().display().to_string());
            }
        }
    }
    for (file, sql) in function_files() {
        if file != "ledger/functions/record_event.sql" && by_hand(&sql) {
            writers.push(file);
        }
    }
    assert!(
        writers.is_empty(),
        "event rows inserted by hand (call nifi_ops.record_event): {writers:?}"
    );
}

/// The module a file is (`store`, `ops::owner`, `ops::sweeper` for `ops/sweeper/mod.rs`; the
/// crate root is "").
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// Which modules each module names (`crate::…` and `super::…` paths of its product code), each
/// reference resolved to the longest module it begins with. A module and its own submodules are
/// one room split in files: references between them do not count.
fn module_references(krate: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let src = repo().join(krate).join("src");
    let files = rust_files(&src);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let path = Regex::new(
        r"\b(crate|super)::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)",
    )
    .unwrap();
    let related = |a: &str, b: &str| {
        a.is_empty()
            || b.is_empty()
            || a == b
            || a.starts_with(&format!("{b}::"))
            || b.starts_with(&format!("{a}::"))
    };
    let resolve = |segments: Vec<&str>| -> Option<String> {
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|m| modules.contains(m))
    };
    let mut refs = std::collections::BTreeMap::new();
    for f in &files {
        let me = module_of(&src, f);
        let text = std::fs::read_to_string(f).unwrap();
        let mut named = BTreeSet::new();
        for line in product_lines(&text) {
            let code = line.split("//").next().unwrap_or("");
            for c in path.captures_iter(code) {
                let base: Vec<&str> = if &c[1] == "crate" {
                    vec![]
                } else {
                    let mut p: Vec<&str> = me.split("::").filter(|s| !s.is_empty()).collect();
                    // `super` of `a/b.rs` (module a::b) is a; of `a/b/mod.rs` also a.
                    p.pop();
                    p
                };
                let tails: Vec<String> = if c[2].starts_with('{') {
                    c[2].trim_matches(|ch| ch == '{' || ch == '}')
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                } else {
                    vec![c[2].to_string()]
                };
                for tail in tails {
                    let mut segments = base.clone();
                    segments.extend(tail.split("::"));
                    if let Some(m) = resolve(segments)
                        && !related(&me, &m)
                    {
                        named.insert(m);
                    }
                }
            }
        }
        refs.entry(me).or_insert_with(BTreeSet::new).extend(named);
    }
    refs
}

/// Issue 39: no two modules name each other, directly or through others, so each can be read
/// knowing only what it depends on. Seen failing on the tree before the modules were untied, with
/// 17 circles: config ↔ load, config ↔ redact, store ↔ ops::owner, store ↔ schema, error ↔ schema,
/// error ↔ ops::owner, ops::owner ↔ ops::leader, api-server's app ↔ handlers ↔ openapi.
#[test]
fn no_module_of_product_code_is_in_an_import_circle() {
    let mut circles = vec![];
    for krate in PRODUCT_CRATES {
        let refs = module_references(krate);
        // A module is in a circle when it reaches itself.
        for start in refs.keys() {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
            while let Some((m, trail)) = stack.pop() {
                for next in refs.get(&m).into_iter().flatten() {
                    if next == start {
                        circles.push(format!("{krate}: {} → {start}", trail.join(" → ")));
                    } else if seen.insert(next.clone()) {
                        let mut t = trail.clone();
                        t.push(next.clone());
                        stack.push((next.clone(), t));
                    }
                }
            }
        }
    }
    circles.sort();
    circles.dedup();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// Issue 39: every compatibility shim in one place, with the release that removes it. Markers
/// `COMPAT(<name>, <release>)` in the product's code, the model and the chart must match the rows
/// of docs/architecture.md's "Compatibility shims" one to one; a row whose file is a migration
/// (history, never edited) names an object the migration still creates.
#[test]
fn every_compatibility_shim_is_listed_with_the_release_that_removes_it() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("## Compatibility shims")
        .nth(1)
        .expect("docs/architecture.md has a \"Compatibility shims\" section");
    let row =
        Regex::new(r"^\| ([a-z0-9-]+) \| .+ \| `([^`]+)` \| `([^`]+)` \| (\d+\.\d+\.\d+) \|$")
            .unwrap();
    let rows: Vec<(String, String, String, String)> = section
        .lines()
        .filter_map(|l| row.captures(l))
        .map(|c| (c[1].into(), c[2].into(), c[3].into(), c[4].into()))
        .collect();
    assert!(rows.len() >= 5, "{rows:?}");
    let marker = Regex::new(r"COMPAT\(([a-z0-9-]+), (\d+\.\d+\.\d+)\)").unwrap();
    let mut marked: std::collections::BTreeMap<String, (String, String)> = Default::default();
    let mut files: Vec<PathBuf> = PRODUCT_CRATES
        .iter()
        .flat_map(|c| rust_files(&repo().join(c).join("src")))
        .collect();
    for dir in ["spec/model", "charts/load-control/templates"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for c in marker.captures_iter(&text) {
            let rel = f.strip_prefix(repo()).unwrap_or(f).to_string_lossy();
            let rel = rel.trim_start_matches("ledger/../").to_string();
            let earlier = marked.insert(c[1].to_string(), (rel.clone(), c[2].to_string()));
            assert!(earlier.is_none(), "COMPAT({}) marked twice", &c[1]);
        }
    }
    for (name, file, object, release) in &rows {
        let text = std::fs::read_to_string(repo().join(file))
            .unwrap_or_else(|e| panic!("{name}: {file}: {e}"));
        assert!(
            text.contains(object.as_str()),
            "{name}: {file} does not name {object}"
        );
        if file.starts_with("migrations/") {
            assert!(
                !marked.contains_key(name),
                "{name} is a migration's and also marked"
            );
            continue;
        }
        let (at, marked_release) = marked
            .remove(name)
            .unwrap_or_else(|| panic!("{name}: no COMPAT({name}, {release}) in {file}"));
        assert!(
            at.ends_with(file.as_str()),
            "{name}: marked in {at}, listed in {file}"
        );
        assert_eq!(
            &marked_release, release,
            "{name}: the marker and the table disagree"
        );
    }
    assert!(
        marked.is_empty(),
        "COMPAT markers without a row in docs/architecture.md: {marked:?}"
    );
}
