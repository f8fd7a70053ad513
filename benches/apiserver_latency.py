#!/usr/bin/env python3
"""What each engine adds to a sync target's DELETE and to a `kubectl scale` through a real
kube-apiserver: handoff's webhooks, handoff's in-API-server admission policies, a bare TLS floor.

    python3 benches/apiserver_latency.py [--deletes 400] [--scales 400]

A real kube-apiserver (../shared/envtest) with three namespaces, each a located kcp namespace
that nothing holds: deletes in the first are sent to `handoff serve` (the guard), in the second
to the bare TLS floor (`examples/floor.rs`, which echoes the uid and decides nothing), in the
third to no webhook at all (a ValidatingWebhookConfiguration per target, selected by a namespace
label, with the manifests' kcp-syncers-only matchCondition). The script creates a ConfigMap in
each namespace (not timed) and deletes it as the syncer (impersonated), round-robin over the
three, so that all three see the same moments of the shared machine; each DELETE's wall time on
one keep-alive HTTPS connection is recorded. It prints median and p90 for each, and what handoff
and the floor add over no webhook. Traffic stays on 127.0.0.1.

A fourth namespace, `bench-policy`, is decided by the ValidatingAdmissionPolicy that `handoff
policy install` writes (its binding narrowed to that namespace), with no webhook. Then the same
for scale requests: a MoveWindow is open, each namespace holds a selected Deployment, and
`PATCH .../deployments/<name>/scale` (what `kubectl scale` sends) goes to handoff's pin webhook,
the floor, the pin's MutatingAdmissionPolicy (its scale binding narrowed to `bench-policy`), or
nothing.
"""
import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVTEST = os.path.join(ROOT, "..", "shared", "envtest")
SYNCER = "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw"
LOCATOR = '{"syncTarget":{"cluster":"root:org:ws","name":"us-west1","uid":"syncTargetUID"},"cluster":"root:org:ws","namespace":"test"}'
MATCH = ("request.userInfo.username.startsWith('system:serviceaccount:') && "
         "size(request.userInfo.username.split(':')) == 4 && "
         "request.userInfo.username.split(':')[3].startsWith('kcp-syncer-')")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cargo_executables(args):
    out = subprocess.run(["cargo", "build", "--release", "--message-format=json-render-diagnostics"] + args,
                         cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    exes = {}
    for line in out.splitlines():
        m = json.loads(line)
        if m.get("reason") == "compiler-artifact" and m.get("executable"):
            exes[m["target"]["name"]] = m["executable"]
    return exes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_https(port, ctx, path):
    for _ in range(300):
        try:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=1)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"nothing answers on {port}")


def report(title, targets, samples):
    stats = {n: (statistics.median(s), statistics.quantiles(s, n=10)[-1]) for n, s in samples.items()}
    base = stats["none"]
    print(f"| {title} | median ms | p90 ms | added over nothing (median / p90) |")
    print("|---|---|---|---|")
    for name, _ in targets:
        med, p90 = stats[name]
        added = "-" if name == "none" else f"+{med - base[0]:.2f} / +{p90 - base[1]:.2f}"
        print(f"| {name} | {med:.2f} | {p90:.2f} | {added} |")
    h_add, f_add, p_add = (stats[n][0] - base[0] for n in ("handoff", "floor", "policy"))
    if f_add > 0:
        print(f"\nhandoff's webhook adds {h_add:.2f} ms at the median ({h_add / f_add:.2f}x the floor's "
              f"{f_add:.2f} ms); handoff's admission policy adds {p_add:.2f} ms")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deletes", type=int, default=400, help="deletes per target")
    p.add_argument("--scales", type=int, default=400, help="scale requests per target")
    a = p.parse_args()
    log("building handoff and the floor (release)")
    exes = cargo_executables(["--bin", "handoff", "--example", "floor"])
    work = tempfile.mkdtemp(prefix="handoff-latency-")
    procs = []
    api_dir = os.path.join(work, "api")
    try:
        subprocess.run([os.path.join(ENVTEST, "start-apiserver.sh"), api_dir], check=True, stdout=subprocess.DEVNULL)
        env = dict(l.strip().split("=", 1) for l in open(os.path.join(api_dir, "env")) if "=" in l)
        api_port = int(env["KUBE_APISERVER_URL"].rsplit(":", 1)[1])
        token = open(os.path.join(api_dir, "tokens.csv")).read().split(",")[0]
        api_ctx = ssl.create_default_context(cafile=os.path.join(api_dir, "pki", "ca.crt"))

        certs = os.path.join(work, "certs")
        subprocess.run([exes["handoff"], "certs", "--out", certs, "--ip", "127.0.0.1", "--dns", "localhost"],
                       check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ca_bundle = base64.b64encode(open(os.path.join(certs, "ca.crt"), "rb").read()).decode()
        hook_ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.crt"))
        tls = ["--tls-cert", os.path.join(certs, "tls.crt"), "--tls-key", os.path.join(certs, "tls.key")]
        h_port, f_port, m_port = free_port(), free_port(), free_port()
        logf = open(os.path.join(work, "servers.log"), "w")
        procs.append(subprocess.Popen([exes["handoff"], "serve", "--listen", f"127.0.0.1:{h_port}", "--metrics-listen",
                                       f"127.0.0.1:{m_port}", "--kubeconfig",
                                       env["KUBECONFIG"]] + tls, stdout=logf, stderr=logf))
        procs.append(subprocess.Popen([exes["floor"], "--listen", f"127.0.0.1:{f_port}"] + tls, stdout=logf, stderr=logf))
        kube = dict(os.environ, KUBECONFIG=env["KUBECONFIG"])
        crd = subprocess.run([exes["handoff"], "crd"], check=True, stdout=subprocess.PIPE, text=True).stdout
        subprocess.run(["kubectl", "apply", "-f", "-"], input=crd, env=kube, check=True, text=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["kubectl", "wait", "--for=condition=Established", "crd/movewindows.handoff.dev"],
                       env=kube, check=True, stdout=subprocess.DEVNULL)
        wait_https(h_port, hook_ctx, "/readyz")
        wait_https(f_port, hook_ctx, "/readyz")

        conn = http.client.HTTPSConnection("127.0.0.1", api_port, context=api_ctx)

        def call(method, path, body=None, syncer=False, content="application/json"):
            headers = {"Authorization": f"Bearer {token}", "Content-Type": content}
            if syncer:
                headers["Impersonate-User"] = SYNCER
            conn.request(method, path, json.dumps(body) if body is not None else None, headers)
            r = conn.getresponse()
            data = r.read()
            if r.status >= 300 and not (method == "POST" and r.status == 409):
                sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
            return data

        call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-syncer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "User", "name": SYNCER}]})
        targets = [("handoff", h_port), ("floor", f_port), ("policy", None), ("none", None)]
        for name, port in targets:
            call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": f"bench-{name}", "labels": {"bench": name},
                "annotations": {"kcp.io/namespace-locator": LOCATOR}}})
            if port is None:
                continue
            call("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": f"bench-{name}"},
                "webhooks": [{
                    "name": f"{name}.bench.handoff.dev",
                    "clientConfig": {"url": f"https://127.0.0.1:{port}/validate/sync-finalizer", "caBundle": ca_bundle},
                    "rules": [{"operations": ["DELETE"], "apiGroups": ["*"], "apiVersions": ["*"],
                               "resources": ["*/*"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"bench": name}},
                    "matchConditions": [{"name": "kcp-syncers-only", "expression": MATCH}],
                    "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5}]})
        # The policies, installed as a user would, then narrowed to bench-policy.
        call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": "handoff-system"}})
        subprocess.run([exes["handoff"], "policy", "install"], env=kube, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        narrow = {"spec": {"matchResources": {"namespaceSelector": {"matchLabels": {"bench": "policy"}}}}}
        call("PATCH", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/handoff-sync-finalizer",
             narrow, content="application/merge-patch+json")
        time.sleep(3)  # the API server's webhook configuration and policy informers
        samples = {n: [] for n, _ in targets}
        total = a.deletes + 20
        log(f"{total} deletes per target, interleaved (the first 20 of each are warm-up)")
        for i in range(total):
            for name, _ in targets:
                path = f"/api/v1/namespaces/bench-{name}/configmaps"
                call("POST", path, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}})
                t = time.perf_counter()
                call("DELETE", f"{path}/cm-{i}", syncer=True)
                if i >= 20:
                    samples[name].append((time.perf_counter() - t) * 1000)
        report(f"DELETE by a sync target ({a.deletes} each, interleaved)", targets, samples)

        # Scale: a selected Deployment per namespace, a window open, the pin per namespace.
        for name, _ in targets:
            call("POST", f"/apis/apps/v1/namespaces/bench-{name}/deployments", {
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "capi", "labels": {"cluster.x-k8s.io/provider": "cluster-api",
                                                        "clusterctl.cluster.x-k8s.io": ""}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "capi"}},
                         "template": {"metadata": {"labels": {"app": "capi"}},
                                      "spec": {"containers": [{"name": "m", "image": "registry.example/m"}]}}}})
        for name, port in targets:
            if port is None:
                continue
            call("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": f"bench-{name}"},
                "webhooks": [{
                    "name": f"{name}.scale.bench.handoff.dev",
                    "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate/move-window", "caBundle": ca_bundle},
                    "rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
                               "resources": ["deployments/scale"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"bench": name}},
                    "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                    "reinvocationPolicy": "IfNeeded", "timeoutSeconds": 5}]})
        subprocess.run([exes["handoff"], "window", "open", "bench", "--wait-timeout", "0s"], env=kube, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        call("PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/handoff-pin-bench-scale",
             narrow, content="application/merge-patch+json")
        call("DELETE", "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/handoff-pin-bench")
        time.sleep(3)
        samples = {n: [] for n, _ in targets}
        total = a.scales + 20
        log(f"{total} scale requests per target, interleaved (the first 20 of each are warm-up)")
        for i in range(total):
            for name, _ in targets:
                path = f"/apis/apps/v1/namespaces/bench-{name}/deployments/capi/scale"
                t = time.perf_counter()
                out = json.loads(call("PATCH", path, {"spec": {"replicas": 2 + i % 2}},
                                      content="application/merge-patch+json"))
                if i >= 20:
                    samples[name].append((time.perf_counter() - t) * 1000)
                pinned = out.get("spec", {}).get("replicas", 0) == 0
                if pinned != (name in ("handoff", "policy")):
                    sys.exit(f"scale in bench-{name}: pinned={pinned}, which is wrong")
        print()
        report(f"`kubectl scale` of a selected Deployment during a window ({a.scales} each, interleaved)",
               targets, samples)
    finally:
        for pr in procs:
            pr.terminate()
        subprocess.run([os.path.join(ENVTEST, "stop-apiserver.sh"), api_dir], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
