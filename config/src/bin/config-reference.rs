//! Writes the configuration reference (docs/configuration.md) and its JSON schema
//! (config/config.schema.json) from the configuration types. `config/tests/reference.rs` fails
//! when the committed files are not what this writes.
use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (path, text) in [
        ("docs/configuration.md", lcconfig::reference::markdown()),
        (
            "config/config.schema.json",
            lcconfig::reference::schema_json(),
        ),
    ] {
        std::fs::write(root.join(path), text)?;
        println!("wrote {path}");
    }
    Ok(())
}
