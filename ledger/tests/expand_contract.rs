//! Issue 27 item 1, expand/contract read from the migration files themselves (no database): a
//! migration never breaks the binary of the release before it. Every migration after the first
//! only adds; a destructive statement on an object that existed before the migration — DROP,
//! RENAME, a type change, SET NOT NULL, a NOT NULL column without a default, a new constraint or
//! unique index, TRUNCATE or DELETE — is refused unless the file declares itself the contract step
//! of something unused for a whole release:
//!
//! ```sql
//! -- contract: unused since schema version N: <what, and which release stopped using it>
//! ```
//!
//! with N at most the migration's own schema version minus one (the binary of version N-1 runs on
//! schema N, so what it uses lives until schema N+1). `schema_version.rs` checks the same rule on
//! the real schema; this test names the statement. Also: [`SCHEMA_HISTORY`] names the newest
//! migration, so adding one means deciding which schema version it belongs to.
use ledger::migrate::MIGRATOR;
use ledger::schema::{SCHEMA_HISTORY, SCHEMA_VERSION, SUPPORTED_SCHEMA};
use regex::Regex;
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// The SQL of `text` without comments and string contents, dollar quotes opened (a `DO` block's
/// statements are checked as any other), split into statements: upper case, single spaces.
fn statements(text: &str) -> Vec<String> {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'\'' => {
                i += 1;
                while i < b.len() {
                    if b[i] == b'\'' {
                        if b.get(i + 1) == Some(&b'\'') {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("''");
            }
            b'$' => {
                // `$tag$` opens or closes a dollar quote: dropped, its body kept as SQL.
                let end = text[i + 1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map(|n| i + 1 + n);
                match end {
                    Some(e) if b[e] == b'$' => {
                        out.push(' ');
                        i = e + 1;
                    }
                    _ => {
                        out.push('$');
                        i += 1;
                    }
                }
            }
            _ => {
                let c = text[i..].chars().next().unwrap();
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out.split(';')
        .map(|s| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

fn re(s: &str) -> Regex {
    Regex::new(s).unwrap()
}

static CREATE_TABLE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^CREATE (?:UNLOGGED )?TABLE (?:IF NOT EXISTS )?([\w.\x22]+)"));
static ALTER_TABLE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^ALTER TABLE (?:IF EXISTS )?(?:ONLY )?([\w.\x22]+) (.*)$"));
static UNIQUE_INDEX: LazyLock<Regex> =
    LazyLock::new(|| re(r"^CREATE UNIQUE INDEX .*? ON (?:ONLY )?([\w.\x22]+)"));
static DROP: LazyLock<Regex> = LazyLock::new(|| re(r"\bDROP\b( NOT NULL\b)?"));
static RENAME: LazyLock<Regex> = LazyLock::new(|| re(r"\bRENAME\b"));
static RETYPE: LazyLock<Regex> =
    LazyLock::new(|| re(r"\bALTER (?:COLUMN )?[\w\x22]+ (?:SET DATA )?TYPE\b"));
static SET_NOT_NULL: LazyLock<Regex> = LazyLock::new(|| re(r"\bSET NOT NULL\b"));
static WIPE: LazyLock<Regex> = LazyLock::new(|| re(r"^(?:TRUNCATE|DELETE FROM)\b"));
static ADD_GUARD: LazyLock<Regex> =
    LazyLock::new(|| re(r"^ADD (?:CONSTRAINT|PRIMARY KEY|UNIQUE|CHECK|FOREIGN KEY|EXCLUDE)\b"));
static ADD_COLUMN: LazyLock<Regex> = LazyLock::new(|| re(r"^ADD (?:COLUMN )?"));
static CONTRACT: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?m)^-- contract: unused since schema version (\d+):"));

fn unquoted(name: &str) -> String {
    name.replace('"', "")
}

/// The ALTER TABLE actions, split on the commas outside parentheses.
fn actions(list: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, vec![]);
    for (i, c) in list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(list[start..].trim());
    out
}

/// The statements of one migration that could break the previous release's binary.
fn expand_only_violations(text: &str) -> Vec<String> {
    let stmts = statements(text);
    let created: BTreeSet<String> = stmts
        .iter()
        .filter_map(|s| CREATE_TABLE.captures(s).map(|c| unquoted(&c[1])))
        .collect();
    let existing = |t: &str| !created.contains(&unquoted(t));
    let mut bad = vec![];
    for s in &stmts {
        let mut why = vec![];
        if DROP.captures_iter(s).any(|c| c.get(1).is_none()) {
            why.push("DROP");
        }
        if RENAME.is_match(s) {
            why.push("RENAME");
        }
        if RETYPE.is_match(s) {
            why.push("a column type change");
        }
        if WIPE.is_match(s) {
            why.push("deleted rows");
        }
        if let Some(c) = ALTER_TABLE.captures(s)
            && existing(&c[1])
        {
            if SET_NOT_NULL.is_match(s) {
                why.push("SET NOT NULL");
            }
            for a in actions(&c[2]) {
                if ADD_GUARD.is_match(a) {
                    why.push("a new constraint on an existing table");
                } else if ADD_COLUMN.is_match(a) && a.contains("NOT NULL") && !a.contains("DEFAULT")
                {
                    why.push("a NOT NULL column without a default");
                }
            }
        }
        if let Some(c) = UNIQUE_INDEX.captures(s)
            && existing(&c[1])
        {
            why.push("a new unique index on an existing table");
        }
        if !why.is_empty() {
            bad.push(format!("{}: {s}", why.join(", ")));
        }
    }
    bad
}

/// The schema version a migration belongs to: the first whose newest migration is not older.
fn schema_version_of(migration: i64) -> i32 {
    SCHEMA_HISTORY
        .iter()
        .find(|(_, last)| *last >= migration)
        .map(|(v, _)| *v)
        .unwrap_or(i32::MAX)
}

#[test]
fn every_migration_after_the_first_only_adds() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    let mut failures = vec![];
    for path in &files[1..] {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let version: i64 = name.split('_').next().unwrap().parse().unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        let bad = expand_only_violations(&text);
        if bad.is_empty() {
            continue;
        }
        let own = schema_version_of(version);
        match CONTRACT.captures(&text) {
            Some(c) if c[1].parse::<i32>().unwrap() < own => {}
            Some(c) => failures.push(format!(
                "{name}: contracts what schema version {} stopped using, in schema version {own}: \
                 the binary of version {} still runs on this schema",
                &c[1],
                own - 1
            )),
            None => failures.extend(bad.into_iter().map(|b| format!("{name}: {b}"))),
        }
    }
    assert!(
        failures.is_empty(),
        "migrations that break the previous release's binary (docs/operations.md, \"Schema versions, upgrades and rollbacks\"):\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_checker_refuses_each_destructive_change_and_accepts_additions() {
    let refused = [
        "DROP TABLE nifi_ops.load_file;",
        "ALTER TABLE nifi_ops.load_run DROP COLUMN source_count;",
        "ALTER TABLE nifi_ops.load_run ALTER COLUMN error_code DROP DEFAULT;",
        "DROP INDEX nifi_ops.uq_load_run_active;",
        "ALTER TABLE nifi_ops.load_run RENAME COLUMN status TO state;",
        "ALTER TABLE nifi_ops.load_job RENAME TO jobs;",
        "ALTER TABLE nifi_ops.load_run ALTER COLUMN job_key TYPE text;",
        "ALTER TABLE nifi_ops.load_run ALTER job_key SET DATA TYPE varchar(100);",
        "ALTER TABLE nifi_ops.load_run ALTER COLUMN source_count SET NOT NULL;",
        "ALTER TABLE nifi_ops.load_run ADD COLUMN owner text NOT NULL;",
        "ALTER TABLE nifi_ops.load_run ADD COLUMN a int, ADD owner text NOT NULL;",
        "ALTER TABLE nifi_ops.load_run ADD CONSTRAINT ck_x CHECK (extracted_count < 10) NOT VALID;",
        "ALTER TABLE nifi_ops.load_job ADD UNIQUE (job_key, suspended);",
        "CREATE UNIQUE INDEX IF NOT EXISTS uq_x ON nifi_ops.load_run (business_key);",
        "TRUNCATE nifi_ops.load_event;",
        "DELETE FROM nifi_ops.load_event WHERE run_id IS NULL;",
        "DO $$ BEGIN EXECUTE 'x'; DROP TABLE nifi_ops.load_file; END $$;",
        "/* harmless? */ alter table \"nifi_ops\".load_run\n  drop column\n  hdfs_run_path;",
    ];
    for sql in refused {
        assert!(
            !expand_only_violations(sql).is_empty(),
            "not refused: {sql}"
        );
    }
    let accepted = [
        "CREATE TABLE IF NOT EXISTS nifi_ops.t (id int PRIMARY KEY, v text NOT NULL); \
         ALTER TABLE nifi_ops.t ADD CONSTRAINT ck_t CHECK (id > 0), ALTER COLUMN v SET NOT NULL; \
         CREATE UNIQUE INDEX uq_t ON nifi_ops.t (v);",
        "ALTER TABLE nifi_ops.load_run ADD COLUMN IF NOT EXISTS owner text;",
        "ALTER TABLE nifi_ops.load_run ADD COLUMN owner text NOT NULL DEFAULT 'x';",
        "ALTER TABLE nifi_ops.load_run ALTER COLUMN source_count DROP NOT NULL;",
        "CREATE INDEX IF NOT EXISTS ix_x ON nifi_ops.load_run (job_key, (COALESCE(a, b)));",
        "ALTER TABLE nifi_ops.load_run SET (autovacuum_vacuum_scale_factor = 0.02);",
        "-- DROP TABLE nifi_ops.load_file;\nCOMMENT ON TABLE nifi_ops.load_run IS 'drop; rename';",
        "UPDATE nifi_ops.load_run SET owner = job_key WHERE owner IS NULL;",
        "DO $body$ BEGIN IF EXISTS (SELECT 1) THEN GRANT SELECT ON nifi_ops.t TO r; END IF; END $body$;",
    ];
    for sql in accepted {
        assert_eq!(expand_only_violations(sql), Vec::<String>::new(), "{sql}");
    }
}

#[test]
fn schema_history_names_the_newest_migration() {
    let newest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    assert_eq!(
        SCHEMA_HISTORY.last(),
        Some(&(SCHEMA_VERSION, newest)),
        "a new migration belongs to a schema version: name it in ledger::schema::SCHEMA_HISTORY \
         (raising SCHEMA_VERSION by one in the first migration of a release)"
    );
    for (i, w) in SCHEMA_HISTORY.windows(2).enumerate() {
        assert_eq!(w[1].0, w[0].0 + 1, "versions go up by one (entry {i})");
        assert!(w[1].1 > w[0].1, "each version adds migrations (entry {i})");
    }
    for (v, last) in SCHEMA_HISTORY {
        assert!(
            MIGRATOR.iter().any(|m| m.version == *last),
            "schema version {v} names migration {last}, which does not exist"
        );
    }
    assert_eq!(*SUPPORTED_SCHEMA.start(), SCHEMA_VERSION);
    assert_eq!(*SUPPORTED_SCHEMA.end(), SCHEMA_VERSION + 1);
}

static CREATE_INDEX: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"^CREATE (?:UNIQUE )?INDEX (CONCURRENTLY )?(?:IF NOT EXISTS )?[\w\x22]* ?ON (?:ONLY )?([\w.\x22]+)",
    )
});
static DROP_INDEX: LazyLock<Regex> = LazyLock::new(|| re(r"^DROP INDEX (CONCURRENTLY )?"));
static VOLATILE_DEFAULT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"^ALTER TABLE .*\bADD (?:COLUMN )?.*\bDEFAULT (?:NOW|CLOCK_TIMESTAMP|RANDOM|GEN_RANDOM_UUID)\(",
    )
});

/// What in `text` (one migration) blocks NiFi's writes while it runs, on a table it did not create:
/// an index built or dropped without CONCURRENTLY (SHARE / ACCESS EXCLUSIVE for the whole build or
/// behind every reader), CONCURRENTLY inside a transaction (refused by PostgreSQL) or beside another
/// statement (a multi-statement query is one implicit transaction), an ADD COLUMN whose default
/// rewrites the table.
fn blocking_forms(text: &str) -> Vec<String> {
    let no_tx = text.starts_with("-- no-transaction");
    let stmts = statements(text);
    let created: BTreeSet<String> = stmts
        .iter()
        .filter_map(|s| CREATE_TABLE.captures(s).map(|c| unquoted(&c[1])))
        .collect();
    let mut bad = vec![];
    if no_tx && stmts.len() != 1 {
        bad.push(format!(
            "a -- no-transaction migration of {} statements: PostgreSQL runs them as one implicit transaction",
            stmts.len()
        ));
    }
    for s in &stmts {
        let concurrently = if let Some(c) = CREATE_INDEX.captures(s) {
            if created.contains(&unquoted(&c[2])) {
                continue; // an index of a table this migration creates: empty, nobody waits
            }
            c.get(1).is_some()
        } else if let Some(c) = DROP_INDEX.captures(s) {
            c.get(1).is_some()
        } else {
            if VOLATILE_DEFAULT.is_match(s) {
                bad.push(format!("a column whose default rewrites the table: {s}"));
            }
            continue;
        };
        if !concurrently {
            bad.push(format!(
                "an index built or dropped without CONCURRENTLY: {s}"
            ));
        } else if !no_tx {
            bad.push(format!(
                "CONCURRENTLY inside a transaction (no `-- no-transaction` first line): {s}"
            ));
        }
    }
    bad
}

/// Issue 40 item 1: every migration since the first release runs online, and the lint sees the
/// blocking forms it names.
#[test]
fn migrations_since_the_first_release_never_block_nifi() {
    let released = SCHEMA_HISTORY[0].1;
    let mut failures = vec![];
    for m in MIGRATOR.iter().filter(|m| m.version > released) {
        for b in blocking_forms(m.sql.as_str()) {
            failures.push(format!("{} {}: {b}", m.version, m.description));
        }
    }
    assert!(
        failures.is_empty(),
        "migrations that block NiFi:\n{}",
        failures.join("\n")
    );

    // The forms the migrations of 0.2.0 had before they were rewritten, each caught.
    for (sql, why) in [
        (
            "CREATE INDEX IF NOT EXISTS ix ON nifi_ops.load_partition (run_id);",
            "without CONCURRENTLY",
        ),
        ("DROP INDEX IF EXISTS nifi_ops.ix;", "without CONCURRENTLY"),
        (
            "CREATE INDEX CONCURRENTLY ix ON nifi_ops.load_run (run_id);",
            "inside a transaction",
        ),
        (
            "-- no-transaction\nALTER TABLE nifi_ops.load_run ADD COLUMN x int;\nCREATE INDEX CONCURRENTLY ix ON nifi_ops.load_run (x);",
            "implicit transaction",
        ),
        (
            "ALTER TABLE nifi_ops.load_run ADD COLUMN t timestamptz DEFAULT now();",
            "rewrites",
        ),
    ] {
        let found = blocking_forms(sql);
        assert!(found.iter().any(|b| b.contains(why)), "{sql}: {found:?}");
    }
    assert!(
        blocking_forms("CREATE TABLE nifi_ops.t (a int);\nCREATE INDEX ix ON nifi_ops.t (a);")
            .is_empty()
    );
}
