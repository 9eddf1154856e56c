//! Validation, publish, operator, cleanup and read endpoints (CONTRACT §4.9–§4.22) over real HTTP.
mod common;
use common::*;
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn the_whole_happy_path_over_http() {
    let api = Api::start().await;
    let r = api.post("/v1/runs", json!({"jobKey":"JOB","businessKey":"2026-09-28","hdfsRoot":"/data/stage/","stageTablePrefix":"tmp_"})).await;
    let run: Uuid = r.body["runId"].as_str().unwrap().parse().unwrap();
    let mut m = manifest(&[10, 20]);
    m["sourceMetrics"] = json!({"AMOUNT_SUM": "123.45"});
    assert_eq!(
        api.post(&format!("/v1/runs/{run}/manifest"), m).await.body["status"],
        "EXTRACTING"
    );
    let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
    assert_eq!(api.claim(run, "0000", t0).await.body["claimed"], true);
    assert_eq!(api.claim(run, "0001", t1).await.body["claimed"], true);
    assert_eq!(
        api.chunk(run, "0000", t0, 0, 1, 10).await.body["validationScheduled"],
        false
    );
    assert_eq!(
        api.chunk(run, "0001", t1, 0, 1, 20).await.body["validationScheduled"],
        true
    );
    let (dispatch,): (Uuid,) =
        sqlx::query_as("SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    let start = api
        .post(
            &format!("/v1/runs/{run}/validation/start"),
            json!({"dispatchId": dispatch, "node": "nifi-02"}),
        )
        .await;
    assert_eq!(
        start.body,
        json!({"started": true, "runStatus": "STAGE_VALIDATING", "jobKey": "JOB", "businessKey": "2026-09-28", "snapshotScn": "1234567890",
               "hdfsRunPath": format!("/data/stage/JOB/run_id={run}"), "stageTable": format!("tmp_{}", run.simple()),
               "sourceCount": 30, "extractedCount": 30, "sourceMetrics": {"AMOUNT_SUM": "123.45", "SOURCE_COUNT": "30"}})
    );
    let staging = api
        .staging_metrics(run, json!([{"metricName":"STAGE_COUNT","expectedValue":"30","actualValue":"30","result":"PASS"},
                                     {"metricName":"DUP_PK_COUNT","expectedValue":"0","actualValue":"0","result":"PASS","details":{"sql":"q7"}}]))
        .await;
    assert_eq!(
        staging.body,
        json!({"recorded": 2, "failCount": 0, "runStatus": "STAGE_VALIDATING"})
    );
    let sv = api
        .post(&format!("/v1/runs/{run}/stage-validated"), json!({}))
        .await;
    assert_eq!(
        sv.body,
        json!({"stageValidated": true, "runStatus": "STAGING_VALIDATED", "reasons": []})
    );
    let token = Uuid::new_v4();
    assert_eq!(
        api.post(
            &format!("/v1/runs/{run}/publish/claim"),
            json!({"publishToken": token})
        )
        .await
        .body,
        json!({"claimed": true, "runStatus": "PUBLISHING"})
    );
    let published = api
        .post(
            &format!("/v1/runs/{run}/publish/result"),
            json!({"publishToken": token, "outcome": "PUBLISHED", "message": "INSERT OVERWRITE done"}),
        )
        .await;
    assert_eq!(
        published.body,
        json!({"runStatus": "PUBLISHED", "changed": true})
    );
    let target = api.post(&format!("/v1/runs/{run}/validations"), json!({"stage":"TARGET","metrics":[{"metricName":"TARGET_COUNT","actualValue":"30","result":"PASS"}]})).await;
    assert_eq!(target.body["runStatus"], "PUBLISHED");
    let done = api
        .post(&format!("/v1/runs/{run}/success"), json!({}))
        .await;
    assert_eq!(
        done.body,
        json!({"success": true, "runStatus": "SUCCESS", "reasons": []})
    );
    let (staging_count, target_count, completed): (Option<i64>, Option<i64>, bool) =
        sqlx::query_as("SELECT staging_count, target_count, completed_at IS NOT NULL FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!(
        (staging_count, target_count, completed),
        (Some(30), Some(30), true)
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND status = 'ACKED'",
            run
        )
        .await,
        1
    );
    assert_eq!(
        api.events(run).await,
        vec![
            "RUN_STARTED",
            "MANIFEST_CREATED",
            "PARTITION_STARTED",
            "PARTITION_STARTED",
            "PARTITION_SUCCESS",
            "PARTITION_SUCCESS",
            "EXTRACT_VALIDATED",
            "STAGE_VALIDATION_STARTED",
            "STAGE_VALIDATED",
            "PUBLISH_STARTED",
            "PUBLISH_FINISHED",
            "RUN_SUCCESS"
        ]
    );
    let again = api
        .post(&format!("/v1/runs/{run}/success"), json!({}))
        .await;
    assert_eq!(again.body["success"], true);
    let metrics = api.get(&format!("/v1/runs/{run}/validations")).await;
    let order: Vec<String> = metrics.body["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}:{}",
                m["stage"].as_str().unwrap(),
                m["metricName"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![
            "SOURCE:AMOUNT_SUM",
            "SOURCE:SOURCE_COUNT",
            "STAGING:DUP_PK_COUNT",
            "STAGING:STAGE_COUNT",
            "TARGET:TARGET_COUNT"
        ]
    );
    let events = api.get(&format!("/v1/runs/{run}/events?limit=3")).await;
    let names: Vec<&str> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["PUBLISH_STARTED", "PUBLISH_FINISHED", "RUN_SUCCESS"],
        "the latest 3, oldest first"
    );
    assert_eq!(
        events.body["events"][0]["details"]["publishToken"],
        token.to_string()
    );
    assert_eq!(
        events.body["events"][1]["message"], "INSERT OVERWRITE done",
        "§8: PUBLISH_FINISHED keeps the request's message"
    );
}

#[tokio::test]
async fn validation_start_acks_every_time_but_starts_once() {
    let api = Api::start().await;
    let (run, dispatch) = api.validated_run("K").await;
    let (other_run, other_dispatch) = api.validated_run("K2").await;
    let path = format!("/v1/runs/{run}/validation/start");
    let foreign = api.post(&path, json!({"dispatchId": other_dispatch})).await;
    assert_eq!(
        (
            foreign.status.as_u16(),
            foreign.body["code"].as_str().unwrap()
        ),
        (409, "DISPATCH_MISMATCH")
    );
    assert_eq!(
        api.post(&path, json!({"dispatchId": Uuid::new_v4()}))
            .await
            .body["code"],
        "DISPATCH_MISMATCH"
    );
    let empty = api.post(&path, json!({"dispatchId": ""})).await;
    assert_eq!(
        empty.status, 422,
        "an empty dispatchId is a client mistake, never a 500"
    );
    assert_eq!(
        api.post(&path, json!({"dispatchId": dispatch})).await.body["started"],
        true
    );
    // A duplicate delivery: acknowledged again, not started again.
    let dup = api.post(&path, json!({"dispatchId": dispatch})).await;
    assert_eq!(
        dup.body,
        json!({"started": false, "runStatus": "STAGE_VALIDATING", "jobKey": null, "businessKey": null, "snapshotScn": null,
        "hdfsRunPath": null, "stageTable": null, "sourceCount": null, "extractedCount": null, "sourceMetrics": {}})
    );
    assert_eq!(
        api.events(run)
            .await
            .iter()
            .filter(|e| *e == "STAGE_VALIDATION_STARTED")
            .count(),
        1
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND status = 'ACKED'",
            other_run
        )
        .await,
        0
    );
    let extracting = api.extracting_run("JOB", "K3", &[1]).await;
    let r = api
        .post(
            &format!("/v1/runs/{extracting}/validation/start"),
            json!({"dispatchId": dispatch}),
        )
        .await;
    assert_eq!(r.body["code"], "DISPATCH_MISMATCH");
    let nf = api
        .post(
            &format!("/v1/runs/{}/validation/start", Uuid::new_v4()),
            json!({"dispatchId": dispatch}),
        )
        .await;
    assert_eq!(nf.body["code"], "RUN_NOT_FOUND");
}

#[tokio::test]
async fn metrics_are_upserted_and_judged_from_the_ledger() {
    let api = Api::start().await;
    let (run, dispatch) = api.validated_run("K").await;
    let early = api
        .staging_metrics(run, json!([{"metricName":"X","result":"PASS"}]))
        .await;
    assert_eq!(
        (early.status.as_u16(), early.body["code"].as_str().unwrap()),
        (409, "RUN_STATUS_MISMATCH")
    );
    assert_eq!(
        early.body["details"],
        json!({"runStatus": "EXTRACTED_VALIDATED", "stage": "STAGING"})
    );
    let source = api
        .post(
            &format!("/v1/runs/{run}/validations"),
            json!({"stage":"SOURCE","metrics":[{"metricName":"X","result":"PASS"}]}),
        )
        .await;
    assert_eq!(source.status, 422);
    api.post(
        &format!("/v1/runs/{run}/validation/start"),
        json!({"dispatchId": dispatch}),
    )
    .await;
    let sv = format!("/v1/runs/{run}/stage-validated");
    assert_eq!(
        api.post(&sv, json!({})).await.body,
        json!({"stageValidated": false, "runStatus": "STAGE_VALIDATING", "reasons": ["NO_METRICS"]})
    );
    let r = api
        .staging_metrics(run, json!([{"metricName":"MIN_TS","result":"FAIL"},{"metricName":"AMOUNT","result":"FAIL"},{"metricName":"AMOUNT","result":"WARN"},
                                     {"metricName":"STAGE_COUNT","actualValue":"NULL","result":"PASS"}]))
        .await;
    assert_eq!(
        r.body,
        json!({"recorded": 4, "failCount": 1, "runStatus": "STAGE_VALIDATING"})
    );
    assert_eq!(
        api.post(&sv, json!({})).await.body["reasons"],
        json!(["FAIL MIN_TS"])
    );
    api.post(&format!("/v1/runs/{run}/validations"), json!({"stage":"STAGING","queryVersion":"v2","metrics":[{"metricName":"MIN_TS","result":"FAIL"}]})).await;
    assert_eq!(
        api.post(&sv, json!({})).await.body["reasons"],
        json!(["FAIL MIN_TS", "FAIL MIN_TS"]),
        "every query version is judged"
    );
    api.post(&format!("/v1/runs/{run}/validations"), json!({"stage":"STAGING","queryVersion":"v2","metrics":[{"metricName":"MIN_TS","result":"PASS"}]})).await;
    api.staging_metrics(run, json!([{"metricName":"MIN_TS","result":"WARN"}]))
        .await;
    let ok = api.post(&sv, json!({})).await;
    assert_eq!(ok.body["stageValidated"], true);
    assert_eq!(
        api.count(
            "SELECT COALESCE(staging_count, -1) FROM nifi_ops.load_run WHERE run_id = $1",
            run
        )
        .await,
        -1,
        "NULL is not a count"
    );
    assert_eq!(
        api.events(run)
            .await
            .iter()
            .filter(|e| *e == "STAGING_METRIC_FAILED")
            .count(),
        2
    );
    assert_eq!(
        api.post(&sv, json!({})).await.body["stageValidated"],
        true,
        "already validated"
    );
    let created = api.create_run("JOB", "C").await;
    assert_eq!(
        api.post(&format!("/v1/runs/{created}/stage-validated"), json!({}))
            .await
            .body["reasons"],
        json!(["RUN_STATUS CREATED"])
    );
    assert_eq!(
        api.post(
            &format!("/v1/runs/{}/stage-validated", Uuid::new_v4()),
            json!({})
        )
        .await
        .status,
        404
    );
}

#[tokio::test]
async fn publish_is_owned_by_one_token_and_unknown_outcomes_wait_for_a_person() {
    let api = Api::start().await;
    let run = api.stage_validated_run("K").await;
    let claim = format!("/v1/runs/{run}/publish/claim");
    let result = format!("/v1/runs/{run}/publish/result");
    let never_claimed = api
        .post(
            &result,
            json!({"publishToken": Uuid::new_v4(), "outcome": "PUBLISHED"}),
        )
        .await;
    assert_eq!(
        (
            never_claimed.status.as_u16(),
            never_claimed.body["code"].as_str().unwrap()
        ),
        (409, "PUBLISH_TOKEN_MISMATCH")
    );
    let token = Uuid::new_v4();
    assert_eq!(
        api.post(&claim, json!({"publishToken": token})).await.body["claimed"],
        true
    );
    assert_eq!(
        api.post(&claim, json!({"publishToken": token})).await.body["claimed"],
        true,
        "replay"
    );
    assert_eq!(
        api.post(&claim, json!({"publishToken": Uuid::new_v4()}))
            .await
            .body,
        json!({"claimed": false, "runStatus": "PUBLISHING"})
    );
    let wrong = api
        .post(
            &result,
            json!({"publishToken": Uuid::new_v4(), "outcome": "PUBLISHED"}),
        )
        .await;
    assert_eq!(wrong.body["code"], "PUBLISH_TOKEN_MISMATCH");
    let unknown = api.post(&result, json!({"publishToken": token, "outcome": "PUBLISH_UNKNOWN", "errorCode": "TIMEOUT", "message": "HiveServer2 lost"})).await;
    assert_eq!(
        unknown.body,
        json!({"runStatus": "PUBLISH_UNKNOWN", "changed": true})
    );
    assert_eq!(
        api.post(
            &result,
            json!({"publishToken": token, "outcome": "PUBLISH_UNKNOWN"})
        )
        .await
        .body["changed"],
        false
    );
    let late = api
        .post(
            &result,
            json!({"publishToken": token, "outcome": "PUBLISHED"}),
        )
        .await;
    assert_eq!(
        (
            late.status.as_u16(),
            late.body["details"]["runStatus"].as_str().unwrap()
        ),
        (409, "PUBLISH_UNKNOWN")
    );
    let (code, completed): (String, bool) = sqlx::query_as(
        "SELECT error_code, completed_at IS NOT NULL FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!((code.as_str(), completed), ("TIMEOUT", false));
    // The key is blocked until a person resolves it.
    let blocked = api
        .post(
            "/v1/runs",
            json!({"jobKey":"JOB","businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t"}),
        )
        .await;
    assert_eq!(blocked.body["code"], "DUPLICATE_ACTIVE_RUN");
    let resolve = format!("/v1/runs/{run}/publish-unknown/resolve");
    assert_eq!(
        api.post(
            &resolve,
            json!({"resolution": "FAILED_PUBLISH", "reason": "checked the table"})
        )
        .await
        .status,
        403,
        "operators only"
    );
    assert_eq!(
        api.send_op(
            &resolve,
            json!({"resolution": "FAILED_PUBLISH", "reason": "shrt"})
        )
        .await
        .status,
        422
    );
    let resolved = api.send_op(&resolve, json!({"resolution": "FAILED_PUBLISH", "reason": "target partition untouched, verified"})).await;
    assert_eq!(
        resolved.body,
        json!({"runStatus": "FAILED_PUBLISH", "changed": true})
    );
    assert_eq!(
        api.send_op(
            &resolve,
            json!({"resolution": "FAILED_PUBLISH", "reason": "again, same answer"})
        )
        .await
        .body["changed"],
        false
    );
    let other = api
        .send_op(
            &resolve,
            json!({"resolution": "PUBLISHED", "reason": "changed my mind"}),
        )
        .await;
    assert_eq!(other.status, 409);
    let (code, msg, stage): (String, String, String) = sqlx::query_as(
        "SELECT error_code, error_message, error_stage FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(
        (code.as_str(), msg.as_str(), stage.as_str()),
        (
            "PUBLISH_UNKNOWN_RESOLVED",
            "target partition untouched, verified",
            "PUBLISH"
        )
    );
    let (details,): (serde_json::Value,) = sqlx::query_as("SELECT details FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'PUBLISH_UNKNOWN_RESOLVED'")
        .bind(run)
        .fetch_one(&mut api.conn().await)
        .await
        .unwrap();
    assert_eq!(
        details,
        json!({"resolution": "FAILED_PUBLISH", "operator": "alice", "operatorRole": "operator"})
    );
    api.create_run("JOB", "K").await;

    // Resolved as PUBLISHED: error fields cleared, the run continues to SUCCESS.
    let (run2, token2) = api.publishing_run("K2").await;
    api.post(
        &format!("/v1/runs/{run2}/publish/result"),
        json!({"publishToken": token2, "outcome": "PUBLISH_UNKNOWN"}),
    )
    .await;
    let r = api
        .send_op(
            &format!("/v1/runs/{run2}/publish-unknown/resolve"),
            json!({"resolution": "PUBLISHED", "reason": "rows are in the target"}),
        )
        .await;
    assert_eq!(r.body["runStatus"], "PUBLISHED");
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_run WHERE run_id = $1 AND error_code IS NULL AND published_at IS NOT NULL", run2).await, 1);
    // A failed publish ends the run.
    let (run3, token3) = api.publishing_run("K3").await;
    let failed = api
        .post(
            &format!("/v1/runs/{run3}/publish/result"),
            json!({"publishToken": token3, "outcome": "FAILED_PUBLISH", "message": "denied"}),
        )
        .await;
    assert_eq!(failed.body["runStatus"], "FAILED_PUBLISH");
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_run WHERE run_id = $1 AND completed_at IS NOT NULL AND error_code = 'FAILED_PUBLISH'", run3).await, 1);
    assert!(api.events(run3).await.contains(&"RUN_FAILED".to_string()));
}

#[tokio::test]
async fn success_needs_target_metrics_and_takes_the_count() {
    let api = Api::start().await;
    let (run, token) = api.publishing_run("K").await;
    let success = format!("/v1/runs/{run}/success");
    assert_eq!(
        api.post(&success, json!({})).await.body["reasons"],
        json!(["RUN_STATUS PUBLISHING"])
    );
    api.post(
        &format!("/v1/runs/{run}/publish/result"),
        json!({"publishToken": token, "outcome": "PUBLISHED"}),
    )
    .await;
    assert_eq!(
        api.post(&success, json!({})).await.body["reasons"],
        json!(["NO_METRICS"])
    );
    api.post(&format!("/v1/runs/{run}/validations"), json!({"stage":"TARGET","metrics":[{"metricName":"TARGET_COUNT","actualValue":"7","result":"PASS"}]})).await;
    let no_body = api
        .raw(
            "POST",
            &success,
            &[("authorization", &format!("Bearer {NIFI}"))],
            vec![],
        )
        .await;
    assert_eq!(no_body.status, 422, "the body is required (send {{}})");
    assert_eq!(
        api.post(&success, json!({"targetCount": "5"})).await.body["success"],
        true
    );
    assert_eq!(
        api.count(
            "SELECT target_count FROM nifi_ops.load_run WHERE run_id = $1",
            run
        )
        .await,
        5
    );
}

#[tokio::test]
async fn cancel_closes_partitions_and_dispatches_and_nifi_sees_it() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[5, 5]).await;
    let t = Uuid::new_v4();
    api.claim(run, "0000", t).await;
    let cancel = format!("/v1/runs/{run}/cancel");
    assert_eq!(
        api.post(&cancel, json!({"reason": "wrong business date"}))
            .await
            .status,
        403
    );
    let r = api
        .send_op(&cancel, json!({"reason": "wrong business date loaded"}))
        .await;
    assert_eq!(
        r.body,
        json!({"runId": run, "runStatus": "CANCELLED", "changed": true})
    );
    assert_eq!(
        api.send_op(&cancel, json!({"reason": "wrong business date loaded"}))
            .await
            .body["changed"],
        false
    );
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status = 'ABORTED' AND error_code = 'CANCELLED'", run).await, 2);
    let (details,): (serde_json::Value,) = sqlx::query_as("SELECT details FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'RUN_CANCELLED'")
        .bind(run)
        .fetch_one(&mut api.conn().await)
        .await
        .unwrap();
    assert_eq!(
        details,
        json!({"from": "EXTRACTING", "operator": "alice", "operatorRole": "operator", "abortedPartitions": 2})
    );
    // What NiFi sees afterwards.
    assert_eq!(
        api.claim(run, "0001", Uuid::new_v4()).await.body["claimed"],
        false
    );
    let late = api.chunk(run, "0000", t, 0, 1, 5).await;
    assert_eq!(
        (
            late.status.as_u16(),
            late.body["runStatus"].as_str().unwrap(),
            late.body["partitionStatus"].as_str().unwrap()
        ),
        (200, "CANCELLED", "ABORTED")
    );
    assert_eq!(
        api.post(&format!("/v1/runs/{run}/stage-validated"), json!({}))
            .await
            .body["reasons"],
        json!(["RUN_STATUS CANCELLED"])
    );

    // From EXTRACTED_VALIDATED: its VALIDATE_RUN dispatch is settled DEAD, and raises no alert.
    let (run2, dispatch) = api.validated_run("K2").await;
    api.send_op(
        &format!("/v1/runs/{run2}/cancel"),
        json!({"reason": "re-run requested"}),
    )
    .await;
    let (status, err): (String, String) = sqlx::query_as(
        "SELECT status, last_error FROM nifi_ops.load_dispatch WHERE dispatch_id = $1",
    )
    .bind(dispatch)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!((status.as_str(), err.as_str()), ("DEAD", "run cancelled"));
    let start = api
        .post(
            &format!("/v1/runs/{run2}/validation/start"),
            json!({"dispatchId": dispatch}),
        )
        .await;
    assert_eq!(
        (
            start.body["started"].as_bool(),
            start.body["runStatus"].as_str()
        ),
        (Some(false), Some("CANCELLED"))
    );
    let summary = api.get("/v1/monitor/summary").await;
    assert!(
        summary.body["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["kind"] != "DISPATCH_DEAD" && a["kind"] != "RUN_FAILED"),
        "{}",
        summary.body
    );

    let (run3, _) = api.publishing_run("K3").await;
    let refused = api
        .send_op(
            &format!("/v1/runs/{run3}/cancel"),
            json!({"reason": "too late for this"}),
        )
        .await;
    assert_eq!(
        (
            refused.status.as_u16(),
            refused.body["details"]["runStatus"].as_str().unwrap()
        ),
        (409, "PUBLISHING")
    );
}

#[tokio::test]
async fn resend_resets_dead_or_sent_dispatches_only() {
    let api = Api::start().await;
    let (run, dispatch) = api.validated_run("K").await;
    let path = format!("/v1/runs/{run}/dispatches/{dispatch}/resend");
    let pending = api.send_op(&path, json!({})).await;
    assert_eq!(
        (
            pending.status.as_u16(),
            pending.body["code"].as_str().unwrap()
        ),
        (409, "DISPATCH_STATUS_MISMATCH")
    );
    assert_eq!(pending.body["details"], json!({"status": "PENDING"}));
    api.sql("UPDATE nifi_ops.load_dispatch SET status = 'DEAD', attempt_count = 20, last_error = 'HTTP 400' WHERE run_id = $1", run).await;
    let r = api.send("POST", &path, Some(OPERATOR), None).await;
    assert_eq!(r.body, json!({"dispatchId": dispatch, "status": "PENDING"}));
    let (attempts, err): (i32, Option<String>) = sqlx::query_as(
        "SELECT attempt_count, last_error FROM nifi_ops.load_dispatch WHERE dispatch_id = $1",
    )
    .bind(dispatch)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!((attempts, err), (0, None));
    let (details,): (serde_json::Value,) = sqlx::query_as("SELECT details FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'DISPATCH_RESENT'")
        .bind(run)
        .fetch_one(&mut api.conn().await)
        .await
        .unwrap();
    assert_eq!(
        details,
        json!({"dispatchId": dispatch, "previousStatus": "DEAD", "operator": "alice", "operatorRole": "operator"})
    );
    let nf = api
        .send_op(
            &format!("/v1/runs/{run}/dispatches/{}/resend", Uuid::new_v4()),
            json!({}),
        )
        .await;
    assert_eq!(
        (nf.status.as_u16(), nf.body["code"].as_str().unwrap()),
        (404, "DISPATCH_NOT_FOUND")
    );
    let bad = api
        .send_op(&format!("/v1/runs/{run}/dispatches/nope/resend"), json!({}))
        .await;
    assert_eq!(
        bad.body["details"]["errors"][0]["field"],
        "path.dispatch_id"
    );
}

#[tokio::test]
async fn cleanup_candidates_and_reports_follow_retention() {
    let api = Api::start().await;
    let failed = api.create_run("JOB", "F").await;
    api.post(&format!("/v1/runs/{failed}/fail"), json!({"expectedStatus":"CREATED","failStatus":"FAILED_MANIFEST","errorStage":"M","errorCode":"X"})).await;
    let report = format!("/v1/runs/{failed}/cleanup");
    let early = api.post(&report, json!({})).await;
    assert_eq!(
        (early.status.as_u16(), early.body["code"].as_str().unwrap()),
        (409, "CLEANUP_NOT_DUE")
    );
    assert_eq!(
        api.get("/v1/cleanup/candidates").await.body,
        json!({"runs": []})
    );
    api.sql(
        "UPDATE nifi_ops.load_run SET completed_at = now() - interval '15 days' WHERE run_id = $1",
        failed,
    )
    .await;
    let c = api.get("/v1/cleanup/candidates?jobKey=JOB&limit=10").await;
    assert_eq!(c.body["runs"][0]["runId"], failed.to_string());
    assert_eq!(c.body["runs"][0]["status"], "FAILED_MANIFEST");
    assert_eq!(api.get("/v1/monitor/summary").await.body["cleanupDue"], 1);
    let r = api
        .send_op(
            &report,
            json!({"droppedTable": "tmp_x", "deletedPath": "/data/stage/JOB"}),
        )
        .await;
    assert_eq!(
        r.body,
        json!({"runStatus": "FAILED_MANIFEST", "changed": true})
    );
    assert_eq!(api.post(&report, json!({})).await.body["changed"], false);
    let (details,): (serde_json::Value,) = sqlx::query_as(
        "SELECT details FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'RUN_CLEANED'",
    )
    .bind(failed)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(
        details,
        json!({"droppedTable": "tmp_x", "deletedPath": "/data/stage/JOB", "operator": "alice", "operatorRole": "operator"})
    );
    assert_eq!(
        api.get("/v1/cleanup/candidates").await.body["runs"],
        json!([])
    );
    // A job's own retention overrides the global one.
    let other = api.create_run("SHORT", "S").await;
    api.post(&format!("/v1/runs/{other}/fail"), json!({"expectedStatus":"CREATED","failStatus":"FAILED_MANIFEST","errorStage":"M","errorCode":"X"})).await;
    api.sql(
        "UPDATE nifi_ops.load_run SET completed_at = now() - interval '2 days' WHERE run_id = $1",
        other,
    )
    .await;
    assert_eq!(
        api.get("/v1/cleanup/candidates").await.body["runs"],
        json!([])
    );
    sqlx::query("INSERT INTO nifi_ops.load_job (job_key, settings) VALUES ('SHORT', '{\"cleanup\": {\"failed_retention\": \"1d\"}}')")
        .execute(&mut api.conn().await)
        .await
        .unwrap();
    assert_eq!(
        api.get("/v1/cleanup/candidates").await.body["runs"][0]["runId"],
        other.to_string()
    );
    assert_eq!(
        api.get("/v1/cleanup/candidates?jobKey=bad-key")
            .await
            .status,
        422
    );
    let active = api.create_run("JOB", "A").await;
    assert_eq!(
        api.post(&format!("/v1/runs/{active}/cleanup"), json!({}))
            .await
            .body["details"],
        json!({"runStatus": "CREATED"})
    );
}

#[tokio::test]
async fn monitor_summary_counts_and_alerts() {
    let api = Api::start().await;
    let created = api.create_run("JOB", "A").await;
    let (unknown, token) = api.publishing_run("U").await;
    api.post(
        &format!("/v1/runs/{unknown}/publish/result"),
        json!({"publishToken": token, "outcome": "PUBLISH_UNKNOWN", "message": "  lost  "}),
    )
    .await;
    let failed = api.extracting_run("JOB", "F", &[3]).await;
    api.post(&format!("/v1/runs/{failed}/fail"), json!({"expectedStatus":"EXTRACTING","failStatus":"FAILED_EXTRACT","errorStage":"E","errorCode":"HDFS","message":"down"})).await;
    let (dead_run, dispatch) = api.validated_run("D").await;
    api.sql("UPDATE nifi_ops.load_dispatch SET status = 'DEAD', last_error = 'HTTP 404' WHERE run_id = $1", dead_run).await;
    api.sql(
        "UPDATE nifi_ops.load_run SET heartbeat_at = now() - interval '3 hours' WHERE run_id = $1",
        created,
    )
    .await;
    sqlx::query("INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, process_group, message) VALUES (gen_random_uuid(), 'ERROR', 'CLEANUP_FAILED', $1, 'PG-90', 'hdfs dfs -rm failed')")
        .bind(failed)
        .execute(&mut api.conn().await)
        .await
        .unwrap();
    let s = api
        .send(
            "GET",
            "/v1/monitor/summary?alertLimit=50",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(s.status, 200);
    assert_eq!(
        s.body["activeRuns"],
        json!({"CREATED": 1, "PUBLISH_UNKNOWN": 1, "EXTRACTED_VALIDATED": 1})
    );
    assert_eq!(s.body["recentRuns"], json!({"FAILED_EXTRACT": 1}));
    assert_eq!(s.body["recentWindowHours"], 24);
    assert_eq!(
        s.body["dispatches"],
        json!({"PENDING": 0, "SENT": 0, "DEAD": 1})
    );
    let kinds: Vec<(String, String)> = s.body["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["kind"].as_str().unwrap().to_string(),
                a["runId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let errors = &kinds[..3];
    assert!(
        errors.contains(&("PUBLISH_UNKNOWN".into(), unknown.to_string())),
        "{kinds:?}"
    );
    assert!(errors.contains(&("RUN_FAILED".into(), failed.to_string())));
    assert!(errors.contains(&("DISPATCH_DEAD".into(), dead_run.to_string())));
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    assert!(kinds[3..].contains(&("RUN_STALE".into(), created.to_string())));
    assert!(kinds[3..].contains(&("CLEANUP_FAILED".into(), failed.to_string())));
    let alerts = s.body["alerts"].as_array().unwrap();
    let pu = alerts
        .iter()
        .find(|a| a["kind"] == "PUBLISH_UNKNOWN")
        .unwrap();
    assert_eq!(pu["message"], "lost", "trimmed");
    let dd = alerts
        .iter()
        .find(|a| a["kind"] == "DISPATCH_DEAD")
        .unwrap();
    assert_eq!(
        (dd["message"].as_str(), dd["dispatchId"].as_str()),
        (
            Some("VALIDATE_RUN: HTTP 404"),
            Some(dispatch.to_string().as_str())
        )
    );
    let cf = alerts
        .iter()
        .find(|a| a["kind"] == "CLEANUP_FAILED")
        .unwrap();
    assert_eq!(cf["status"], serde_json::Value::Null);
    assert_eq!(
        api.get("/v1/monitor/summary?alertLimit=2").await.body["alerts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        api.get("/v1/monitor/summary?alertLimit=0").await.status,
        422
    );
}
