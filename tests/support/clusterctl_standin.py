#!/usr/bin/env python3
"""A stand-in for `clusterctl move`, for tests: it follows objectMover.move in
cmd/clusterctl/client/cluster/mover.go (kubernetes-sigs/cluster-api) step by step, through
kubectl, against real API servers:

  discovery    every object, in --namespace, of the CRDs labelled clusterctl.cluster.x-k8s.io
               (objectgraph.go getDiscoveryTypes); an object carrying
               clusterctl.cluster.x-k8s.io/block-move now is "blocking" (objMetaToNode)
  refuse       any Cluster paused (spec.paused or cluster.x-k8s.io/paused): exit 1
               (checkClustersNotPaused, clusterctl v1.12+)
  pause        spec.paused=true on every source Cluster (setClusterPause), writes retried
               0.5 s x 1.5, 13 attempts (newWriteBackoff)
  wait         each blocking object, one after the other, until its block-move is gone:
               5 s x 1.5, 10 attempts each (waitReadyForMove)
  create       in the target, in owner order (getMoveSequence), each object read again from
               the source first (createTargetObject), namespace first, owner references
               re-pointed at the new UIDs; an existing object is updated
  delete       from the source in reverse order: delete-for-move annotation, delete,
               finalizers dropped (deleteSourceObject)
  unpause      spec.paused=false on the target's Clusters

  clusterctl_standin.py move --kubeconfig A [--kubeconfig-context C] --to-kubeconfig B
                             [--to-kubeconfig-context C] [--namespace NS] [--dry-run]
  clusterctl_standin.py version -o short     v1.13.0, the series it follows

For tests, from the environment:
  CLUSTERCTL_STANDIN_FAIL_AFTER_CREATES=N  exit 1 after the N-th create (a move that fails
                                           halfway)
  CLUSTERCTL_STANDIN_FAIL_IN_NAMESPACE=NS  the injected failures only in a move of namespace NS
                                           (one run of a whole move's)
  CLUSTERCTL_STANDIN_FAIL_AFTER_DELETES=N  exit 1 after the N-th delete from the source (a move
                                           that fails once deletes have begun)
  CLUSTERCTL_STANDIN_CREATE_DELAY=S        sleep S seconds after each create (a copy that
                                           takes a while)
  CLUSTERCTL_STANDIN_RECORD=FILE           append JSON lines: each step, with the count of
                                           every `*-reconciles` ConfigMap of both clusters at
                                           copy-start and copy-end
"""
import argparse, json, os, random, signal, subprocess, sys, time

BLOCK_MOVE = 'clusterctl.cluster.x-k8s.io/block-move'
DELETE_FOR_MOVE = 'clusterctl.cluster.x-k8s.io/delete-for-move'
PAUSED = 'cluster.x-k8s.io/paused'

ap = argparse.ArgumentParser(prog='clusterctl')
sub = ap.add_subparsers(dest='cmd', required=True)
mv = sub.add_parser('move')
mv.add_argument('--kubeconfig', default=os.environ.get('KUBECONFIG', ''))
mv.add_argument('--kubeconfig-context', default='')
mv.add_argument('--to-kubeconfig', required=True)
mv.add_argument('--to-kubeconfig-context', default='')
mv.add_argument('--namespace', '-n', default='default')
mv.add_argument('--dry-run', action='store_true')
mv.add_argument('-v', type=int, default=0)
ver = sub.add_parser('version')
ver.add_argument('--output', '-o', default='')
a = ap.parse_args()
if a.cmd == 'version':
    # The release series whose mover.go this follows.
    print('v1.13.0' if a.output == 'short' else 'clusterctl version: &version.Info{GitVersion:"v1.13.0"}')
    sys.exit(0)


def interrupted(sig, _frame):
    # As a Go program's default for SIGINT/SIGTERM: stop where it is.
    print(f"Error: interrupted by signal {sig}", file=sys.stderr, flush=True)
    os._exit(128 + sig)


signal.signal(signal.SIGINT, interrupted)
signal.signal(signal.SIGTERM, interrupted)

fail_after = int(os.environ.get('CLUSTERCTL_STANDIN_FAIL_AFTER_CREATES', '0') or 0)
fail_after_deletes = int(os.environ.get('CLUSTERCTL_STANDIN_FAIL_AFTER_DELETES', '0') or 0)
fail_in = os.environ.get('CLUSTERCTL_STANDIN_FAIL_IN_NAMESPACE', '')
if fail_in and fail_in != a.namespace:
    fail_after = fail_after_deletes = 0
create_delay = float(os.environ.get('CLUSTERCTL_STANDIN_CREATE_DELAY', '0') or 0)
record_path = os.environ.get('CLUSTERCTL_STANDIN_RECORD', '')


def log(msg):
    print(msg, flush=True)


def kubectl(side, *args, data=None, check=True):
    kc, ctx = (a.kubeconfig, a.kubeconfig_context) if side == 'source' else (a.to_kubeconfig, a.to_kubeconfig_context)
    cmd = ['kubectl']
    if kc:
        cmd += ['--kubeconfig', kc]
    if ctx:
        cmd += ['--context', ctx]
    r = subprocess.run(cmd + list(args), input=data, capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} ({side}): {r.stderr.strip()}")
    return r


def get_json(side, *args):
    return json.loads(kubectl(side, *args, '-o', 'json').stdout)


def record(event, **kw):
    if record_path:
        with open(record_path, 'a') as f:
            f.write(json.dumps(dict(event=event, t=time.time(), **kw)) + '\n')


def reconciles(side):
    out = {}
    for cm in get_json(side, 'get', 'configmaps', '-A').get('items', []):
        name = cm['metadata']['name']
        if name.endswith('-reconciles'):
            out[f"{cm['metadata']['namespace']}/{name}"] = int(cm.get('data', {}).get('count', '0') or 0)
    return out


def backoff(duration, factor, steps, jitter):
    """wait.Backoff's sleeps between attempts, as clusterctl's retryWithExponentialBackoff."""
    for i in range(steps):
        yield i
        if i + 1 < steps:
            time.sleep(duration * (1 + random.random() * jitter))
            duration *= factor


def retry(what, fn, duration=0.5, factor=1.5, steps=13, jitter=0.4):
    err = None
    for i in backoff(duration, factor, steps, jitter):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 -- every error is retried, as clusterctl does
            err = e
            if a.v >= 5:
                log(f"Retrying with backoff cause={e}")
    raise RuntimeError(f"{what}: action failed after {steps} attempts: {err}")


def fail(msg):
    print(f"Error: {msg}", file=sys.stderr, flush=True)
    record('failed', error=msg)
    sys.exit(1)


def resource_of(obj):
    group = obj['apiVersion'].split('/')[0] if '/' in obj['apiVersion'] else ''
    return obj['plural'] + ('.' + group if group else '')


# ---- discovery ----
try:
    crds = get_json('source', 'get', 'crd', '-l', 'clusterctl.cluster.x-k8s.io')['items']
except RuntimeError as e:
    fail(f"failed to get discovery types: {e}")
nodes = []
for crd in crds:
    if crd['spec']['scope'] != 'Namespaced':
        continue
    plural, group = crd['spec']['names']['plural'], crd['spec']['group']
    for o in get_json('source', 'get', f'{plural}.{group}', '-n', a.namespace).get('items', []):
        o['plural'] = plural
        nodes.append(o)
for n in nodes:
    n['blocking'] = BLOCK_MOVE in (n['metadata'].get('annotations') or {})
clusters = [n for n in nodes if n['kind'] == 'Cluster' and n['apiVersion'].startswith('cluster.x-k8s.io/')]
record('discovered', objects=[f"{n['kind']} {n['metadata']['name']}" for n in nodes],
       blocking=[f"{n['kind']} {n['metadata']['name']}" for n in nodes if n['blocking']])
log(f"Performing move... namespace={a.namespace} objects={len(nodes)}")
log("Discovering Cluster API objects")

# ---- refuse paused Clusters ----
paused = [f"{a.namespace}/{c['metadata']['name']}" for c in clusters
          if (c.get('spec') or {}).get('paused') or PAUSED in (c['metadata'].get('annotations') or {})]
if paused:
    fail(f"cannot start operation while the following Clusters are paused: {', '.join(paused)}")
log(f"Moving Cluster API objects Clusters={len(clusters)}")

if a.dry_run:
    # As clusterctl's dry run logs at -v 1 (mover.go, createTargetObject logs before it returns
    # on a dry run; cmd/clusterctl/log/logger.go quotes each value): handoff's -A dry run reads
    # these lines to name what would not be carried.
    for n in nodes:
        if a.v >= 1:
            log(f'Creating {n["kind"]}="{n["metadata"]["name"]}" Namespace="{a.namespace}"')
        else:
            log(f"  would move {n['kind']} {a.namespace}/{n['metadata']['name']}")
    log("Dry run: nothing was written")
    sys.exit(0)

# ---- pause ----
def set_paused(side, value):
    """setClusterPause: spec.paused on every Cluster of the move, writes retried."""
    for c in clusters:
        name = c['metadata']['name']
        try:
            retry(f"error setting Cluster.Spec.Paused={value} on {name}", lambda: kubectl(
                side, '-n', a.namespace, 'patch', 'clusters.cluster.x-k8s.io', name,
                '--type', 'merge', '-p', json.dumps({'spec': {'paused': value}})))
        except RuntimeError as e:
            fail(str(e))


log("Pausing the source cluster")
set_paused('source', True)
record('paused')

# ---- wait for block-move ----
log("Waiting for all resources to be ready to move")
for n in nodes:
    if not n['blocking']:
        continue
    name, res = n['metadata']['name'], resource_of(n)
    logged = False

    def ready():
        global logged
        o = get_json('source', '-n', a.namespace, 'get', res, name)
        if BLOCK_MOVE in (o['metadata'].get('annotations') or {}):
            if not logged:
                log(f"Move blocked by {BLOCK_MOVE} annotation, waiting for it to be removed resource={n['kind']}/{name}")
                logged = True
            raise RuntimeError(f"resource is not ready to move: {n['kind']} {a.namespace}/{name}")
    try:
        retry(f"error waiting for resources to be ready to move", ready, duration=5, factor=1.5, steps=10, jitter=0.1)
    except RuntimeError as e:
        fail(str(e))
    record('unblocked', object=f"{n['kind']} {name}")

# ---- create in the target, owners first ----
by_uid = {n['metadata']['uid']: n for n in nodes}
groups, placed = [], set()
while len(placed) < len(nodes):
    group = [n for n in nodes if n['metadata']['uid'] not in placed and all(
        o['uid'] not in by_uid or o['uid'] in placed for o in n['metadata'].get('ownerReferences') or [])]
    if not group:
        fail("owner references form a cycle")
    groups.append(group)
    placed.update(n['metadata']['uid'] for n in group)

record('copy-start', reconciles={'source': reconciles('source'), 'target': reconciles('target')})
log("Creating objects in the target cluster")
kubectl('target', 'create', 'namespace', a.namespace, check=False)
new_uid, created = {}, 0
for group in groups:
    for n in group:
        name, res = n['metadata']['name'], resource_of(n)
        # Read again from the source, as createTargetObject does: what is copied is the
        # object as it is now, not as discovered.
        try:
            fresh = retry(f"error reading {n['kind']} {a.namespace}/{name}",
                          lambda: get_json('source', '-n', a.namespace, 'get', res, name), duration=0.25, steps=9, jitter=0.1)
        except RuntimeError as e:
            fail(str(e))
        obj = {k: v for k, v in fresh.items() if k != 'status'}
        meta = {k: v for k, v in fresh['metadata'].items()
                if k not in ('uid', 'resourceVersion', 'creationTimestamp', 'generation', 'managedFields', 'selfLink')}
        refs = []
        for o in n['metadata'].get('ownerReferences') or []:
            if o['uid'] in by_uid:
                o = dict(o, uid=new_uid[o['uid']])
            refs.append(o)
        meta.pop('ownerReferences', None)
        if refs:
            meta['ownerReferences'] = refs
        obj['metadata'] = meta

        def create():
            r = kubectl('target', 'create', '-f', '-', '-o', 'json', data=json.dumps(obj), check=False)
            if r.returncode == 0:
                return json.loads(r.stdout)
            if 'AlreadyExists' not in r.stderr:
                raise RuntimeError(r.stderr.strip())
            existing = get_json('target', '-n', a.namespace, 'get', res, name)
            upd = dict(obj, metadata=dict(meta, resourceVersion=existing['metadata']['resourceVersion']))
            return json.loads(kubectl('target', 'replace', '-f', '-', '-o', 'json', data=json.dumps(upd)).stdout)
        try:
            made = retry(f"error creating {n['kind']} {a.namespace}/{name}", create)
        except RuntimeError as e:
            fail(str(e))
        new_uid[n['metadata']['uid']] = made['metadata']['uid']
        created += 1
        record('created', object=f"{n['kind']} {name}", annotations=made['metadata'].get('annotations') or {})
        log(f"Creating {n['kind']} {a.namespace}/{name}")
        if create_delay:
            time.sleep(create_delay)
        if fail_after and created >= fail_after:
            fail(f"action failed after 13 attempts: error creating the next object (injected failure after {created} creates)")
record('copy-end', reconciles={'source': reconciles('source'), 'target': reconciles('target')})

# ---- delete from the source, in reverse ----
log("Deleting objects from the source cluster")
for group in reversed(groups):
    for n in group:
        name, res = n['metadata']['name'], resource_of(n)

        def delete():
            r = kubectl('source', '-n', a.namespace, 'annotate', '--overwrite', res, name, f'{DELETE_FOR_MOVE}=', check=False)
            if r.returncode != 0 and 'NotFound' not in r.stderr:
                raise RuntimeError(r.stderr.strip())
            r = kubectl('source', '-n', a.namespace, 'delete', res, name, '--wait=false', check=False)
            if r.returncode != 0 and 'NotFound' not in r.stderr:
                raise RuntimeError(r.stderr.strip())
            r = kubectl('source', '-n', a.namespace, 'patch', res, name, '--type', 'merge',
                        '-p', '{"metadata":{"finalizers":null}}', check=False)
            if r.returncode != 0 and 'NotFound' not in r.stderr:
                raise RuntimeError(r.stderr.strip())
        try:
            retry(f"error deleting {n['kind']} {a.namespace}/{name}", delete)
        except RuntimeError as e:
            fail(str(e))
        record('deleted', object=f"{n['kind']} {name}")
        deleted = globals().get('deleted', 0) + 1
        globals()['deleted'] = deleted
        if fail_after_deletes and deleted >= fail_after_deletes:
            fail(f"error deleting the next object (injected failure after {deleted} deletes)")

# ---- unpause the target ----
log("Resuming the target cluster")
set_paused('target', False)
record('done')
log("Move completed")
