//! A real kube-apiserver (and etcd) for tests, started from envtest's binaries.
//!
//! `KUBEBUILDER_ASSETS` names the folder holding `etcd` and `kube-apiserver` (controller-runtime's
//! envtest layout; `../shared/envtest/assets.sh` prints one, `setup-envtest` makes another).
//! Without it the tests that need an API server are `#[ignore]`d at build time (`build.rs`'s
//! `cfg(apiserver)`), so `cargo test` reports them as ignored with the command that runs them;
//! a folder that lacks a binary makes them print one line and return; with
//! `HANDOFF_REQUIRE_APISERVER=1` a missing binary fails them instead (CI).
//!
//! Every process the harness starts (etcd, kube-apiserver, `handoff serve`) is spawned from one
//! thread that lives as long as the test binary, with `PR_SET_PDEATHSIG`: whatever way the
//! binary ends (pass, panic, abort, a kill), the kernel kills them. `Drop` stops them earlier
//! when a test owns its API server.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use handoff::certs::Ca;

/// The admin's bearer token and the other users the token file knows.
pub const ADMIN: &str = "admin";
/// One `handoff serve` that serves both webhooks: the tests bind it to both of the base
/// manifests' ClusterRoles (`manifests/base/rbac.yaml`).
pub const HANDOFF_USER: &str = "system:serviceaccount:handoff-system:handoff";
/// The manifests' own identities of the two servers, bound by `manifests/base/rbac.yaml`.
pub const GUARD_USER: &str = "system:serviceaccount:handoff-system:handoff-guard";
pub const PIN_USER: &str = "system:serviceaccount:handoff-system:handoff-pin";
/// A user bound to nothing unless a test binds it.
pub const NOBODY: &str = "nobody";

/// The sync target of the recorded fixtures: `us-west1` in `root:org:ws`, UID `syncTargetUID`.
pub const SYNCER: &str =
    "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw";
pub const SYNC_TARGET_KEY: &str = "6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g";
pub const LOCATOR: &str = r#"{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}"#;

/// The folder with `etcd` and `kube-apiserver`, or `None` (and one line on stderr) when the
/// tests that need them should be skipped.
pub fn assets() -> Option<PathBuf> {
    let required = std::env::var("HANDOFF_REQUIRE_APISERVER").is_ok_and(|v| v == "1");
    let dir = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from);
    let missing = match &dir {
        None => "KUBEBUILDER_ASSETS is not set".to_string(),
        Some(d) => match ["etcd", "kube-apiserver"]
            .iter()
            .find(|b| !is_executable(&d.join(b)))
        {
            Some(b) => format!("{} is missing or not executable", d.join(b).display()),
            None => return dir,
        },
    };
    let how = "run with KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh), or a folder from `setup-envtest use -p path`";
    if required {
        panic!("HANDOFF_REQUIRE_APISERVER=1 but {missing}: {how}");
    }
    static SAID: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| {
        // Straight to the process's stderr: libtest hides what a passing test prints.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: the real-API-server tests need etcd and kube-apiserver ({missing}); {how}"
        );
    });
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// True when the calling test must return at once: no API server can be started here.
pub fn skip() -> bool {
    assets().is_none()
}

// ---- processes that die with the test binary ----

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawn `cmd` from the keeper thread, so that `PR_SET_PDEATHSIG` (which fires when the
/// spawning *thread* ends) fires only when the whole test binary ends.
pub fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("process-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The senders live in a static: this loop never ends while the binary runs.
                loop {
                    std::thread::park();
                }
            })
            .expect("process keeper thread");
        Mutex::new(tx)
    });
    // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .expect("keeper alive");
    rx.recv().expect("keeper answers")
}

/// `kubectl --kubeconfig KUBECONFIG get ARGS -w --output-watch-events -o json`: each event (its
/// `type` and `object`) handed to `on_event` as it arrives, on a thread of its own, until the
/// stream ends, a line does not parse, or `on_event` says `false`; `ended` is set then. The
/// caller owns the child: killing it ends the watch.
pub fn kubectl_watch(
    kubeconfig: &Path,
    args: &[&str],
    ended: Arc<std::sync::atomic::AtomicBool>,
    mut on_event: impl FnMut(&str, serde_json::Value) -> bool + Send + 'static,
) -> Child {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("get")
        .args(args)
        .args(["-w", "--output-watch-events", "-o", "json"])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = spawn(cmd).expect("kubectl get -w");
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        let stream = serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
            .into_iter::<serde_json::Value>();
        for v in stream {
            let Ok(mut v) = v else { break };
            let kind = v["type"].as_str().unwrap_or("").to_string();
            if !on_event(&kind, v["object"].take()) {
                break;
            }
        }
        ended.store(true, Ordering::SeqCst);
    });
    child
}

pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn stop(child: &mut Child) {
    // SIGTERM first: etcd and kube-apiserver shut down cleanly and quickly.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A plain `GET path` over HTTP/1.0 to a loopback port: `(status, body)`.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(500),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Some((status, body.to_string()))
}

// ---- the API server ----

/// etcd and kube-apiserver on free loopback ports, state in a temporary folder.
pub struct ApiServer {
    pub dir: tempfile::TempDir,
    pub url: String,
    pub port: u16,
    pub ca_pem: String,
    tokens: Vec<(String, String)>,
    etcd: Child,
    etcd_port: u16,
    apiserver: Option<Child>,
    assets: PathBuf,
}

impl ApiServer {
    /// Start a new one (about 3 s). Panics with the components' logs when it does not come up.
    pub fn start() -> ApiServer {
        let assets = assets().expect("KUBEBUILDER_ASSETS (check require_apiserver! first)");
        let dir = temp_dir("handoff-apiserver-");
        let d = dir.path();
        let (ca, cert, key) = loopback_serving_cert("envtest CA");
        let sa = rcgen::KeyPair::generate().expect("service-account key");
        write(d, "ca.crt", &ca.cert_pem);
        write(d, "apiserver.crt", &cert);
        write(d, "apiserver.key", &key);
        write(d, "sa.key", &sa.serialize_pem());
        write(d, "sa.pub", &sa.public_key_pem());
        let tokens: Vec<(String, String)> = [ADMIN, HANDOFF_USER, GUARD_USER, PIN_USER, NOBODY]
            .iter()
            .map(|u| (u.to_string(), random_token()))
            .collect();
        let csv: String = tokens
            .iter()
            .map(|(user, token)| {
                let groups = match user.as_str() {
                    ADMIN => "system:masters",
                    HANDOFF_USER | GUARD_USER | PIN_USER => {
                        "system:serviceaccounts,system:serviceaccounts:handoff-system"
                    }
                    _ => "",
                };
                format!("{token},{user},{user},\"{groups}\"\n")
            })
            .collect();
        write(d, "tokens.csv", &csv);
        // Writes and deletes at Metadata level: where the API server records a webhook's audit
        // annotations (`<webhook name>/<key>`), for tests to read.
        write(
            d,
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n- level: None\n",
        );

        let mut last_error = String::new();
        let (etcd, etcd_port) = (0..5)
            .find_map(|_| {
                let port = free_port();
                start_etcd(&assets, d, port)
                    .map(|c| (c, port))
                    .map_err(|e| last_error = e)
                    .ok()
            })
            .unwrap_or_else(|| panic!("etcd did not start: {last_error}"));
        let port = free_port();
        let mut server = ApiServer {
            url: format!("https://127.0.0.1:{port}"),
            port,
            ca_pem: ca.cert_pem.clone(),
            tokens,
            etcd,
            etcd_port,
            apiserver: None,
            assets,
            dir,
        };
        for attempt in 0..3 {
            match server.start_apiserver() {
                Ok(()) => return server,
                // Another process took the port between our probe and the bind: a new one.
                Err(e) if e.contains("address already in use") && attempt < 2 => {
                    server.port = free_port();
                    server.url = format!("https://127.0.0.1:{}", server.port);
                }
                Err(e) => panic!("kube-apiserver did not start: {e}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// (Re)start kube-apiserver on this server's port.
    fn start_apiserver(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("kube-apiserver.log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(self.assets.join("kube-apiserver"));
        cmd.args([
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", self.port),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", d.display()),
            format!("--tls-cert-file={}", d.join("apiserver.crt").display()),
            format!(
                "--tls-private-key-file={}",
                d.join("apiserver.key").display()
            ),
            format!("--client-ca-file={}", d.join("ca.crt").display()),
            format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", d.join("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            format!(
                "--audit-policy-file={}",
                d.join("audit-policy.yaml").display()
            ),
            format!("--audit-log-path={}", d.join("audit.log").display()),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
        let child = spawn(cmd).map_err(|e| format!("kube-apiserver: {e}"))?;
        self.apiserver = Some(child);
        // Generous: on 2 cores shared with other suites (load average 40-80) a start took
        // longer than a minute, and a slow start proves nothing wrong.
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Some(Ok(Some(status))) = self.apiserver.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "kube-apiserver exited ({status}):\n{}",
                    tail(&d.join("kube-apiserver.log"))
                ));
            }
            if self.kubectl(ADMIN, &["get", "--raw", "/readyz"]).stdout == b"ok" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no /readyz ok within 300 s:\n{}",
                    tail(&d.join("kube-apiserver.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stop kube-apiserver and start it again on the same port (etcd keeps the data): what a
    /// control-plane upgrade or a crash looks like to a watch.
    pub fn restart_apiserver(&mut self, down_for: Duration) {
        if let Some(mut c) = self.apiserver.take() {
            stop(&mut c);
        }
        std::thread::sleep(down_for);
        self.start_apiserver()
            .unwrap_or_else(|e| panic!("kube-apiserver did not come back: {e}"));
    }

    pub fn token(&self, user: &str) -> &str {
        &self
            .tokens
            .iter()
            .find(|(u, _)| u == user)
            .unwrap_or_else(|| panic!("no token for {user}"))
            .1
    }

    /// A kubeconfig for `user` (one of the token file's), written into the server's folder.
    pub fn kubeconfig(&self, user: &str) -> PathBuf {
        self.kubeconfig_at(user, &self.url)
    }

    /// The same, reaching the API server at `url` (e.g. through a proxy).
    pub fn kubeconfig_at(&self, user: &str, url: &str) -> PathBuf {
        let safe: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let file = match url == self.url {
            true => format!("kubeconfig-{safe}"),
            false => format!(
                "kubeconfig-{safe}-{}",
                url.rsplit(':').next().unwrap_or("proxy")
            ),
        };
        let path = self.dir.path().join(&file);
        {
            use base64::Engine as _;
            let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
            let text = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: {safe}\n  user:\n    token: {}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: {safe}\n    namespace: default\ncurrent-context: envtest\n",
                url,
                self.token(user)
            );
            // Written aside and renamed: every kubectl call rewrites it, and a reader on another
            // thread (a proxy starting, a client being built) must never see half a file.
            static N: AtomicU64 = AtomicU64::new(0);
            let aside = format!("{file}.{}", N.fetch_add(1, Ordering::SeqCst));
            write(self.dir.path(), &aside, &text);
            std::fs::rename(self.dir.path().join(&aside), &path)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
        }
        path
    }

    /// Run kubectl as `user` (no shell; the output is returned whatever the exit status).
    pub fn kubectl(&self, user: &str, args: &[&str]) -> Output {
        self.kubectl_stdin(user, args, None)
    }

    pub fn kubectl_stdin(&self, user: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig(user))
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("kubectl: {e}: the real-API-server tests drive the cluster with kubectl; put it on PATH")
        });
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("stdin");
            pipe.write_all(input.as_bytes()).expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// kubectl as `user` that must succeed; its stdout.
    pub fn ok(&self, user: &str, args: &[&str]) -> String {
        let out = self.kubectl(user, args);
        assert!(
            out.status.success(),
            "kubectl {} (as {user}) failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml` as the admin.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_stdin(ADMIN, &["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply failed:\n{}\n---\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The project's MoveWindow CRD (`manifests/base/movewindow-crd.yaml`), Established.
    pub fn install_crd(&self) {
        let crd = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/base/movewindow-crd.yaml"),
        )
        .expect("movewindow-crd.yaml");
        self.apply(&crd);
        self.ok(
            ADMIN,
            &[
                "wait",
                "--for=condition=Established",
                "crd/movewindows.handoff.dev",
            ],
        );
    }

    /// A kube-rs client as the admin. Build one per test: a client belongs to the runtime that
    /// made it.
    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig(ADMIN)).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("client config");
        kube::Client::try_from(config).expect("client")
    }

    pub fn log(&self) -> String {
        tail(&self.dir.path().join("kube-apiserver.log"))
    }

    /// The audit events recorded so far (`audit.k8s.io/v1` Event objects).
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            stop(&mut c);
        }
        stop(&mut self.etcd);
    }
}

fn start_etcd(assets: &Path, d: &Path, port: u16) -> Result<Child, String> {
    let log = std::fs::File::create(d.join("etcd.log")).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(assets.join("etcd"));
    cmd.args([
        format!("--data-dir={}", d.join("etcd-data").display()),
        format!("--listen-client-urls=http://127.0.0.1:{port}"),
        format!("--advertise-client-urls=http://127.0.0.1:{port}"),
        "--listen-peer-urls=http://127.0.0.1:0".into(),
        "--unsafe-no-fsync=true".into(),
    ])
    .stdin(Stdio::null())
    .stdout(log.try_clone().map_err(|e| e.to_string())?)
    .stderr(log);
    let mut child = spawn(cmd).map_err(|e| format!("etcd: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "etcd exited ({status}):\n{}",
                tail(&d.join("etcd.log"))
            ));
        }
        if http_get(port, "/health")
            .is_some_and(|(code, body)| code == 200 && body.contains("true"))
        {
            return Ok(child);
        }
        if Instant::now() > deadline {
            stop(&mut child);
            return Err(format!(
                "etcd: no /health within 30 s:\n{}",
                tail(&d.join("etcd.log"))
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("temp dir")
}

/// A CA named `name` and a serving certificate it signed for localhost and 127.0.0.1:
/// `(CA, cert PEM, key PEM)`.
fn loopback_serving_cert(name: &str) -> (Ca, String, String) {
    let ca = Ca::new(name, 30).expect("CA");
    let (cert, key) = ca
        // Also the `kubernetes` Service's ClusterIP (the first address of envtest's service
        // range), where pods reach the API server in `support::kubelet`'s cluster.
        .serving_cert(
            &["localhost".into(), "kubernetes.default.svc".into()],
            &[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            ],
            30,
        )
        .expect("serving cert");
    (ca, cert, key)
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn random_token() -> String {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

// ---- handoff serve against it ----

/// `handoff serve` (the real binary) with a certificate made for the test, watching `api` as
/// handoff's own ServiceAccount (or another user).
pub struct Handoff {
    pub port: u16,
    pub metrics_port: u16,
    pub ca: Ca,
    pub dir: tempfile::TempDir,
    child: Child,
}

impl Handoff {
    pub fn start(api: &ApiServer, user: &str, extra: &[&str]) -> Handoff {
        Self::start_with_kubeconfig(&api.kubeconfig(user), extra)
    }

    pub fn start_with_kubeconfig(kubeconfig: &Path, extra: &[&str]) -> Handoff {
        let dir = temp_dir("handoff-serve-");
        let (ca, cert, key) = loopback_serving_cert("handoff test CA");
        write(dir.path(), "tls.crt", &cert);
        write(dir.path(), "tls.key", &key);
        write(dir.path(), "ca.crt", &ca.cert_pem);
        let port = free_port();
        let metrics_port = free_port();
        let log = std::fs::File::create(dir.path().join("handoff.log")).expect("log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--drain-delay")
            .arg("0s")
            .args(extra)
            .env("RUST_LOG", "info,handoff=debug")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let child = spawn(cmd).expect("handoff serve");
        Handoff {
            port,
            metrics_port,
            ca,
            dir,
            child,
        }
    }

    /// `/readyz` on the plain port: `(status, body)`.
    pub fn readyz(&self) -> Option<(u16, String)> {
        http_get(self.metrics_port, "/readyz")
    }

    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("handoff serve exited ({status}):\n{}", self.log());
            }
            if self.readyz().is_some_and(|(code, _)| code == 200) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "handoff serve not ready within 30 s ({:?}):\n{}",
                    self.readyz(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("handoff.log")).unwrap_or_default()
    }

    /// Register this server with `api` through the project's own `local` overlay: the CRD and
    /// both webhook configurations, pointed at this server's port, with its CA as caBundle.
    pub fn register(&self, api: &ApiServer) {
        api.apply(&self.rendered_local_overlay());
    }

    /// `kubectl kustomize manifests/overlays/local`, with this server's CA and port.
    pub fn rendered_local_overlay(&self) -> String {
        let work = self.dir.path().join("manifests");
        copy_tree(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests"),
            &work,
        );
        let certs = work.join("overlays/local/certs");
        std::fs::create_dir_all(&certs).expect("certs dir");
        std::fs::write(certs.join("ca.crt"), &self.ca.cert_pem).expect("ca.crt");
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(work.join("overlays/local"))
            .output()
            .expect("kubectl kustomize");
        assert!(
            out.status.success(),
            "kubectl kustomize: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf-8");
        assert!(
            text.contains("https://127.0.0.1:8443/"),
            "the local overlay no longer points at https://127.0.0.1:8443/"
        );
        text.replace(
            "https://127.0.0.1:8443/",
            &format!("https://127.0.0.1:{}/", self.port),
        )
    }

    pub fn stop(&mut self) {
        stop(&mut self.child);
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            if e.file_name() != "certs" {
                copy_tree(&e.path(), &target);
            }
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

// ---- a connection that stops answering ----

/// A TCP proxy to a loopback port whose connections can be made to go silent without closing:
/// what a watch sees when a NAT entry, a load balancer or a node's network drops it.
pub struct FreezingProxy {
    pub port: u16,
    opened: Arc<AtomicU64>,
    frozen_before: Arc<AtomicU64>,
}

impl FreezingProxy {
    pub fn start(target: u16) -> FreezingProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("proxy listener");
        let port = listener.local_addr().expect("addr").port();
        let opened = Arc::new(AtomicU64::new(0));
        let frozen_before = Arc::new(AtomicU64::new(0));
        let (o, f) = (opened.clone(), frozen_before.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(upstream) = TcpStream::connect((Ipv4Addr::LOCALHOST, target)) else {
                    continue;
                };
                let id = o.fetch_add(1, Ordering::SeqCst);
                for (from, to) in [
                    (client.try_clone(), upstream.try_clone()),
                    (upstream.try_clone(), client.try_clone()),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let f = f.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => {
                                    let _ = to.shutdown(std::net::Shutdown::Write);
                                    return;
                                }
                                Ok(n) => {
                                    if id < f.load(Ordering::SeqCst) {
                                        // Frozen: swallow everything, close nothing.
                                        continue;
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    });
                }
            }
        });
        FreezingProxy {
            port,
            opened,
            frozen_before,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Every connection opened so far stops forwarding, in both directions, and stays open.
    /// New connections work.
    pub fn freeze(&self) {
        self.frozen_before
            .store(self.opened.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

// ---- waiting ----

/// Poll `check` until it returns `Some`, for up to `within`; panic with `what` otherwise.
pub fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {within:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Lossy UTF-8 of a command's output.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The `handoff` binary under test, as the admin of `api`.
pub fn handoff_cmd(api: &ApiServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(args)
        .arg("--kubeconfig")
        .arg(api.kubeconfig(ADMIN))
        .env_remove("KUBECONFIG")
        .output()
        .expect("handoff")
}

/// A Cluster API provider controller, as the default MoveWindow selector picks them; no
/// `replicas` when `None`.
pub fn capi_deployment(ns: &str, name: &str, replicas: Option<i64>) -> String {
    let replicas = replicas
        .map(|r| format!("  replicas: {r}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    cluster.x-k8s.io/provider: cluster-api\n    clusterctl.cluster.x-k8s.io: \"\"\nspec:\n{replicas}  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      containers:\n      - name: manager\n        image: registry.example/capi:v1\n"
    )
}

/// An application's Deployment, which no window selects.
pub fn app_deployment(ns: &str, name: &str, replicas: i64) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      containers:\n      - name: web\n        image: registry.example/web:v1\n"
    )
}
