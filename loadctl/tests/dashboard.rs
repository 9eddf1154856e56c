//! The terminal dashboard: every screen rendered at 80×24 with ratatui's TestBackend, the alert
//! cursor across refreshes, and a PUBLISH_UNKNOWN run resolved through the dialog, key by key,
//! against a real api-server and ledger.
mod common;
use common::*;
use loadctl::client::Api as Client;
use loadctl::dashboard::app::{Action, App, Key, Screen};
use loadctl::dashboard::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde_json::json;
use std::time::Duration;

/// The screen as text, one line per row.
fn screen(app: &App) -> String {
    let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
    t.draw(|f| ui::draw(f, app)).unwrap();
    let buf = t.backend().buffer().clone();
    (0..24)
        .map(|y| {
            (0..80)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn alert(kind: &str, run: &str, severity: &str) -> serde_json::Value {
    json!({"kind": kind, "severity": severity, "runId": run, "jobKey": "ORDERS", "businessKey": "2026-09-28",
           "status": "PUBLISH_UNKNOWN", "at": "2026-09-28T03:12:44Z", "message": "connection lost", "dispatchId": null})
}

fn summary(alerts: Vec<serde_json::Value>) -> serde_json::Value {
    json!({"activeRuns": {"EXTRACTING": 2, "PUBLISH_UNKNOWN": 1}, "recentRuns": {"SUCCESS": 14},
           "recentWindowHours": 24, "dispatches": {"PENDING": 1, "SENT": 0, "DEAD": 1}, "cleanupDue": 3, "alerts": alerts})
}

fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        assert_eq!(app.on_key(Key::Char(c)), Action::None);
    }
}

#[test]
fn the_overview_fits_80_by_24_empty_and_with_alerts() {
    let mut app = App::new("http://lc:8080", Duration::from_secs(5));
    app.set_overview(summary(vec![]), vec![]);
    let empty = screen(&app);
    assert!(empty.contains("No alerts."), "{empty}");
    assert!(
        empty.contains("Active   EXTRACTING 2  PUBLISH_UNKNOWN 1"),
        "{empty}"
    );
    assert!(empty.contains("DEAD 1"), "{empty}");

    let runs = vec![
        json!({"runId": "r1", "jobKey": "ORDERS", "businessKey": "2026-09-28", "status": "EXTRACTING",
                           "successPartitionCount": 3, "expectedPartitionCount": 5, "startedAt": "2026-09-28T03:00:00Z"}),
    ];
    app.set_overview(
        summary(vec![
            alert("PUBLISH_UNKNOWN", "r9", "ERROR"),
            alert("RUN_STALE", "r1", "WARN"),
        ]),
        runs,
    );
    let shown = screen(&app);
    eprintln!("{shown}");
    assert!(shown.contains("ERROR PUBLISH_UNKNOWN"), "{shown}");
    assert!(shown.contains("WARN  RUN_STALE"), "{shown}");
    assert!(
        shown.contains("▮▮▮▯▯ 3/5"),
        "progress of the recent run:\n{shown}"
    );
    assert!(shown.lines().count() <= 24 && shown.lines().all(|l| l.chars().count() <= 80));
}

#[test]
fn the_cursor_stays_on_the_same_alert_across_refreshes() {
    let mut app = App::new("s", Duration::from_secs(5));
    app.set_overview(
        summary(vec![
            alert("PUBLISH_UNKNOWN", "a", "ERROR"),
            alert("DISPATCH_DEAD", "b", "ERROR"),
        ]),
        vec![],
    );
    app.on_key(Key::Down);
    assert_eq!(app.alert_cursor, 1);
    // A new alert sorts first: the cursor follows DISPATCH_DEAD/b to its new place.
    app.set_overview(
        summary(vec![
            alert("RUN_FAILED", "c", "ERROR"),
            alert("PUBLISH_UNKNOWN", "a", "ERROR"),
            alert("DISPATCH_DEAD", "b", "ERROR"),
        ]),
        vec![],
    );
    assert_eq!(app.alert_cursor, 2);
    assert_eq!(app.alerts()[app.alert_cursor]["runId"], "b");
    // The alert went away: the cursor stays in range.
    app.set_overview(summary(vec![alert("RUN_FAILED", "c", "ERROR")]), vec![]);
    assert_eq!(app.alert_cursor, 0);
}

#[test]
fn detail_tabs_and_dialogs_render() {
    let mut app = App::new("s", Duration::from_secs(5));
    app.set_overview(
        summary(vec![alert("PUBLISH_UNKNOWN", "r9", "ERROR")]),
        vec![],
    );
    assert_eq!(app.on_key(Key::Enter), Action::Refresh);
    assert!(matches!(app.screen, Screen::Detail { .. }));
    app.detail = Some(json!({
        "run": {"runId": "r9", "jobKey": "ORDERS", "businessKey": "2026-09-28", "status": "PUBLISH_UNKNOWN",
                "successPartitionCount": 4, "expectedPartitionCount": 4, "extractedCount": 1200, "sourceCount": 1200,
                "errorCode": "TIMEOUT", "errorMessage": "connection lost",
                "partitions": [{"partitionId": "0000", "status": "SUCCESS", "actualRowCount": 300, "expectedRowCount": 300, "fileCount": 3, "attemptCount": 1, "workerNode": "nifi-01"}],
                "dispatches": [{"dispatchId": "d5c4e0aa-1111-4222-8333-444455556666", "dispatchType": "VALIDATE_RUN", "partitionId": null, "status": "ACKED", "attemptCount": 1, "sentAt": "2026-09-28T03:10:00Z"}]},
        "validations": {"metrics": [{"stage": "STAGING", "metricName": "STAGE_COUNT", "expectedValue": "1200", "actualValue": "1200", "result": "PASS"}]},
        "events": {"events": [{"eventTime": "2026-09-28T03:12:44Z", "level": "ERROR", "name": "PUBLISH_UNKNOWN", "message": "connection lost"}]}
    }));
    let tabs = [
        ("Partitions", "nifi-01"),
        ("Metrics", "STAGE_COUNT"),
        ("Dispatches", "VALIDATE_RUN"),
        ("Events", "connection lost"),
    ];
    for (i, (tab, needle)) in tabs.iter().enumerate() {
        if i > 0 {
            app.on_key(Key::Right);
        }
        let shown = screen(&app);
        assert!(
            shown.contains(tab) && shown.contains(needle),
            "tab {tab}:\n{shown}"
        );
        assert!(
            shown.contains("ORDERS / 2026-09-28") && shown.contains("error TIMEOUT"),
            "{shown}"
        );
    }
    // s on the Dispatches tab: the resend confirmation.
    app.on_key(Key::Char('3'));
    app.on_key(Key::Char('s'));
    let shown = screen(&app);
    assert!(
        shown.contains("Resend dispatch") && shown.contains("[ Cancel ]"),
        "{shown}"
    );
    app.on_key(Key::Esc);
    // R: the resolve dialog, then its confirmation with Cancel focused.
    app.on_key(Key::Char('R'));
    type_text(&mut app, "rows checked");
    let shown = screen(&app);
    assert!(
        shown.contains("Resolve PUBLISH_UNKNOWN") && shown.contains("reason: rows checked"),
        "{shown}"
    );
    app.on_key(Key::Enter);
    let shown = screen(&app);
    eprintln!("{shown}");
    assert!(shown.contains("Are you sure?"), "{shown}");
    // c: the cancel dialog.
    app.on_key(Key::Esc);
    app.on_key(Key::Char('c'));
    assert!(screen(&app).contains("Cancel run"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publish_unknown_run_is_resolved_through_the_dialog() {
    let api = Api::start().await;
    let run = api.publish_unknown_run("2026-10-01").await;
    let client = Client::from_settings(
        Some(&api.base),
        Some(OPS),
        None,
        Some(std::path::Path::new("/nonexistent")),
    )
    .err();
    assert!(
        client.is_some(),
        "a named config file that does not exist is refused"
    );
    let client = Client::from_settings(Some(&api.base), Some(OPS), None, None).unwrap();
    let mut app = App::new(&api.base, Duration::from_secs(5));
    app.load(&client).await;
    assert_eq!(app.alerts()[0]["kind"], "PUBLISH_UNKNOWN");
    assert_eq!(app.on_key(Key::Enter), Action::Refresh);
    app.load(&client).await;
    assert_eq!(app.detail_status(), Some("PUBLISH_UNKNOWN"));

    // A short reason is not enough; the confirmation starts on Cancel, and Enter there cancels.
    app.on_key(Key::Char('R'));
    type_text(&mut app, "ok");
    assert_eq!(app.on_key(Key::Enter), Action::None);
    assert!(app.dialog.as_ref().unwrap().hint.is_some());
    type_text(&mut app, " - checked in Hive");
    app.on_key(Key::Down); // outcome: FAILED_PUBLISH
    assert_eq!(app.on_key(Key::Enter), Action::None);
    assert_eq!(app.on_key(Key::Enter), Action::None, "Cancel is focused");
    assert!(app.dialog.is_none());
    assert_eq!(
        api.status(&run).await,
        "PUBLISH_UNKNOWN",
        "nothing happened"
    );

    // Again, this time Tab to Confirm.
    app.on_key(Key::Char('R'));
    type_text(&mut app, "target partition empty in Hive");
    app.on_key(Key::Down);
    app.on_key(Key::Enter);
    app.on_key(Key::Tab);
    let action = app.on_key(Key::Enter);
    assert_eq!(
        action,
        Action::Resolve {
            run_id: run.clone(),
            outcome: "FAILED_PUBLISH",
            reason: "target partition empty in Hive".into()
        }
    );
    app.perform(&client, &action).await;
    assert_eq!(app.status, "done: run FAILED_PUBLISH");
    assert_eq!(api.status(&run).await, "FAILED_PUBLISH");

    // With a NiFi token the same action shows as "no permission".
    let nifi = Client::from_settings(Some(&api.base), Some(NIFI), None, None).unwrap();
    app.perform(
        &nifi,
        &Action::Cancel {
            run_id: run.clone(),
            reason: "not mine to cancel".into(),
        },
    )
    .await;
    assert!(app.status.starts_with("no permission"), "{}", app.status);
    assert!(screen(&app).contains("no permission"));
}
