//! `database.runtime_role`: `migrate` grants a role of any name what the pods need. The oracle is
//! the migrations' own grants to `load_control_api` (their history), replayed for a second role:
//! both roles must end with the same privileges on every object of the schema.
use regex::Regex;
use sqlx::Connection;
use testkit::TestDb;

/// Every `GRANT … TO load_control_api;` of the migrations, oldest first, for `role`.
fn migration_grants(role: &str) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    let grant = Regex::new(r"(?s)GRANT [^;]*? TO load_control_api;").unwrap();
    files
        .iter()
        .flat_map(|f| {
            let sql = std::fs::read_to_string(f).unwrap();
            grant
                .find_iter(&sql)
                .map(|m| m.as_str().replace("load_control_api", role))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// (object, privilege) pairs `role` holds on the schema, its tables, sequences and functions.
async fn privileges(conn: &mut sqlx::PgConnection, role: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT 'schema nifi_ops', p FROM unnest(ARRAY['USAGE','CREATE']) p WHERE has_schema_privilege($1, 'nifi_ops', p) \
         UNION ALL \
         SELECT c.oid::regclass::text, p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, \
                unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p \
          WHERE n.nspname = 'nifi_ops' AND c.relkind IN ('r','p','v') AND has_table_privilege($1, c.oid, p) \
         UNION ALL \
         SELECT c.oid::regclass::text, p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, \
                unnest(ARRAY['USAGE','SELECT','UPDATE']) p \
          WHERE n.nspname = 'nifi_ops' AND c.relkind = 'S' AND has_sequence_privilege($1, c.oid, p) \
         UNION ALL \
         SELECT f.oid::regprocedure::text, 'EXECUTE' FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace \
          WHERE n.nspname = 'nifi_ops' AND has_function_privilege($1, f.oid, 'EXECUTE') \
         ORDER BY 1, 2",
    )
    .bind(role)
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

/// `role` as an SQL identifier.
async fn quoted(conn: &mut sqlx::PgConnection, role: &str) -> String {
    sqlx::query_scalar("SELECT quote_ident($1)")
        .bind(role)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn migrate_grants_a_runtime_role_of_any_name_what_the_migrations_grant_load_control_api() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (history, named) = (
        format!("lc_rt_history_{suffix}"),
        format!("lc rt \"named\" {suffix}"),
    );
    for role in [&history, &named] {
        let quoted = quoted(&mut conn, role).await;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {quoted}")))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // The history: each grant as its migration made it; one on a function a later migration
    // replaced under another signature no longer applies, as it would not on a migrated ledger.
    let mut tx = conn.begin().await.unwrap();
    for grant in migration_grants(&history) {
        let mut sp = tx.begin().await.unwrap();
        match sqlx::raw_sql(sqlx::AssertSqlSafe(grant.clone()))
            .execute(&mut *sp)
            .await
        {
            Ok(_) => sp.commit().await.unwrap(),
            Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42883") => {
                sp.rollback().await.unwrap()
            }
            Err(e) => panic!("{grant}: {e}"),
        }
    }
    tx.commit().await.unwrap();
    // The functions of ledger/functions/, as `migrate` grants them to `load_control_api`.
    let history_quoted = quoted(&mut conn, &history).await;
    ledger::functions::grant_server_functions(&mut conn, &history_quoted)
        .await
        .unwrap();
    // What every role has (EXECUTE of the functions nobody revoked from PUBLIC), and no more.
    let before = privileges(&mut conn, &named).await;
    assert!(
        before.iter().all(|(_, p)| p == "EXECUTE") && before.len() < 5,
        "{before:?}"
    );
    let version =
        ledger::migrate::run_migrations_granting(&ledger::Dsn::new(db.url.clone()), Some(&named))
            .await
            .unwrap();
    assert_eq!(version, ledger::SCHEMA_VERSION);
    let expected = privileges(&mut conn, &history).await;
    assert!(expected.len() > 20, "{expected:?}");
    assert_eq!(privileges(&mut conn, &named).await, expected);
    // Every function the pods call, and none for PUBLIC (a role the grants forgot would fail
    // NiFi's first report, not this test, if the two lists above were equal but short).
    for f in ledger::functions::SERVER_FUNCTIONS {
        let (callable, public): (bool, bool) = sqlx::query_as(
            "SELECT bool_and(has_function_privilege($1, p.oid, 'EXECUTE')) OR bool_and(p.prorettype = 'trigger'::regtype), \
                    bool_or(has_function_privilege('public', p.oid, 'EXECUTE')) \
               FROM pg_proc p WHERE p.pronamespace = 'nifi_ops'::regnamespace AND p.proname = $2",
        )
        .bind(&named)
        .bind(f.name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert!(callable, "{named} may not execute nifi_ops.{}", f.name);
        assert!(!public, "PUBLIC may execute nifi_ops.{}", f.name);
    }
    // Twice is the same as once.
    ledger::migrate::run_migrations_granting(&ledger::Dsn::new(db.url.clone()), Some(&named))
        .await
        .unwrap();
    assert_eq!(privileges(&mut conn, &named).await, expected);
    for role in [&history, &named] {
        let quoted = quoted(&mut conn, role).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP OWNED BY {quoted}; DROP ROLE {quoted}"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}

/// A role that does not exist is refused by name, after the migrations (which stay applied).
#[tokio::test]
async fn a_runtime_role_that_does_not_exist_is_refused_by_name() {
    let db = TestDb::fresh().await;
    let err = ledger::migrate::run_migrations_granting(
        &ledger::Dsn::new(db.url.clone()),
        Some("no_such_role_lc"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("database.runtime_role \"no_such_role_lc\" is not a role"),
        "{err}"
    );
}
