//! Writes the CRD YAML of LoadJob and LoadRun to `crds/` and the chart's `crds/`
//! (`cargo run -p load-control-crds --bin crdgen`). A test fails when the committed files are stale.
use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["crds", "charts/load-control/crds"] {
        std::fs::create_dir_all(root.join(dir))?;
        for (name, yaml) in crds::crd_yaml() {
            let path = root.join(dir).join(name);
            std::fs::write(&path, yaml)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
