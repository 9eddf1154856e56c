//! The contract oracle (issue 38, item 1): seeded request sequences against the real
//! api-server binary over real HTTP on a real PostgreSQL, every answer and every ledger row of
//! the sequence's runs compared with the executable model of CONTRACT.md after every request.
//!
//! `LC_ORACLE_SEED=N` replays a seed (printed first); `LC_ORACLE_SECONDS=N` sets the wall-time
//! budget (default 60 s); `LC_ORACLE_SEQUENCES=N` caps the number of sequences (default 400);
//! `LC_ORACLE_API_BIN=PATH` checks another build of `load-control-api` (it migrates its own
//! empty database first).
//! Needs `scripts/pg-up` (or `LC_TEST_PG_URL`) and the binary: `cargo build -p load-control-api`.
use e2e::oracle::driver::{self, Driver, Server, Tally};
use std::time::{Duration, Instant};
use testkit::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_oracle() {
    let seed = driver::seed();
    println!("contract_oracle: seed {seed}");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(driver::seconds());
    let max_sequences = std::env::var("LC_ORACLE_SEQUENCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let db = TestDb::empty().await;
    let bin = match std::env::var("LC_ORACLE_API_BIN") {
        Ok(path) => std::path::PathBuf::from(path),
        Err(_) => e2e::standalone::bin("load-control-api").expect("the api-server binary"),
    };
    let server = Server::start(&bin, &db.url)
        .await
        .expect("the api-server starts");
    let mut driver = Driver::new(&server.base, &db.url, seed)
        .await
        .expect("a connection to the ledger");
    let mut tally = Tally::default();
    let outcome = driver.run(deadline, max_sequences, &mut tally).await;
    println!(
        "contract_oracle: seed {seed}: {} sequences, {} requests checked in {:.1} s",
        tally.sequences,
        tally.requests,
        started.elapsed().as_secs_f64()
    );
    for (answer, n) in &tally.answers {
        println!("contract_oracle:   {n:6} {answer}");
    }
    if let Err(failure) = outcome {
        panic!("{failure}\n(api-server log: {})", server.log.display());
    }
}
