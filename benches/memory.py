#!/usr/bin/env python3
"""Memory and start-up of `handoff serve` with namespaces shaped like a physical cluster under kcp.

    python3 benches/memory.py                      # 1k / 10k / 100k through a real API server and as --state
    python3 benches/memory.py --sizes 100000       # one size
    python3 benches/memory.py --state-only 1000000 # also 1,000,000 as --state files only

Every namespace is a `kcp-...` namespace with a locator naming one of five sync targets (the
recorded fixtures' us-west1 among them), locators in both annotation domains (`kcp.io` with
`cluster`, legacy `kcp.dev` with `workspace`), and one in ten held by a sync finalizer, its key in
either scheme (current or legacy). For each size:

  * a real kube-apiserver (../shared/envtest, or KUBEBUILDER_ASSETS) is filled with them, and
    `handoff serve --kubeconfig` is measured: time from start to ready, RSS (VmRSS) and peak
    (VmHWM) when ready, RSS after 10,000 reviews of the syncer's DELETE in those namespaces, and
    the peak during a relist (kube-apiserver restarted on the same port, VmHWM cleared first,
    RSS read once the watch has listed again);
  * the same namespaces as `--state` files, one file each: ready time, RSS and peak, RSS after
    10,000 reviews.

Results go to stdout as a table and to OUT/memory.tsv (default target/bench). Traffic stays on
127.0.0.1; every process this script starts is stopped when it ends.
"""
import argparse
import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVTEST = os.path.join(ROOT, "..", "shared", "envtest")
DIGITS62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
SYNCER = "system:serviceaccount:kcp-syncer-us-west1-1nuzj7pw:kcp-syncer-us-west1-1nuzj7pw"
# (cluster, name, uid): the fixtures' sync target first, whose syncer the requests come from.
TARGETS = [("root:org:ws", "us-west1", "syncTargetUID")] + [
    (f"root:org:team-{k}", f"edge-{k}", f"uid-{k}-0f3c") for k in range(1, 5)
]
CHILDREN = []


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def base62(data):
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 62)
        out = DIGITS62[r] + out
    return out or "0"


def key(cluster, name, scheme):
    text = f"{cluster}:{name}" if scheme == "current" else f"{cluster}{name}"
    return base62(hashlib.sha224(text.encode()).digest())


def namespace(i):
    """The i-th namespace: name and annotations."""
    cluster, name, uid = TARGETS[i % len(TARGETS)]
    legacy_domain = (i // len(TARGETS)) % 2 == 1
    domain = "kcp.dev" if legacy_domain else "kcp.io"
    where = "workspace" if legacy_domain else "cluster"
    locator = {"syncTarget": {where: cluster, "name": name, "uid": uid}, where: cluster, "namespace": f"app-{i}"}
    ann = {f"{domain}/namespace-locator": json.dumps(locator, separators=(",", ":"))}
    if i % 10 == 0:
        scheme = "legacy" if (i // 10) % 2 else "current"
        ann[f"finalizers.workload.{domain}/{key(cluster, name, scheme)}"] = "glbc-migration"
    return f"kcp-{i:012x}", ann


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                k, v = line.split(":")
                out[k] = int(v.split()[0])
    return out["VmRSS"], out["VmHWM"]


def clear_peak(pid):
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build():
    """Build handoff in release and return the binary's path as cargo reports it."""
    log("building handoff (release)")
    out = subprocess.run(
        ["cargo", "build", "--release", "--bin", "handoff", "--message-format=json-render-diagnostics"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "handoff" and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo did not report the handoff executable")


class ApiServer:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="handoff-memory-")
        env = dict(os.environ)
        log("starting etcd + kube-apiserver")
        subprocess.run([os.path.join(ENVTEST, "start-apiserver.sh"), self.dir], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(self.dir, "env")) as f:
            vals = dict(l.strip().split("=", 1) for l in f if "=" in l)
        self.port = int(vals["KUBE_APISERVER_URL"].rsplit(":", 1)[1])
        self.kubeconfig = vals["KUBECONFIG"]
        with open(os.path.join(self.dir, "tokens.csv")) as f:
            self.token = f.read().split(",")[0]
        self.ctx = ssl.create_default_context(cafile=os.path.join(self.dir, "pki", "ca.crt"))

    def fill(self, n, threads=8):
        log(f"creating {n} namespaces")
        start = time.time()
        errors = []

        def work(lo):
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx)
            for i in range(lo, n, threads):
                name, ann = namespace(i)
                body = json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": name, "annotations": ann}})
                conn.request("POST", "/api/v1/namespaces", body,
                             {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status not in (201, 409):
                    errors.append(f"{name}: {r.status}")
                    return

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            sys.exit(f"creating namespaces failed: {errors[:3]}")
        log(f"created {n} namespaces in {time.time() - start:.0f}s")

    def restart(self):
        """Stop kube-apiserver and start it again with the same command line (same port; etcd
        keeps the data): every watch breaks and lists again."""
        pid_file = os.path.join(self.dir, "kube-apiserver.pid")
        pid = int(open(pid_file).read())
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]
        os.kill(pid, 15)
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            time.sleep(0.1)
        log_file = open(os.path.join(self.dir, "kube-apiserver.log"), "ab")
        proc = subprocess.Popen(argv, stdout=log_file, stderr=log_file, start_new_session=True)
        CHILDREN.append(proc)
        with open(pid_file, "w") as f:
            f.write(str(proc.pid))
        while True:
            try:
                c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=2)
                c.request("GET", "/readyz", headers={"Authorization": f"Bearer {self.token}"})
                if c.getresponse().read() == b"ok":
                    return
            except OSError:
                pass
            time.sleep(0.2)

    def stop(self):
        subprocess.run([os.path.join(ENVTEST, "stop-apiserver.sh"), self.dir], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


class Handoff:
    def __init__(self, binary, args, workdir):
        self.port, self.metrics = free_port(), free_port()
        self.log = open(os.path.join(workdir, f"handoff-{self.port}.log"), "w")
        self.started = time.time()
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics}",
             "--drain-delay", "0s", "--webhooks", "sync-finalizer"] + args,
            stdout=self.log, stderr=self.log, env={**os.environ, "RUST_LOG": "warn,handoff::state=info"})
        CHILDREN.append(self.proc)

    def wait_ready(self, timeout=600):
        while time.time() - self.started < timeout:
            if self.proc.poll() is not None:
                sys.exit(f"handoff exited: see {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.metrics, timeout=1)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    return time.time() - self.started
            except OSError:
                pass
            time.sleep(0.05)
        sys.exit("handoff not ready in time")

    def metric(self, name):
        c = http.client.HTTPConnection("127.0.0.1", self.metrics, timeout=5)
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return None

    def reviews(self, n, spread, threads=4):
        """n reviews of the syncer's DELETE, spread over the first `spread` namespaces of us-west1."""
        ctx = ssl._create_unverified_context()
        with open(os.path.join(ROOT, "tests", "fixtures", "delete-configmap-by-syncer.json")) as f:
            review = json.load(f)
        counts = {"allowed": 0, "denied": 0}
        lock = threading.Lock()

        def work(k):
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx)
            for j in range(k, n, threads):
                i = (j * len(TARGETS)) % max(spread, 1)  # namespaces of TARGETS[0]
                i -= i % len(TARGETS)
                review["request"]["namespace"] = namespace(i)[0]
                conn.request("POST", "/validate/sync-finalizer?timeout=10s", json.dumps(review),
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                body = json.loads(r.read())
                with lock:
                    counts["allowed" if body["response"]["allowed"] else "denied"] += 1

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return counts

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def measure_watch(binary, n, work):
    api = ApiServer()
    try:
        api.fill(n)
        h = Handoff(binary, ["--kubeconfig", api.kubeconfig], work)
        ready = h.wait_ready()
        ready_rss, ready_hwm = rss(h.proc.pid)
        counts = h.reviews(10_000, n)
        after_rss, after_hwm = rss(h.proc.pid)
        # A relist: kube-apiserver restarts, the peak measured from here.
        clear_peak(h.proc.pid)
        synced = lambda: sum(1 for l in open(h.log.name) if "cache synced" in l and "namespaces" in l)
        before = synced()
        api.restart()
        deadline = time.time() + 300
        while synced() == before and time.time() < deadline:
            time.sleep(0.2)
        if synced() == before:
            sys.exit(f"no relist after the reset: see {h.log.name}")
        time.sleep(1)
        relist_rss, relist_hwm = rss(h.proc.pid)
        h.stop()
        return dict(ready_s=ready, ready_rss=ready_rss, ready_hwm=ready_hwm, after_rss=after_rss,
                    after_hwm=after_hwm, relist_rss=relist_rss, relist_hwm=relist_hwm, **counts)
    finally:
        api.stop()


def measure_state(binary, n, work):
    d = os.path.join(work, f"state-{n}")
    os.makedirs(d, exist_ok=True)
    log(f"writing {n} namespace files")
    for i in range(n):
        name, ann = namespace(i)
        lines = "".join(f"    {k}: '{v}'\n" for k, v in ann.items())
        with open(os.path.join(d, f"{name}.yaml"), "w") as f:
            f.write(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  annotations:\n{lines}")
    h = Handoff(binary, ["--state", d], work)
    ready = h.wait_ready()
    ready_rss, ready_hwm = rss(h.proc.pid)
    counts = h.reviews(10_000, n)
    after_rss, after_hwm = rss(h.proc.pid)
    h.stop()
    shutil.rmtree(d, ignore_errors=True)
    return dict(ready_s=ready, ready_rss=ready_rss, ready_hwm=ready_hwm, after_rss=after_rss,
                after_hwm=after_hwm, relist_rss="", relist_hwm="", **counts)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--state-only", default="", help="sizes measured as --state files only, e.g. 1000000")
    p.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "target", "bench")))
    a = p.parse_args()
    binary = build()
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="handoff-memory-work-")
    rows = []
    try:
        for n in [int(x) for x in a.sizes.split(",") if x]:
            log(f"--- {n} namespaces through the API server")
            rows.append(("watch", n, measure_watch(binary, n, work)))
            log(f"    {rows[-1][2]}")
            log(f"--- {n} namespaces as --state files")
            rows.append(("state", n, measure_state(binary, n, work)))
            log(f"    {rows[-1][2]}")
        for n in [int(x) for x in a.state_only.split(",") if x]:
            log(f"--- {n} namespaces as --state files")
            rows.append(("state", n, measure_state(binary, n, work)))
            log(f"    {rows[-1][2]}")
    finally:
        for c in CHILDREN:
            if c.poll() is None:
                c.kill()
        shutil.rmtree(work, ignore_errors=True)
    cols = ["ready_s", "ready_rss", "ready_hwm", "after_rss", "after_hwm", "relist_rss", "relist_hwm", "allowed", "denied"]
    with open(os.path.join(a.out, "memory.tsv"), "w") as f:
        f.write("source\tnamespaces\t" + "\t".join(cols) + "\n")
        for src, n, r in rows:
            f.write(f"{src}\t{n}\t" + "\t".join(str(r[c]) for c in cols) + "\n")
    mib = lambda k: f"{k / 1024:.1f}" if k != "" else "-"
    print("| source | namespaces | ready in | RSS ready (peak) MiB | RSS after 10k reviews (peak) MiB | relist peak MiB (x steady) | ≤ 32 MiB |")
    print("|---|---|---|---|---|---|---|")
    for src, n, r in rows:
        relist = "-" if r["relist_hwm"] == "" else f"{mib(r['relist_hwm'])} ({r['relist_hwm'] / r['after_rss']:.2f}x)"
        met = "met" if max(r["ready_rss"], r["after_rss"]) <= 32 * 1024 else "missed"
        print(f"| {src} | {n:,} | {r['ready_s']:.1f} s | {mib(r['ready_rss'])} ({mib(r['ready_hwm'])}) | "
              f"{mib(r['after_rss'])} ({mib(r['after_hwm'])}) | {relist} | {met} |")


if __name__ == "__main__":
    main()
