//! Issue 27 item 5, two releases on one ledger: refused. Two operator processes of different
//! installations on one real PostgreSQL ledger: the second never leads and bumps no epoch, its
//! /readyz fails naming both and what to do, `lca_ledger_owned_by_other` is 1; the same
//! installation twice fails over as before; the first release gone (its claim stale), the second
//! takes over.
mod common;
use common::*;
use lcoperator::leadership::{AdvisoryLockLeadership, Leadership};
use lcoperator::metrics_listener;
use lcoperator::process::Operator;
use ledger::{Fence, Ledger};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Each release's own leader Lease, as under Kubernetes (two releases never contend for one):
/// shared by the pods of one release, never by two releases. Like `KubeLeaseLeadership`, the
/// Lease is handed back when the epoch cannot be bumped.
struct OwnLease {
    lease: Arc<AtomicBool>,
    have: bool,
    ledger: Ledger,
    holder: String,
}

impl Leadership for OwnLease {
    async fn acquire(&mut self) -> anyhow::Result<Fence> {
        loop {
            if !self.have {
                self.have = self
                    .lease
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok();
            }
            if self.have {
                match self.ledger.acquire_epoch(&self.holder).await {
                    Ok(fence) => return Ok(fence),
                    Err(e) => {
                        lcoperator::leadership::epoch_refused(&e, "could not bump the epoch");
                        self.release().await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn lost(&mut self) {
        std::future::pending::<()>().await
    }

    async fn release(&mut self) {
        if std::mem::take(&mut self.have) {
            self.lease.store(false, Ordering::SeqCst);
        }
    }
}

/// `/readyz` and `/metrics` of one process, over real HTTP on 127.0.0.1.
struct Probe {
    url: String,
    client: reqwest::Client,
}

impl Probe {
    async fn serve(ledger: &Ledger, op: &Operator) -> Probe {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = metrics_listener::router(ledger.clone(), op.metrics.clone(), op.health.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Probe {
            url,
            client: reqwest::Client::new(),
        }
    }

    async fn readyz(&self) -> (u16, String) {
        let r = self
            .client
            .get(format!("{}/readyz", self.url))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn owned_by_other(&self) -> Option<i64> {
        let body = self
            .client
            .get(format!("{}/metrics", self.url))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        body.lines()
            .find_map(|l| l.strip_prefix("lca_ledger_owned_by_other "))
            .map(|v| v.trim().parse().unwrap())
    }
}

async fn epoch_row(env: &Env) -> (i64, String) {
    env.ledger
        .current_epoch()
        .await
        .unwrap()
        .expect("an epoch row")
}

async fn owner_row(env: &Env) -> String {
    let (owner,): (String,) = sqlx::query_as("SELECT installation FROM nifi_ops.ledger_owner")
        .fetch_one(&mut env.conn().await)
        .await
        .unwrap();
    owner
}

fn quiet_env(c: &mut lcconfig::config::Config) {
    c.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_release_on_the_same_ledger_never_leads_and_says_why() {
    let env = Env::start(quiet_env).await;
    let stale = Duration::from_secs(60);
    let ledger_a = env
        .ledger
        .clone()
        .with_installation("team-a/load-control-leader", stale);
    let ledger_b = env
        .ledger_with(|_| {})
        .await
        .with_installation("team-b/load-control-leader", stale);
    let release = |ledger: &Ledger, holder: &str| OwnLease {
        lease: Arc::new(AtomicBool::new(false)),
        have: false,
        ledger: ledger.clone(),
        holder: holder.into(),
    };
    let mut a = Operator::start(&env.config, ledger_a.clone(), release(&ledger_a, "a-0")).unwrap();
    let first = a
        .wait_leading(Duration::from_secs(10))
        .await
        .expect("release A leads");
    let probe_a = Probe::serve(&ledger_a, &a).await;
    // Release B has its own Lease (won at once), so it reaches the ledger every 200 ms.
    let mut b = Operator::start(&env.config, ledger_b.clone(), release(&ledger_b, "b-0")).unwrap();
    let probe_b = Probe::serve(&ledger_b, &b).await;
    let watched = Instant::now();
    assert!(
        b.wait_leading(Duration::from_secs(8)).await.is_none(),
        "release B must never lead on release A's ledger"
    );
    // The epoch was bumped exactly once in those seconds: A's acquisition, still current.
    assert_eq!(epoch_row(&env).await, (first.epoch, "a-0".to_string()));
    assert_eq!(first.epoch, 1, "one bump in {:?}", watched.elapsed());
    assert!(a.fence.borrow().is_some(), "A still leads, never fenced");
    assert_eq!(owner_row(&env).await, "team-a/load-control-leader");

    let (code, body) = probe_b.readyz().await;
    assert_eq!(code, 503, "B is not ready: {body}");
    for part in [
        "two load-control releases share the ledger database",
        "team-a/load-control-leader",
        "team-b/load-control-leader",
        "give each release its own database, or uninstall the other",
    ] {
        assert!(body.contains(part), "{part:?} missing from {body}");
    }
    assert_eq!(probe_b.owned_by_other().await, Some(1));
    let (code, body) = probe_a.readyz().await;
    assert_eq!(code, 200, "A is ready: {body}");
    assert_eq!(probe_a.owned_by_other().await, Some(0));

    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pods_of_one_release_fail_over_as_before() {
    let env = Env::start(quiet_env).await;
    let stale = Duration::from_secs(60);
    let pod = |name: &str| {
        let ledger = env
            .ledger
            .clone()
            .with_installation("team-a/load-control-leader", stale);
        (
            ledger.clone(),
            AdvisoryLockLeadership::new(env.config.session_dsn(), ledger, name.to_string()),
        )
    };
    let (la, a_lead) = pod("a-0");
    let mut a = Operator::start(&env.config, la, a_lead).unwrap();
    let first = a
        .wait_leading(Duration::from_secs(10))
        .await
        .expect("a-0 leads");
    let (lb, b_lead) = pod("a-1");
    let mut b = Operator::start(&env.config, lb.clone(), b_lead).unwrap();
    let probe_b = Probe::serve(&lb, &b).await;
    assert_eq!(
        probe_b.readyz().await.0,
        200,
        "a follower of the owner is ready"
    );
    a.stop().await.unwrap();
    let second = b
        .wait_leading(Duration::from_secs(15))
        .await
        .expect("a-1 takes over at once: same installation");
    assert_eq!(second.epoch, first.epoch + 1);
    assert_eq!(epoch_row(&env).await, (second.epoch, "a-1".to_string()));
    assert_eq!(probe_b.owned_by_other().await, Some(0));
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_other_release_takes_over_once_the_owners_claim_is_stale() {
    let env = Env::start(quiet_env).await;
    // A short window for the test (the binary's is 3 × the lease duration, at least 60 s).
    let stale = Duration::from_secs(8);
    let ledger_a = env
        .ledger
        .clone()
        .with_installation("team-a/load-control-leader", stale);
    let ledger_b = env
        .ledger_with(|_| {})
        .await
        .with_installation("team-b/load-control-leader", stale);
    let mut a = Operator::start(
        &env.config,
        ledger_a.clone(),
        AdvisoryLockLeadership::new(env.config.session_dsn(), ledger_a.clone(), "a-0".into()),
    )
    .unwrap();
    let first = a
        .wait_leading(Duration::from_secs(10))
        .await
        .expect("A leads");
    // A leads for a while, refreshing its claim (every 2 s with this window).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(epoch_row(&env).await.0, first.epoch);
    let mut b = Operator::start(
        &env.config,
        ledger_b.clone(),
        AdvisoryLockLeadership::new(env.config.session_dsn(), ledger_b.clone(), "b-0".into()),
    )
    .unwrap();
    let probe_b = Probe::serve(&ledger_b, &b).await;
    assert_eq!(probe_b.readyz().await.0, 503, "A's claim is fresh");
    // Release A uninstalled: its leader stops; its claim stays until it is stale.
    a.stop().await.unwrap();
    let stopped = Instant::now();
    let second = b
        .wait_leading(Duration::from_secs(25))
        .await
        .expect("B takes the ledger over once A's claim is stale");
    let waited = stopped.elapsed();
    eprintln!("took over {waited:?} after A stopped");
    // A refreshed at most one refresh period (2 s) before it stopped: B waited the rest of the
    // 8 s (without the claim B leads at its next try, within one 2 s retry period).
    assert!(
        waited >= Duration::from_secs(5),
        "B led {waited:?} after A stopped: before A's claim was stale"
    );
    assert_eq!(second.epoch, first.epoch + 1, "one bump: B's takeover");
    assert_eq!(epoch_row(&env).await, (second.epoch, "b-0".to_string()));
    assert_eq!(owner_row(&env).await, "team-b/load-control-leader");
    let (code, body) = probe_b.readyz().await;
    assert_eq!(code, 200, "B owns the ledger now: {body}");
    assert_eq!(probe_b.owned_by_other().await, Some(0));
    b.stop().await.unwrap();
}
