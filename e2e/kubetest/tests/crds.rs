//! Our generated CRDs against the real kube-apiserver: accepted, Established, and enforcing their
//! patterns and CEL immutability rules; `kubectl get` shows the print columns.
use kubetest::ControlPlane;

fn apply(cp: &ControlPlane, ns: &str, yaml: &str) -> std::process::Output {
    let path = std::env::temp_dir().join(format!("obj-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, yaml).unwrap();
    let out = cp
        .kubectl()
        .args(["apply", "-n", ns, "-f", path.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(path);
    out
}

#[tokio::test]
async fn the_crds_install_and_enforce_patterns_and_immutability() {
    let cp = ControlPlane::start().await.expect("control plane");
    let all = crds::all_crds_yaml();
    let names = cp.install_crds(&all).await.unwrap();
    assert_eq!(
        names,
        vec!["loadjobs.loadcontrol.io", "loadruns.loadcontrol.io"]
    );
    let ns = cp.create_namespace("crds").await.unwrap();
    let job = "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: insp}\nspec:\n  jobKey: ORACLE_INSP_DTL_DAILY\n  recovery: {mode: REISSUE, stale: 2h}\n";
    let out = apply(&cp, &ns, job);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let changed = apply(&cp, &ns, &job.replace("ORACLE_INSP_DTL_DAILY", "OTHER_JOB"));
    assert!(!changed.status.success());
    assert!(
        String::from_utf8_lossy(&changed.stderr).contains("jobKey is immutable"),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    let bad = apply(
        &cp,
        &ns,
        "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: bad}\nspec: {jobKey: lower-case}\n",
    );
    assert!(!bad.status.success(), "pattern enforced");
    let bad_duration = apply(
        &cp,
        &ns,
        "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: bad2}\nspec: {jobKey: J, recovery: {stale: soon}}\n",
    );
    assert!(!bad_duration.status.success(), "duration pattern enforced");
    let get = cp
        .kubectl()
        .args(["get", "lj", "-n", &ns])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&get.stdout);
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        vec![
            "NAME",
            "JOBKEY",
            "READY",
            "SUSPENDED",
            "ACTIVE",
            "LAST",
            "AGE"
        ]
    );
    assert!(text.contains("ORACLE_INSP_DTL_DAILY"));
    let runs = cp
        .kubectl()
        .args(["get", "loadruns", "-n", &ns])
        .output()
        .unwrap();
    assert!(runs.status.success());
}
