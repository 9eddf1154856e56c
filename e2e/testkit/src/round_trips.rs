//! Round trips to PostgreSQL, counted on the wire: a forwarder on 127.0.0.1 between a client and
//! the test PostgreSQL that reads the client's protocol messages as they pass.
//!
//! A client waits for the server once per `Sync` (the end of an extended-protocol exchange) and
//! once per `Query` (a simple-protocol statement such as sqlx's `BEGIN` and `COMMIT`). A `Sync`
//! that ends an `Execute` is a statement; sqlx also sends a bare `Sync` as its ping when a
//! connection returns to its pool (after the answer was used), counted apart.
//!
//! Faults, each taking effect once: [`RoundTrips::lose_next_answer`] lets the next statement
//! reach the server and run to its end (`ReadyForQuery`: committed, when it ran on its own), then
//! closes the client's connection without a byte of the answer — a connection lost between the
//! commit and the reply; [`RoundTrips::lose_next_commit_answer`] does the same to the next
//! `COMMIT`; [`RoundTrips::drop_next_commit`] closes both connections instead of passing the next
//! `COMMIT` on, so the server rolls the transaction back.
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    /// `Query` messages, and `Sync` messages that end an exchange with an `Execute`.
    statements: AtomicU64,
    /// Every `Sync` and `Query`: every time the client waited for the server.
    waits: AtomicU64,
    /// The next statement's answer is to be lost.
    lose_next: AtomicBool,
    /// The next COMMIT's answer is to be lost.
    lose_commit: AtomicBool,
    /// The next COMMIT is not to reach the server.
    drop_commit: AtomicBool,
    /// Answers lost so far.
    lost: AtomicU64,
}

pub struct RoundTrips {
    /// The database URL through the forwarder (TLS off, so that the messages can be read).
    pub url: String,
    counts: Arc<Counts>,
    accept: tokio::task::JoinHandle<()>,
}

impl RoundTrips {
    /// A forwarder to the server of `db_url`.
    pub async fn start(db_url: &str) -> RoundTrips {
        let options = PgConnectOptions::from_str(db_url).expect("a PostgreSQL URL");
        let target = (options.get_host().to_string(), options.get_port());
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the forwarder");
        let port = listener.local_addr().expect("its address").port();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, counts) = (target.clone(), c.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    forward(client, server, counts).await;
                });
            }
        });
        let (base, query) = match db_url.split_once('?') {
            Some((b, q)) => (b, format!("?{q}&sslmode=disable")),
            None => (db_url, "?sslmode=disable".to_string()),
        };
        let from = format!(":{}/", options.get_port());
        assert!(base.contains(&from), "{db_url} names its port");
        let url = base.replacen(&from, &format!(":{port}/"), 1) + &query;
        RoundTrips {
            url,
            counts,
            accept,
        }
    }

    /// Statements sent so far (`Query`, and `Sync` after an `Execute`).
    pub fn statements(&self) -> u64 {
        self.counts.statements.load(Ordering::Acquire)
    }

    /// Every wait for the server so far (statements and bare `Sync` pings).
    pub fn waits(&self) -> u64 {
        self.counts.waits.load(Ordering::Acquire)
    }

    /// The next statement, on whichever connection sends it, runs on the server to its end and
    /// its connection is then closed before any of the answer reaches the client.
    pub fn lose_next_answer(&self) {
        self.counts.lose_next.store(true, Ordering::Release);
    }

    /// The next `COMMIT` runs on the server, and its connection is then closed before the
    /// answer reaches the client.
    pub fn lose_next_commit_answer(&self) {
        self.counts.lose_commit.store(true, Ordering::Release);
    }

    /// The next `COMMIT` never reaches the server: both connections are closed instead.
    pub fn drop_next_commit(&self) {
        self.counts.drop_commit.store(true, Ordering::Release);
    }

    /// How many answers were lost or COMMITs dropped (each fault that took effect).
    pub fn answers_lost(&self) -> u64 {
        self.counts.lost.load(Ordering::Acquire)
    }
}

impl Drop for RoundTrips {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, counts: Arc<Counts>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Set by the client's side when it sends the statement whose answer is to be lost.
    let losing = Arc::new(AtomicBool::new(false));
    tokio::select! {
        _ = upstream(client_read, server_write, counts.clone(), losing.clone()) => {}
        _ = downstream(server_read, client_write, counts, losing) => {}
    }
}

/// The server's messages to the client, message by message (a type byte and a length each; no
/// SSL negotiation, which the URL turns off), until an answer is to be lost: then nothing more is
/// passed on, and once the server is ready for the next query (the statement has ended) the
/// connection is closed.
/// One protocol message after the startup: its type byte with its length, and its body.
async fn message(from: &mut tokio::net::tcp::OwnedReadHalf) -> std::io::Result<([u8; 5], Vec<u8>)> {
    let mut head = [0u8; 5];
    from.read_exact(&mut head).await?;
    let n = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; n.saturating_sub(4)];
    from.read_exact(&mut body).await?;
    Ok((head, body))
}

async fn downstream(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counts: Arc<Counts>,
    losing: Arc<AtomicBool>,
) -> std::io::Result<()> {
    loop {
        let (head, body) = message(&mut from).await?;
        if losing.load(Ordering::Acquire) {
            if head[0] == b'Z' {
                counts.lost.fetch_add(1, Ordering::AcqRel);
                return Ok(());
            }
            continue;
        }
        to.write_all(&head).await?;
        to.write_all(&body).await?;
    }
}

/// The client's messages to the server, counted on the way.
async fn upstream(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counts: Arc<Counts>,
    losing: Arc<AtomicBool>,
) -> std::io::Result<()> {
    // The startup message has no type byte: a length, then the rest.
    let mut len = [0u8; 4];
    from.read_exact(&mut len).await?;
    let mut body = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
    from.read_exact(&mut body).await?;
    to.write_all(&len).await?;
    to.write_all(&body).await?;
    let mut executed = false;
    loop {
        let (head, body) = message(&mut from).await?;
        // Counted before the message reaches the server, so before any answer to it.
        match head[0] {
            b'E' => executed = true,
            b'S' => {
                if std::mem::take(&mut executed) {
                    counts.statements.fetch_add(1, Ordering::AcqRel);
                    if counts.lose_next.swap(false, Ordering::AcqRel) {
                        losing.store(true, Ordering::Release);
                    }
                }
                counts.waits.fetch_add(1, Ordering::AcqRel);
            }
            b'Q' => {
                counts.statements.fetch_add(1, Ordering::AcqRel);
                counts.waits.fetch_add(1, Ordering::AcqRel);
                if body.starts_with(b"COMMIT") {
                    if counts.drop_commit.swap(false, Ordering::AcqRel) {
                        counts.lost.fetch_add(1, Ordering::AcqRel);
                        return Ok(());
                    }
                    if counts.lose_commit.swap(false, Ordering::AcqRel) {
                        losing.store(true, Ordering::Release);
                    }
                }
            }
            _ => {}
        }
        to.write_all(&head).await?;
        to.write_all(&body).await?;
    }
}
