//! The provider harness (`tests/support/providers.rs`) against a real kube-apiserver, in a
//! network namespace of the test's own: Cluster API core's manager as two `provider-standin`
//! replicas of a real Deployment, electing a leader on a Lease, reconciling only as the leader,
//! and serving a fail-closed webhook that kube-apiserver calls through the Service's ClusterIP.

mod support;

use std::process::Output;
use std::time::{Duration, Instant};

use support::apiserver::{ADMIN, ApiServer, skip, text};
use support::providers::{
    Provider, ProviderSpec, cluster, holder_pod, install_capi_crds, webhook_rule,
};

/// The machine is small and shared: waits are generous.
const WAIT: Duration = Duration::from_secs(90);
const WEBHOOK: &str = "validation.cluster.cluster.x-k8s.io";

#[test]
#[cfg_attr(
    not(apiserver),
    ignore = "needs etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(../shared/envtest/assets.sh) cargo test"
)]
fn provider_replicas_lead_reconcile_and_serve_a_fail_closed_webhook_through_their_service() {
    if skip()
        || !support::netns::in_own_netns(
            "provider_replicas_lead_reconcile_and_serve_a_fail_closed_webhook_through_their_service",
        )
    {
        return;
    }
    let started = Instant::now();
    let api = ApiServer::start();
    install_capi_crds(&api);
    let capi = Provider::start(
        &api,
        ProviderSpec::capi_core()
            .replicas(2)
            .lease(support::providers::LeaseTiming::FAST),
    );
    eprintln!("provider up after {:.1} s", started.elapsed().as_secs_f64());

    // Two Pods named as a ReplicaSet names them, the Deployment's template labels on each.
    let pods = capi.pods(&api);
    assert_eq!(pods.len(), 2, "{pods:?}");
    for pod in &pods {
        let suffix = pod
            .strip_prefix("capi-controller-manager-")
            .unwrap_or_else(|| panic!("pod {pod}"));
        let (hash, id) = suffix
            .split_once('-')
            .unwrap_or_else(|| panic!("pod {pod}"));
        assert!(!hash.is_empty() && id.len() == 5, "pod {pod}");
    }

    // One of them leads: `<pod>_<uuid>`, as controller-runtime's identity is.
    let holder = capi.wait_leader(&api, WAIT);
    let (pod, uuid) = holder.rsplit_once('_').expect("holder <pod>_<uuid>");
    assert!(pods.iter().any(|p| p == pod), "{holder} among {pods:?}");
    assert_eq!(uuid.len(), 36, "{holder}");
    assert_eq!(uuid.matches('-').count(), 4, "{holder}");
    assert_eq!(holder_pod(&holder), pod);

    // Its reconcilers run: the counter rises.
    let first = wait("the reconcile counter", || {
        Some(capi.reconciles(&api)).filter(|n| *n > 0)
    });
    wait("the reconcile counter to rise", || {
        (capi.reconciles(&api) > first).then_some(())
    });

    // A fail-closed webhook behind the Service's ClusterIP: creates go through it.
    capi.register_webhook(
        &api,
        WEBHOOK,
        &[webhook_rule(
            "cluster.x-k8s.io",
            "v1beta2",
            "clusters",
            &["CREATE"],
        )],
    );
    api.ok(ADMIN, &["create", "namespace", "clusters"]);
    // Until the API server has loaded the configuration, creates do not call the webhook.
    capi.until_webhook_called(&api, WAIT, |i| {
        let out = create_cluster(&api, &format!("probe-{i}"));
        assert!(
            out.status.success(),
            "create probe-{i}: {}",
            text(&out.stderr)
        );
    });
    let before = capi.webhook_requests(&api);
    let out = create_cluster(&api, "workload");
    assert!(
        out.status.success(),
        "create workload: {}",
        text(&out.stderr)
    );
    assert!(
        capi.webhook_requests(&api) > before,
        "the create of clusters/workload did not reach the webhook:\n{}",
        capi.logs()
    );

    // No replicas, no endpoints: the fail-closed webhook refuses every create.
    capi.scale(&api, 0);
    capi.wait_replicas(&api, 0, WAIT);
    let reconciled = capi.reconciles(&api);
    let last_holder = capi.lease_holder(&api);
    let refused = wait("a create refused for want of the webhook", || {
        let out = create_cluster(&api, "refused");
        (!out.status.success()).then(|| text(&out.stderr))
    });
    // Called as a Service's webhook is: by its DNS name, at the ClusterIP and port.
    assert!(
        refused.contains(&format!("failed calling webhook \"{WEBHOOK}\""))
            && refused.contains("https://capi-webhook-service.capi-system.svc:443/validate"),
        "{refused}"
    );
    let gone = api.kubectl(
        ADMIN,
        &[
            "-n",
            "clusters",
            "get",
            "clusters.cluster.x-k8s.io",
            "refused",
        ],
    );
    assert!(!gone.status.success(), "clusters/refused was created");
    // Nobody reconciles any more, and the last leader, stopped by SIGTERM, left the Lease
    // naming it (controller-runtime does not release it on cancel) past its duration.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        capi.reconciles(&api),
        reconciled,
        "reconciled with no replicas"
    );
    assert_eq!(capi.lease_holder(&api), last_holder);
    let last_holder = last_holder.expect("the Lease still names a holder");
    assert!(
        pods.iter().any(|p| p == holder_pod(&last_holder)),
        "{last_holder} among {pods:?}"
    );
    eprintln!(
        "done after {:.1} s; refused with: {}",
        started.elapsed().as_secs_f64(),
        refused.trim()
    );
}

fn create_cluster(api: &ApiServer, name: &str) -> Output {
    api.kubectl_stdin(
        ADMIN,
        &["create", "-f", "-"],
        Some(&cluster("clusters", name, false)),
    )
}

fn wait<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    support::apiserver::eventually(what, WAIT, check)
}
