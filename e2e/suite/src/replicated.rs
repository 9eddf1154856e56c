//! A replicated ledger for the failover suite (issue 21): a primary and a streaming standby
//! (PostgreSQL from Debian, each a [`PgServer`]), and one address that moves to the current
//! primary the way a CloudNativePG `-rw` Service (or a Patroni-managed virtual address) does:
//! new connections go to wherever it points now, established ones stay where they were until the
//! server behind them goes away ([`Forwarder::cut_established`] is what a dead server does).
//!
//! Synchronous replication is `synchronous_standby_names = '*'`. As Patroni and CloudNativePG do
//! when no standby is left to wait for, a promoted primary runs without a synchronous standby
//! until the old primary has rejoined (pg_rewind) and streams again.
use crate::standalone::PgServer;
use anyhow::{Context, bail};
use sqlx::Connection;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP address on 127.0.0.1 that forwards to a port that can change.
pub struct Forwarder {
    pub port: u16,
    target: Arc<AtomicU16>,
    cut: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    pub async fn start(target: u16) -> anyhow::Result<Forwarder> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(AtomicU16::new(target));
        let (cut, _) = watch::channel(0u64);
        let (t, c) = (target.clone(), cut.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let to = t.load(Ordering::Acquire);
                let mut cut = c.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", to)).await else {
                        return; // nobody there: the client sees its connection closed
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Ok(Forwarder {
            port,
            target,
            cut,
            accept,
        })
    }

    /// New connections go to `port`; established ones are kept (a Service's endpoints moving).
    pub fn point_at(&self, port: u16) {
        self.target.store(port, Ordering::Release);
    }

    /// Closes every connection established so far.
    pub fn cut_established(&self) {
        self.cut.send_modify(|g| *g += 1);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_established();
    }
}

/// A PostgreSQL program of the newest version installed (the servers of the tests are that
/// version, and pg_dump refuses a server newer than itself).
pub fn pg_bin(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL server binaries (/usr/lib/postgresql)")?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .max_by_key(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(0)
        })
        .context("no PostgreSQL version installed")?;
    Ok(dir.join("bin").join(name))
}

/// Runs a server binary as the cluster's owner (`postgres` when we are root, as scripts/pg-up).
fn as_owner(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let bin = pg_bin(program)?;
    let root = Command::new("id").arg("-u").output()?.stdout == b"0\n";
    let out = if root {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&bin)
            .args(args)
            .output()?
    } else {
        Command::new(&bin).args(args).output()?
    };
    if !out.status.success() {
        let _ = std::fs::write(
            std::env::temp_dir().join(format!("lc-{program}-failed.log")),
            [&out.stdout[..], &out.stderr[..]].concat(),
        );
        bail!(
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Server options of both nodes. Test data (no fsync), but every commit waits for the standby
/// as configured, and pg_rewind needs hint bits logged and full page writes.
const NODE_OPTIONS: &str = "-c synchronous_commit=on -c full_page_writes=on -c wal_log_hints=on \
    -c wal_keep_size=256MB -c max_wal_senders=10";

impl PgServer {
    fn admin(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    pub async fn sql(&self, statement: &str) -> anyhow::Result<()> {
        let mut c = sqlx::PgConnection::connect(&self.admin()).await?;
        sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
            .execute(&mut c)
            .await?;
        Ok(())
    }

    async fn scalar(&self, query: &str) -> anyhow::Result<i64> {
        let mut c = sqlx::PgConnection::connect(&self.admin()).await?;
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(query.to_string()))
            .fetch_one(&mut c)
            .await?;
        Ok(n)
    }

    /// SIGKILL of the postmaster and every backend, as a crashed machine: nothing is flushed or
    /// handed over, and nothing of it lingers (pg_rewind needs the shared memory free).
    pub fn kill(&self) -> anyhow::Result<()> {
        let pid = self.postmaster_pid()?.to_string();
        Command::new("kill").args(["-STOP", &pid]).status()?;
        Command::new("pkill").args(["-KILL", "-P", &pid]).status()?;
        Command::new("kill").args(["-KILL", &pid]).status()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Command::new("pgrep")
            .args(["-P", &pid])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
            || std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the killed server's processes linger"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            anyhow::ensure!(Instant::now() < deadline, "killed server still answers");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// A clean fast shutdown (every connection cut, the shutdown checkpoint sent to standbys).
    pub fn stop(&self) -> anyhow::Result<()> {
        as_owner("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"])
    }

    /// Starts the server again on its data directory and port.
    pub fn start_again(&self) -> anyhow::Result<()> {
        self.up().map(|_| ())
    }
}

/// A new, unstarted server `name` holding a base backup of `source` (`pg_basebackup -X stream`
/// with `extra` arguments, e.g. `-R` for a standby).
fn base_backup(source: &PgServer, name: &str, extra: &[&str]) -> anyhow::Result<PgServer> {
    let b = PgServer::unstarted(name, false, NODE_OPTIONS)?;
    if Command::new("id").arg("-u").output()?.stdout == b"0\n" {
        Command::new("chown")
            .args(["postgres:", &b.dir.display().to_string()])
            .status()?;
    }
    let (conninfo, data) = (source.conninfo(), b.data());
    let mut args = vec!["-d", &conninfo, "-D", &data];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-X", "stream", "-c", "fast"]);
    as_owner("pg_basebackup", &args)?;
    Ok(b)
}

/// A primary and a streaming standby behind one moving address.
pub struct ReplicatedPg {
    pub nodes: [PgServer; 2],
    primary: usize,
    pub address: Forwarder,
    pub synchronous: bool,
    /// The ledger's database (created on the first primary, replicated).
    pub db: String,
}

impl ReplicatedPg {
    pub async fn start(name: &str, synchronous: bool) -> anyhow::Result<ReplicatedPg> {
        let a = PgServer::start_with(&format!("{name}-a"), false, NODE_OPTIONS)?;
        // Also in postgresql.auto.conf (copied to the standby): pg_rewind's crash recovery runs
        // the server without our command line, and must keep logging hint bits.
        // Likewise the WAL since the last common checkpoint: its end-of-recovery checkpoint
        // must not recycle what pg_rewind then reads.
        a.sql("ALTER SYSTEM SET wal_log_hints = on").await?;
        a.sql("ALTER SYSTEM SET wal_keep_size = '256MB'").await?;
        a.create_db(name)?;
        let b = base_backup(&a, &format!("{name}-b"), &["-R"])?;
        b.start_again()?;
        if synchronous {
            // Only now: a commit before the standby streams would wait for it.
            a.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .await?;
            a.sql("SELECT pg_reload_conf()").await?;
        }
        let address = Forwarder::start(a.port).await?;
        let pair = ReplicatedPg {
            nodes: [a, b],
            primary: 0,
            address,
            synchronous,
            db: name.to_string(),
        };
        pair.wait_streaming().await?;
        Ok(pair)
    }

    /// The ledger's URL, through the moving address.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.address.port, self.db
        )
    }

    pub fn primary(&self) -> &PgServer {
        &self.nodes[self.primary]
    }

    pub fn standby(&self) -> &PgServer {
        &self.nodes[1 - self.primary]
    }

    /// Waits until the primary sees its standby streaming (and, when synchronous, as `sync`).
    pub async fn wait_streaming(&self) -> anyhow::Result<Duration> {
        self.wait_replication(self.synchronous).await
    }

    async fn wait_replication(&self, synchronous: bool) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let query = if synchronous {
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'"
        } else {
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
        };
        loop {
            if self.primary().scalar(query).await.unwrap_or(0) == 1 {
                return Ok(t.elapsed());
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "the standby does not stream"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Points the address at the standby (new connections only; established ones are kept).
    pub fn address_to_standby(&self) {
        self.address.point_at(self.standby().port);
    }

    /// Points the address back at the primary (established connections are kept).
    pub fn address_to_primary(&self) {
        self.address.point_at(self.primary().port);
    }

    /// Promotes the standby and moves the address to it; the promoted primary does not wait for
    /// a synchronous standby until one has rejoined.
    pub async fn promote_standby(&mut self) -> anyhow::Result<()> {
        let standby = 1 - self.primary;
        as_owner(
            "pg_ctl",
            &["-D", &self.nodes[standby].data(), "-w", "promote"],
        )?;
        self.nodes[standby]
            .sql("ALTER SYSTEM SET synchronous_standby_names = ''")
            .await?;
        self.nodes[standby].sql("SELECT pg_reload_conf()").await?;
        self.primary = standby;
        self.address.point_at(self.nodes[standby].port);
        Ok(())
    }

    /// Failover: the primary is SIGKILLed, the standby promoted, the address moved. Returns how
    /// long the address led nowhere.
    pub async fn failover(&mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.primary().kill()?;
        self.address.cut_established();
        self.promote_standby().await?;
        Ok(t.elapsed())
    }

    /// Switchover: the primary stops cleanly, the standby is promoted, the address moves, and the
    /// old primary rejoins as the standby.
    pub async fn switchover(&mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.primary().stop()?;
        self.address.cut_established();
        self.promote_standby().await?;
        let away = t.elapsed();
        self.rejoin_old_primary().await?;
        Ok(away)
    }

    /// The old primary (crashed or stopped) is rewound onto the new primary's timeline, starts
    /// as its standby, and synchronous replication is restored.
    pub async fn rejoin_old_primary(&mut self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let (old, new) = (&self.nodes[1 - self.primary], &self.nodes[self.primary]);
        // A just promoted server's control file names its new timeline only after a checkpoint;
        // without one pg_rewind sees one timeline and rewinds nothing (its documented caveat).
        new.sql("CHECKPOINT").await?;
        as_owner(
            "pg_rewind",
            &["-D", &old.data(), "--source-server", &new.conninfo(), "-R"],
        )?;
        old.start_again()?;
        // Synchronous again only once the standby streams: until then every commit would wait.
        self.wait_replication(false).await?;
        if self.synchronous {
            new.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .await?;
            new.sql("SELECT pg_reload_conf()").await?;
        }
        self.wait_streaming().await?;
        Ok(t.elapsed())
    }
}

/// A primary that archives its WAL, and a base backup of it taken at the start: point-in-time
/// recovery as CloudNativePG's `bootstrap.recovery` (or pgBackRest's restore) does it: a new server
/// from the base backup replays the archive up to a target and is promoted, on a new timeline; the
/// moving address then leads to it, and every connection to the old primary is cut.
pub struct ArchivedPg {
    pub primary: PgServer,
    /// The base backup's data directory, in a server started only by [`ArchivedPg::recover_to`].
    pub restored: PgServer,
    archive: std::path::PathBuf,
    pub address: Forwarder,
    /// The ledger's database (created before the base backup).
    pub db: String,
}

impl ArchivedPg {
    pub async fn start(name: &str) -> anyhow::Result<ArchivedPg> {
        let a = PgServer::start_with(&format!("{name}-a"), false, NODE_OPTIONS)?;
        let archive = a.dir.join("archive");
        std::fs::create_dir_all(&archive)?;
        let root = Command::new("id").arg("-u").output()?.stdout == b"0\n";
        if root {
            Command::new("chown")
                .args(["postgres:", &archive.display().to_string()])
                .status()?;
        }
        a.sql("ALTER SYSTEM SET archive_mode = on").await?;
        a.sql(&format!(
            "ALTER SYSTEM SET archive_command = 'test ! -f {0}/%f && cp %p {0}/%f'",
            archive.display()
        ))
        .await?;
        a.stop()?;
        a.start_again()?;
        a.create_db(name)?;
        let b = base_backup(&a, &format!("{name}-restored"), &[])?;
        let address = Forwarder::start(a.port).await?;
        Ok(ArchivedPg {
            primary: a,
            restored: b,
            archive,
            address,
            db: name.to_string(),
        })
    }

    /// The ledger's URL, through the moving address.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.address.port, self.db
        )
    }

    /// A named restore point at the primary's current WAL position (`pg_create_restore_point`, as
    /// before a risky change), its segment switched and archived.
    pub async fn mark(&self, name: &str) -> anyhow::Result<()> {
        let mut c = sqlx::PgConnection::connect(&self.primary.admin()).await?;
        sqlx::query("SELECT pg_create_restore_point($1)")
            .bind(name)
            .execute(&mut c)
            .await?;
        let (segment,): (String,) = sqlx::query_as("SELECT pg_walfile_name(pg_switch_wal())")
            .fetch_one(&mut c)
            .await?;
        let t = Instant::now();
        loop {
            let (archived,): (Option<String>,) =
                sqlx::query_as("SELECT last_archived_wal FROM pg_stat_archiver")
                    .fetch_one(&mut c)
                    .await?;
            if archived.is_some_and(|a| a >= segment) {
                return Ok(());
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(30),
                "segment {segment} not archived"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Point-in-time recovery to `mark`: the primary stops (fast: every connection cut), the base
    /// backup replays the archive up to the restore point and is promoted, and the address moves
    /// to it. Returns how long the address led to no primary.
    pub async fn recover_to(&mut self, mark: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.primary.stop()?;
        self.address.cut_established();
        let data = std::path::PathBuf::from(self.restored.data());
        let settings = format!(
            "restore_command = 'cp {}/%f %p'\nrecovery_target_name = '{mark}'\n\
             recovery_target_action = 'promote'\narchive_mode = off\n",
            self.archive.display()
        );
        let auto = data.join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto).unwrap_or_default();
        conf.push_str(&settings);
        std::fs::write(&auto, conf)?;
        std::fs::write(data.join("recovery.signal"), "")?;
        if Command::new("id").arg("-u").output()?.stdout == b"0\n" {
            Command::new("chown")
                .args(["-R", "postgres:", &data.display().to_string()])
                .status()?;
        }
        self.restored.start_again()?;
        loop {
            let promoted = async {
                let mut c = sqlx::PgConnection::connect(&self.restored.admin()).await?;
                let (recovering,): (bool,) = sqlx::query_as("SELECT pg_is_in_recovery()")
                    .fetch_one(&mut c)
                    .await?;
                anyhow::Ok(!recovering)
            };
            if promoted.await.unwrap_or(false) {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "the recovered server was not promoted"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.address.point_at(self.restored.port);
        Ok(t.elapsed())
    }
}
