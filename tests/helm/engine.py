"""The real Helm engine (helm-sdkpy: Helm v4's Go code as a shared library) for tests/helm.rs.

One action per run: a JSON request on stdin, a JSON answer on stdout, exit 0; on a Helm error,
exit 1 with Helm's message on stderr (exit 2 for a bad request, 3 for the driver's own failure). Requests:

  {"action": "lint", "chart": DIR}
  {"action": "install" | "upgrade", "kubeconfig": FILE, "namespace": NS, "release": NAME,
   "chart": DIR, "values": {...}}
  {"action": "rollback", "kubeconfig": FILE, "namespace": NS, "release": NAME, "chart": DIR,
   "revision": N}
  {"action": "history" | "uninstall", "kubeconfig": FILE, "namespace": NS, "release": NAME}
  {"action": "list", "kubeconfig": FILE, "namespace": NS}
  {"action": "version"}

Releases (uninstall: the release removed) are answered as
{name, namespace, version, status, description, config, manifest}.
Install and upgrade never wait (the test's API server has no kubelet: nothing becomes ready).
"""

import asyncio
import json
import os
import sys
import traceback

import helm_sdkpy as helm

TIMEOUT = 120


def release(r):
    info = r.get("info") or {}
    return {
        "name": r.get("name"),
        "namespace": r.get("namespace"),
        "version": r.get("version"),
        "status": info.get("status"),
        "description": info.get("description"),
        "config": r.get("config") or {},
        "manifest": r.get("manifest") or "",
    }


def config(req):
    # lint reaches no cluster, but the binding wants a configuration: the test passes an empty
    # kubeconfig file, so that Helm never reads ~/.kube/config.
    return helm.Configuration(namespace=req.get("namespace", "default"), kubeconfig=req["kubeconfig"])


async def rollback(cfg, req):
    """`helm rollback RELEASE REVISION`, by the engine's upgrade.

    A rollback is an upgrade to the chart and the values of an earlier revision, recorded as a
    new revision. helm_sdkpy 0.1.32's own Rollback cannot be used: it sets no wait strategy,
    which Helm v4 requires ("unable to get waiter: wait strategy not set"), and it fails only
    after it has stored the new revision as pending-rollback, which then refuses every later
    upgrade ("another operation (install/upgrade/rollback) is in progress"). So the values come
    from Helm's own release record (history) and the chart from disk (the same chart here), and
    the engine's upgrade applies them with --reset-values: the same objects come back.
    """
    history = await helm.History(cfg).run(req["release"])
    earlier = [h for h in history if h.get("version") == req["revision"]]
    if not earlier:
        versions = [h.get("version") for h in history]
        raise helm.RollbackError(
            f"release {req['release']} has no revision {req['revision']} (it has {versions})"
        )
    r = await helm.Upgrade(cfg).run(
        req["release"],
        req["chart"],
        values=earlier[0].get("config") or {},
        wait=False,
        timeout=TIMEOUT,
        reset_values=True,
    )
    return release(r)


async def run(req):
    action = req["action"]
    if action == "version":
        return {"helm_sdkpy": helm.__version__, "library": helm.get_version()}
    if action == "lint":
        return await helm.Lint(config(req)).run(req["chart"])
    cfg = config(req)
    if action == "install":
        r = await helm.Install(cfg).run(
            req["release"],
            req["chart"],
            values=req.get("values") or {},
            create_namespace=True,
            wait=False,
            timeout=TIMEOUT,
        )
        return release(r)
    if action == "upgrade":
        r = await helm.Upgrade(cfg).run(
            req["release"],
            req["chart"],
            values=req.get("values") or {},
            wait=False,
            timeout=TIMEOUT,
            # As `helm upgrade` without --reuse-values: the chart's defaults and these values.
            reset_values=True,
        )
        return release(r)
    if action == "rollback":
        return await rollback(cfg, req)
    if action == "history":
        return [release(r) for r in await helm.History(cfg).run(req["release"])]
    if action == "list":
        # No release: the binding answers None, not [].
        return [release(r) for r in await helm.List(cfg).run(all=True) or []]
    if action == "uninstall":
        r = await helm.Uninstall(cfg).run(req["release"], wait=False, timeout=TIMEOUT)
        return release(r.get("release") or {})
    print(f"unknown action {action!r}", file=sys.stderr)
    sys.exit(2)


def main():
    try:
        req = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"the request is not JSON: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        answer = asyncio.run(run(req))
    except helm.HelmError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
    except Exception:  # noqa: BLE001 - the driver's own failure, not Helm's answer
        traceback.print_exc()
        sys.exit(3)
    json.dump(answer, sys.stdout, default=str)
    sys.stdout.flush()
    # The Go runtime inside the library may keep threads; leave without waiting for them.
    os._exit(0)


if __name__ == "__main__":
    main()
