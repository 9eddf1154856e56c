//! The private control plane is a real Kubernetes API: these tests prove the harness the operator
//! tests stand on. Start-up and teardown times are printed (benchmark figures, not asserts).
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kubetest::ControlPlane;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn smoke_namespaces_configmaps_leases_kubectl_and_helm() {
    let cp = ControlPlane::start().await.expect("control plane");
    eprintln!("control plane ready in {:?}", cp.startup);
    let client = cp.client().await.unwrap();
    let names: Vec<String> = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"default".to_string()), "{names:?}");

    let ns = cp.create_namespace("smoke").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(cms.get("cfg").await.unwrap().data.unwrap()["k"], "v");

    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})).unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut first = created.clone();
    first.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("leader", &PostParams::default(), &first)
        .await
        .unwrap();
    // The same stale resourceVersion again: optimistic concurrency refuses it.
    let mut stale = created;
    stale.spec.as_mut().unwrap().holder_identity = Some("c".into());
    match leases
        .replace("leader", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
    assert_eq!(
        leases
            .get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );

    let out = cp
        .kubectl()
        .args(["get", "ns", ns.as_str(), "-o", "name"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("namespace/{ns}")
    );
    let version = cp
        .kubectl()
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap();
    assert!(
        v["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap()
            .starts_with("v1.34"),
        "{v}"
    );
    let helm = cp.helm().args(["version", "--short"]).output().unwrap();
    assert!(helm.status.success() && String::from_utf8_lossy(&helm.stdout).starts_with('v'));
    let teardown = cp.stop();
    eprintln!("control plane stopped in {teardown:?}");
}

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.loadcontrol.io
spec:
  group: test.loadcontrol.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
          status: {type: object, properties: {phase: {type: string}}}
"#;

#[tokio::test]
async fn a_crd_from_yaml_is_established_and_its_status_subresource_is_watched() {
    let cp = ControlPlane::start().await.expect("control plane");
    assert_eq!(
        cp.install_crds(WIDGET_CRD).await.unwrap(),
        vec!["widgets.test.loadcontrol.io"]
    );
    let ns = cp.create_namespace("crd").await.unwrap();
    let gvk = GroupVersionKind::gvk("test.loadcontrol.io", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let api: Api<DynamicObject> = Api::namespaced_with(cp.client().await.unwrap(), &ns, &ar);
    let mut events = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    let obj: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "test.loadcontrol.io/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}}),
    )
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    api.patch_status(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Ready"}})),
    )
    .await
    .unwrap();
    // A status write through the main resource is ignored: status is a subresource.
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Hacked"}})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.get("w1").await.unwrap().data["status"]["phase"],
        "Ready"
    );

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .expect("watch event in time")
            .unwrap()
            .unwrap();
        match ev {
            WatchEvent::Added(o) => seen.push(("ADDED", o.data["status"]["phase"].clone())),
            WatchEvent::Modified(o) => seen.push(("MODIFIED", o.data["status"]["phase"].clone())),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", serde_json::Value::Null),
            ("MODIFIED", json!("Ready"))
        ]
    );
}

#[tokio::test]
async fn two_control_planes_run_side_by_side() {
    let (a, b) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_ne!(a.url, b.url);
    assert_ne!(a.kubeconfig, b.kubeconfig);
    let ns = a.create_namespace("only-in-a").await.unwrap();
    let in_b = Api::<Namespace>::all(b.client().await.unwrap())
        .get_opt(&ns)
        .await
        .unwrap();
    assert!(in_b.is_none(), "the planes share no storage");
    eprintln!("parallel start-up: {:?} and {:?}", a.startup, b.startup);
}

#[tokio::test]
async fn a_service_account_client_is_held_to_rbac() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let cp = ControlPlane::start().await.expect("control plane");
    let ns = cp.create_namespace("rbac").await.unwrap();
    let sa_client = cp.service_account_client(&ns, "operator").await.unwrap();
    let as_sa: Api<ConfigMap> = Api::namespaced(sa_client, &ns);
    match as_sa.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("expected 403 before any grant, got {other:?}"),
    }
    let admin = cp.client().await.unwrap();
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]}))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "cm-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]}))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // The RBAC authorizer reads bindings from an informer cache, so a new grant takes effect
    // a moment after the create returns: await it, bounded, instead of assuming it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match as_sa.list(&ListParams::default()).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 403 && std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => panic!("list is granted within 30 s, got {other:?}"),
        }
    }
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    match as_sa.create(&PostParams::default(), &cm).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "create is not granted"),
        other => panic!("expected 403 for create, got {other:?}"),
    }
}
