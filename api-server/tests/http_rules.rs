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
    let r = post_bytes(&api, big.clone()).await;
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

/// The concurrency limit refuses `/v1` requests only, and only once a request is authenticated
/// and its body has arrived within the size limit (a permit is never held while a body arrives):
/// route → authentication → size → limit.
#[tokio::test]
async fn concurrency_limit_refuses_only_v1_requests() {
    let api = Api::start_with(|c| {
        c.server.limit_concurrency = Some(0);
        c.server.max_body_bytes = 1024;
    })
    .await;
    let r = api.get("/v1/runs").await;
    assert_eq!(
        (r.status.as_u16(), r.body["code"].as_str().unwrap()),
        (503, "SERVICE_UNAVAILABLE")
    );
    assert_eq!(api.send("GET", "/healthz", None, None).await.status, 200);
    assert_eq!(
        api.send("GET", "/v1/nowhere", Some(NIFI), None)
            .await
            .status,
        404
    );
    assert_eq!(api.send("GET", "/v1/runs", None, None).await.status, 401);
    let big = api
        .raw(
            "POST",
            "/v1/runs",
            &[
                ("authorization", &format!("Bearer {NIFI}")),
                ("content-type", "application/json"),
            ],
            vec![b' '; 4096],
        )
        .await;
    assert_eq!(big.status, 413);
    // The overload is counted by its cause, apart from a ledger that cannot be reached.
    let metrics = api.send("GET", "/metrics", None, None).await;
    let text = metrics.body.as_str().unwrap().to_string();
    assert!(
        text.lines()
            .any(|l| l == "lca_unavailable_total{code=\"SERVICE_UNAVAILABLE\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("lca_unavailable_total{code=\"DATABASE_UNAVAILABLE\"}"),
        "{text}"
    );
}

/// Answers given before the body is read (401, 403, 413) must leave a pooled keep-alive client
/// able to send its next request: one client, one connection, many rejected requests with bodies.
#[tokio::test]
async fn early_answers_keep_a_pooled_connection_usable() {
    let api = Api::start_with(|c| c.server.max_body_bytes = 64 * 1024).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .http1_only()
        .build()
        .unwrap();
    let url = format!("{}/v1/runs", api.base);
    let body = format!("{{\"jobKey\":\"{}\"}}", "X".repeat(48 * 1024));
    let big = format!("{{\"jobKey\":\"{}\"}}", "X".repeat(200 * 1024));
    let cases: [(Option<&str>, &String, u16); 3] = [
        (None, &body, 401),
        (Some(OPERATOR), &body, 403),
        (Some(NIFI), &big, 413),
    ];
    for i in 0..60 {
        let (token, body, want) = cases[i % cases.len()];
        let mut req = client
            .post(&url)
            .header("Content-Type", "application/json")
            .body(body.clone());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {i} on the pooled connection failed: {e:?}"));
        assert_eq!(resp.status().as_u16(), want, "request {i}");
        let reply: serde_json::Value = resp.json().await.unwrap();
        assert!(reply["code"].is_string(), "request {i}: {reply}");
    }
    // The connection still serves an accepted request afterwards.
    let ok = client
        .get(format!("{}/v1/runs?limit=1", api.base))
        .bearer_auth(NIFI)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
}

/// The same on the wire, without a client library's retries: after an early answer the server
/// either says `Connection: close` (and closes), or reads past the body and serves the next request
/// on the same connection.
#[tokio::test]
async fn early_answers_on_the_wire_close_or_drain() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let api = Api::start_with(|c| c.server.max_body_bytes = 64 * 1024).await;
    let addr = api.base.trim_start_matches("http://").to_string();
    let body = format!("{{\"jobKey\":\"{}\"}}", "X".repeat(48 * 1024));
    let big = format!("{{\"jobKey\":\"{}\"}}", "X".repeat(200 * 1024));
    for (auth, body, want) in [
        (String::new(), &body, "401"),
        (
            format!("Authorization: Bearer {OPERATOR}\r\n"),
            &body,
            "403",
        ),
        (format!("Authorization: Bearer {NIFI}\r\n"), &big, "413"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let req = format!(
            "POST /v1/runs HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        // The whole request is written, as a pooled client does, even if the answer comes first.
        let (mut rd, mut wr) = conn.split();
        let (written, first) = tokio::join!(wr.write_all(req.as_bytes()), read_response(&mut rd));
        let first = first.unwrap_or_else(|| panic!("{want}: no answer (written: {written:?})"));
        assert!(first.starts_with(&format!("HTTP/1.1 {want}")), "{first}");
        if first
            .to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n")
        {
            let mut rest = Vec::new();
            let closed =
                tokio::time::timeout(std::time::Duration::from_secs(5), rd.read_to_end(&mut rest))
                    .await;
            assert!(
                closed.is_ok(),
                "{want}: announced close but kept the connection open"
            );
            continue;
        }
        assert!(
            written.is_ok(),
            "{want}: the server stopped reading the body without saying Connection: close"
        );
        wr.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let second = read_response(&mut rd).await;
        assert!(
            second
                .as_deref()
                .is_some_and(|s| s.starts_with("HTTP/1.1 200")),
            "{want}: the kept-alive connection did not serve the next request: {second:?}"
        );
    }
}

/// Reads one HTTP/1.1 response (head and Content-Length body) as text; None on EOF or reset.
async fn read_response(rd: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = rd.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(String::from_utf8_lossy(&buf[..end + 4 + len]).to_string());
        }
        let n = rd.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A NUL character in any text or free-form field, or in a query parameter, is the client's
/// mistake: 422 naming the field, nothing written — never PostgreSQL's 22021/22P05 as a 503,
/// which NiFi would retry until it gave up and lost the report.
#[tokio::test]
async fn a_nul_character_is_a_422_and_writes_nothing() {
    let api = Api::start().await;
    let run = api.extracting_run("NULJOB", "bk-nul", &[5]).await;
    let token = uuid::Uuid::new_v4();
    assert_eq!(api.claim(run, &pid(0), token).await.status.as_u16(), 200);
    let fail = api
        .post(
            &format!("/v1/runs/{run}/partitions/{}/fail", pid(0)),
            json!({"claimToken": token, "errorStage": "EXTRACT", "errorClass": "IO",
                   "errorCode": "E1", "message": "disk\u{0}full"}),
        )
        .await;
    assert_eq!(fail.status.as_u16(), 422, "{}", fail.body);
    assert!(fail.body.to_string().contains("message"), "{}", fail.body);
    assert_eq!(api.run_status(run).await, "EXTRACTING", "nothing written");
    let chunk = api
        .post(
            &format!("/v1/runs/{run}/partitions/{}/chunks", pid(0)),
            json!({"claimToken": token, "chunkIndex": 0, "chunkCount": 1, "recordCount": 5,
                   "hdfsPath": format!("/data/stage/NULJOB/run_id={run}/p/a\u{0}b.parquet")}),
        )
        .await;
    assert_eq!(chunk.status.as_u16(), 422, "{}", chunk.body);
    assert!(
        chunk.body.to_string().contains("U+0000"),
        "refused for the NUL: {}",
        chunk.body
    );
    let created = api
        .post(
            "/v1/runs",
            json!({"jobKey": "NULJOB2", "businessKey": "b", "hdfsRoot": "/data",
                   "stageTablePrefix": "t_", "parameters": {"note": "x\u{0}y"}}),
        )
        .await;
    assert_eq!(created.status.as_u16(), 422, "{}", created.body);
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_run WHERE job_key = 'NULJOB2' AND $1 IS NOT NULL",
            run
        )
        .await,
        0
    );
    let listed = api.get("/v1/runs?jobKey=%00").await;
    assert_eq!(listed.status.as_u16(), 422, "{}", listed.body);
}

/// Found by the schema fuzzer: PostgreSQL keeps a jsonb number exactly and prints
/// 1.7976931348623157e308 as a 309-digit integer, which serde_json's fast float parser rounded past
/// f64::MAX ("number out of range"), so creating such a run answered 503 and NiFi retried it.
/// Free-form numbers at the edges of f64 must round-trip.
#[tokio::test]
async fn free_form_numbers_at_the_edges_of_f64_round_trip() {
    let api = Api::start().await;
    let parameters =
        json!({"max": f64::MAX, "min": f64::MIN, "tiny": 5e-324, "big": 6.707092002166461e232});
    let created = api
        .post(
            "/v1/runs",
            json!({"jobKey": "F64JOB", "businessKey": "b", "hdfsRoot": "/data",
                   "stageTablePrefix": "t_", "parameters": parameters}),
        )
        .await;
    assert_eq!(created.status.as_u16(), 200, "{}", created.body);
    let run: Uuid = created.body["runId"]
        .as_str()
        .expect("runId")
        .parse()
        .expect("uuid");
    let detail = api.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(detail.status.as_u16(), 200, "{}", detail.body);
    assert_eq!(detail.body["jobKey"], "F64JOB", "{}", detail.body);
    // Every operation reads the stored parameters back with the run row.
    let cancel = api
        .send_op(
            &format!("/v1/runs/{run}/cancel"),
            json!({"reason": "edge of f64"}),
        )
        .await;
    assert_eq!(cancel.status.as_u16(), 200, "{}", cancel.body);
    assert_eq!(api.run_status(run).await, "CANCELLED");
}

/// One HDFS file has one spelling: `p//f`, `p/./f` and the run directory itself are refused, so
/// one file can never be recorded as several chunks.
#[tokio::test]
async fn path_aliases_cannot_record_one_file_twice() {
    let api = Api::start().await;
    let run = api.extracting_run("ALIAS", "bk-alias", &[10]).await;
    let token = Uuid::new_v4();
    assert_eq!(api.claim(run, &pid(0), token).await.status.as_u16(), 200);
    let root = format!("/data/stage/ALIAS/run_id={run}");
    for (i, path) in [
        format!("{root}/p//f"),
        format!("{root}/p/./f"),
        format!("{root}/"),
    ]
    .iter()
    .enumerate()
    {
        let r = api
            .post(
                &format!("/v1/runs/{run}/partitions/{}/chunks", pid(0)),
                json!({"claimToken": token, "chunkIndex": i, "chunkCount": 4, "hdfsPath": path, "recordCount": 1}),
            )
            .await;
        assert_eq!(r.status.as_u16(), 422, "{path}: {}", r.body);
        assert_eq!(r.body["code"], "HDFS_PATH_OUTSIDE_RUN");
    }
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1",
            run
        )
        .await,
        0
    );
    // The canonical spelling is accepted (the refusals above were about the aliases).
    let ok = api
        .post(
            &format!("/v1/runs/{run}/partitions/{}/chunks", pid(0)),
            json!({"claimToken": token, "chunkIndex": 0, "chunkCount": 4,
                   "hdfsPath": format!("{root}/p/f"), "recordCount": 1}),
        )
        .await;
    assert_eq!(ok.status.as_u16(), 200, "{}", ok.body);
}

/// An empty queryVersion is a ShortText like any other (§4.10): stored, not refused.
#[tokio::test]
async fn an_empty_query_version_is_accepted() {
    let api = Api::start().await;
    let (run, dispatch) = api.validated_run("bk-qv").await;
    let started = api
        .post(
            &format!("/v1/runs/{run}/validation/start"),
            json!({"dispatchId": dispatch}),
        )
        .await;
    assert_eq!(started.status.as_u16(), 200, "{}", started.body);
    let r = api
        .post(
            &format!("/v1/runs/{run}/validations"),
            json!({"stage": "STAGING", "queryVersion": "", "metrics": [{"metricName": "STAGE_COUNT", "actualValue": "5", "result": "PASS"}]}),
        )
        .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    assert_eq!(
        api.count("SELECT count(*) FROM nifi_ops.load_validation WHERE run_id = $1 AND query_version = ''", run).await,
        1
    );
}

/// Every protected endpoint of the served OpenAPI document (so a new route is covered the day it
/// is added) × {no token, another scheme, an empty token, an unknown token, the wrong role}:
/// 401/403 with the contract's body, and nothing written.
#[tokio::test]
async fn every_endpoint_refuses_missing_unknown_and_wrong_role_tokens() {
    let api = Api::start().await;
    let doc = api.send("GET", "/openapi.json", None, None).await;
    assert_eq!(doc.status, 200);
    let paths = doc.body["paths"].as_object().expect("paths");
    let mut checked = 0;
    for (template, ops) in paths {
        if !template.starts_with("/v1/") {
            continue;
        }
        let path = template
            .replace("{run_id}", &Uuid::new_v4().to_string())
            .replace("{partition_id}", "0000")
            .replace("{dispatch_id}", &Uuid::new_v4().to_string());
        for method in ["get", "post"] {
            if ops.get(method).is_none() {
                continue;
            }
            let m = method.to_uppercase();
            let body = (m == "POST").then(|| json!({}));
            let what = format!("{m} {template}");
            // CONTRACT §3.6: operator-only actions; reads and the cleanup report take either role.
            let operator_only = ["/resend", "/publish-unknown/resolve", "/cancel"]
                .iter()
                .any(|s| template.ends_with(s));
            let either = m == "GET" || template.ends_with("/cleanup");
            let unauthenticated = [
                api.send(&m, &path, None, body.as_ref()).await,
                api.raw(
                    &m,
                    &path,
                    &[("authorization", "Basic Zm9vOmJhcg==")],
                    vec![],
                )
                .await,
                api.raw(&m, &path, &[("authorization", "Bearer ")], vec![])
                    .await,
            ];
            for r in unauthenticated {
                assert_eq!(r.status, 401, "{what}: {:?}", r.body);
                assert_eq!(r.body["code"], "UNAUTHENTICATED", "{what}");
                assert_eq!(r.headers["www-authenticate"], "Bearer", "{what}");
            }
            let mut forbidden = vec![
                api.send(&m, &path, Some("no-such-token"), body.as_ref())
                    .await,
            ];
            if !either {
                let wrong = if operator_only { NIFI } else { OPERATOR };
                forbidden.push(api.send(&m, &path, Some(wrong), body.as_ref()).await);
            }
            for r in forbidden {
                assert_eq!(r.status, 403, "{what}: {:?}", r.body);
                assert_eq!(r.body["code"], "FORBIDDEN", "{what}");
                assert!(r.body["requestId"].is_string(), "{what}");
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 20,
        "only {checked} endpoints in the OpenAPI document"
    );
    for table in ["load_run", "load_event", "load_dispatch"] {
        assert_eq!(
            api.count(
                &format!("SELECT count(*) FROM nifi_ops.{table} WHERE $1::uuid IS NOT NULL"),
                Uuid::nil()
            )
            .await,
            0,
            "{table}"
        );
    }
}

/// A body within the size limit but made of millions of tiny values is refused while parsing
/// (422), before any tree of them is built.
#[tokio::test]
async fn a_body_of_millions_of_values_is_a_422() {
    let api = Api::start().await;
    let body = format!("[{}0]", "0,".repeat(4_000_000)).into_bytes();
    assert!(body.len() < 16 * 1024 * 1024);
    let r = post_bytes(&api, body).await;
    assert_eq!(r.status, 422, "{:?}", r.body);
    assert_eq!(r.body["code"], "REQUEST_INVALID");
    assert!(
        r.body["message"].as_str().unwrap().contains("JSON values"),
        "{}",
        r.body
    );
}

/// `POST /v1/runs` with raw `body` bytes, as NiFi (token, JSON content type).
async fn post_bytes(api: &Api, body: Vec<u8>) -> Reply {
    api.raw(
        "POST",
        "/v1/runs",
        &[
            ("authorization", &format!("Bearer {NIFI}")),
            ("content-type", "application/json"),
        ],
        body,
    )
    .await
}
