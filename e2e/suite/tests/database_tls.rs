//! TLS to PostgreSQL as a managed ledger serves it (issue 21 item 8): the server's certificate is
//! signed by a CA of its own, and the binaries verify it (`sslmode=verify-full`) with the CA the
//! chart mounts from a Secret (`database.tls.caSecret` → PGSSLMODE, PGSSLROOTCERT). The real
//! api-server binary migrates through it; with another CA, or a name the certificate does not
//! carry, it refuses to connect.
use e2e::standalone::{PgServer, bin};
use rcgen::{CertificateParams, DnType, KeyPair};
use std::process::Command;

fn ca(name: &str) -> (String, rcgen::Issuer<'static, KeyPair>) {
    let ca = testkit::TestCa::new(name);
    (ca.pem, ca.issuer)
}

/// `load-control-api migrate` against `url` with the given sslmode and CA file: its outcome.
fn migrate(url: &str, mode: &str, ca: &std::path::Path) -> (bool, String) {
    let out = Command::new(bin("load-control-api").unwrap())
        .arg("migrate")
        .env("DATABASE_URL", url)
        .env("LCA_CONFIG", "/dev/null")
        .env("PGSSLMODE", mode)
        .env("PGSSLROOTCERT", ca)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binaries_verify_the_database_certificate_with_the_mounted_ca() {
    let dir = std::env::temp_dir().join(format!("lc-dbtls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_pem, issuer) = ca("ledger CA");
    let (other_pem, _) = ca("some other CA");
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, "localhost");
    let cert = p.signed_by(&key, &issuer).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (crt, key_file) = (
        write("server.crt", &cert.pem()),
        write("server.key", &key.serialize_pem()),
    );
    let (ca_file, other_file) = (write("ca.crt", &ca_pem), write("other.crt", &other_pem));
    // PostgreSQL reads its key only when the file is private to the server's user.
    Command::new("chmod")
        .arg("600")
        .arg(&key_file)
        .status()
        .unwrap();
    if Command::new("id").arg("-u").output().unwrap().stdout == b"0\n" {
        Command::new("chown")
            .arg("postgres:")
            .arg(&crt)
            .arg(&key_file)
            .status()
            .unwrap();
    }
    let pg = PgServer::start_with(
        "dbtls",
        false,
        &format!(
            "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            crt.display(),
            key_file.display()
        ),
    )
    .expect("PostgreSQL with TLS");
    let url = pg.create_db("ledger").unwrap();
    let by_name = url.replace("127.0.0.1", "localhost");

    let (ok, err) = migrate(&by_name, "verify-full", &ca_file);
    assert!(ok, "verify-full with the server's CA connects: {err}");
    let (ok, err) = migrate(&by_name, "verify-full", &other_file);
    assert!(!ok, "another CA is refused");
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("tls"),
        "{err}"
    );
    // The certificate names localhost, not 127.0.0.1: verify-full checks the name too.
    let (ok, _) = migrate(&url, "verify-full", &ca_file);
    assert!(!ok, "a name the certificate does not carry is refused");
    let (ok, err) = migrate(&url, "verify-ca", &ca_file);
    assert!(ok, "verify-ca checks the chain only: {err}");
    drop(pg);
    let _ = std::fs::remove_dir_all(&dir);
}
