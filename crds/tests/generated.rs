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

/// Issue 27 item 4: `v1beta1` is the storage version and `v1alpha1` is served beside it without a
/// conversion webhook, which is right only while their schemas agree with each other and with
/// what release v0.1.0 stored as `v1alpha1` (its CRDs are kept under tests/fixtures). A change to
/// the schema that objects stored by that release would not satisfy needs a conversion webhook
/// (or a new version); this test fails until that is decided.
#[test]
fn every_served_version_has_the_schema_of_the_first_release() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, yaml) in crds::crd_yaml() {
        let crd: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
        let versions = crd["spec"]["versions"].as_array().unwrap();
        let names: Vec<(&str, bool, bool)> = versions
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap(),
                    v["served"].as_bool().unwrap(),
                    v["storage"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![("v1beta1", true, true), ("v1alpha1", true, false)],
            "{name}"
        );
        assert!(crd["spec"].get("conversion").is_none(), "{name}");
        let first: serde_json::Value = serde_yaml::from_str(
            &std::fs::read_to_string(root.join("tests/fixtures/v0.1.0").join(name)).unwrap(),
        )
        .unwrap();
        let first = &first["spec"]["versions"][0];
        assert_eq!(first["name"], "v1alpha1");
        for v in versions {
            for part in ["schema", "additionalPrinterColumns", "subresources"] {
                assert_eq!(
                    v[part], first[part],
                    "{name} {}: {part} differs from v0.1.0's v1alpha1",
                    v["name"]
                );
            }
        }
    }
}
