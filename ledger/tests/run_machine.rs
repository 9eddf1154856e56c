//! The run state machine (`ledger/src/machine.rs`) is one table, and the two places generated
//! from it say the same: the database's `nifi_ops.run_transition`, which refuses every other
//! status change even to a hand-written UPDATE, and the spin model's `RUN_TRANSITION`.
//! `LC_REGENERATE=1` rewrites `spec/model/run_transitions.pml` instead of failing on it.
use ledger::machine::{self, RUN_TRANSITIONS, TRANSITION_REFUSED};
use ledger::{LedgerConfig, RunStatus};
use sqlx::{Connection, Row};
use std::path::PathBuf;
use testkit::{TestDb, new_run};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test]
async fn the_database_table_is_the_rust_table() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let rows = sqlx::query(
        "SELECT from_status, to_status, terminal, aborts_partitions, settled_dispatch_error \
         FROM nifi_ops.run_transition ORDER BY from_status, to_status",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let in_db: Vec<(String, String, bool, bool, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let mut in_rust: Vec<(String, String, bool, bool, Option<String>)> = RUN_TRANSITIONS
        .iter()
        .map(|&(from, to)| {
            let e = machine::entering(to);
            (
                from.to_string(),
                to.to_string(),
                e.terminal,
                e.aborts_partitions,
                e.settled_dispatch_error,
            )
        })
        .collect();
    in_rust.sort();
    assert_eq!(
        in_db, in_rust,
        "nifi_ops.run_transition differs from RUN_TRANSITIONS: add a migration that makes them equal"
    );
}

#[test]
fn the_migration_holds_the_generated_rows() {
    let text =
        std::fs::read_to_string(repo().join("migrations/20261205000019_run_transition_table.sql"))
            .unwrap();
    assert!(
        text.contains(&format!("VALUES\n{};\n", machine::sql_rows())),
        "the rows of migration 20261205000019 are not machine::sql_rows()"
    );
}

#[test]
fn the_model_checks_the_same_transitions() {
    let path = repo().join("spec/model/run_transitions.pml");
    let want = machine::promela();
    if std::env::var_os("LC_REGENERATE").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        have, want,
        "spec/model/run_transitions.pml is stale: LC_REGENERATE=1 cargo test -p load-control-ledger --test run_machine"
    );
    let model = std::fs::read_to_string(repo().join("spec/model/load_run.pml")).unwrap();
    assert!(model.contains("#include \"run_transitions.pml\""));
    assert!(
        model.contains("RUN_TRANSITION(g_prev, rstat)"),
        "the model's check() asserts every status change against RUN_TRANSITION"
    );
}

/// Every ordered pair of distinct statuses, written by hand as a plain UPDATE (the run placed in
/// `from` with triggers off): exactly the pairs of the table pass, every other is refused with
/// LC002 and changes nothing. The ledger's own function refuses them too.
#[tokio::test]
async fn a_status_change_outside_the_table_is_refused_even_by_hand() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let run = ledger.create_run(&new_run("BY-HAND")).await.unwrap().run_id;
    let mut conn = db.conn().await;
    let (mut passed, mut refused) = (0, 0);
    for &from in RunStatus::ALL {
        for &to in RunStatus::ALL {
            if from == to {
                continue;
            }
            testkit::outside_the_state_machine(
                &mut conn,
                &format!("UPDATE nifi_ops.load_run SET status = '{from}' WHERE run_id = $1"),
                run,
            )
            .await;
            let mut tx = conn.begin().await.unwrap();
            sqlx::query("SAVEPOINT by_hand")
                .execute(&mut *tx)
                .await
                .unwrap();
            let by_hand = sqlx::query("UPDATE nifi_ops.load_run SET status = $2 WHERE run_id = $1")
                .bind(run)
                .bind(to.as_str())
                .execute(&mut *tx)
                .await;
            let allowed = machine::allowed(from, to);
            match by_hand {
                Ok(_) => {
                    assert!(allowed, "{from} -> {to} written by hand was accepted");
                    passed += 1;
                }
                Err(e) => {
                    let code = e
                        .as_database_error()
                        .and_then(|d| d.code())
                        .map(|c| c.to_string());
                    assert!(
                        !allowed,
                        "{from} -> {to} is in the table but was refused: {e}"
                    );
                    assert_eq!(
                        code.as_deref(),
                        Some(TRANSITION_REFUSED),
                        "{from} -> {to}: {e}"
                    );
                    assert!(
                        e.to_string()
                            .contains(&format!("{from} -> {to} is not a run transition"))
                    );
                    refused += 1;
                }
            }
            sqlx::query("ROLLBACK TO SAVEPOINT by_hand")
                .execute(&mut *tx)
                .await
                .unwrap();
            let through_the_function = sqlx::query(
                "SELECT changed FROM nifi_ops.transition($1, $2, $3, 'keep', NULL, NULL, NULL)",
            )
            .bind(run)
            .bind(from.as_str())
            .bind(to.as_str())
            .fetch_one(&mut *tx)
            .await;
            assert_eq!(
                through_the_function.is_ok(),
                allowed,
                "nifi_ops.transition {from} -> {to}"
            );
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(passed, RUN_TRANSITIONS.len());
    assert_eq!(refused, 17 * 16 - RUN_TRANSITIONS.len());
    let status: String =
        sqlx::query_scalar("SELECT status FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        status,
        RunStatus::ALL.last().unwrap().as_str(),
        "every attempt was rolled back"
    );
}
