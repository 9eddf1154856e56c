//! Test support shared by every crate's integration tests: a fresh, migrated database per test on
//! the private PostgreSQL that `scripts/pg-up` starts (never a mock of the ledger).
//!
//! The admin URL comes from `LC_TEST_PG_URL`, else from `.pgdata/url` of this checkout. Each test
//! database is cloned from a template migrated once per migration set, so a test costs one
//! `CREATE DATABASE`, not a migration run.
//!
//! With `LC_TEST_PGBOUNCER_URL` (PgBouncer in transaction mode in front of that server,
//! `scripts/pgbouncer-up`; `scripts/test pooler`), a test database's [`TestDb::url`] goes through
//! the pooler: the product's pools use it, and [`TestDb::direct_url`] is what a platform team
//! points `database.listen_dsn` and `database.migration_url` at.
use ledger::{Ledger, LedgerConfig};
use sqlx::{Connection, PgConnection};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;
use tokio::sync::OnceCell;
use uuid::Uuid;

pub mod hostile;
mod ports;
pub use ports::free_port;
mod round_trips;
pub use round_trips::RoundTrips;
mod secret_volume;
pub use secret_volume::SecretVolume;

/// Installs ring as the process's rustls provider (the only one the project uses); HTTP clients
/// built with `rustls-no-provider` need it before they are created.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub struct TestDb {
    pub name: String,
    /// Where the product's pools connect: through the pooler under `LC_TEST_PGBOUNCER_URL`,
    /// else straight to PostgreSQL.
    pub url: String,
    /// Straight to PostgreSQL: LISTEN, session advisory locks, migrations, the tests' own reads.
    pub direct_url: String,
}

/// The admin URL through PgBouncer (`LC_TEST_PGBOUNCER_URL`), when the suites run behind it.
pub fn pooler_url() -> Option<String> {
    std::env::var("LC_TEST_PGBOUNCER_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

fn admin_url() -> String {
    if let Ok(url) = std::env::var("LC_TEST_PG_URL") {
        return url;
    }
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.pgdata/url");
    match std::fs::read_to_string(&file) {
        Ok(url) => url.trim().to_string(),
        Err(_) => panic!(
            "no test PostgreSQL: run `scripts/pg-up` (or set LC_TEST_PG_URL to an admin URL); looked for {}",
            file.display()
        ),
    }
}

fn db_url(admin: &str, db: &str) -> String {
    let (base, _) = admin
        .rsplit_once('/')
        .expect("admin URL has a database path");
    format!("{base}/{db}")
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// Databases this test process created. The sweep of earlier runs' databases skips them: a test
/// whose database has no connection open at that instant (between two `migrate` processes, say)
/// would otherwise lose it to a sibling test that happens to build the template.
static CREATED_HERE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// A new test database name, recorded before the database exists.
fn new_database_name() -> String {
    let name = format!("t_{}", Uuid::new_v4().simple());
    CREATED_HERE
        .lock()
        .expect("the set of created databases")
        .insert(name.clone());
    name
}

/// Name of the template database for the current migrations and server-side functions, created
/// on first use. Both are in its name: a function file edited (by hand or by scripts/sql-mutants)
/// must not be tested against a template that has the old body.
async fn template(admin: &str) -> String {
    TEMPLATE
        .get_or_init(|| async {
            let mut sum: u64 = 0xcbf29ce484222325;
            for m in ledger::migrate::MIGRATOR.iter() {
                for b in m.checksum.iter().chain(&m.version.to_be_bytes()) {
                    sum = (sum ^ *b as u64).wrapping_mul(0x100000001b3);
                }
            }
            for f in ledger::functions::SERVER_FUNCTIONS {
                for b in f.name.bytes().chain(f.sql.bytes()) {
                    sum = (sum ^ b as u64).wrapping_mul(0x100000001b3);
                }
            }
            let name = format!("lc_tpl_{sum:016x}");
            let mut conn = PgConnection::connect(admin).await.expect("connect to the test PostgreSQL");
            // Serializes template creation across test binaries running at once.
            sqlx::query("SELECT pg_advisory_lock(hashtext('lc_testkit_template'))").execute(&mut conn).await.unwrap();
            let exists: Option<(i32,)> = sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
                .bind(&name)
                .fetch_optional(&mut conn)
                .await
                .unwrap();
            if exists.is_none() {
                // Databases of earlier runs are dropped here (those still in use refuse, and stay).
                let old: Vec<(String,)> =
                    sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE 't\\_%' OR datname LIKE 'lc\\_tpl\\_%'")
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                let ours = CREATED_HERE.lock().expect("the set of created databases").clone();
                for (db,) in old.into_iter().filter(|(db,)| !ours.contains(db)) {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{db}\""))).execute(&mut conn).await;
                }
                let build = format!("{name}_build");
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{build}\""))).execute(&mut conn).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{build}\""))).execute(&mut conn).await.unwrap();
                ledger::migrate::run_migrations(&db_url(admin, &build)).await.expect("migrate the template");
                sqlx::query(sqlx::AssertSqlSafe(format!("ALTER DATABASE \"{build}\" RENAME TO \"{name}\"")))
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            sqlx::query("SELECT pg_advisory_unlock(hashtext('lc_testkit_template'))").execute(&mut conn).await.unwrap();
            name
        })
        .await
        .clone()
}

impl TestDb {
    /// A new database with the whole ledger schema, for one test.
    pub async fn fresh() -> TestDb {
        install_crypto();
        let admin = admin_url();
        let tpl = template(&admin).await;
        let name = new_database_name();
        let mut conn = PgConnection::connect(&admin)
            .await
            .expect("connect to the test PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE \"{name}\" TEMPLATE \"{tpl}\" STRATEGY FILE_COPY"
        )))
        .execute(&mut conn)
        .await
        .expect("create the test database");
        TestDb::named(&admin, name)
    }

    /// A new database without any schema (for migration tests).
    pub async fn empty() -> TestDb {
        install_crypto();
        let admin = admin_url();
        let name = new_database_name();
        let mut conn = PgConnection::connect(&admin)
            .await
            .expect("connect to the test PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create database");
        TestDb::named(&admin, name)
    }

    /// The database `name` of the server at `admin`, through the pooler if the suites use one.
    fn named(admin: &str, name: String) -> TestDb {
        let direct_url = db_url(admin, &name);
        TestDb {
            url: pooler_url().map_or_else(|| direct_url.clone(), |p| db_url(&p, &name)),
            direct_url,
            name,
        }
    }

    /// A ledger on this database with `pool` connections.
    pub async fn ledger(&self, pool: u32, config: LedgerConfig) -> Ledger {
        Ledger::connect(&self.url, pool, 0, config)
            .await
            .expect("connect the ledger")
    }

    /// A backup of this database as it is now (`pg_dump -Fc`, as docs/operations.md's backups),
    /// taken under running processes.
    pub fn backup(&self) -> PathBuf {
        let file = std::env::temp_dir().join(format!("lc-backup-{}.dump", self.name));
        let out = std::process::Command::new("pg_dump")
            .args(["-Fc", "-f"])
            .arg(&file)
            .arg(&self.direct_url)
            .output()
            .expect("run pg_dump");
        assert!(
            out.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        file
    }

    /// Restores `backup` in place under running processes: their connections are cut (the
    /// database is dropped and created again, as a restore replaces the server), and the ledger
    /// they reconnect to holds the past of the backup.
    pub async fn restore(&self, backup: &std::path::Path) {
        let mut conn = PgConnection::connect(&admin_url())
            .await
            .expect("connect to the test PostgreSQL");
        for sql in [
            format!("DROP DATABASE \"{}\" WITH (FORCE)", self.name),
            format!("CREATE DATABASE \"{}\"", self.name),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .expect("replace the database");
        }
        let out = std::process::Command::new("pg_restore")
            // One transaction: a process reconnecting meanwhile sees an empty database or the
            // whole backup, never half of it.
            .args([
                "--exit-on-error",
                "--single-transaction",
                "-d",
                &self.direct_url,
            ])
            .arg(backup)
            .output()
            .expect("run pg_restore");
        assert!(
            out.status.success(),
            "pg_restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A plain connection straight to PostgreSQL, for asserting on ledger rows.
    pub async fn conn(&self) -> PgConnection {
        PgConnection::connect(&self.direct_url)
            .await
            .expect("connect to the test database")
    }
}

/// Runs `sql` (one statement; `$1` is `run`) with the database's triggers off
/// (`session_replication_role = replica`, which only a superuser may set, as pg_restore does): how
/// a test puts a run where no transition of the state machine leads, such as a run created and
/// ended long ago, or a terminal run back in PUBLISH_UNKNOWN. Any other writer is refused such a
/// status change by `tr_load_run_transition_allowed` (ledger/src/machine.rs). The success recount
/// trigger is off too: the counters stay as written.
pub async fn outside_the_state_machine(conn: &mut PgConnection, sql: &str, run: Uuid) {
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(run)
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    tx.commit().await.unwrap();
}

/// A run to create in tests: job `JOB`, business key `bk`, everything else minimal.
pub fn new_run(bk: &str) -> ledger::NewRun {
    ledger::NewRun {
        job_key: "JOB".into(),
        business_key: bk.into(),
        hdfs_root: "/data".into(),
        stage_table_prefix: "t_".into(),
        allow_empty_source: false,
        parameters: Default::default(),
    }
}

/// The manifest of a run of `rows.len()` partitions `0000`, `0001`, … expecting `rows[i]` rows
/// each, over adjacent numeric ranges (the last one inclusive), snapshot SCN 777.
pub fn manifest(rows: &[i64]) -> ledger::Manifest {
    use ledger::{Decimal38, ManifestPartition};
    let n = rows.len();
    ledger::Manifest {
        snapshot_scn: Decimal38::parse("777"),
        source_count: rows.iter().sum(),
        source_null_split_count: 0,
        source_min_split: None,
        source_max_split: None,
        planned_partition_count: n as i64,
        source_metrics: vec![],
        source_metrics_version: "v1".into(),
        partitions: rows
            .iter()
            .enumerate()
            .map(|(i, r)| ManifestPartition {
                partition_id: format!("{i:04}"),
                lower_bound: Decimal38::parse(&(i * 10).to_string()),
                upper_bound: Decimal38::parse(&((i + 1) * 10).to_string()),
                lower_text: None,
                upper_text: None,
                upper_inclusive: i + 1 == n,
                is_null_partition: false,
                expected_row_count: *r,
            })
            .collect(),
    }
}

/// A new run (`new_run(bk)`) with the manifest `manifest(rows)` registered: EXTRACTING.
pub async fn extracting_run(ledger: &Ledger, bk: &str, rows: &[i64]) -> ledger::CreatedRun {
    let created = ledger
        .create_run(&new_run(bk))
        .await
        .expect("create the run");
    ledger
        .register_manifest(created.run_id, &manifest(rows))
        .await
        .expect("register its manifest");
    created
}

/// Chunk `index` of `count` of partition `pid` under the claim `token`: `rows` rows in 10 bytes,
/// at `<run_path>/p=<pid>/part-<index>.parquet`.
pub fn chunk_report(
    token: Uuid,
    run_path: &str,
    pid: &str,
    index: i32,
    count: i32,
    rows: i64,
) -> ledger::ChunkReport {
    ledger::ChunkReport {
        claim_token: token,
        chunk_index: index,
        chunk_count: count,
        fragment_identifier: None,
        hdfs_path: format!("{run_path}/p={pid}/part-{index}.parquet"),
        record_count: rows,
        byte_count: Some(10),
    }
}

/// Claims each of `pids` with `token` as worker `nifi-01`, asserting that every claim is granted.
pub async fn claim_all(ledger: &Ledger, run: Uuid, pids: &[&str], token: Uuid) {
    for pid in pids {
        let claim = ledger
            .claim_partition(run, pid, token, "nifi-01")
            .await
            .unwrap_or_else(|e| panic!("claim of {pid}: {e}"));
        assert!(claim.claimed, "claim of {pid} refused: {claim:?}");
    }
}

/// The notifications `listener` receives until a marker sent now on `channel` (one it listens
/// on) arrives, as (channel, payload): notifications come in commit order, so this is everything
/// committed before the call, and an empty answer means nothing was sent (no sleep, no timeout
/// guessed).
pub async fn notified_until_now(
    db: &TestDb,
    listener: &mut sqlx::postgres::PgListener,
    channel: &str,
) -> Vec<(String, String)> {
    let marker = Uuid::new_v4().to_string();
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(channel)
        .bind(&marker)
        .execute(&mut db.conn().await)
        .await
        .expect("send the marker notification");
    let mut seen = Vec::new();
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
            .await
            .expect("the marker notification within 10 s")
            .expect("a notification");
        if n.payload() == marker {
            return seen;
        }
        seen.push((n.channel().to_string(), n.payload().to_string()));
    }
}

/// A certificate authority of its own for TLS tests: its PEM and what signs with it.
pub struct TestCa {
    pub pem: String,
    pub issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().expect("a key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).expect("a self-signed CA");
        TestCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(p, key),
        }
    }
}
