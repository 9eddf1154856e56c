//! The committed CRD YAML is what the types generate.
use std::path::Path;

#[test]
fn committed_crd_yaml_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["crds", "charts/load-control/crds"] {
        for (name, yaml) in crds::crd_yaml() {
            let path = root.join(dir).join(name);
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == yaml,
                "{} is stale: run `cargo run -p load-control-crds --bin crdgen`",
                path.display()
            );
        }
    }
}

#[test]
fn the_crds_carry_what_operators_rely_on() {
    use kube::CustomResourceExt;
    let job = serde_json::to_value(crds::LoadJob::crd()).unwrap();
    assert_eq!(
        job["spec"]["names"]["shortNames"],
        serde_json::json!(["lj"])
    );
    assert_eq!(job["spec"]["scope"], "Namespaced");
    let v = &job["spec"]["versions"][0];
    assert_eq!(v["subresources"]["status"], serde_json::json!({}));
    let cols: Vec<&str> = v["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        vec!["JobKey", "Ready", "Suspended", "Active", "Last", "Age"]
    );
    assert_eq!(
        job["spec"]["names"]["categories"],
        serde_json::json!(["loadcontrol"])
    );
    let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        spec["jobKey"]["x-kubernetes-validations"][0]["rule"],
        "self == oldSelf"
    );
    let conditions =
        &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(
        conditions["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
    let run = serde_json::to_value(crds::LoadRun::crd()).unwrap();
    let rv = &run["spec"]["versions"][0];
    let cols: Vec<&str> = rv["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        vec!["Job", "BusinessKey", "Phase", "Partitions", "Rows", "Age"]
    );
    let rspec = &rv["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    for f in ["jobKey", "businessKey", "runId"] {
        assert_eq!(
            rspec[f]["x-kubernetes-validations"][0]["rule"], "self == oldSelf",
            "{f}"
        );
    }
}
