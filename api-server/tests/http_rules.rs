//! The common HTTP rules (CONTRACT §3): authentication, routing errors, size limit, request
//! validation with every problem listed, request ids, path normalisation. A client mistake is never
//! a 500 and never writes anything.
mod common;
use common::*;
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn authentication_and_roles() {
    let api = Api::start().await;
    let none = api
        .send("POST", "/v1/runs", None, Some(&json!({"garbage": true})))
        .await;
    assert_eq!(none.status, 401, "auth is judged before the body");
    assert_eq!(none.body["code"], "UNAUTHENTICATED");
    assert_eq!(none.body["message"], "Unauthorized");
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    let basic = api
        .raw(
            "GET",
            "/v1/runs",
            &[("authorization", "Basic Zm9vOmJhcg==")],
            vec![],
        )
        .await;
    assert_eq!(basic.status, 401);
    let unknown = api.send("GET", "/v1/runs", Some("not-a-token"), None).await;
    assert_eq!(
        (
            unknown.status.as_u16(),
            unknown.body["code"].as_str().unwrap()
        ),
        (403, "FORBIDDEN")
    );
    let operator_on_nifi = api
        .send("POST", "/v1/runs", Some(OPERATOR), Some(&json!({})))
        .await;
    assert_eq!(operator_on_nifi.status, 403);
    assert_eq!(
        api.send("GET", "/v1/runs", Some(OPERATOR), None)
            .await
            .status,
        200
    );
    let lower_scheme = api
        .raw(
            "GET",
            "/v1/runs",
            &[("authorization", &format!("bearer {NIFI}"))],
            vec![],
        )
        .await;
    assert_eq!(lower_scheme.status, 200);
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_run WHERE $1::uuid IS NOT NULL",
            Uuid::nil()
        )
        .await,
        0
    );
}

#[tokio::test]
async fn unauthenticated_endpoints_and_routing_errors() {
    let api = Api::start().await;
    let h = api.send("GET", "/healthz", None, None).await;
    assert_eq!(
        (h.status.as_u16(), h.body.clone()),
        (200, json!({"status":"ok"}))
    );
    let r = api.send("GET", "/readyz", None, None).await;
    assert_eq!(
        (r.status.as_u16(), r.body.clone()),
        (200, json!({"status":"ok"}))
    );
    let nf = api.send("GET", "/v1/nothing", Some(NIFI), None).await;
    assert_eq!(nf.status, 404);
    assert_eq!(nf.body["code"], "NOT_FOUND");
    assert_eq!(nf.body["message"], "Not Found");
    let nf_noauth = api.send("GET", "/nope", None, None).await;
    assert_eq!(
        nf_noauth.status, 404,
        "routing is judged before authentication"
    );
    let wrong = api.send("DELETE", "/v1/runs", None, None).await;
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.body["code"], "METHOD_NOT_ALLOWED");
    let allow = wrong.headers["allow"].to_str().unwrap().to_string();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    let first_key = serde_json::to_string(&wrong.body).unwrap();
    assert!(
        first_key.starts_with("{\"code\""),
        "code comes first: {first_key}"
    );
}

#[tokio::test]
async fn oversized_bodies_are_413_on_every_route() {
    let api = Api::start_with(|c| c.server.max_body_bytes = 1024).await;
    let big = vec![b'x'; 4096];
    let r = api
        .raw(
            "POST",
            "/v1/runs",
            &[
                ("authorization", &format!("Bearer {NIFI}")),
                ("content-type", "application/json"),
            ],
            big.clone(),
        )
        .await;
    assert_eq!(r.status, 413);
    assert_eq!(r.body["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(r.body["details"], json!({"limit": 1024}));
    let get = api
        .raw(
            "GET",
            "/v1/runs",
            &[("authorization", &format!("Bearer {NIFI}"))],
            big.clone(),
        )
        .await;
    assert_eq!(get.status, 413, "ignored bodies still count");
    let noauth = api
        .raw(
            "POST",
            "/v1/runs",
            &[("content-type", "application/json")],
            big,
        )
        .await;
    assert_eq!(noauth.status, 401, "authentication before size");
}

#[tokio::test]
async fn request_validation_lists_every_problem() {
    let api = Api::start().await;
    let r = api
        .post("/v1/runs", json!({"jobKey":"lower","businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t","color":"red","job_key":"X"}))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.body["code"], "REQUEST_INVALID");
    let fields: Vec<&str> = r.body["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, vec!["$.jobKey", "$.color"]);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .starts_with("request validation failed: $.jobKey given more than once"),
        "{}",
        r.body["message"]
    );
    assert!(r.body["message"].as_str().unwrap().ends_with("(+1 more)"));

    let types = api
        .post("/v1/runs", json!({"jobKey":"J","businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t","allowEmptySource":"maybe","parameters":[1]}))
        .await;
    let fields: Vec<&str> = types.body["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, vec!["$.allowEmptySource", "$.parameters"]);

    let malformed = api
        .raw(
            "POST",
            "/v1/runs",
            &[("authorization", &format!("Bearer {NIFI}"))],
            b"{\"jobKey\":".to_vec(),
        )
        .await;
    assert_eq!(malformed.status, 422);
    assert_eq!(malformed.body["details"]["errors"][0]["field"], "$");
    let not_object = api.post("/v1/runs", json!([1, 2])).await;
    assert_eq!(
        not_object.body["details"]["errors"][0]["message"],
        "must be a JSON object"
    );
    let text = api
        .raw(
            "POST",
            "/v1/runs",
            &[
                ("authorization", &format!("Bearer {NIFI}")),
                ("content-type", "text/plain"),
            ],
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(text.status, 422);
    let empty = api
        .raw(
            "POST",
            "/v1/runs",
            &[("authorization", &format!("Bearer {NIFI}"))],
            vec![],
        )
        .await;
    assert_eq!(empty.status, 422);

    // Path and body problems together; a bad run id and partition id are 422, not 404.
    let both = api
        .post(
            "/v1/runs/not-a-uuid/partitions/12/claim",
            json!({"claimToken":"", "workerNode": ""}),
        )
        .await;
    assert_eq!(both.status, 422);
    let fields: Vec<&str> = both.body["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        vec![
            "path.run_id",
            "path.partition_id",
            "$.claimToken",
            "$.workerNode"
        ]
    );

    let long = api.post("/v1/runs", json!({"jobKey":"J".repeat(201),"businessKey":"K","hdfsRoot":"/d","stageTablePrefix":"t"})).await;
    assert_eq!(long.status, 422);
    let int_range = api.post(&format!("/v1/runs/{}/partitions/0000/fail", Uuid::new_v4()),
        json!({"claimToken": Uuid::new_v4(), "errorStage":"E","errorClass":"C","errorCode":"X","attempt": 2147483648i64})).await;
    assert_eq!(int_range.body["details"]["errors"][0]["field"], "$.attempt");
    let huge = api.raw("POST", &format!("/v1/runs/{}/partitions/0000/chunks", Uuid::new_v4()),
        &[("authorization", &format!("Bearer {NIFI}"))],
        format!("{{\"claimToken\":\"{}\",\"chunkIndex\":0,\"chunkCount\":1,\"hdfsPath\":\"/x\",\"recordCount\":99999999999999999999}}", Uuid::new_v4()).into_bytes()).await;
    assert_eq!(huge.status, 422);
    assert_eq!(huge.body["details"]["errors"][0]["field"], "$.recordCount");
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_run WHERE $1::uuid IS NOT NULL",
            Uuid::nil()
        )
        .await,
        0
    );
}

#[tokio::test]
async fn lenient_types_and_snake_case_are_accepted() {
    let api = Api::start().await;
    let r = api
        .raw(
            "POST",
            "/v1/runs",
            &[("authorization", &format!("Bearer {NIFI}")), ("content-type", "application/json; charset=UTF-8")],
            br#"{"job_key":"J","business_key":"K\u002e1","hdfs_root":"\/data\/x","stage_table_prefix":"t_","allow_empty_source":"yes"}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let run = r.body["runId"].as_str().unwrap();
    assert!(
        r.body["hdfsRunPath"]
            .as_str()
            .unwrap()
            .starts_with("/data/x/J/run_id=")
    );
    // A 38-digit SCN sent as a JSON number is kept exactly.
    let scn = "12345678901234567890123456789012345678";
    let body = format!(
        r#"{{"snapshotScn":{scn},"source_count":"1","planned_partition_count":1.0,"partitions":[{{"partition_id":"0000","lower_bound":0,"upper_bound":"5","upper_inclusive":"t","expected_row_count":"1"}}]}}"#
    );
    let m = api
        .raw(
            "POST",
            &format!("/v1/runs/{run}/manifest"),
            &[("authorization", &format!("Bearer {NIFI}"))],
            body.into_bytes(),
        )
        .await;
    assert_eq!(m.status, 200, "{:?}", m.body);
    let d = api.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(d.body["snapshotScn"], scn);
}

#[tokio::test]
async fn request_ids_paths_and_root_path() {
    let api = Api::start_with(|c| c.server.root_path = "/lca".into()).await;
    let adopted = api
        .raw("GET", "/healthz", &[("x-request-id", "nifi-req-1")], vec![])
        .await;
    assert_eq!(adopted.headers["x-request-id"], "nifi-req-1");
    let replaced = api
        .raw("GET", "/v1/nothing", &[("x-request-id", "bad id!")], vec![])
        .await;
    let rid = replaced.headers["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(Uuid::parse_str(&rid).is_ok(), "{rid}");
    assert_eq!(replaced.body["requestId"], rid);
    assert_eq!(
        api.send("GET", "/v1//runs/", Some(NIFI), None).await.status,
        200
    );
    assert_eq!(
        api.send("GET", "/lca/v1/runs", Some(NIFI), None)
            .await
            .status,
        200
    );
    assert_eq!(
        api.send("GET", "/lcav1/runs", Some(NIFI), None)
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn concurrency_limit_refuses_only_v1_requests() {
    let api = Api::start_with(|c| c.server.limit_concurrency = Some(0)).await;
    let r = api.get("/v1/runs").await;
    assert_eq!(
        (r.status.as_u16(), r.body["code"].as_str().unwrap()),
        (503, "SERVICE_UNAVAILABLE")
    );
    assert_eq!(api.send("GET", "/healthz", None, None).await.status, 200);
}
