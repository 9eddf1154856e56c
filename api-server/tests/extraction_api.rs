//! Every extraction endpoint (CONTRACT §4.1–§4.8) over real HTTP on a real ledger: success paths,
//! each error code, and the ledger rows and events behind them.
mod common;
use common::*;
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn create_run_answers_the_contract_shape_and_writes_run_and_event() {
    let api = Api::start().await;
    let r = api
        .post(
            "/v1/runs",
            json!({"jobKey":"ORACLE_INSP_DTL_DAILY","businessKey":"2026-09-28","hdfsRoot":"/data/nifi/stage/",
                   "stageTablePrefix":"tmp_insp_dtl_","allowEmptySource":"false","parameters":{"trigger":"SCHEDULE","n":1}}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let run: Uuid = r.body["runId"].as_str().unwrap().parse().unwrap();
    assert_eq!(r.body["status"], "CREATED");
    assert_eq!(
        r.body["hdfsRunPath"],
        format!("/data/nifi/stage/ORACLE_INSP_DTL_DAILY/run_id={run}")
    );
    assert_eq!(
        r.body["stageTable"],
        format!("tmp_insp_dtl_{}", run.simple())
    );
    assert_eq!(r.body.as_object().unwrap().len(), 4);
    let (params, version): (serde_json::Value, i32) =
        sqlx::query_as("SELECT parameters, version_no FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!(
        params,
        json!({"trigger":"SCHEDULE","n":1,"allowEmptySource":false})
    );
    assert_eq!(version, 0);
    assert_eq!(api.events(run).await, vec!["RUN_STARTED"]);
}

#[tokio::test]
async fn create_run_refusals() {
    let api = Api::start_with(|c| c.jobs.require_registered = false).await;
    api.create_run("JOB", "K1").await;
    let dup = api
        .post(
            "/v1/runs",
            json!({"jobKey":"JOB","businessKey":"K1","hdfsRoot":"/d","stageTablePrefix":"t"}),
        )
        .await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.body["code"], "DUPLICATE_ACTIVE_RUN");
    assert_eq!(
        dup.body["details"],
        json!({"jobKey":"JOB","businessKey":"K1"})
    );

    let dotdot = api.post("/v1/runs", json!({"jobKey":"JOB","businessKey":"K2","hdfsRoot":"/data/../etc","stageTablePrefix":"t"})).await;
    assert_eq!(
        (
            dotdot.status.as_u16(),
            dotdot.body["code"].as_str().unwrap()
        ),
        (422, "INVALID_HDFS_ROOT")
    );

    sqlx::query(
        "INSERT INTO nifi_ops.load_job (job_key, suspended) VALUES ('SUSP', true), ('GONE', true)",
    )
    .execute(&mut api.conn().await)
    .await
    .unwrap();
    sqlx::query("UPDATE nifi_ops.load_job SET removed_at = now() WHERE job_key = 'GONE'")
        .execute(&mut api.conn().await)
        .await
        .unwrap();
    let susp = api
        .post(
            "/v1/runs",
            json!({"jobKey":"SUSP","businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t"}),
        )
        .await;
    assert_eq!(susp.status, 409);
    assert_eq!(susp.body["code"], "JOB_SUSPENDED");
    assert_eq!(susp.body["details"], json!({"jobKey":"SUSP"}));
    // A removed row counts as absent: its suspend flag is ignored.
    let gone = api
        .post(
            "/v1/runs",
            json!({"jobKey":"GONE","businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t"}),
        )
        .await;
    assert_eq!(gone.status, 200);
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_run WHERE job_key = 'SUSP' AND $1::uuid IS NOT NULL", Uuid::nil()).await, 0);

    let registered = Api::start_with(|c| c.jobs.require_registered = true).await;
    let r = registered
        .post(
            "/v1/runs",
            json!({"jobKey":"NEW","businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t"}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["code"].as_str().unwrap()),
        (422, "JOB_NOT_REGISTERED")
    );
    assert_eq!(r.body["details"], json!({"jobKey":"NEW"}));
}

#[tokio::test]
async fn a_terminal_run_frees_its_key() {
    let api = Api::start().await;
    let run = api.create_run("JOB", "K").await;
    let f = api
        .post(&format!("/v1/runs/{run}/fail"), json!({"expectedStatus":"CREATED","failStatus":"FAILED_MANIFEST","errorStage":"MANIFEST","errorCode":"X"}))
        .await;
    assert_eq!(
        f.body,
        json!({"runId": run, "runStatus":"FAILED_MANIFEST","changed":true})
    );
    let again = api.create_run("JOB", "K").await;
    assert_ne!(again, run);
}

#[tokio::test]
async fn manifest_registers_partitions_metrics_and_answers_in_request_order() {
    let api = Api::start().await;
    let run = api.create_run("JOB", "K").await;
    let body = json!({"snapshotScn":"1234567890","sourceCount":"30","sourceNullSplitCount":0,"sourceMinSplit":"0","sourceMaxSplit":"3000",
        "plannedPartitionCount":"3","sourceMetrics":{"AMOUNT_SUM":"123.45","SOURCE_COUNT":"999"},"sourceMetricsVersion":"v1",
        "partitions":[{"partitionId":"0001","lowerBound":1000,"upperBound":2000,"expectedRowCount":20},
                      {"partitionId":"0000","lowerBound":"0","upperBound":"1000","upperInclusive":"false","expectedRowCount":"10"},
                      {"partitionId":"0002","lowerBound":"2000","upperBound":"3000","upperInclusive":true,"expectedRowCount":0}]});
    let r = api
        .post(&format!("/v1/runs/{run}/manifest"), body.clone())
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({"runId": run, "status":"EXTRACTING","emptyPartitionCount":1,"validationScheduled":false,"dispatchPartitions":[
            {"partitionId":"0001","lowerBound":"1000","upperBound":"2000","upperInclusive":false,"isNullPartition":false,"expectedRowCount":20},
            {"partitionId":"0000","lowerBound":"0","upperBound":"1000","upperInclusive":false,"isNullPartition":false,"expectedRowCount":10}]})
    );
    let (status, expected, success, scn, version): (String, i32, i32, String, i32) = sqlx::query_as(
        "SELECT status, expected_partition_count, success_partition_count, snapshot_scn::text, version_no FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), expected, success, scn.as_str(), version),
        ("EXTRACTING", 3, 1, "1234567890", 1)
    );
    let metrics: Vec<(String, String)> =
        sqlx::query_as("SELECT metric_name, actual_value FROM nifi_ops.load_validation WHERE run_id = $1 AND stage = 'SOURCE' ORDER BY metric_name")
            .bind(run)
            .fetch_all(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!(
        metrics,
        vec![
            ("AMOUNT_SUM".into(), "123.45".into()),
            ("SOURCE_COUNT".into(), "30".into())
        ]
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status = 'SUCCESS'",
            run
        )
        .await,
        1
    );
    assert_eq!(
        api.events(run).await,
        vec!["RUN_STARTED", "MANIFEST_CREATED"]
    );

    // The same plan again (its answer was lost): the stored state, ordered by id.
    let replay = api.post(&format!("/v1/runs/{run}/manifest"), body).await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay.body["dispatchPartitions"][0]["partitionId"], "0000");
    assert_eq!(replay.body["validationScheduled"], false);
    // A different plan is a status mismatch.
    let other = api
        .post(&format!("/v1/runs/{run}/manifest"), manifest(&[30]))
        .await;
    assert_eq!(
        (other.status.as_u16(), other.body["code"].as_str().unwrap()),
        (409, "RUN_STATUS_MISMATCH")
    );
    assert_eq!(other.body["details"], json!({"runStatus":"EXTRACTING"}));
}

#[tokio::test]
async fn invalid_manifest_commits_failed_manifest_then_answers_422() {
    let api = Api::start().await;
    let run = api.create_run("JOB", "K").await;
    let mut m = manifest(&[10, 20]);
    m["sourceCount"] = json!(31);
    m["plannedPartitionCount"] = json!(3);
    let r = api
        .post(&format!("/v1/runs/{run}/manifest"), m.clone())
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.body["code"], "MANIFEST_INVALID");
    let violations = json!([
        "PARTITION_COUNT_MISMATCH planned=3 actual=2",
        "EXPECTED_SUM_MISMATCH sum=30 source=31"
    ]);
    assert_eq!(r.body["details"]["violations"], violations);
    assert_eq!(
        r.body["message"],
        "PARTITION_COUNT_MISMATCH planned=3 actual=2; EXPECTED_SUM_MISMATCH sum=30 source=31"
    );
    let (status, code, stage): (String, String, String) = sqlx::query_as(
        "SELECT status, error_code, error_stage FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), code.as_str(), stage.as_str()),
        ("FAILED_MANIFEST", "MANIFEST_INVALID", "MANIFEST")
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1",
            run
        )
        .await,
        0
    );
    assert_eq!(
        api.events(run).await,
        vec!["RUN_STARTED", "MANIFEST_INVALID"]
    );
    // FAILED_MANIFEST has no partitions: any manifest now is 409.
    let again = api.post(&format!("/v1/runs/{run}/manifest"), m).await;
    assert_eq!(again.status, 409);
    let missing = api
        .post(
            &format!("/v1/runs/{}/manifest", Uuid::new_v4()),
            manifest(&[1]),
        )
        .await;
    assert_eq!(
        (
            missing.status.as_u16(),
            missing.body["code"].as_str().unwrap()
        ),
        (404, "RUN_NOT_FOUND")
    );
}

#[tokio::test]
async fn all_empty_manifest_completes_in_the_same_transaction() {
    let api = Api::start().await;
    let r = api
        .post("/v1/runs", json!({"jobKey":"JOB","businessKey":"E","hdfsRoot":"/d","stageTablePrefix":"t","allowEmptySource":true}))
        .await;
    let run: Uuid = r.body["runId"].as_str().unwrap().parse().unwrap();
    let r = api
        .post(&format!("/v1/runs/{run}/manifest"), manifest(&[0, 0]))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["status"], "EXTRACTED_VALIDATED");
    assert_eq!(r.body["validationScheduled"], true);
    assert_eq!(r.body["dispatchPartitions"], json!([]));
    assert_eq!(r.body["emptyPartitionCount"], 2);
    assert_eq!(
        api.count(
            "SELECT version_no::bigint FROM nifi_ops.load_run WHERE run_id = $1",
            run
        )
        .await,
        2
    );
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN' AND status = 'PENDING'", run).await, 1);
    assert_eq!(
        api.events(run).await,
        vec!["RUN_STARTED", "MANIFEST_CREATED", "EXTRACT_VALIDATED"]
    );
    // Without allowEmptySource the same plan is refused.
    let blocked = api.create_run("JOB", "E2").await;
    let r = api
        .post(&format!("/v1/runs/{blocked}/manifest"), manifest(&[0]))
        .await;
    assert_eq!(
        r.body["details"]["violations"],
        json!(["EMPTY_SOURCE_BLOCKED"])
    );
}

#[tokio::test]
async fn run_fail_pairs_idempotency_and_refusals() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[5, 5]).await;
    let token = Uuid::new_v4();
    api.claim(run, "0000", token).await;
    let path = format!("/v1/runs/{run}/fail");
    let not_allowed = api
        .post(&format!("/v1/runs/{}/fail", Uuid::new_v4()), json!({"expectedStatus":"EXTRACTING","failStatus":"CANCELLED","errorStage":"S","errorCode":"C"}))
        .await;
    assert_eq!(
        not_allowed.status, 422,
        "checked before the run is looked up"
    );
    assert_eq!(not_allowed.body["code"], "FAIL_TRANSITION_NOT_ALLOWED");
    assert_eq!(
        not_allowed.body["details"],
        json!({"expectedStatus":"EXTRACTING","failStatus":"CANCELLED"})
    );
    let stale = api.post(&path, json!({"expectedStatus":"CREATED","failStatus":"FAILED_MANIFEST","errorStage":"S","errorCode":"C"})).await;
    assert_eq!(
        (
            stale.status.as_u16(),
            stale.body["details"]["runStatus"].as_str().unwrap()
        ),
        (409, "EXTRACTING")
    );
    let body = json!({"expectedStatus":"EXTRACTING","failStatus":"FAILED_EXTRACT","errorStage":"E".repeat(90),"errorCode":"HDFS_DOWN","message":"boom"});
    let r = api.post(&path, body.clone()).await;
    assert_eq!(
        r.body,
        json!({"runId": run, "runStatus":"FAILED_EXTRACT","changed":true})
    );
    let again = api.post(&path, body).await;
    assert_eq!(again.body["changed"], false);
    let (stage, msg): (String, String) = sqlx::query_as(
        "SELECT error_stage, error_message FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!((stage.len(), msg.as_str()), (80, "boom"));
    // [v1-ext] unfinished partitions are ABORTED with the run's status as their code.
    let parts: Vec<(String, String)> =
        sqlx::query_as("SELECT status, error_code FROM nifi_ops.load_partition WHERE run_id = $1 ORDER BY partition_id")
            .bind(run)
            .fetch_all(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!(
        parts,
        vec![
            ("ABORTED".into(), "FAILED_EXTRACT".into()),
            ("ABORTED".into(), "FAILED_EXTRACT".into())
        ]
    );
    let (details,): (serde_json::Value,) = sqlx::query_as(
        "SELECT details FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'RUN_FAILED'",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(details["abortedPartitions"], 2);
    assert_eq!(details["from"], "EXTRACTING");
    let missing = api.post(&format!("/v1/runs/{}/fail", Uuid::new_v4()), json!({"expectedStatus":"EXTRACTING","failStatus":"FAILED_EXTRACT","errorStage":"S","errorCode":"C"})).await;
    assert_eq!(missing.status, 404);
}

#[tokio::test]
async fn list_and_detail() {
    let api = Api::start().await;
    let a = api.extracting_run("JOB", "A", &[3]).await;
    let b = api.create_run("OTHER", "B").await;
    let all = api.get("/v1/runs").await;
    assert_eq!(all.status, 200);
    let ids: Vec<&str> = all
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![b.to_string(), a.to_string()], "newest first");
    let one = api
        .send(
            "GET",
            "/v1/runs?jobKey=JOB&status=EXTRACTING&limit=1&extra=ignored",
            Some(OPERATOR),
            None,
        )
        .await;
    assert_eq!(one.body.as_array().unwrap().len(), 1);
    let row = &one.body[0];
    for key in [
        "runId",
        "jobKey",
        "businessKey",
        "status",
        "sourceCount",
        "extractedCount",
        "stagingCount",
        "targetCount",
        "expectedPartitionCount",
        "successPartitionCount",
        "failedPartitionCount",
        "startedAt",
        "heartbeatAt",
        "completedAt",
        "errorCode",
    ] {
        assert!(row.get(key).is_some(), "missing {key}");
    }
    assert!(row["startedAt"].as_str().unwrap().ends_with('Z'));
    let bad = api.get("/v1/runs?status=RUNNING&limit=0").await;
    assert_eq!(bad.status, 422);
    let fields: Vec<&str> = bad.body["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, vec!["query.status", "query.limit"]);
    // A parameter given twice with different values is refused, whichever comes last (the fuzzer
    // found `limit=<garbage>&limit=3` on the cleanup candidates answered 200); the same value twice
    // is one value.
    for path in [
        "/v1/runs?limit=x&limit=3",
        "/v1/runs?limit=3&limit=x",
        "/v1/runs?status=SUCCESS&status=FAILED_EXTRACT",
        "/v1/runs?jobKey=A&job_key=B",
        "/v1/cleanup/candidates?limit=%1C&limit=3",
        "/v1/cleanup/candidates?jobKey=A&jobKey=B",
        &format!("/v1/runs/{a}/events?limit=2&limit=3"),
    ] {
        let twice = api.get(path).await;
        assert_eq!(twice.status, 422, "{path}: {}", twice.body);
        let message = &twice.body["details"]["errors"][0]["message"];
        assert_eq!(
            message, "is given more than once with different values",
            "{path}"
        );
    }
    let same = api.get("/v1/runs?limit=1&limit=1").await;
    assert_eq!(
        (same.status.as_u16(), same.body.as_array().unwrap().len()),
        (200, 1)
    );

    let token = Uuid::new_v4();
    api.claim(a, "0000", token).await;
    let d = api.get(&format!("/v1/runs/{a}")).await;
    assert_eq!(d.status, 200);
    assert_eq!(d.body["snapshotScn"], "1234567890");
    assert_eq!(d.body["partitionCounts"], json!({"RUNNING": 1}));
    assert_eq!(d.body["partitions"][0]["workerNode"], "nifi-01");
    assert_eq!(d.body["partitions"][0]["attemptCount"], 1);
    assert_eq!(d.body["dispatches"], json!([]));
    assert_eq!(d.body["stageTable"], format!("tmp_{}", a.simple()));
    let nf = api.get(&format!("/v1/runs/{}", Uuid::new_v4())).await;
    assert_eq!(
        (nf.status.as_u16(), nf.body["code"].as_str().unwrap()),
        (404, "RUN_NOT_FOUND")
    );
}

#[tokio::test]
async fn claim_replay_refusal_and_not_found() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[5, 0]).await;
    let t1 = Uuid::new_v4();
    let r = api.claim(run, "0000", t1).await;
    assert_eq!(
        r.body,
        json!({"claimed":true,"runStatus":"EXTRACTING","partitionStatus":"RUNNING","attempt":1})
    );
    // Same token in another accepted form: a replay, attempt unchanged.
    let braced = format!("{{{}}}", t1.simple().to_string().to_uppercase());
    let r = api
        .post(
            &format!("/v1/runs/{run}/partitions/0000/claim"),
            json!({"claimToken": braced, "workerNode":"nifi-01"}),
        )
        .await;
    assert_eq!(r.body["claimed"], true);
    assert_eq!(r.body["attempt"], 1);
    let other = api.claim(run, "0000", Uuid::new_v4()).await;
    assert_eq!(
        other.body,
        json!({"claimed":false,"runStatus":"EXTRACTING","partitionStatus":"RUNNING","attempt":1})
    );
    let done = api.claim(run, "0001", Uuid::new_v4()).await;
    assert_eq!(done.body["partitionStatus"], "SUCCESS");
    assert_eq!(done.body["claimed"], false);
    let nf = api.claim(run, "0009", Uuid::new_v4()).await;
    assert_eq!(
        (nf.status.as_u16(), nf.body["code"].as_str().unwrap()),
        (404, "PARTITION_NOT_FOUND")
    );
    let nr = api.claim(Uuid::new_v4(), "0000", Uuid::new_v4()).await;
    assert_eq!(nr.body["code"], "RUN_NOT_FOUND");
    let events = api.events(run).await;
    assert_eq!(
        events.iter().filter(|e| *e == "PARTITION_STARTED").count(),
        1
    );
    let created = api.create_run("JOB", "C").await;
    let not_extracting = api.claim(created, "0000", Uuid::new_v4()).await;
    assert_eq!(not_extracting.body["code"], "PARTITION_NOT_FOUND");
}

#[tokio::test]
async fn chunks_progress_success_completion_and_validate_run() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[10, 7]).await;
    let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
    api.claim(run, "0000", t0).await;
    api.claim(run, "0001", t1).await;
    let r = api.chunk(run, "0000", t0, 1, 2, 4).await;
    assert_eq!(
        r.body,
        json!({"recorded":true,"partitionStatus":"RUNNING","runStatus":"EXTRACTING","receivedChunks":1,"chunkCount":2,"validationScheduled":false})
    );
    let r = api.chunk(run, "0000", t0, 0, 2, 6).await;
    assert_eq!(r.body["partitionStatus"], "SUCCESS");
    assert_eq!(r.body["validationScheduled"], false);
    // An identical replay after success is accepted without rewriting the row (same row
    // version), a changed one is a conflict and changes nothing.
    let version = async || -> String {
        sqlx::query_scalar("SELECT xmin::text FROM nifi_ops.load_file WHERE run_id = $1 AND partition_id = '0000' AND chunk_index = 0")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap()
    };
    let before = version().await;
    assert_eq!(api.chunk(run, "0000", t0, 0, 2, 6).await.status, 200);
    assert_eq!(
        version().await,
        before,
        "an identical replay rewrote the chunk row"
    );
    let conflict = api.chunk(run, "0000", t0, 0, 2, 5).await;
    assert_eq!(
        (
            conflict.status.as_u16(),
            conflict.body["code"].as_str().unwrap()
        ),
        (409, "CHUNK_CONFLICT")
    );
    assert_eq!(api.count("SELECT record_count FROM nifi_ops.load_file WHERE run_id = $1 AND partition_id = '0000' AND chunk_index = 0", run).await, 6);
    let last = api.chunk(run, "0001", t1, 0, 1, 7).await;
    assert_eq!(
        last.body,
        json!({"recorded":true,"partitionStatus":"SUCCESS","runStatus":"EXTRACTED_VALIDATED","receivedChunks":1,"chunkCount":1,"validationScheduled":true})
    );
    let (status, extracted, success): (String, i64, i32) =
        sqlx::query_as("SELECT status, extracted_count, success_partition_count FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), extracted, success),
        ("EXTRACTED_VALIDATED", 17, 2)
    );
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'", run).await, 1);
    let (rows, files, bytes): (i64, i32, i64) =
        sqlx::query_as("SELECT actual_row_count, file_count, byte_count FROM nifi_ops.load_partition WHERE run_id = $1 AND partition_id = '0000'")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!((rows, files, bytes), (10, 2, 200));
    // A late chunk after completion is recorded, not judged.
    let late = api.chunk(run, "0001", t1, 0, 1, 7).await;
    assert_eq!(late.body["runStatus"], "EXTRACTED_VALIDATED");
    let events = api.events(run).await;
    assert_eq!(
        events.iter().filter(|e| *e == "PARTITION_SUCCESS").count(),
        2
    );
    assert_eq!(
        events.iter().filter(|e| *e == "EXTRACT_VALIDATED").count(),
        1
    );
}

#[tokio::test]
async fn chunk_refusals_write_nothing() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[10, 10]).await;
    let t = Uuid::new_v4();
    api.claim(run, "0000", t).await;
    let stale = api.chunk(run, "0000", Uuid::new_v4(), 0, 1, 10).await;
    assert_eq!(
        (stale.status.as_u16(), stale.body["code"].as_str().unwrap()),
        (409, "CLAIM_MISMATCH")
    );
    let unclaimed = api.chunk(run, "0001", t, 0, 1, 10).await;
    assert_eq!(unclaimed.body["code"], "CLAIM_MISMATCH");
    let mut outside = chunk_body(run, "0000", t, 0, 1, 10);
    outside["hdfsPath"] = json!(format!(
        "/data/stage/JOB/run_id={run}/../run_id=x/part.parquet"
    ));
    let r = api
        .post(&format!("/v1/runs/{run}/partitions/0000/chunks"), outside)
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["code"].as_str().unwrap()),
        (422, "HDFS_PATH_OUTSIDE_RUN")
    );
    assert_eq!(
        r.body["message"], "HDFS_PATH_OUTSIDE_RUN",
        "§3.7: the message is the code"
    );
    let mut sibling = chunk_body(run, "0000", t, 0, 1, 10);
    sibling["hdfsPath"] = json!(format!("/data/stage/JOB/run_id={run}x/part.parquet"));
    assert_eq!(
        api.post(&format!("/v1/runs/{run}/partitions/0000/chunks"), sibling)
            .await
            .body["code"],
        "HDFS_PATH_OUTSIDE_RUN"
    );
    let range = api.chunk(Uuid::new_v4(), "0000", t, 2, 2, 10).await;
    assert_eq!(
        (range.status.as_u16(), range.body["code"].as_str().unwrap()),
        (422, "CHUNK_INDEX_OUT_OF_RANGE"),
        "before any lookup"
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1",
            run
        )
        .await,
        0
    );
    // Another chunk row may not record the same file.
    let t1 = Uuid::new_v4();
    api.claim(run, "0001", t1).await;
    assert_eq!(api.chunk(run, "0000", t, 0, 2, 4).await.status, 200);
    let mut same_file = chunk_body(run, "0001", t1, 0, 2, 4);
    same_file["hdfsPath"] = chunk_body(run, "0000", t, 0, 2, 4)["hdfsPath"].clone();
    let dup = api
        .post(&format!("/v1/runs/{run}/partitions/0001/chunks"), same_file)
        .await;
    assert_eq!(
        (dup.status.as_u16(), dup.body["code"].as_str().unwrap()),
        (409, "UNIQUE_VIOLATION")
    );
    assert_eq!(
        dup.body["details"],
        json!({"constraint":"uq_load_file_path"})
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1",
            run
        )
        .await,
        1
    );
}

/// §5.3: `byte_count` is Σ of the chunks' `byteCount`, NULL when no chunk carried one (the field
/// is optional, §4.7), in the partition row and in PARTITION_SUCCESS's details; a partition where
/// some chunks carried bytes sums those.
#[tokio::test]
async fn a_partition_without_byte_counts_stores_none() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[5, 6]).await;
    let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
    api.claim(run, "0000", t0).await;
    api.claim(run, "0001", t1).await;
    let mut none = chunk_body(run, "0000", t0, 0, 1, 5);
    none.as_object_mut().unwrap().remove("byteCount");
    let r = api
        .post(&format!("/v1/runs/{run}/partitions/0000/chunks"), none)
        .await;
    assert_eq!(r.body["partitionStatus"], "SUCCESS", "{:?}", r.body);
    let mut null = chunk_body(run, "0001", t1, 0, 2, 3);
    null["byteCount"] = json!(null);
    api.post(&format!("/v1/runs/{run}/partitions/0001/chunks"), null)
        .await;
    let r = api.chunk(run, "0001", t1, 1, 2, 3).await;
    assert_eq!(r.body["partitionStatus"], "SUCCESS", "{:?}", r.body);
    let rows: Vec<(String, Option<i64>, serde_json::Value)> = sqlx::query_as(
        "SELECT p.partition_id, p.byte_count, e.details FROM nifi_ops.load_partition p \
           JOIN nifi_ops.load_event e ON e.run_id = p.run_id AND e.partition_id = p.partition_id \
          WHERE p.run_id = $1 AND e.event_name = 'PARTITION_SUCCESS' ORDER BY 1",
    )
    .bind(run)
    .fetch_all(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            ("0000".into(), None, json!({"files": 1, "bytes": null})),
            ("0001".into(), Some(100), json!({"files": 2, "bytes": 100})),
        ]
    );
}

/// §4.7 checks the path (step 5: another chunk row records it → 409 UNIQUE_VIOLATION) before the
/// succeeded-and-changed rule (step 6: CHUNK_CONFLICT), as §11 #5 says; before and after the
/// partition's success alike. Nothing is written either way.
#[tokio::test]
async fn a_used_path_is_a_unique_violation_after_success_too() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[4, 4]).await;
    let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
    api.claim(run, "0000", t0).await;
    api.claim(run, "0001", t1).await;
    assert_eq!(api.chunk(run, "0001", t1, 0, 2, 2).await.status, 200);
    let r = api.chunk(run, "0000", t0, 0, 1, 4).await;
    assert_eq!(r.body["partitionStatus"], "SUCCESS", "{:?}", r.body);
    let files = async || -> Vec<(String, i32, String, i64)> {
        sqlx::query_as(
            "SELECT partition_id, chunk_index, hdfs_path, record_count FROM nifi_ops.load_file \
              WHERE run_id = $1 ORDER BY 1, 2",
        )
        .bind(run)
        .fetch_all(&mut api.conn().await)
        .await
        .unwrap()
    };
    let before = files().await;
    // The succeeded partition's chunk re-reported with the other partition's recorded path.
    let mut taken = chunk_body(run, "0000", t0, 0, 1, 4);
    taken["hdfsPath"] = chunk_body(run, "0001", t1, 0, 2, 2)["hdfsPath"].clone();
    let dup = api
        .post(&format!("/v1/runs/{run}/partitions/0000/chunks"), taken)
        .await;
    assert_eq!(
        (dup.status.as_u16(), dup.body["code"].as_str().unwrap()),
        (409, "UNIQUE_VIOLATION"),
        "{:?}",
        dup.body
    );
    assert_eq!(dup.body["message"], "unique constraint violated");
    assert_eq!(
        dup.body["details"],
        json!({"constraint": "uq_load_file_path"})
    );
    // A changed chunk with a path of its own is still the conflict.
    let conflict = api.chunk(run, "0000", t0, 0, 1, 3).await;
    assert_eq!(conflict.body["code"], "CHUNK_CONFLICT");
    assert_eq!(files().await, before, "nothing written");
}

#[tokio::test]
async fn gate_mismatch_fails_partition_and_run_and_aborts_the_rest() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[10, 10]).await;
    let t = Uuid::new_v4();
    api.claim(run, "0000", t).await;
    let r = api.chunk(run, "0000", t, 0, 1, 9).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["partitionStatus"], "FAILED");
    assert_eq!(r.body["runStatus"], "FAILED_EXTRACT");
    let (code, msg, failed): (String, String, i32) =
        sqlx::query_as("SELECT error_code, error_message, failed_partition_count FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!(code, "ROW_COUNT_MISMATCH");
    assert_eq!(
        msg,
        "partition 0000: files=1 chunkCount=1 distinctCounts=1 rows=9 expected=10"
    );
    assert_eq!(failed, 1);
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status = 'ABORTED'",
            run
        )
        .await,
        1
    );
    let events = api.events(run).await;
    assert!(
        events.ends_with(&["PARTITION_FAILED".to_string(), "RUN_FAILED".to_string()]),
        "{events:?}"
    );
}

#[tokio::test]
async fn partition_fail_outcomes() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[5, 5, 5]).await;
    let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
    api.claim(run, "0000", t0).await;
    api.claim(run, "0001", t1).await;
    let path = |p: &str| format!("/v1/runs/{run}/partitions/{p}/fail");
    let body = |t: Uuid| json!({"claimToken": t, "errorStage":"EXTRACT","errorClass":"SNAPSHOT","errorCode":"ora-01555","message":"snapshot too old","attempt":"3"});
    let wrong = api.post(&path("0000"), body(Uuid::new_v4())).await;
    assert_eq!(
        (wrong.status.as_u16(), wrong.body["code"].as_str().unwrap()),
        (409, "CLAIM_MISMATCH")
    );
    let r = api.post(&path("0000"), body(t0)).await;
    assert_eq!(
        r.body,
        json!({"partitionStatus":"FAILED","runStatus":"FAILED_SNAPSHOT_EXPIRED","changed":true})
    );
    assert_eq!(
        api.post(&path("0000"), body(t0)).await.body["changed"],
        false
    );
    // The other running partition was closed with the run.
    let aborted = api.post(&path("0001"), body(t1)).await;
    assert_eq!(
        aborted.body,
        json!({"partitionStatus":"ABORTED","runStatus":"FAILED_SNAPSHOT_EXPIRED","changed":false})
    );
    let (attempt, class): (i32, String) =
        sqlx::query_as("SELECT attempt_no, error_class FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'PARTITION_FAILED'")
            .bind(run)
            .fetch_one(&mut api.conn().await)
            .await
            .unwrap();
    assert_eq!((attempt, class.as_str()), (3, "SNAPSHOT"));
    let (msg,): (String,) = sqlx::query_as(
        "SELECT message FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'RUN_FAILED'",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(msg, "partition 0000: snapshot too old");

    let run2 = api.extracting_run("JOB", "K2", &[5, 5]).await;
    let t = Uuid::new_v4();
    api.claim(run2, "0000", t).await;
    api.chunk(run2, "0000", t, 0, 1, 5).await;
    let done = api
        .post(
            &format!("/v1/runs/{run2}/partitions/0000/fail"),
            json!({"claimToken": t, "errorStage":"E","errorClass":"DB","errorCode":"X"}),
        )
        .await;
    assert_eq!(
        (done.status.as_u16(), done.body["code"].as_str().unwrap()),
        (409, "PARTITION_STATUS_MISMATCH")
    );
    assert_eq!(done.body["details"], json!({"partitionStatus":"SUCCESS"}));
    let t1 = Uuid::new_v4();
    api.claim(run2, "0001", t1).await;
    let plain = api
        .post(
            &format!("/v1/runs/{run2}/partitions/0001/fail"),
            json!({"claimToken": t1, "errorStage":"E","errorClass":"DB","errorCode":"ORA-00001"}),
        )
        .await;
    assert_eq!(plain.body["runStatus"], "FAILED_EXTRACT");
    let nf = api
        .post(&format!("/v1/runs/{run2}/partitions/0042/fail"), body(t))
        .await;
    assert_eq!(nf.body["code"], "PARTITION_NOT_FOUND");
}

#[tokio::test]
async fn chunk_reports_refresh_heartbeats_without_rewriting_a_fresh_run_row() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "HB", &[10]).await;
    let t = Uuid::new_v4();
    api.claim(run, "0000", t).await;
    let mut db = api.conn().await;
    for table in ["load_run", "load_partition"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE nifi_ops.{table} SET heartbeat_at = now() - interval '1 hour' WHERE run_id = $1"
        )))
        .bind(run)
        .execute(&mut db)
        .await
        .unwrap();
    }
    let ages = async |db: &mut sqlx::PgConnection| -> (f64, f64, String) {
        sqlx::query_as(
            "SELECT extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8, \
                    extract(epoch FROM clock_timestamp() - p.heartbeat_at)::float8, r.xmin::text \
               FROM nifi_ops.load_run r JOIN nifi_ops.load_partition p USING (run_id) WHERE r.run_id = $1",
        )
        .bind(run)
        .fetch_one(db)
        .await
        .unwrap()
    };
    assert_eq!(api.chunk(run, "0000", t, 0, 3, 4).await.status, 200);
    let (run_age, part_age, version) = ages(&mut db).await;
    assert!(
        run_age < 60.0 && part_age < 60.0,
        "not refreshed: run {run_age}s, partition {part_age}s"
    );
    // A second report within the second leaves the run row alone (§5.3 rule 5).
    assert_eq!(api.chunk(run, "0000", t, 1, 3, 3).await.status, 200);
    assert_eq!(
        ages(&mut db).await.2,
        version,
        "a fresh run heartbeat was rewritten"
    );
    // The partition success refreshes it with its counter update.
    sqlx::query(
        "UPDATE nifi_ops.load_run SET heartbeat_at = now() - interval '1 hour' WHERE run_id = $1",
    )
    .bind(run)
    .execute(&mut db)
    .await
    .unwrap();
    let done = api.chunk(run, "0000", t, 2, 3, 3).await;
    assert_eq!(done.body["runStatus"], "EXTRACTED_VALIDATED");
    assert!(ages(&mut db).await.0 < 60.0);
}
