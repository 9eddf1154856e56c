//! Issue 27 item 1, the schema version contract, against a real PostgreSQL: `migrate` writes the
//! version and never lowers it (an older binary's run succeeds on a newer schema it runs on and
//! is refused, changing nothing, on one it does not), and a binary outside its range is not ready
//! and writes nothing. Readings are cached: no round trip on every write.
use ledger::migrate::{MIGRATOR, run_migrations};
use ledger::schema::{SCHEMA_HISTORY, SCHEMA_VERSION, SUPPORTED_SCHEMA};
use ledger::{LedgerConfig, LedgerError};
use sqlx::PgConnection;
use std::time::Duration;
use testkit::{TestDb, new_run};

async fn version_row(conn: &mut PgConnection) -> Option<(i32, String, String)> {
    sqlx::query_as("SELECT version, written_at::text, written_by FROM nifi_ops.schema_version")
        .fetch_optional(conn)
        .await
        .unwrap()
}

async fn set_version(conn: &mut PgConnection, version: i32) {
    sqlx::query("UPDATE nifi_ops.schema_version SET version = $1")
        .bind(version)
        .execute(conn)
        .await
        .unwrap();
}

async fn count(conn: &mut PgConnection, table: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM nifi_ops.{table}"
    )))
    .fetch_one(conn)
    .await
    .unwrap();
    n
}

fn unsupported(e: &LedgerError) -> String {
    match e {
        LedgerError::SchemaUnsupported(m) => m.to_string(),
        other => panic!("expected SchemaUnsupported, got {other:?}"),
    }
}

#[tokio::test]
async fn a_fresh_database_is_migrated_to_this_binarys_schema_version() {
    let db = TestDb::empty().await;
    assert_eq!(run_migrations(&db.url).await.unwrap(), SCHEMA_VERSION);
    let mut conn = db.conn().await;
    let (version, _, by) = version_row(&mut conn).await.expect("the version row");
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(by, concat!("load-control ", env!("CARGO_PKG_VERSION")));
    let ledger = db.ledger(1, LedgerConfig::default()).await;
    assert_eq!(ledger.check_schema().await.unwrap(), SCHEMA_VERSION);
    ledger.write_check().await.expect("ready");
    ledger.create_run(&new_run("fresh")).await.expect("writes");
}

#[tokio::test]
async fn migrate_is_idempotent_and_never_lowers_the_version() {
    let db = TestDb::empty().await;
    run_migrations(&db.url).await.unwrap();
    let mut conn = db.conn().await;
    let first = version_row(&mut conn).await.unwrap();
    assert_eq!(run_migrations(&db.url).await.unwrap(), SCHEMA_VERSION);
    assert_eq!(
        version_row(&mut conn).await.unwrap(),
        first,
        "a second run by the same binary writes nothing"
    );

    // The next release migrated this database (its schema version, and a migration this binary
    // does not know): this binary's `migrate` — a rollback's hook — succeeds and lowers nothing.
    let newest = *SUPPORTED_SCHEMA.end();
    assert!(newest > SCHEMA_VERSION);
    set_version(&mut conn, newest).await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (29991231000001, 'a newer release''s migration', true, '\\x00'::bytea, 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        run_migrations(&db.url)
            .await
            .expect("an older binary's migrate"),
        newest
    );
    assert_eq!(version_row(&mut conn).await.unwrap().0, newest);
    let ledger = db.ledger(1, LedgerConfig::default()).await;
    ledger.write_check().await.expect("this binary runs on it");

    // Two releases ahead: refused before anything is applied, naming both versions.
    set_version(&mut conn, newest + 1).await;
    // (As if this binary's newest migration were pending: a migrate that ran would apply it.)
    let own_newest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    let forget = format!("DELETE FROM _sqlx_migrations WHERE version = {own_newest}");
    sqlx::query(sqlx::AssertSqlSafe(forget))
        .execute(&mut conn)
        .await
        .unwrap();
    let refused = run_migrations(&db.url).await.unwrap_err();
    let msg = unsupported(&refused);
    assert!(
        msg.contains(&format!("database schema version {}", newest + 1))
            && msg.contains(&format!("supports (≤{newest})")),
        "{msg}"
    );
    assert_eq!(version_row(&mut conn).await.unwrap().0, newest + 1);
    let (applied,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM _sqlx_migrations WHERE version = $1")
            .bind(own_newest)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(applied, 0, "the refused migrate applied nothing");
}

#[tokio::test]
async fn a_database_newer_than_supported_is_not_ready_and_takes_no_write() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    ledger
        .write_check()
        .await
        .expect("ready on its own version");
    ledger.create_run(&new_run("before")).await.unwrap();
    let mut conn = db.conn().await;
    let newer = *SUPPORTED_SCHEMA.end() + 1;
    set_version(&mut conn, newer).await;

    // The reading is cached: a write right after does not read the version again.
    ledger
        .create_run(&new_run("cached"))
        .await
        .expect("the last reading is trusted for a while");

    // Each readiness probe reads it, names both versions and says what to do.
    let not_ready = ledger.write_check().await.unwrap_err();
    let msg = unsupported(&not_ready);
    assert!(
        msg.starts_with(&format!(
            "database schema version {newer} is newer than this binary (load-control {}) supports (≤{})",
            env!("CARGO_PKG_VERSION"),
            SUPPORTED_SCHEMA.end()
        )) && msg.contains("roll forward")
            && msg.contains("restore"),
        "{msg}"
    );

    // From then on no write: runs, reports, the leader epoch.
    let runs = count(&mut conn, "load_run").await;
    let refused = ledger.create_run(&new_run("refused")).await.unwrap_err();
    unsupported(&refused);
    let refused = ledger.acquire_epoch("old-binary").await.unwrap_err();
    unsupported(&refused);
    assert_eq!(count(&mut conn, "load_run").await, runs);
    assert_eq!(count(&mut conn, "leader_epoch").await, 0);

    // Rolled forward (here: the version back in range): ready and writing again.
    set_version(&mut conn, SCHEMA_VERSION).await;
    ledger.write_check().await.expect("ready again");
    ledger.create_run(&new_run("after")).await.unwrap();
}

#[tokio::test]
async fn a_reading_older_than_the_recheck_is_renewed_before_a_write() {
    let db = TestDb::fresh().await;
    let ledger = db
        .ledger(1, LedgerConfig::default())
        .await
        .with_schema_recheck(Duration::from_millis(300));
    ledger.create_run(&new_run("before")).await.unwrap();
    let mut conn = db.conn().await;
    set_version(&mut conn, *SUPPORTED_SCHEMA.end() + 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // No readiness probe in between: the write itself reads the version again.
    let refused = ledger.create_run(&new_run("refused")).await.unwrap_err();
    unsupported(&refused);
    assert_eq!(count(&mut conn, "load_run").await, 1);
}

#[tokio::test]
async fn an_unversioned_database_is_older_than_supported() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    // Release 0.1.0's schema has no version table.
    sqlx::query("DROP TABLE nifi_ops.schema_version")
        .execute(&mut conn)
        .await
        .unwrap();
    let ledger = db.ledger(1, LedgerConfig::default()).await;
    let msg = unsupported(&ledger.write_check().await.unwrap_err());
    assert!(
        msg.starts_with(&format!(
            "database schema version 0 is older than this binary (load-control {}) needs (≥{})",
            env!("CARGO_PKG_VERSION"),
            SUPPORTED_SCHEMA.start()
        )) && msg.contains("migrate"),
        "{msg}"
    );
    unsupported(&ledger.create_run(&new_run("refused")).await.unwrap_err());
}

/// The expand/contract rule on the real schema: for each schema version, the previous version's
/// tables and columns are all still there with the same types, none became NOT NULL, a column
/// added to an existing table is nullable or has a default, and no constraint or unique index
/// that could refuse the previous binary's writes was added to an existing table.
#[tokio::test]
async fn each_schema_version_keeps_what_the_previous_binary_uses() {
    for pair in SCHEMA_HISTORY.windows(2) {
        let ((prev, prev_last), (cur, cur_last)) = (pair[0], pair[1]);
        let db = TestDb::empty().await;
        let mut conn = db.conn().await;
        let upto = |last: i64| {
            sqlx::migrate::Migrator::with_migrations(
                MIGRATOR
                    .iter()
                    .filter(|m| m.version <= last)
                    .cloned()
                    .collect(),
            )
        };
        upto(prev_last).run(&mut conn).await.unwrap();
        let before = Shape::read(&mut conn).await;
        upto(cur_last).run(&mut conn).await.unwrap();
        let after = Shape::read(&mut conn).await;
        let broken = before.broken_by(&after);
        assert!(
            broken.is_empty(),
            "schema version {cur} breaks the binary of version {prev}:\n{}",
            broken.join("\n")
        );
    }
}

/// What a binary relies on in the `nifi_ops` schema.
struct Shape {
    /// (table, column) → (type, nullable, has default)
    columns: std::collections::BTreeMap<(String, String), (String, bool, bool)>,
    /// (table, name, definition) of every constraint and unique index
    guards: std::collections::BTreeSet<(String, String, String)>,
}

impl Shape {
    async fn read(conn: &mut PgConnection) -> Shape {
        let cols: Vec<(String, String, String, bool, bool)> = sqlx::query_as(
            "SELECT c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, a.atthasdef \
               FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'nifi_ops' AND c.relkind IN ('r', 'p', 'v') AND a.attnum > 0 AND NOT a.attisdropped",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let guards: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT c.relname::text, con.conname::text, pg_get_constraintdef(con.oid) \
               FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'nifi_ops' \
             UNION ALL \
             SELECT c.relname::text, i.relname::text, pg_get_indexdef(x.indexrelid) \
               FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'nifi_ops' AND x.indisunique",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        Shape {
            columns: cols
                .into_iter()
                .map(|(t, c, ty, null, def)| ((t, c), (ty, null, def)))
                .collect(),
            guards: guards.into_iter().collect(),
        }
    }

    /// What `after` changed that a binary written for `self` could trip on.
    fn broken_by(&self, after: &Shape) -> Vec<String> {
        let mut broken = vec![];
        let old_tables: std::collections::BTreeSet<&String> =
            self.columns.keys().map(|(t, _)| t).collect();
        for ((t, c), (ty, null, _)) in &self.columns {
            match after.columns.get(&(t.clone(), c.clone())) {
                None => broken.push(format!("{t}.{c} is gone")),
                Some((ty2, _, _)) if ty2 != ty => {
                    broken.push(format!("{t}.{c} changed type {ty} → {ty2}"))
                }
                Some((_, false, _)) if *null => broken.push(format!("{t}.{c} became NOT NULL")),
                _ => {}
            }
        }
        for ((t, c), (_, null, def)) in &after.columns {
            if old_tables.contains(t)
                && !self.columns.contains_key(&(t.clone(), c.clone()))
                && !null
                && !def
            {
                broken.push(format!(
                    "{t}.{c} is new, NOT NULL and without a default: the previous binary's inserts fail"
                ));
            }
        }
        for g @ (t, name, def) in &after.guards {
            if old_tables.contains(t) && !self.guards.contains(g) {
                broken.push(format!(
                    "{t}: constraint or unique index {name} ({def}) is new or changed: it may refuse the previous binary's writes"
                ));
            }
        }
        broken
    }
}

/// Issue 40 item 1: an ACCESS EXCLUSIVE step of a migration (here 0.2.0's ADD COLUMN of
/// `events_kept_from`) behind a long reader of the table (a `pg_dump`) gives way after
/// `lock_timeout` instead of queueing every NiFi write behind it, and is retried until the reader
/// is gone. The writer below completes while the reader still holds its lock; before the change it
/// waited for the reader (7.0 s behind an 8 s reader, measured in the issue).
#[tokio::test]
async fn a_waiting_migration_lets_nifi_writes_pass_and_completes_after_the_reader() {
    use sqlx::Connection;
    let db = TestDb::empty().await;
    let before_column = sqlx::migrate::Migrator::with_migrations(
        MIGRATOR
            .iter()
            .filter(|m| m.version < 20261203000008)
            .cloned()
            .collect(),
    );
    let mut setup = db.conn().await;
    before_column.run(&mut setup).await.unwrap();
    let run = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status) VALUES ($1, 'JOB', 'bk', 'CREATED')",
    )
    .bind(run)
    .execute(&mut setup)
    .await
    .unwrap();
    // The reader: what pg_dump holds on every table for the whole dump.
    let mut reader = db.conn().await;
    let mut dump = reader.begin().await.unwrap();
    sqlx::query("LOCK TABLE nifi_ops.load_run IN ACCESS SHARE MODE")
        .execute(&mut *dump)
        .await
        .unwrap();
    // On a thread of its own: migrate's future is not Send (sqlx's Migrator borrows the
    // connection across awaits), as `serve --migrate` runs it on the main task.
    let migrating = std::thread::spawn({
        let url = db.url.clone();
        move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(run_migrations(&url))
        }
    });
    // Until the ADD COLUMN waits for the reader's lock (nothing else of this database waits for one).
    let mut watch = db.conn().await;
    let reached = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let waiting: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock')",
            )
            .fetch_one(&mut watch)
            .await
            .unwrap();
            if waiting || migrating.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if reached.is_err() {
        let rows: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT datname || ' ' || state, wait_event_type || ':' || wait_event, left(query, 120) FROM pg_stat_activity WHERE backend_type = 'client backend'",
        )
        .fetch_all(&mut watch)
        .await
        .unwrap();
        panic!("the migration never waited for the reader: {rows:#?}");
    }
    assert!(!migrating.is_finished(), "{:?}", migrating.join());
    // A NiFi write to the table, while the migration waits and the reader holds: it completes.
    let mut writer = db.conn().await;
    let wrote = tokio::time::timeout(
        Duration::from_secs(20),
        sqlx::query(
            "UPDATE nifi_ops.load_run SET heartbeat_at = clock_timestamp() WHERE run_id = $1",
        )
        .bind(run)
        .execute(&mut writer),
    )
    .await;
    assert!(
        matches!(wrote, Ok(Ok(ref r)) if r.rows_affected() == 1),
        "the write queued behind the migration's lock request until the reader ended: {wrote:?}"
    );
    assert!(
        !migrating.is_finished(),
        "the migration cannot have passed the reader"
    );
    dump.rollback().await.unwrap();
    let version = tokio::task::spawn_blocking(move || migrating.join().unwrap())
        .await
        .unwrap()
        .expect("the migration completes after the reader");
    assert_eq!(version, SCHEMA_VERSION);
    let column: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'nifi_ops' \
           AND table_name = 'load_run' AND column_name = 'events_kept_from')",
    )
    .fetch_one(&mut setup)
    .await
    .unwrap();
    assert!(column);
}

/// Issue 40 item 1: an index a failed CONCURRENTLY build left INVALID is built again by the next
/// `migrate` (`IF NOT EXISTS` alone would keep the broken one).
#[tokio::test]
async fn an_index_left_invalid_is_built_again() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    // What a cancelled build of migration 22 leaves: the index INVALID, the migration unrecorded.
    sqlx::query(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'nifi_ops.ix_load_run_events_due'::regclass",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 20261205000022")
        .execute(&mut conn)
        .await
        .unwrap();
    run_migrations(&db.url).await.unwrap();
    let valid: Option<bool> = sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = 'nifi_ops.ix_load_run_events_due'::regclass",
    )
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    assert_eq!(valid, Some(true));
}

// ---- Server-side functions (ledger/src/functions.rs): one file each, applied by hash, never
// ---- edited once released, outcomes typed on both sides.

use ledger::functions::{SERVER_FUNCTIONS, outcome_types};

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The sha256 PostgreSQL computes of `text`, as `migrate` records it.
async fn sha256(conn: &mut PgConnection, text: &str) -> String {
    sqlx::query_scalar("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')")
        .bind(text)
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn recorded(conn: &mut PgConnection, name: &str) -> Option<(String, i32, String)> {
    sqlx::query_as(
        "SELECT sha256, schema_version, written_by FROM nifi_ops.server_function WHERE function_name = $1",
    )
    .bind(name)
    .fetch_optional(conn)
    .await
    .unwrap()
}

/// The bodies (`prosrc`) of every overload of `nifi_ops.<name>`.
async fn bodies(conn: &mut PgConnection, name: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT prosrc FROM pg_proc WHERE pronamespace = 'nifi_ops'::regnamespace AND proname = $1",
    )
    .bind(name)
    .fetch_all(conn)
    .await
    .unwrap()
}

/// The server-side functions `body` calls, of those in `names` other than `own`.
fn calls<'a>(own: &str, body: &str, names: &[&'a str]) -> Vec<&'a str> {
    names
        .iter()
        .filter(|n| **n != own && body.contains(&format!("nifi_ops.{n}(")))
        .copied()
        .collect()
}

#[test]
fn a_function_is_applied_after_every_function_it_calls() {
    let names: Vec<&str> = SERVER_FUNCTIONS.iter().map(|f| f.name).collect();
    // The checker sees a call (and only a call: a name in a comment without its parenthesis is
    // none), and the one this test would miss were the list sorted by name.
    assert_eq!(
        calls(
            "complete_extraction",
            "-- nifi_ops.transition\nPERFORM nifi_ops.record_event(",
            &names
        ),
        ["record_event"]
    );
    let mut applied: Vec<&str> = vec![];
    let mut late = vec![];
    for f in SERVER_FUNCTIONS {
        for callee in calls(f.name, f.sql, &names) {
            if !applied.contains(&callee) {
                late.push(format!("{} calls {callee}", f.name));
            }
        }
        applied.push(f.name);
    }
    assert!(
        late.is_empty(),
        "SERVER_FUNCTIONS applies a caller before its callee (a request served while migrate runs \
         would call the callee missing or in its older form): {late:?}"
    );
}

#[tokio::test]
async fn every_function_file_is_applied_and_recorded_by_its_hash() {
    let mut on_disk: Vec<String> = std::fs::read_dir(repo().join("ledger/functions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = SERVER_FUNCTIONS
        .iter()
        .map(|f| format!("{}.sql", f.name))
        .collect();
    listed.sort();
    assert_eq!(
        on_disk, listed,
        "ledger/functions/ and SERVER_FUNCTIONS differ"
    );
    let db = TestDb::empty().await;
    run_migrations(&db.url).await.unwrap();
    let mut conn = db.conn().await;
    for f in SERVER_FUNCTIONS {
        assert!(
            f.sql
                .contains(&format!("CREATE OR REPLACE FUNCTION nifi_ops.{}(", f.name)),
            "ledger/functions/{}.sql defines nifi_ops.{0}",
            f.name
        );
        let hash = sha256(&mut conn, f.sql).await;
        let (recorded_hash, version, by) = recorded(&mut conn, f.name).await.expect("recorded");
        assert_eq!(
            (recorded_hash, version, by.as_str()),
            (
                hash,
                SCHEMA_VERSION,
                concat!("load-control ", env!("CARGO_PKG_VERSION"))
            )
        );
        // The function the database runs is the file's (one overload has its body).
        let body = f.sql.split("$$").nth(1).expect("a body in $$ … $$");
        assert!(
            bodies(&mut conn, f.name).await.iter().any(|b| b == body),
            "nifi_ops.{} is not the body of its file",
            f.name
        );
    }
}

#[tokio::test]
async fn a_function_changed_by_hand_is_restored_and_a_newer_releases_is_kept() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    // Somebody replaced the gate by hand (its record still says the file's hash).
    let gate = SERVER_FUNCTIONS
        .iter()
        .find(|f| f.name == "chunk_gate")
        .unwrap();
    let body = gate.sql.split("$$").nth(1).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "{} \
         UPDATE nifi_ops.server_function SET sha256 = 'by hand' WHERE function_name = 'chunk_gate'",
        gate.sql.replace(body, " SELECT NULL::text ")
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        bodies(&mut conn, "chunk_gate").await,
        vec![" SELECT NULL::text ".to_string()]
    );
    // And a newer release wrote its own `transition` (schema version ahead of this binary's).
    sqlx::query(
        "UPDATE nifi_ops.server_function SET sha256 = 'newer', schema_version = $1, \
                written_by = 'load-control 9.9.9' WHERE function_name = 'transition'",
    )
    .bind(SCHEMA_VERSION + 1)
    .execute(&mut conn)
    .await
    .unwrap();
    run_migrations(&db.url).await.unwrap();
    assert_eq!(
        recorded(&mut conn, "chunk_gate").await.unwrap().0,
        sha256(&mut conn, gate.sql).await
    );
    assert_eq!(
        bodies(&mut conn, "chunk_gate").await,
        vec![body.to_string()]
    );
    let (hash, version, by) = recorded(&mut conn, "transition").await.unwrap();
    assert_eq!(
        (hash.as_str(), version, by.as_str()),
        ("newer", SCHEMA_VERSION + 1, "load-control 9.9.9"),
        "a rollback's migrate keeps the newer release's function"
    );
}

#[tokio::test]
async fn each_outcome_type_has_the_values_of_its_rust_enum() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    for (pg_type, function, values) in outcome_types() {
        let in_db: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT unnest(enum_range(NULL::{pg_type}))::text"
        )))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(in_db, values, "{pg_type} and its Rust enum differ");
        // The function answers its outcome in that type.
        let (name,) = function.split_once('.').map(|(_, n)| (n,)).unwrap();
        let out: String = sqlx::query_scalar(
            "SELECT t.oid::regtype::text FROM pg_proc p, unnest(p.proallargtypes, p.proargnames, p.proargmodes) \
                    AS a(typ, name, mode) JOIN pg_type t ON t.oid = a.typ \
              WHERE p.pronamespace = 'nifi_ops'::regnamespace AND p.proname = $1 \
                AND a.name = 'outcome' AND a.mode = 'o'",
        )
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(out, pg_type, "{function} answers its outcome as {out}");
    }
}

/// The files of `ledger/functions/` that differ from the same file of a release: (release, file).
fn edited_released_functions(
    released: &[(String, String, String)],
    tree: &std::path::Path,
) -> Vec<(String, String)> {
    released
        .iter()
        .filter(|(_, file, sql)| {
            std::fs::read_to_string(tree.join(file)).is_ok_and(|ours| ours != *sql)
        })
        .map(|(release, file, _)| (release.clone(), file.clone()))
        .collect()
}

/// Every function file of every release of `RELEASES`: (release, file, its text), read with git
/// from the release's commit.
fn released_function_files() -> Vec<(String, String, String)> {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .current_dir(repo())
            .args(args)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let releases = std::fs::read_to_string(repo().join("RELEASES")).unwrap();
    let mut files = Vec::new();
    for line in releases
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (release, commit) = line.split_once(' ').expect("`<version> <commit>`");
        let listing = git(&["ls-tree", "--name-only", commit, "ledger/functions/"]);
        for path in listing.lines() {
            let file = path.trim_start_matches("ledger/functions/").to_string();
            files.push((
                release.to_string(),
                file,
                git(&["show", &format!("{commit}:{path}")]),
            ));
        }
    }
    files
}

#[test]
fn a_released_function_file_is_never_edited() {
    // The checker finds an edit (a release whose copy of a file differs from the tree's) and
    // ignores a file the tree no longer has (dropped by a contract migration).
    let tree = repo().join("ledger/functions");
    let gate = std::fs::read_to_string(tree.join("chunk_gate.sql")).unwrap();
    let fixture = vec![
        (
            "0.9.0".to_string(),
            "chunk_gate.sql".to_string(),
            gate.replace("STABLE", "IMMUTABLE"),
        ),
        (
            "0.9.0".to_string(),
            "transition.sql".to_string(),
            std::fs::read_to_string(tree.join("transition.sql")).unwrap(),
        ),
        (
            "0.9.0".to_string(),
            "gone.sql".to_string(),
            "anything".to_string(),
        ),
    ];
    assert_eq!(
        edited_released_functions(&fixture, &tree),
        vec![("0.9.0".to_string(), "chunk_gate.sql".to_string())]
    );
    let edited = edited_released_functions(&released_function_files(), &tree);
    assert!(
        edited.is_empty(),
        "released server-side functions edited: {edited:?}. The previous release's pods call them \
         by name during an upgrade and after a rollback: give the new behaviour a new name \
         (ledger/src/functions.rs)"
    );
}

/// What the next release's migration does to the chunk report, as `ledger/src/functions.rs`
/// allows (`name` a new function) or not (`name` this release's): a body that answers a new
/// outcome, THROTTLED, to a report of more than 1000 chunks, and the schema version one ahead.
async fn next_release_reports_chunks_as(conn: &mut PgConnection, name: &str) {
    let ours = SERVER_FUNCTIONS
        .iter()
        .find(|f| f.name == "report_chunk_v2")
        .unwrap()
        .sql;
    let changed = ours
        .replacen(
            "FUNCTION nifi_ops.report_chunk_v2(",
            &format!("FUNCTION nifi_ops.{name}("),
            1,
        )
        .replacen(
            "\nBEGIN\n",
            "\nBEGIN\n    IF p_chunk_count > 1000 THEN\n        outcome := 'THROTTLED';\n        RETURN;\n    END IF;\n",
            1,
        );
    assert_ne!(changed, ours);
    sqlx::raw_sql("ALTER TYPE nifi_ops.report_chunk_outcome ADD VALUE 'THROTTLED'")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(changed))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO nifi_ops.server_function (function_name, sha256, schema_version, written_by) \
         VALUES ($1, 'next', $2, 'load-control next') \
         ON CONFLICT (function_name) DO UPDATE SET sha256 = 'next', schema_version = $2, \
            written_by = 'load-control next'",
    )
    .bind(name)
    .bind(SCHEMA_VERSION + 1)
    .execute(&mut *conn)
    .await
    .unwrap();
    set_version(conn, SCHEMA_VERSION + 1).await;
}

#[tokio::test]
async fn this_release_answers_nifi_on_the_next_releases_functions() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    next_release_reports_chunks_as(&mut conn, "report_chunk_v3").await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    assert_eq!(ledger.check_schema().await.unwrap(), SCHEMA_VERSION + 1);
    // A report the next release would throttle is answered as this release answers it.
    let created = testkit::extracting_run(&ledger, "next-release", &[10]).await;
    let run = created.run_id;
    let token = uuid::Uuid::new_v4();
    testkit::claim_all(&ledger, run, &["0000"], token).await;
    let many = testkit::chunk_report(token, &created.hdfs_run_path, "0000", 0, 2000, 10);
    let progress = ledger.report_chunk(run, "0000", &many).await.unwrap();
    assert_eq!(progress.result, ledger::ChunkResult::Progress);
    assert_eq!(progress.received_chunks, 1);
    let recorded_chunk: (String, i64) = sqlx::query_as(
        "SELECT p.status, (SELECT count(*) FROM nifi_ops.load_file f \
                            WHERE f.run_id = p.run_id AND f.partition_id = p.partition_id) \
           FROM nifi_ops.load_partition p WHERE p.run_id = $1 AND p.partition_id = '0000'",
    )
    .bind(run)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(recorded_chunk, ("RUNNING".to_string(), 1));
    // A clean run completes and starts validation.
    let clean = testkit::extracting_run(&ledger, "next-release-clean", &[10]).await;
    testkit::claim_all(&ledger, clean.run_id, &["0000"], token).await;
    let done = ledger
        .report_chunk(
            clean.run_id,
            "0000",
            &testkit::chunk_report(token, &clean.hdfs_run_path, "0000", 0, 1, 10),
        )
        .await
        .unwrap();
    assert_eq!(done.result, ledger::ChunkResult::RunComplete);
    let dispatch: uuid::Uuid = sqlx::query_scalar(
        "SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'",
    )
    .bind(clean.run_id)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let started = ledger
        .start_validation(clean.run_id, dispatch, "nifi-02")
        .await
        .unwrap();
    assert!(started.started);
    // And this release's migrate (a rollback's hook) leaves the next release's function be.
    assert_eq!(run_migrations(&db.url).await.unwrap(), SCHEMA_VERSION + 1);
    assert_eq!(
        recorded(&mut conn, "report_chunk_v3").await.unwrap().0,
        "next"
    );
    assert_eq!(bodies(&mut conn, "report_chunk_v3").await.len(), 1);
}

/// Why the rule holds: a next release that replaced this release's function in place would have
/// this release's pods answer NiFi with an error (the outcome it does not know), not a silent wrong
/// answer. `a_released_function_file_is_never_edited` keeps it from happening.
#[tokio::test]
async fn a_function_replaced_in_place_under_this_release_fails_loudly() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    next_release_reports_chunks_as(&mut conn, "report_chunk_v2").await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let created = testkit::extracting_run(&ledger, "replaced-in-place", &[10]).await;
    let token = uuid::Uuid::new_v4();
    testkit::claim_all(&ledger, created.run_id, &["0000"], token).await;
    let many = testkit::chunk_report(token, &created.hdfs_run_path, "0000", 0, 2000, 10);
    let err = ledger
        .report_chunk(created.run_id, "0000", &many)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("THROTTLED") && err.contains("does not know"),
        "{err}"
    );
}
