//! A private Kubernetes control plane for tests (envtest-style): a real etcd and a real
//! kube-apiserver, built from Go modules by `scripts/controlplane-build`, started on loopback with
//! generated certificates and RBAC, and stopped when dropped. No nodes, no controllers: what our
//! operator needs from Kubernetes is the API server itself.
//!
//! Binaries come from `LC_CONTROLPLANE_BIN`, else `~/.cache/load-control/controlplane/<k8s>-<etcd>/`
//! (the versions read from `e2e/controlplane/go.mod`).
use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub struct ControlPlane {
    dir: PathBuf,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    bin_dir: PathBuf,
    /// A kubeconfig with the admin (system:masters) credential.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// From spawning etcd to the API server answering `/readyz` with `ok`.
    pub startup: Duration,
}

use testkit::free_port;

fn go_mod_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().map(str::trim).find_map(|l| {
        let mut parts = l.split_whitespace();
        (parts.next() == Some(module))
            .then(|| parts.next())
            .flatten()
            .filter(|v| v.starts_with('v'))
            .map(str::to_string)
    })
}

/// Where `scripts/controlplane-build` put the binaries.
/// `helm` for rendering only (`helm template`, `install --dry-run=client`): no control plane, its
/// homes in the temporary directory.
/// The chart's required values (`examples/values-required.yaml`): a `-f` for every `helm
/// template`, `lint` and `install` of the tests that is not about those values.
pub fn required_values() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/values-required.yaml")
        .to_string_lossy()
        .into_owned()
}

pub fn helm_offline() -> Command {
    let mut helm = Command::new(bin_dir().expect("the control-plane binaries").join("helm"));
    for home in ["CACHE", "CONFIG", "DATA"] {
        helm.env(
            format!("HELM_{home}_HOME"),
            std::env::temp_dir().join(format!("lc-helm-{home}")),
        );
    }
    helm
}

pub fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("LC_CONTROLPLANE_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let go_mod_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane/go.mod");
    let go_mod = std::fs::read_to_string(&go_mod_path)
        .with_context(|| format!("reading {}", go_mod_path.display()))?;
    let k8s = go_mod_version(&go_mod, "k8s.io/kubernetes")
        .context("k8s.io/kubernetes version in go.mod")?;
    let etcd =
        go_mod_version(&go_mod, "go.etcd.io/etcd/server/v3").context("etcd version in go.mod")?;
    let root = match std::env::var_os("LC_CONTROLPLANE_CACHE") {
        Some(r) => PathBuf::from(r),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME")?)
            .join(".cache/load-control/controlplane"),
    };
    Ok(root.join(format!("{k8s}-{etcd}")))
}

struct Pki {
    ca_cert: String,
    serving_cert: String,
    serving_key: String,
    admin_cert: String,
    admin_key: String,
    sa_key: String,
    sa_pub: String,
}

fn pki() -> anyhow::Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "load-control-test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let admin_key = KeyPair::generate()?;
    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin.distinguished_name.push(DnType::CommonName, "admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &issuer)?;

    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: ca_cert.pem(),
        serving_cert: serving_cert.pem(),
        serving_key: serving_key.serialize_pem(),
        admin_cert: admin_cert.pem(),
        admin_key: admin_key.serialize_pem(),
        sa_key: sa.serialize_pem(),
        sa_pub: sa.public_key_pem(),
    })
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver in a new temporary folder and waits until the API is ready.
    pub async fn start() -> anyhow::Result<ControlPlane> {
        let bin_dir = bin_dir()?;
        for b in ["etcd", "kube-apiserver"] {
            if !bin_dir.join(b).is_file() {
                bail!(
                    "{} is missing: run scripts/controlplane-build first",
                    bin_dir.join(b).display()
                );
            }
        }
        let dir =
            std::env::temp_dir().join(format!("lc-controlplane-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(dir.join("certs"))?;
        let pki = pki()?;
        let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text)?;
            Ok(p)
        };
        let ca = write("ca.crt", &pki.ca_cert)?;
        let serving_cert = write("serving.crt", &pki.serving_cert)?;
        let serving_key = write("serving.key", &pki.serving_key)?;
        let admin_cert = write("admin.crt", &pki.admin_cert)?;
        let admin_key = write("admin.key", &pki.admin_key)?;
        let sa_key = write("sa.key", &pki.sa_key)?;
        let sa_pub = write("sa.pub", &pki.sa_pub)?;

        let started = Instant::now();
        let (client_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let etcd_log = std::fs::File::create(dir.join("etcd.log"))?;
        let etcd = Command::new(bin_dir.join("etcd"))
            .args(["--name", "default", "--data-dir"])
            .arg(dir.join("etcd"))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{client_port}"
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{client_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=default=http://127.0.0.1:{peer_port}"
            ))
            .args(["--unsafe-no-fsync", "--log-level=warn"])
            .stdout(Stdio::null())
            .stderr(etcd_log)
            .spawn()
            .context("spawning etcd")?;
        let mut plane = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            url: format!("https://127.0.0.1:{api_port}"),
            dir: dir.clone(),
            etcd: Some(etcd),
            apiserver: None,
            bin_dir: bin_dir.clone(),
            startup: Duration::ZERO,
        };
        let api_log = std::fs::File::create(dir.join("kube-apiserver.log"))?;
        let apiserver = Command::new(bin_dir.join("kube-apiserver"))
            .arg(format!("--etcd-servers=http://127.0.0.1:{client_port}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={api_port}"))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!("--tls-cert-file={}", serving_cert.display()))
            .arg(format!("--tls-private-key-file={}", serving_key.display()))
            .arg(format!("--client-ca-file={}", ca.display()))
            .arg(format!("--service-account-key-file={}", sa_pub.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_key.display()
            ))
            .args([
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--disable-admission-plugins=ServiceAccount",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ])
            .stdout(Stdio::null())
            .stderr(api_log)
            .spawn()
            .context("spawning kube-apiserver")?;
        plane.apiserver = Some(apiserver);
        std::fs::write(
            &plane.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
                 users:\n- name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
                 contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n    namespace: default\ncurrent-context: test\n",
                url = plane.url,
                ca = ca.display(),
                cert = admin_cert.display(),
                key = admin_key.display()
            ),
        )?;
        plane.wait_ready(Duration::from_secs(120)).await?;
        plane.startup = started.elapsed();
        Ok(plane)
    }

    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        let client = self.client().await?;
        loop {
            for (name, child) in [
                ("etcd", &mut self.etcd),
                ("kube-apiserver", &mut self.apiserver),
            ] {
                if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    let log = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
                        .unwrap_or_default();
                    let tail: String = log
                        .lines()
                        .rev()
                        .take(20)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    bail!("{name} exited with {status} during start-up:\n{tail}");
                }
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            if let Ok(text) = client.request_text(req).await
                && text.trim() == "ok"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready after {limit:?}; log in {}",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn config(&self) -> anyhow::Result<Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A client with the admin credential (group system:masters).
    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// A client with the admin credential whose writes (any method but GET) to a path containing
    /// one of `path_parts` are held `stall` before they are sent, once [`Stalls::start`] is
    /// called: an API server that hangs on some kinds, as a slow admission webhook or an
    /// overloaded etcd makes it, while the rest answers.
    pub async fn client_stalling_writes(
        &self,
        path_parts: &'static [&'static str],
        stall: Duration,
    ) -> anyhow::Result<(Client, Arc<Stalls>)> {
        let stalls = Arc::new(Stalls {
            path_parts,
            stall,
            on: AtomicBool::new(false),
            held: path_parts.iter().map(|_| AtomicUsize::new(0)).collect(),
        });
        let layer = tower::layer::layer_fn({
            let stalls = stalls.clone();
            move |inner| StallWrites {
                inner,
                stalls: stalls.clone(),
            }
        });
        let client = kube::client::ClientBuilder::try_from(self.config().await?)?
            .with_layer(&layer)
            .build();
        Ok((client, stalls))
    }

    /// A client that impersonates `user` with `groups` (the admin credential may impersonate).
    pub async fn impersonating(&self, user: &str, groups: &[String]) -> anyhow::Result<Client> {
        let mut config = self.config().await?;
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = Some(groups.to_vec());
        Ok(Client::try_from(config)?)
    }

    /// A client acting as the service account `namespace/name`, as a pod using it would.
    pub async fn service_account_client(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Client> {
        let groups = [
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".to_string(),
        ];
        self.impersonating(
            &format!("system:serviceaccount:{namespace}:{name}"),
            &groups,
        )
        .await
    }

    /// A new namespace `<prefix>-<random>`, for one test.
    pub async fn create_namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let name = format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        Api::<Namespace>::all(self.client().await?)
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(name)
    }

    /// Applies every CustomResourceDefinition in a (multi-document) YAML text and waits until each
    /// is Established.
    pub async fn install_crds(&self, yaml: &str) -> anyhow::Result<Vec<String>> {
        let api = Api::<CustomResourceDefinition>::all(self.client().await?);
        let mut names = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc)?;
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(value)?;
            let name = crd.metadata.name.clone().context("CRD without a name")?;
            api.patch(
                &name,
                &PatchParams::apply("kubetest").force(),
                &Patch::Apply(&crd),
            )
            .await?;
            names.push(name);
        }
        for name in &names {
            tokio::time::timeout(
                Duration::from_secs(30),
                await_condition(api.clone(), name, conditions::is_crd_established()),
            )
            .await
            .with_context(|| format!("CRD {name} not Established within 30s"))??;
        }
        Ok(names)
    }

    /// `kubectl --kubeconfig <admin>`.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.bin_dir.join("kubectl"));
        c.arg("--kubeconfig").arg(&self.kubeconfig);
        c
    }

    /// `helm` with `KUBECONFIG` set to the admin kubeconfig and its caches inside the control
    /// plane's folder.
    pub fn helm(&self) -> Command {
        let mut c = Command::new(self.bin_dir.join("helm"));
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"));
        c
    }

    /// Stops both processes and removes the folder; returns how long that took.
    pub fn stop(mut self) -> Duration {
        let started = Instant::now();
        self.shutdown();
        started.elapsed()
    }

    fn shutdown(&mut self) {
        for child in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The writes [`ControlPlane::client_stalling_writes`] holds.
pub struct Stalls {
    path_parts: &'static [&'static str],
    stall: Duration,
    on: AtomicBool,
    held: Vec<AtomicUsize>,
}

impl Stalls {
    /// From now on, matching writes are held.
    pub fn start(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// How many writes to paths containing `path_part` were held so far.
    pub fn held(&self, path_part: &str) -> usize {
        self.path_parts
            .iter()
            .position(|p| *p == path_part)
            .map_or(0, |i| self.held[i].load(Ordering::SeqCst))
    }

    /// The pause `req` waits before it is sent, if any (and it is counted).
    fn pause<B>(&self, req: &http::Request<B>) -> Option<Duration> {
        if !self.on.load(Ordering::SeqCst) || req.method() == http::Method::GET {
            return None;
        }
        let i = self
            .path_parts
            .iter()
            .position(|p| req.uri().path().contains(p))?;
        self.held[i].fetch_add(1, Ordering::SeqCst);
        Some(self.stall)
    }
}

/// The service behind [`ControlPlane::client_stalling_writes`].
struct StallWrites<S> {
    inner: S,
    stalls: Arc<Stalls>,
}

impl<S, B> tower::Service<http::Request<B>> for StallWrites<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let pause = self.stalls.pause(&req);
        let sent = self.inner.call(req);
        Box::pin(async move {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            sent.await
        })
    }
}
