//! The command line: every subcommand, flag and default of `handoff` (and `kubectl handoff`),
//! and the parsers of its values. What each command does is in `main.rs` and the library.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};
use handoff::rules::move_window::OwnDeployment;
use handoff::server;
use handoff::webhook::Webhook;

// Defaults that more than one command takes, each written once.
const WAIT_TIMEOUT: &str = "5m";
const RESTORE_TIMEOUT: &str = "1m";
const LEAD_TIMEOUT: &str = "2m";

/// `handoff --version`: the crate's version and the commit it was built from (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("HANDOFF_GIT_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "handoff",
    version = VERSION,
    about = "Admission webhooks that keep workloads whole while they move between clusters"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

// Parsed once at start-up: the size of the largest variant (serve's many flags) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
    /// Serve the webhooks over HTTPS.
    Serve(ServeArgs),
    /// Decide one AdmissionReview (a file, or stdin) and print the response AdmissionReview.
    Review(ReviewArgs),
    /// Write a CA and a serving certificate, and print the caBundle.
    Certs(CertsArgs),
    /// Print the MoveWindow CustomResourceDefinition (manifests/base/movewindow-crd.yaml).
    Crd,
    /// Open, close and inspect move windows (one cluster, or --source and --target).
    Window(WindowArgs),
    /// Install, remove or print the in-API-server admission policies (both rules).
    Policy(PolicyArgs),
    /// `clusterctl move`, with the controllers of both clusters stopped for the whole copy
    /// (the target's before it starts, the source's once clusterctl has paused it) and
    /// restored afterwards, the target's first; `--abort` brings them back after a failure.
    /// With `--to-directory` (a backup) or `--from-directory` (a restore), one cluster's.
    Move(MoveArgs),
}

#[derive(Args)]
pub struct MoveArgs {
    /// kubeconfig of the source management cluster, passed to clusterctl (default: as
    /// clusterctl and kubectl find it: $KUBECONFIG, ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the source kubeconfig.
    #[arg(long)]
    pub kubeconfig_context: Option<String>,
    /// kubeconfig of the target management cluster (with `--from-directory`: the cluster
    /// restored into).
    #[arg(long, value_name = "FILE", required_unless_present = "to_directory")]
    pub to_kubeconfig: Option<PathBuf>,
    /// A backup: clusterctl writes the namespace's objects to this folder (it must exist),
    /// with the source's controllers stopped from after the providers' block-move until it has
    /// written them. No second cluster.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["to_kubeconfig", "to_kubeconfig_context", "from_directory", "dry_run"])]
    pub to_directory: Option<PathBuf>,
    /// A restore: clusterctl creates the objects of a backup in the `--to-kubeconfig` cluster,
    /// whose controllers stay stopped until it has created them all.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "kubeconfig_context", "namespace", "dry_run"])]
    pub from_directory: Option<PathBuf>,
    /// Context in the target kubeconfig.
    #[arg(long)]
    pub to_kubeconfig_context: Option<String>,
    /// The namespace to move (default: the source context's namespace, else `default`, as
    /// clusterctl picks it); handoff passes it to clusterctl explicitly.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Every namespace of the source that holds a Cluster, a ClusterClass or an object of a
    /// kind labelled for clusterctl's move hierarchy, under one stop of both clusters:
    /// clusterctl once per namespace, each namespace whose Clusters use a ClusterClass of
    /// another before that one (window: move-all-namespaces). With `--to-directory`, each such
    /// namespace into a folder of its own under one stop (window: backup-all-namespaces); with
    /// `--from-directory`, each folder of it, a namespace's backup.
    #[arg(long, short = 'A', conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Passed to clusterctl; handoff prints its plan and writes nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The clusterctl binary.
    #[arg(long, value_name = "PATH", default_value = "clusterctl")]
    pub clusterctl: PathBuf,
    /// The MoveWindow in both clusters (default: move-<namespace>; a backup's
    /// backup-<namespace>, a restore's restore).
    #[arg(long, value_name = "NAME")]
    pub window: Option<String>,
    /// Bring every controller back as it was (the source's first) after a move that failed,
    /// and say what clusterctl left behind (a backup's or restore's: its one cluster's).
    #[arg(long, conflicts_with = "dry_run")]
    pub abort: bool,
    /// How to stop each controller, as `window open --stop`.
    #[arg(long, value_enum)]
    pub stop: Option<StopArg>,
    /// Move even though Deployments pinned to 0 serve webhooks that fail closed.
    #[arg(long)]
    pub allow_webhook_outage: bool,
    /// Do not add a standby replica to a single-replica controller before its Lease is taken
    /// (its only pod then exits and its webhooks are down until it restarts).
    #[arg(long)]
    pub no_standby: bool,
    /// How long to wait for the pinned pods to be gone.
    #[arg(long, value_name = "DURATION", default_value = WAIT_TIMEOUT, value_parser = duration)]
    pub wait_timeout: Duration,
    /// How long a restore may be re-pinned by a webhook that has not yet seen the close.
    #[arg(long, value_name = "DURATION", default_value = RESTORE_TIMEOUT, value_parser = duration)]
    pub restore_timeout: Duration,
    /// How long a released Lease may stay without a pod of its Deployment leading.
    #[arg(long, value_name = "DURATION", default_value = LEAD_TIMEOUT, value_parser = duration)]
    pub lead_timeout: Duration,
    /// handoff's own Deployment (NAMESPACE/NAME), never stopped.
    #[arg(long, value_name = "NS/NAME", default_value_t = OwnDeployment::default(), value_parser = own_deployment)]
    pub own_deployment: OwnDeployment,
    #[command(flatten)]
    pub progress: ProgressArgs,
}

#[derive(Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub command: PolicyCommand,
    /// kubeconfig of the cluster (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Config file (as `handoff serve --config`): explicit identities, domains, key schemes,
    /// enforcement modes and exemptions.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// The ConfigMap in which sync-target identities are published for the guard's policy.
    #[arg(
        long,
        value_name = "NS/NAME",
        default_value_t = handoff::admission_policy::ParamsRef::default(),
        global = true
    )]
    pub params: handoff::admission_policy::ParamsRef,
    /// handoff's own Deployment (NAMESPACE/NAME), never pinned.
    #[arg(long, value_name = "NS/NAME", default_value_t = OwnDeployment::default(), value_parser = own_deployment, global = true)]
    pub own_deployment: OwnDeployment,
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Apply the policies, their bindings and the parameter (idempotent).
    Install,
    /// Remove everything `install` and `window open` created.
    Uninstall,
    /// Print the YAML that `install` would apply, with the identities it would publish now.
    Show,
}

#[derive(Args)]
pub struct WindowArgs {
    #[command(subcommand)]
    pub command: WindowCommand,
    /// kubeconfig of the one cluster to act on (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, value_name = "FILE", global = true, conflicts_with_all = ["source", "target"])]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context of that cluster.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// kubeconfig of the source management cluster of a move (with --target).
    #[arg(long, value_name = "FILE", global = true, requires = "target")]
    pub source: Option<PathBuf>,
    /// kubeconfig of the target management cluster of a move (with --source).
    #[arg(long, value_name = "FILE", global = true, requires = "source")]
    pub target: Option<PathBuf>,
    /// Context in the --source kubeconfig.
    #[arg(long, global = true)]
    pub source_context: Option<String>,
    /// Context in the --target kubeconfig.
    #[arg(long, global = true)]
    pub target_context: Option<String>,
    /// handoff's own Deployment (NAMESPACE/NAME), never pinned.
    #[arg(long, value_name = "NS/NAME", default_value_t = OwnDeployment::default(), value_parser = own_deployment, global = true)]
    pub own_deployment: OwnDeployment,
}

#[derive(Subcommand)]
pub enum WindowCommand {
    /// Preflight, create the MoveWindow, stop every selected Deployment (hold its
    /// leader-election Lease, or pin it to 0), and wait until each is proven stopped.
    Open {
        /// The MoveWindow (cluster-scoped), created if absent.
        name: String,
        /// Deployments to pin, in kubectl syntax (default: the Cluster API provider controllers).
        #[arg(long, short = 'l', value_parser = label_selector)]
        selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
        /// Why, recorded in the window.
        #[arg(long)]
        reason: Option<String>,
        /// Open even though Deployments pinned to 0 serve webhooks that fail closed.
        #[arg(long)]
        allow_webhook_outage: bool,
        /// Do not add a standby replica to a single-replica Deployment before its Lease is
        /// taken (its only pod then exits and its webhooks are down until it restarts).
        #[arg(long)]
        no_standby: bool,
        /// How to stop each Deployment: auto (hold the Lease its pods hold or last held, else
        /// pin to 0), lease (refuse a Deployment without one), scale (pin every one to 0).
        /// Default: an existing window's own, else auto.
        #[arg(long, value_enum)]
        stop: Option<StopArg>,
        /// Print what open would do on each cluster (preflight, each Deployment it would pin
        /// and the count it would save) and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// How long to wait for the pinned pods to be gone (0 to not wait).
        #[arg(long, value_name = "DURATION", default_value = WAIT_TIMEOUT, value_parser = duration)]
        wait_timeout: Duration,
        #[command(flatten)]
        progress: ProgressArgs,
    },
    /// Close the MoveWindow, then restore every pinned Deployment and release every held
    /// Lease, waiting until each controller runs or leads again (target first, then source);
    /// then remove what the window brought along where nothing of handoff was installed.
    Close {
        /// The MoveWindow to close.
        name: String,
        /// How long a restore may be re-pinned by a webhook that has not yet seen the close.
        #[arg(long, value_name = "DURATION", default_value = RESTORE_TIMEOUT, value_parser = duration)]
        restore_timeout: Duration,
        /// How long a released Lease may stay without a pod of its Deployment leading.
        #[arg(long, value_name = "DURATION", default_value = LEAD_TIMEOUT, value_parser = duration)]
        lead_timeout: Duration,
        #[command(flatten)]
        progress: ProgressArgs,
    },
    /// Show windows, their pinned Deployments and saved counts.
    Status {
        /// One MoveWindow (default: every one).
        name: Option<String>,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum StopArg {
    Auto,
    Lease,
    Scale,
}

impl From<StopArg> for handoff::resources::move_window::StopPolicy {
    fn from(s: StopArg) -> Self {
        use handoff::resources::move_window::StopPolicy;
        match s {
            StopArg::Auto => StopPolicy::Auto,
            StopArg::Lease => StopPolicy::Lease,
            StopArg::Scale => StopPolicy::Scale,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// How a command that stops or restores controllers reports its progress.
#[derive(Args)]
pub struct ProgressArgs {
    /// text: lines on standard error; json: one JSON object a line on standard output (each
    /// step of a move, each line said, warnings and details), for CI pipelines and wrappers.
    #[arg(long, short = 'o', value_enum, default_value_t = ProgressOutput::Text)]
    pub output: ProgressOutput,
    /// Also say the details: each step of a move, each former leader's Pod deleted, the pin's
    /// policy bindings and their proof, a wait's countdown.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ProgressOutput {
    Text,
    Json,
}

pub fn label_selector(
    s: &str,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, String> {
    handoff::rules::selector::parse_label_selector(s).map_err(|e| e.to_string())
}

/// Where decisions read their state from.
#[derive(Args, Clone)]
pub struct StateArgs {
    /// Read Namespaces (and MoveWindows, Deployments) from YAML files in DIR instead of a cluster.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// kubeconfig for the cluster (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE", conflicts_with = "state")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    #[arg(long, conflicts_with = "state")]
    pub context: Option<String>,
    /// Config file: explicit sync-target identities, annotation domains, key schemes.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// handoff's own Deployment (NAMESPACE/NAME), never pinned by a MoveWindow.
    #[arg(long, value_name = "NS/NAME", default_value_t = OwnDeployment::default(), value_parser = own_deployment)]
    pub own_deployment: OwnDeployment,
    /// How long a watch may keep failing before its cache counts as stale (readiness fails and
    /// decisions that need it deny).
    #[arg(long, value_name = "DURATION", default_value = handoff::state::STALE_AFTER.text, value_parser = duration)]
    pub stale_after: Duration,
    /// How old the namespace view may be (time since the watch last delivered anything) before
    /// a sync target's delete is allowed only after reading its namespace afresh.
    #[arg(long, value_name = "DURATION", default_value = handoff::state::MAX_STALENESS.text, value_parser = duration)]
    pub max_staleness: Duration,
    /// How long a cache-miss lookup may wait for the API server before the guard denies.
    #[arg(long, value_name = "DURATION", default_value = handoff::state::API_TIMEOUT.text, value_parser = duration)]
    pub api_timeout: Duration,
    /// kubeconfig for kcp (its base URL; a workspace URL is cut back to it). The guard then also
    /// reads the kcp namespace each located namespace's locator names, at
    /// /clusters/<cluster>/api/v1/namespaces/<namespace>, and a sync finalizer set there holds
    /// as one on the physical namespace does; `serve` also mirrors those annotations onto the
    /// physical namespaces (server-side apply, field manager handoff-kcp-mirror).
    #[arg(long, value_name = "FILE")]
    pub kcp_kubeconfig: Option<PathBuf>,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Address of the HTTPS listener.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM serving certificate (chain). Without it, a self-signed one is generated for localhost.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the serving certificate.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this PEM CA (the API server's webhook client).
    #[arg(long, value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
    /// How often the certificate files are checked for changes.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration)]
    pub cert_reload_interval: Duration,
    /// Also serve /healthz, /readyz and /metrics over plain HTTP here.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Largest AdmissionReview body accepted, in bytes (413 past it).
    #[arg(long, value_name = "BYTES", default_value_t = server::Limits::default().body_limit)]
    pub body_limit: usize,
    /// Deadline when the API server sends no ?timeout=.
    #[arg(long, value_name = "DURATION", default_value = server::DEFAULT_TIMEOUT.text, value_parser = duration)]
    pub default_timeout: Duration,
    /// Requests decided at once; more wait.
    #[arg(long, value_name = "N", default_value_t = server::Limits::default().max_concurrency as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrency: u32,
    /// How long a request waits for a slot before it is shed with 503.
    #[arg(long, value_name = "DURATION", default_value = server::QUEUE_TIMEOUT.text, value_parser = duration)]
    pub queue_timeout: Duration,
    /// On SIGTERM, how long readiness fails before the listener closes (endpoint removal).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    pub drain_delay: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = duration)]
    pub drain_timeout: Duration,
    /// The webhooks to serve; each watches only what it reads, and readiness reflects only
    /// their caches.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sync-finalizer,move-window"
    )]
    pub webhooks: Vec<Webhook>,
    /// The ConfigMap in which the guard publishes sync-target identities for its
    /// ValidatingAdmissionPolicy (`handoff policy install` creates it; while it is absent
    /// nothing is written).
    #[arg(
        long,
        value_name = "NS/NAME",
        default_value_t = handoff::admission_policy::ParamsRef::default()
    )]
    pub policy_params: handoff::admission_policy::ParamsRef,
    /// How often the guard compares that ConfigMap with what it computes, and updates it.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub policy_publish_interval: Duration,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct ReviewArgs {
    /// AdmissionReview JSON file; stdin when absent or "-".
    pub file: Option<PathBuf>,
    /// Send it to this webhook instead of the one the registrations would pick.
    #[arg(long, value_enum)]
    pub webhook: Option<Webhook>,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Args)]
pub struct CertsArgs {
    /// Folder to write ca.crt, ca.key, tls.crt, tls.key into.
    #[arg(long, default_value = "certs")]
    pub out: PathBuf,
    /// DNS names of the serving certificate (repeatable).
    #[arg(long = "dns", value_name = "NAME", default_values_t = handoff::certs::default_dns_names())]
    pub dns: Vec<String>,
    /// IP addresses of the serving certificate (repeatable).
    #[arg(long = "ip", value_name = "IP", default_values_t = [IpAddr::from([127, 0, 0, 1])])]
    pub ip: Vec<IpAddr>,
    /// Validity in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

pub fn own_deployment(s: &str) -> Result<OwnDeployment, String> {
    let (namespace, name) = handoff::config::parse_namespaced_name(s)?;
    Ok(OwnDeployment { namespace, name })
}

pub fn duration(s: &str) -> Result<Duration, String> {
    server::parse_go_duration(s)
        .ok_or_else(|| format!("{s:?} is not a duration such as 500ms, 3s or 1m"))
}

/// The command line, named as it was invoked: kubectl runs a plugin as `kubectl-handoff`
/// (the binary, or a symlink to it, on PATH), and its users type `kubectl handoff`.
pub fn parse_cli() -> Cli {
    let invoked_as = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()));
    let mut cmd = Cli::command();
    if invoked_as.as_deref() == Some("kubectl-handoff") {
        cmd = cmd.name("kubectl handoff").bin_name("kubectl handoff");
    }
    Cli::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
}
