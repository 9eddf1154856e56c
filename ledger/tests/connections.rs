//! Issue 21 items 2 and 3 against a real PostgreSQL: a pooled connection whose server cannot take
//! writes is retired after its first refusal (the pool reconnects through the service address), a
//! new connection to such a server is not kept, and the readiness check is a write.
use ledger::{LedgerConfig, LedgerError};
use sqlx::Connection;
use testkit::TestDb;
use testkit::new_run;

fn is_read_only(e: &LedgerError) -> bool {
    matches!(e, LedgerError::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25006"))
}

/// A Kubernetes Service keeps established connections when its endpoints move to another server;
/// here the pool's only connection is made read-only, as if its server had become a standby.
#[tokio::test]
async fn a_connection_to_a_server_that_cannot_write_is_retired_after_one_refusal() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(1, LedgerConfig::default()).await;
    ledger.create_run(&new_run("before")).await.unwrap();
    {
        let mut conn = ledger.pool().acquire().await.unwrap();
        sqlx::query("SET SESSION default_transaction_read_only = on")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    let refused = ledger.create_run(&new_run("refused")).await.unwrap_err();
    assert!(is_read_only(&refused), "{refused:?}");
    // Without retirement the pool would hand out the same connection again, and every write
    // would keep failing for as long as traffic keeps it busy.
    ledger
        .create_run(&new_run("after"))
        .await
        .expect("the next write reconnects");
    assert_eq!(ledger.connections_retired(), 1);
    let mut conn = db.conn().await;
    let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(runs, 2, "the refused write wrote nothing");
}

/// The address still points at a read-only server: writes are refused at once (no wait for a
/// pool timeout), readiness fails with the reason, and both recover by themselves once the server
/// takes writes.
#[tokio::test]
async fn a_read_only_server_is_not_ready_and_not_kept_in_the_pool() {
    let db = TestDb::fresh().await;
    let mut admin = db.conn().await;
    let read_only = |on: bool| {
        format!(
            "ALTER DATABASE \"{}\" {}",
            db.name,
            if on {
                "SET default_transaction_read_only = on"
            } else {
                "RESET default_transaction_read_only"
            }
        )
    };
    sqlx::query(sqlx::AssertSqlSafe(read_only(true)))
        .execute(&mut admin)
        .await
        .unwrap();
    let ledger =
        ledger::Ledger::connect_lazy(&db.url, 2, 0, LedgerConfig::default()).expect("a valid URL");
    match ledger.write_check().await {
        Err(e) => assert!(
            e.to_string().contains("read-only"),
            "the reason is named: {e}"
        ),
        Ok(()) => panic!("a read-only server is not ready"),
    }
    let t = std::time::Instant::now();
    let refused = ledger.create_run(&new_run("refused")).await.unwrap_err();
    assert!(is_read_only(&refused), "{refused:?}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "refused at once"
    );
    sqlx::query(sqlx::AssertSqlSafe(read_only(false)))
        .execute(&mut admin)
        .await
        .unwrap();
    // The pool refills in the background after a refusal retires its connections, so a refill
    // may have opened its session before the RESET (the default is read at session start): such
    // a connection is refused once and retired. Each of the pool's (two) connections can cost
    // one refusal, never more, and every refusal names the read-only server.
    let mut refusals = 0;
    while let Err(e) = ledger.write_check().await {
        assert!(e.to_string().contains("read-only"), "{e}");
        refusals += 1;
        assert!(
            refusals <= 2,
            "still not ready after {refusals} refusals: {e}"
        );
    }
    loop {
        match ledger.create_run(&new_run("after")).await {
            Ok(_) => break,
            Err(e) => {
                assert!(is_read_only(&e), "{e:?}");
                refusals += 1;
                assert!(
                    refusals <= 2,
                    "still refused after {refusals} refusals: {e:?}"
                );
            }
        }
    }
    admin.close().await.unwrap();
}

/// The pooled connections of `db` (the ledger's sessions, by their application name).
async fn pooled(admin: &mut sqlx::PgConnection, db: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'load-control'",
    )
    .bind(db)
    .fetch_one(admin)
    .await
    .unwrap();
    n
}

/// Issue 30: the pool keeps its `size` connections open (warm, not reopened after a lull) and
/// hands them out without a ping; a connection whose server closed it (a restart, a failover, a
/// terminated backend) is found out by its BEGIN, and the operation runs on a new connection
/// instead of failing.
#[tokio::test]
async fn warm_connections_and_a_closed_one_is_replaced_without_an_error() {
    let db = TestDb::fresh().await;
    let mut admin = db.conn().await;
    let ledger = db.ledger(3, LedgerConfig::default()).await;
    {
        let pool = ledger.pool();
        let (a, b, c) = tokio::join!(pool.acquire(), pool.acquire(), pool.acquire());
        drop((a.unwrap(), b.unwrap(), c.unwrap()));
    }
    ledger.create_run(&new_run("before")).await.unwrap();
    let killed: Vec<i32> = sqlx::query_scalar(
        "WITH pooled AS MATERIALIZED (SELECT pid FROM pg_stat_activity \
            WHERE datname = $1 AND application_name = 'load-control') \
         SELECT pid FROM pooled WHERE pg_terminate_backend(pid)",
    )
    .bind(&db.name)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(killed.len(), 3, "{killed:?}");
    // Those backends gone (the pool may already be opening new ones: only these are awaited).
    let t = std::time::Instant::now();
    loop {
        let (left,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&killed)
                .fetch_one(&mut admin)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{left} terminated backends still there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for n in 0..3 {
        ledger
            .create_run(&new_run(&format!("after-{n}")))
            .await
            .expect("a closed connection is replaced, not an error");
    }
    // The pool refills to its size by itself: the next burst finds its connections warm.
    let t = std::time::Instant::now();
    while pooled(&mut admin, &db.name).await < 3 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the pool reopens its {} connections",
            3
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    admin.close().await.unwrap();
}

/// A password rotated under a running pool (issue 41 item 5): PostgreSQL keeps the sessions it
/// authenticated, so the open connections go on; a new connection needs the new password, which
/// the pool takes from `database.password_file` without a restart. Rotated role first, new
/// connections are refused until the file has the new password; rotated file first, none is.
/// The role signs in with SCRAM (scripts/pg-up trusts every other role).
#[tokio::test]
async fn a_rotated_password_is_taken_from_its_file_without_a_restart() {
    const ROLE: &str = "lc_password_rotation";
    let db = TestDb::fresh().await;
    let mut admin = db.conn().await;
    for sql in [
        format!(
            "DO $$ BEGIN CREATE ROLE {ROLE} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        ),
        // What the chart's runtime role is granted, on this test database's objects.
        format!("GRANT USAGE ON SCHEMA nifi_ops TO {ROLE}"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA nifi_ops TO {ROLE}"),
        format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA nifi_ops TO {ROLE}"),
        format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA nifi_ops TO {ROLE}"),
        format!("ALTER ROLE {ROLE} PASSWORD 'first-password'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let dir = std::env::temp_dir().join(format!("lc-rotation-{}", db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "first-password\n").unwrap();
    // The URL's own password is wrong: the file's wins.
    let url = db
        .url
        .replacen("://postgres@", &format!("://{ROLE}:not-this-one@"), 1);
    assert_ne!(url, db.url, "{}", db.url);
    let ledger = ledger::Ledger::connect_lazy(
        &url,
        1,
        0,
        LedgerConfig {
            password_file: Some(file.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    ledger.create_run(&new_run("first")).await.unwrap();
    let terminate = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '{ROLE}'"
    );
    let terminate = || sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(terminate.clone()));

    // The password changes in PostgreSQL: the open connection is not asked again.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE {ROLE} PASSWORD 'second-password'"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    ledger
        .create_run(&new_run("open connection"))
        .await
        .unwrap();
    // Its connection gone, the pool cannot open one with the old password.
    assert_eq!(terminate().fetch_one(&mut admin).await.unwrap(), 1);
    let refused = ledger
        .create_run(&new_run("old password"))
        .await
        .unwrap_err();
    assert!(
        format!("{refused:?}").contains("28P01"),
        "not an authentication failure: {refused:?}"
    );

    // The Secret is re-applied with the new password: the pool takes it, and connects again.
    std::fs::write(&file, "second-password\n").unwrap();
    let started = std::time::Instant::now();
    while ledger.password_reloads() == 0 {
        assert!(
            started.elapsed() < ledger::dsn::PASSWORD_RECHECK * 3,
            "the pool did not take the new password"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    ledger.create_run(&new_run("new password")).await.unwrap();
    // A dedicated connection (the leader's lock, LISTEN) reads the file when it opens.
    let dsn = ledger::Dsn::new(url.as_str()).with_password_file(Some(file.clone()));
    dsn.connect().await.unwrap().close().await.unwrap();
    let mut listener = dsn.listener().await.unwrap();
    listener.listen("load_run").await.unwrap();

    // A file being rewritten (empty for a moment) keeps the password the pool has.
    std::fs::write(&file, "").unwrap();
    assert!(terminate().fetch_one(&mut admin).await.unwrap() >= 1);
    ledger.create_run(&new_run("empty file")).await.unwrap();
    assert_eq!(ledger.password_reloads(), 1);
    let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        runs, 4,
        "every accepted write is in the ledger, the refused one is not"
    );

    // The order the runbook gives, the Secret first and then the role: no write is refused.
    // While PostgreSQL refuses the file's new password, the pool and the dedicated connections
    // keep the one it accepts (the checks every 5 s try the new one and are refused)...
    std::fs::write(&file, "third-password\n").unwrap();
    let until = std::time::Instant::now() + ledger::dsn::PASSWORD_RECHECK * 2;
    let mut written = 0;
    while std::time::Instant::now() < until {
        terminate().fetch_one(&mut admin).await.unwrap();
        ledger
            .create_run(&new_run(&format!("file ahead {written}")))
            .await
            .unwrap();
        dsn.connect().await.unwrap().close().await.unwrap();
        written += 1;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(ledger.password_reloads(), 1, "a refused password was taken");
    // ...and the first refusal of the old one, once the role has the new, takes the new at once.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER ROLE {ROLE} PASSWORD 'third-password'"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    assert!(terminate().fetch_one(&mut admin).await.unwrap() >= 1);
    // (A pooled connection outside a transaction, here the readiness ping, takes it the same;
    // the ping is not tried again on a terminated connection, which its first use may find.)
    if let Err(e) = ledger.ping().await {
        assert!(format!("{e:?}").contains("57P01"), "{e:?}");
        ledger.ping().await.unwrap();
    }
    assert_eq!(ledger.password_reloads(), 2);
    ledger.create_run(&new_run("role altered")).await.unwrap();
    dsn.connect().await.unwrap().close().await.unwrap();
    let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(runs, 4 + written + 1);
    std::fs::remove_dir_all(&dir).unwrap();
}
