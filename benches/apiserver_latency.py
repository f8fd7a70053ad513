#!/usr/bin/env python3
"""What a webhook adds to a sync target's DELETE through a real kube-apiserver.

    python3 benches/apiserver_latency.py [--deletes 400]

A real kube-apiserver (../shared/envtest) with three namespaces, each a located kcp namespace
that nothing holds: deletes in the first are sent to `handoff serve` (the guard), in the second
to the bare TLS floor (`examples/floor.rs`, which echoes the uid and decides nothing), in the
third to no webhook at all (a ValidatingWebhookConfiguration per target, selected by a namespace
label, with the manifests' kcp-syncers-only matchCondition). The script creates a ConfigMap in
each namespace (not timed) and deletes it as the syncer (impersonated), round-robin over the
three, so that all three see the same moments of the shared machine; each DELETE's wall time on
one keep-alive HTTPS connection is recorded. It prints median and p90 for each, and what handoff
and the floor add over no webhook. Traffic stays on 127.0.0.1.
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deletes", type=int, default=400, help="deletes per target")
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
                                       f"127.0.0.1:{m_port}", "--webhooks", "sync-finalizer", "--kubeconfig",
                                       env["KUBECONFIG"]] + tls, stdout=logf, stderr=logf))
        procs.append(subprocess.Popen([exes["floor"], "--listen", f"127.0.0.1:{f_port}"] + tls, stdout=logf, stderr=logf))
        wait_https(h_port, hook_ctx, "/readyz")
        wait_https(f_port, hook_ctx, "/readyz")

        conn = http.client.HTTPSConnection("127.0.0.1", api_port, context=api_ctx)

        def call(method, path, body=None, syncer=False):
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
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
        targets = [("handoff", h_port), ("floor", f_port), ("none", None)]
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
        time.sleep(2)  # the API server's webhook configuration informer
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
        stats = {n: (statistics.median(s), statistics.quantiles(s, n=10)[-1]) for n, s in samples.items()}
        base = stats["none"]
        print(f"| DELETE by a sync target ({a.deletes} each, interleaved) | median ms | p90 ms | added over no webhook (median / p90) |")
        print("|---|---|---|---|")
        for name, _ in targets:
            med, p90 = stats[name]
            added = "-" if name == "none" else f"+{med - base[0]:.2f} / +{p90 - base[1]:.2f}"
            print(f"| {name} | {med:.2f} | {p90:.2f} | {added} |")
        h_add, f_add = stats["handoff"][0] - base[0], stats["floor"][0] - base[0]
        print(f"\nhandoff adds {h_add:.2f} ms at the median, the floor {f_add:.2f} ms: "
              f"{h_add / f_add:.2f}x the floor" if f_add > 0 else "")
    finally:
        for pr in procs:
            pr.terminate()
        subprocess.run([os.path.join(ENVTEST, "stop-apiserver.sh"), api_dir], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
