//! An in-process fake Kubernetes API server for integration tests.
//!
//! [`FakeApi`] speaks the real Kubernetes HTTP API (JSON over plain HTTP on
//! `127.0.0.1:<random port>`), so an unmodified `kube::Client` — including
//! `kube::runtime::watcher` and `kube::runtime::metadata_watcher` — works
//! against it. Objects are kept as `serde_json::Value`s in memory; every write
//! bumps a global `resourceVersion` and is appended to an in-memory event
//! history that watches replay from.
//!
//! Served resources are listed in [`RESOURCES`]; add a type with one line.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

static SEQUENCE: AtomicU64 = AtomicU64::new(0);
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri, header};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

// ---------------------------------------------------------------------------
// Resource table
// ---------------------------------------------------------------------------

/// One served resource type.
#[derive(Debug)]
pub struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Supported subresources: `"status"` and/or `"scale"`.
    pub subresources: &'static [&'static str],
}

const NAMESPACED: bool = true;
const CLUSTER: bool = false;

const fn rt(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        kind,
        namespaced,
        subresources,
    }
}

/// Every resource the fake serves. One line per type.
#[rustfmt::skip]
pub static RESOURCES: &[ResourceType] = &[
    rt("", "v1", "namespaces", "Namespace", CLUSTER, &["status"]),
    rt("", "v1", "pods", "Pod", NAMESPACED, &["status"]),
    rt("", "v1", "services", "Service", NAMESPACED, &["status"]),
    rt("", "v1", "configmaps", "ConfigMap", NAMESPACED, &[]),
    rt("", "v1", "secrets", "Secret", NAMESPACED, &[]),
    rt("", "v1", "serviceaccounts", "ServiceAccount", NAMESPACED, &[]),
    rt("", "v1", "events", "Event", NAMESPACED, &[]),
    rt("apps", "v1", "deployments", "Deployment", NAMESPACED, &["status", "scale"]),
    rt("apps", "v1", "statefulsets", "StatefulSet", NAMESPACED, &["status", "scale"]),
    rt("apps", "v1", "replicasets", "ReplicaSet", NAMESPACED, &["status", "scale"]),
    rt("coordination.k8s.io", "v1", "leases", "Lease", NAMESPACED, &[]),
    rt("events.k8s.io", "v1", "events", "Event", NAMESPACED, &[]),
    rt("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", CLUSTER, &[]),
    rt("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", CLUSTER, &[]),
    rt("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", CLUSTER, &["status"]),
    rt("handoff.dev", "v1alpha1", "movewindows", "MoveWindow", CLUSTER, &["status"]),
];

impl ResourceType {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn has(&self, sub: &str) -> bool {
        self.subresources.contains(&sub)
    }

    /// `deployments.apps`, or just `namespaces` for the core group (as in API messages).
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn is(&self, api_version: &str, kind: &str) -> bool {
        self.kind == kind && self.api_version() == api_version
    }
}

fn find_plural(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

fn find_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES.iter().position(|r| r.is(api_version, kind))
}

fn expect_kind(api_version: &str, kind: &str) -> usize {
    find_kind(api_version, kind).unwrap_or_else(|| {
        panic!("FakeApi: {api_version}/{kind} is not in RESOURCES (tests/support/fake_api.rs)")
    })
}

fn namespace_res() -> usize {
    expect_kind("v1", "Namespace")
}

// ---------------------------------------------------------------------------
// Public test-facing API
// ---------------------------------------------------------------------------

/// A fake Kubernetes API server running on a tokio task in this process.
pub struct FakeApi {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    /// Binds `127.0.0.1:0` and spawns the server on the current tokio runtime.
    pub async fn start() -> FakeApi {
        let (tick, _) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            store: Mutex::new(Store {
                rv: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                tick,
                dry_run: false,
                require_namespaces: false,
            }),
            unavailable: AtomicBool::new(false),
            write_budget: std::sync::atomic::AtomicI64::new(-1),
            latency_ms: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("FakeApi: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("FakeApi: local_addr");
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeApi {
            inner,
            addr,
            server,
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube::Config` pointed at this server. kube's default 503 retry layer is
    /// switched off (it would retry for minutes), so `set_unavailable(true)` makes
    /// calls fail straight away.
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("FakeApi: url"));
        config.default_retry = false;
        config
    }

    /// A `kube::Client` pointed at this server (see [`FakeApi::config`]).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("FakeApi: kube client")
    }

    /// Creates or replaces an object directly (no admission-like rules: `.status` is
    /// stored as given). Sets `uid` (if absent), `resourceVersion`,
    /// `creationTimestamp` (if absent) and `generation` (if absent), and emits an
    /// ADDED or MODIFIED watch event. A namespaced object without
    /// `metadata.namespace` goes to `default`. Panics on an unknown apiVersion/kind.
    pub fn put(&self, obj: Value) {
        let api_version = obj["apiVersion"]
            .as_str()
            .expect("FakeApi::put: apiVersion");
        let kind = obj["kind"].as_str().expect("FakeApi::put: kind");
        let res = expect_kind(api_version, kind);
        self.inner.lock().put(res, obj);
    }

    /// The stored object, if any. `namespace` is ignored for cluster-scoped kinds.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let res = expect_kind(api_version, kind);
        let store = self.inner.lock();
        store.objects.get(&key(res, namespace, name)).cloned()
    }

    /// All stored objects of a kind, across namespaces, ordered by namespace/name.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let res = expect_kind(api_version, kind);
        let store = self.inner.lock();
        store.select(res, &Filter::default())
    }

    /// Deletes an object directly (ignores finalizers, no namespace cascade) and
    /// emits DELETED. Returns whether it existed.
    pub fn remove(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        let res = expect_kind(api_version, kind);
        let mut store = self.inner.lock();
        let key = key(res, namespace, name);
        match store.objects.get(&key).cloned() {
            Some(obj) => {
                store.commit(key, obj, true);
                true
            }
            None => false,
        }
    }

    /// While true every request answers 503 with a `Status` body and open watch
    /// streams are ended (watchers reconnect and then see the 503s).
    pub fn set_unavailable(&self, yes: bool) {
        self.inner.unavailable.store(yes, Ordering::SeqCst);
        self.inner.lock().tick.send_modify(|_| {});
    }

    /// Delay every answer by `d` (a slow or overloaded API server).
    pub fn set_latency(&self, d: std::time::Duration) {
        self.inner
            .latency_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Let `n` more writes (non-GET requests) through, then answer every write with 503 until
    /// `None` is set: a client that dies after its n-th write, as far as the cluster can tell.
    pub fn fail_writes_after(&self, n: Option<u64>) {
        self.inner
            .write_budget
            .store(n.map_or(-1, |n| n as i64), Ordering::SeqCst);
    }

    /// When true, creating a namespaced object over HTTP in a namespace that does not
    /// exist answers 404 like a real cluster. Off by default.
    pub fn set_require_namespaces(&self, yes: bool) {
        self.inner.lock().require_namespaces = yes;
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.lock().rv
    }

    /// Every request as `"METHOD /path?query"` (raw, percent-encoded query; no
    /// trailing `?`) in arrival order, including ones answered 503.
    pub fn requests(&self) -> Vec<String> {
        self.inner.log().iter().map(|(_, _, l)| l.clone()).collect()
    }

    /// Writes with their place in a sequence shared by every FakeApi in the process.
    pub fn sequenced_writes(&self) -> Vec<(u64, String)> {
        self.inner
            .log()
            .iter()
            .filter(|(w, _, _)| *w)
            .map(|(_, seq, l)| (*seq, l.clone()))
            .collect()
    }

    /// Like [`FakeApi::requests`], but only non-GET requests.
    pub fn writes(&self) -> Vec<String> {
        self.inner
            .log()
            .iter()
            .filter(|(w, _, _)| *w)
            .map(|(_, _, l)| l.clone())
            .collect()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.lock().tick.send_modify(|_| {});
        self.server.abort();
    }
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

/// (resource index, namespace or "" for cluster-scoped, name)
type Key = (usize, String, String);

fn key(res: usize, namespace: Option<&str>, name: &str) -> Key {
    let ns = if RESOURCES[res].namespaced {
        namespace.unwrap_or("")
    } else {
        ""
    };
    (res, ns.to_string(), name.to_string())
}

const HISTORY_LIMIT: usize = 20_000;

struct HistEvent {
    rv: u64,
    res: usize,
    kind: &'static str,
    obj: Value,
    prev: Option<Value>,
}

struct Inner {
    store: Mutex<Store>,
    unavailable: AtomicBool,
    /// Writes still allowed before every write answers 503; negative means unlimited.
    write_budget: std::sync::atomic::AtomicI64,
    /// Added before every answer, to stand in for a slow API server.
    latency_ms: AtomicU64,
    closed: AtomicBool,
    /// (is_write, "METHOD /path?query")
    log: Mutex<Vec<(bool, u64, String)>>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self) -> MutexGuard<'_, Vec<(bool, u64, String)>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, method: &Method, uri: &Uri) {
        let target = uri.path_and_query().map_or("/", |p| p.as_str());
        let target = target.strip_suffix('?').unwrap_or(target);
        let is_write = method != Method::GET && method != Method::HEAD;
        // One sequence across every FakeApi in the process, so tests can order requests
        // made to two clusters.
        let seq = SEQUENCE.fetch_add(1, Ordering::SeqCst);
        self.log()
            .push((is_write, seq, format!("{method} {target}")));
    }

    /// Runs a write with `dryRun` honoured.
    fn write<T>(&self, dry_run: bool, f: impl FnOnce(&mut Store) -> T) -> T {
        let mut store = self.lock();
        store.dry_run = dry_run;
        let out = f(&mut store);
        store.dry_run = false;
        out
    }
}

struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<HistEvent>,
    /// Highest resourceVersion dropped from `history` (watches from before it get 410).
    compacted: u64,
    /// Carries the latest resourceVersion; also poked to wake watch streams.
    tick: watch::Sender<u64>,
    dry_run: bool,
    require_namespaces: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Main,
    Status,
}

impl Store {
    /// Stores (or deletes) `obj` under a new resourceVersion and records the watch event.
    fn commit(&mut self, key: Key, mut obj: Value, delete: bool) -> Value {
        if self.dry_run {
            return obj;
        }
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let res = key.0;
        let prev = if delete {
            self.objects.remove(&key)
        } else {
            self.objects.insert(key, obj.clone())
        };
        let kind = match (delete, prev.is_some()) {
            (true, _) => "DELETED",
            (false, true) => "MODIFIED",
            (false, false) => "ADDED",
        };
        self.history.push_back(HistEvent {
            rv,
            res,
            kind,
            obj: obj.clone(),
            prev,
        });
        while self.history.len() > HISTORY_LIMIT {
            if let Some(ev) = self.history.pop_front() {
                self.compacted = ev.rv;
            }
        }
        self.tick.send_replace(rv);
        obj
    }

    fn select(&self, res: usize, filter: &Filter) -> Vec<Value> {
        self.objects
            .range((res, String::new(), String::new())..(res + 1, String::new(), String::new()))
            .map(|(_, v)| v)
            .filter(|v| filter.matches(v))
            .cloned()
            .collect()
    }

    fn get(&self, res: usize, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&key(res, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// Test-side create-or-replace.
    fn put(&mut self, res: usize, mut obj: Value) -> Value {
        let rt = &RESOURCES[res];
        let name = meta_str(&obj, "name")
            .filter(|n| !n.is_empty())
            .expect("FakeApi::put: metadata.name")
            .to_string();
        let ns = if rt.namespaced {
            let ns = meta_str(&obj, "namespace")
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_string();
            meta_mut(&mut obj).insert("namespace".into(), json!(ns));
            ns
        } else {
            meta_mut(&mut obj).remove("namespace");
            String::new()
        };
        let key = (res, ns, name);
        let old = self.objects.get(&key).cloned();
        let generation = match &old {
            Some(old) => generation_of(old) + i64::from(spec_of(old) != spec_of(&obj)),
            None => 1,
        };
        let old_meta = old
            .as_ref()
            .map(|o| o["metadata"].clone())
            .unwrap_or(Value::Null);
        let m = meta_mut(&mut obj);
        if m.get("uid")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            let uid = old_meta["uid"]
                .as_str()
                .map_or_else(new_uid, str::to_string);
            m.insert("uid".into(), json!(uid));
        }
        if !m.contains_key("creationTimestamp") {
            let ts = old_meta["creationTimestamp"]
                .as_str()
                .map_or_else(now_rfc3339, str::to_string);
            m.insert("creationTimestamp".into(), json!(ts));
        }
        if !m.contains_key("generation") {
            m.insert("generation".into(), json!(generation));
        }
        self.commit(key, obj, false)
    }

    fn create(&mut self, res: usize, ns: Option<&str>, mut obj: Value) -> Result<Value, ApiError> {
        let rt = &RESOURCES[res];
        check_type(res, &obj)?;
        let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => match meta_str(&obj, "generateName").filter(|n| !n.is_empty()) {
                Some(prefix) => format!("{prefix}{}", random_suffix()),
                None => {
                    return Err(ApiError::invalid(
                        res,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        let ns = if rt.namespaced {
            let ns = ns.ok_or_else(|| ApiError::bad_request("the namespace is required"))?;
            if let Some(body_ns) = meta_str(&obj, "namespace")
                && !body_ns.is_empty()
                && body_ns != ns
            {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            if self.require_namespaces
                && !self.objects.contains_key(&key(namespace_res(), None, ns))
            {
                return Err(ApiError::not_found(namespace_res(), ns));
            }
            ns.to_string()
        } else {
            String::new()
        };
        if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            ));
        }
        let key = (res, ns.clone(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res, &name));
        }
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        if rt.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(new_uid()));
        m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        set_type(res, &mut obj);
        if rt.has("status")
            && let Some(o) = obj.as_object_mut()
        {
            o.remove("status");
        }
        apply_defaults(res, &mut obj, true);
        Ok(self.commit(key, obj, false))
    }

    fn update(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        body: Value,
        part: Part,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        check_type(res, &body)?;
        check_preconditions(res, name, &old, &body)?;
        self.finish_update(res, old, body, part)
    }

    fn patch(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        content_type: &str,
        body: &[u8],
        part: Part,
    ) -> Result<Value, ApiError> {
        let kind = PatchKind::from_content_type(content_type)?;
        let patch = kind.parse(body)?;
        let old = match self.get(res, ns, name) {
            Ok(old) => old,
            Err(_) if kind == PatchKind::Apply && part == Part::Main => {
                // Server-side apply creates missing objects.
                let mut obj = json!({"metadata": {"name": name}});
                merge_patch(&mut obj, &patch);
                let m = meta_mut(&mut obj);
                m.insert("name".into(), json!(name));
                m.remove("resourceVersion");
                return self.create(res, ns, obj);
            }
            Err(e) => return Err(e),
        };
        let mut patched = old.clone();
        kind.apply(&mut patched, &patch)
            .map_err(|msg| ApiError::invalid(res, name, &msg))?;
        check_type(res, &patched)?;
        check_preconditions(res, name, &old, &patched)?;
        self.finish_update(res, old, patched, part)
    }

    /// Turns an accepted candidate into the stored object: system fields come from
    /// `old`, `.status` is split off according to `part`, no-op writes are skipped.
    fn finish_update(
        &mut self,
        res: usize,
        old: Value,
        candidate: Value,
        part: Part,
    ) -> Result<Value, ApiError> {
        let rt = &RESOURCES[res];
        let mut new = match part {
            Part::Main => {
                let mut new = candidate;
                if rt.has("status") {
                    set_or_remove(&mut new, "status", old.get("status"));
                }
                new
            }
            Part::Status => {
                let mut new = old.clone();
                set_or_remove(&mut new, "status", candidate.get("status"));
                new
            }
        };
        if !new.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        set_type(res, &mut new);
        let generation = generation_of(&old) + i64::from(spec_of(&old) != spec_of(&new));
        let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
        let m = meta_mut(&mut new);
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            match old_meta.get(field) {
                Some(v) => m.insert(field.into(), v.clone()),
                None => m.remove(field),
            };
        }
        m.insert("generation".into(), json!(generation));
        apply_defaults(res, &mut new, false);
        if new == old {
            return Ok(old);
        }
        let finalized = meta_str(&new, "deletionTimestamp").is_some()
            && new["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
        let key = key(
            res,
            meta_str(&new, "namespace"),
            meta_str(&new, "name").unwrap_or(""),
        );
        Ok(self.commit(key, new, finalized))
    }

    fn delete(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        options: &Value,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        let pre = &options["preconditions"];
        for (field, label) in [("resourceVersion", "ResourceVersion"), ("uid", "UID")] {
            if let Some(want) = pre[field].as_str()
                && !want.is_empty()
            {
                let have = meta_str(&old, field).unwrap_or("");
                if want != have {
                    return Err(ApiError::conflict(
                        res,
                        name,
                        &format!(
                            "Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"
                        ),
                    ));
                }
            }
        }
        let key = key(res, ns, name);
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if meta_str(&old, "deletionTimestamp").is_some() {
                return Ok(old);
            }
            let mut new = old;
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            return Ok(self.commit(key, new, false));
        }
        let out = self.commit(key, old, true);
        if res == namespace_res() {
            // Namespace deletion cascades (immediately) to everything inside it.
            let inside: Vec<(Key, Value)> = self
                .objects
                .iter()
                .filter(|(k, _)| RESOURCES[k.0].namespaced && k.1 == name)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in inside {
                self.commit(k, v, true);
            }
        }
        Ok(out)
    }

    fn scale_update(
        &mut self,
        res: usize,
        ns: Option<&str>,
        name: &str,
        desired: impl FnOnce(Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, ns, name)?;
        let desired = desired(scale_of(&old))?;
        if let Some(rv) = meta_str(&desired, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                res,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let replicas = desired["spec"]["replicas"].as_i64().unwrap_or(0);
        let mut candidate = old.clone();
        candidate["spec"]["replicas"] = json!(replicas);
        let new = self.finish_update(res, old, candidate, Part::Main)?;
        Ok(scale_of(&new))
    }
}

// ---------------------------------------------------------------------------
// Object helpers
// ---------------------------------------------------------------------------

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let m = obj
        .as_object_mut()
        .expect("object")
        .entry("metadata")
        .or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("object")
}

fn set_type(res: usize, obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(RESOURCES[res].api_version()));
        o.insert("kind".into(), json!(RESOURCES[res].kind));
    }
}

fn set_or_remove(obj: &mut Value, field: &str, value: Option<&Value>) {
    if let Some(o) = obj.as_object_mut() {
        match value {
            Some(v) => o.insert(field.into(), v.clone()),
            None => o.remove(field),
        };
    }
}

/// Everything except metadata and status (what `generation` tracks).
fn spec_of(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(o) = v.as_object_mut() {
        for f in ["metadata", "status", "apiVersion", "kind"] {
            o.remove(f);
        }
    }
    v
}

fn generation_of(obj: &Value) -> i64 {
    obj["metadata"]["generation"].as_i64().unwrap_or(1)
}

fn check_type(res: usize, obj: &Value) -> Result<(), ApiError> {
    let rt = &RESOURCES[res];
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    if let Some(av) = obj["apiVersion"].as_str()
        && av != rt.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    if let Some(kind) = obj["kind"].as_str()
        && kind != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    Ok(())
}

fn check_preconditions(res: usize, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    if let Some(n) = meta_str(new, "name")
        && !n.is_empty()
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    if let Some(rv) = meta_str(new, "resourceVersion")
        && !rv.is_empty()
        && Some(rv) != meta_str(old, "resourceVersion")
    {
        return Err(ApiError::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if let Some(uid) = meta_str(new, "uid")
        && !uid.is_empty()
        && Some(uid) != meta_str(old, "uid")
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(old, "uid").unwrap_or("")
            ),
        ));
    }
    Ok(())
}

/// What the real API server adds on its own.
fn apply_defaults(res: usize, obj: &mut Value, creating: bool) {
    let rt = &RESOURCES[res];
    if rt.is("v1", "Namespace") {
        let name = meta_str(obj, "name").unwrap_or("").to_string();
        let m = meta_mut(obj);
        let labels = m.entry("labels").or_insert_with(|| json!({}));
        if !labels.is_object() {
            *labels = json!({});
        }
        labels["kubernetes.io/metadata.name"] = json!(name);
        if obj["status"]["phase"].is_null() {
            obj["status"] = json!({"phase": "Active"});
        }
    } else if creating && rt.is("v1", "Pod") {
        obj["status"] = json!({"phase": "Pending"});
    } else if creating && rt.is("apiextensions.k8s.io/v1", "CustomResourceDefinition") {
        let now = now_rfc3339();
        let stored: Vec<Value> = obj["spec"]["versions"]
            .as_array()
            .map(|vs| {
                vs.iter()
                    .filter(|v| v["storage"].as_bool() == Some(true))
                    .map(|v| v["name"].clone())
                    .collect()
            })
            .unwrap_or_default();
        obj["status"] = json!({
            "acceptedNames": obj["spec"]["names"].clone(),
            "storedVersions": stored,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        });
    }
}

/// The `autoscaling/v1` `Scale` view of a scalable object.
fn scale_of(obj: &Value) -> Value {
    let mut meta = Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = obj["metadata"].get(f) {
            meta.insert(f.into(), v.clone());
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {
            "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": selector_string(&obj["spec"]["selector"]),
        },
    })
}

/// Renders a `metav1.LabelSelector` as a label selector string.
fn selector_string(sel: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(labels) = sel["matchLabels"].as_object() {
        for (k, v) in labels {
            parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
        }
    }
    for expr in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = expr["key"].as_str().unwrap_or("");
        let values: Vec<&str> = expr["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        match expr["operator"].as_str().unwrap_or("") {
            "In" => parts.push(format!("{key} in ({})", values.join(","))),
            "NotIn" => parts.push(format!("{key} notin ({})", values.join(","))),
            "Exists" => parts.push(key.to_string()),
            "DoesNotExist" => parts.push(format!("!{key}")),
            _ => {}
        }
    }
    parts.join(",")
}

/// Object as served, possibly reduced to `PartialObjectMetadata`.
fn render(obj: &Value, meta_only: bool) -> Value {
    if meta_only {
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj["metadata"].clone(),
        })
    } else {
        obj.clone()
    }
}

fn list_body(res: usize, items: Vec<Value>, rv: u64, meta_only: bool) -> Value {
    let rt = &RESOURCES[res];
    let (api_version, kind) = if meta_only {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (rt.api_version(), format!("{}List", rt.kind))
    };
    let items: Vec<Value> = items.iter().map(|o| render(o, meta_only)).collect();
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

fn mix(mut x: u64) -> u64 {
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn new_uid() -> String {
    let n = next_id();
    let h = mix(n);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        (h >> 4) & 0xfff,
        h & 0xfff,
        n
    )
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h = mix(next_id() ^ 0x5eed);
    (0..5)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize] as char;
            h /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------
// Patches
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Merge,
    Strategic,
    Json,
    Apply,
}

impl PatchKind {
    fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/json-patch+json" => Ok(Self::Json),
            "application/apply-patch+yaml" => Ok(Self::Apply),
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
                ),
            )),
        }
    }

    fn parse(self, body: &[u8]) -> Result<Value, ApiError> {
        match serde_json::from_slice(body) {
            Ok(v) => Ok(v),
            Err(e) if self == Self::Apply => std::str::from_utf8(body)
                .map_err(|e| e.to_string())
                .and_then(|t| handoff::yaml::from_str(t).map_err(|e| e.to_string()))
                .map_err(|_| ApiError::bad_request(format!("invalid apply patch body: {e}"))),
            Err(e) => Err(ApiError::bad_request(format!("invalid patch body: {e}"))),
        }
    }

    fn apply(self, doc: &mut Value, patch: &Value) -> Result<(), String> {
        match self {
            Self::Merge | Self::Strategic | Self::Apply => {
                merge_patch(doc, patch);
                Ok(())
            }
            Self::Json => json_patch(doc, patch),
        }
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn parse_pointer(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn pointer_get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn pointer_get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(move |i| a.get_mut(i)),
        _ => None,
    })
}

fn pointer_add(doc: &mut Value, tokens: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    let path = format!("/{}", tokens.join("/"));
    match pointer_get_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let idx = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .map_err(|_| format!("invalid array index in {path}"))?
            };
            if idx > a.len() {
                return Err(format!("array index out of range in {path}"));
            }
            a.insert(idx, value);
            Ok(())
        }
        _ => Err(format!("doc is missing path: {path}")),
    }
}

fn pointer_remove(doc: &mut Value, tokens: &[String]) -> Result<Value, String> {
    let path = format!("/{}", tokens.join("/"));
    let Some((last, parent)) = tokens.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    match pointer_get_mut(doc, parent) {
        Some(Value::Object(m)) => m
            .remove(last)
            .ok_or_else(|| format!("doc is missing path: {path}")),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(format!("array index out of range in {path}")),
        },
        _ => Err(format!("doc is missing path: {path}")),
    }
}

/// RFC 6902 JSON patch (add, remove, replace, move, copy, test).
fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    for op in ops {
        let name = op["op"].as_str().ok_or("JSON patch operation without op")?;
        let path_str = op["path"]
            .as_str()
            .ok_or("JSON patch operation without path")?;
        let path = parse_pointer(path_str)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("{name} operation without value"))
        };
        let from = || {
            op["from"]
                .as_str()
                .ok_or_else(|| format!("{name} operation without from"))
                .and_then(parse_pointer)
        };
        match name {
            "add" => pointer_add(doc, &path, value()?)?,
            "remove" => {
                pointer_remove(doc, &path)?;
            }
            "replace" => {
                let v = value()?;
                if path.is_empty() {
                    *doc = v;
                } else {
                    pointer_remove(doc, &path)?;
                    pointer_add(doc, &path, v)?;
                }
            }
            "move" => {
                let v = pointer_remove(doc, &from()?)?;
                pointer_add(doc, &path, v)?;
            }
            "copy" => {
                let v = pointer_get(doc, &from()?)
                    .cloned()
                    .ok_or_else(|| format!("doc is missing from path of copy to {path_str}"))?;
                pointer_add(doc, &path, v)?;
            }
            "test" => {
                if pointer_get(doc, &path) != Some(&value()?) {
                    return Err(format!("testing value {path_str} failed"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, String> {
    let mut out = Vec::new();
    for term in split_top_level(s) {
        let t = term.trim();
        if t.is_empty() {
            continue;
        }
        if let Some(open) = t.find('(') {
            let close = t
                .rfind(')')
                .filter(|&c| c > open)
                .ok_or_else(|| format!("unbalanced parentheses in {t:?}"))?;
            let values: BTreeSet<String> = t[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect();
            let head = t[..open].trim_end();
            let op_key = |op: &str| {
                head.strip_suffix(op)
                    .filter(|k| k.ends_with(char::is_whitespace))
                    .map(|k| k.trim().to_string())
            };
            if let Some(k) = op_key("notin") {
                out.push(LabelReq::NotIn(k, values));
            } else if let Some(k) = op_key("in") {
                out.push(LabelReq::In(k, values));
            } else {
                return Err(format!("unknown set operator in {t:?}"));
            }
        } else if let Some((k, v)) = t.split_once("!=") {
            out.push(LabelReq::Ne(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = t.split_once("==") {
            out.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = t.split_once('=') {
            out.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
        } else if let Some(k) = t.strip_prefix('!') {
            out.push(LabelReq::NotExists(k.trim().into()));
        } else {
            out.push(LabelReq::Exists(t.into()));
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
struct FieldReq {
    path: String,
    value: String,
    negate: bool,
}

fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, String> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (path, value, negate) = if let Some((p, v)) = term.split_once("!=") {
            (p, v, true)
        } else if let Some((p, v)) = term.split_once("==") {
            (p, v, false)
        } else if let Some((p, v)) = term.split_once('=') {
            (p, v, false)
        } else {
            return Err(format!("invalid field selector term {term:?}"));
        };
        out.push(FieldReq {
            path: path.trim().into(),
            value: value.trim().into(),
            negate,
        });
    }
    Ok(out)
}

#[derive(Debug, Clone, Default)]
struct Filter {
    namespace: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    fn from_query(ns: Option<&str>, query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let labels = query
            .get("labelSelector")
            .map(|s| parse_label_selector(s))
            .transpose()
            .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?
            .unwrap_or_default();
        let fields = query
            .get("fieldSelector")
            .map(|s| parse_field_selector(s))
            .transpose()
            .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?
            .unwrap_or_default();
        Ok(Filter {
            namespace: ns.map(str::to_string),
            labels,
            fields,
        })
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && meta_str(obj, "namespace") != Some(ns.as_str())
        {
            return false;
        }
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.contains(l)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| !vs.contains(l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        });
        labels_ok
            && self.fields.iter().all(|f| {
                let actual = f
                    .path
                    .split('.')
                    .try_fold(obj, |cur, seg| cur.get(seg))
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    })
                    .unwrap_or_default();
                (actual == f.value) != f.negate
            })
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, res: usize, name: &str) -> Self {
        let rt = &RESOURCES[res];
        let mut d = json!({"name": name, "kind": rt.plural});
        if !rt.group.is_empty() {
            d["group"] = json!(rt.group);
        }
        self.details = Some(d);
        self
    }

    fn not_found(res: usize, name: &str) -> Self {
        let q = RESOURCES[res].qualified();
        Self::new(404, "NotFound", format!("{q} \"{name}\" not found")).with_details(res, name)
    }

    fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    fn already_exists(res: usize, name: &str) -> Self {
        let q = RESOURCES[res].qualified();
        Self::new(
            409,
            "AlreadyExists",
            format!("{q} \"{name}\" already exists"),
        )
        .with_details(res, name)
    }

    fn conflict(res: usize, name: &str, why: &str) -> Self {
        let q = RESOURCES[res].qualified();
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {q} \"{name}\": {why}"),
        )
        .with_details(res, name)
    }

    fn invalid(res: usize, name: &str, why: &str) -> Self {
        let rt = &RESOURCES[res];
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {why}", rt.kind),
        )
        .with_details(res, name)
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    fn body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }

    fn response(&self) -> Response {
        json_response(
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &self.body(),
        )
    }
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).expect("serialize")))
        .expect("response")
}

// ---------------------------------------------------------------------------
// HTTP routing
// ---------------------------------------------------------------------------

struct Target {
    res: usize,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Json(Value),
    Resource(Target),
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn route(path: &str) -> Result<Route, ApiError> {
    let owned: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = owned.iter().map(String::as_str).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Json(version_info())),
        ["api"] => {
            return Ok(Route::Json(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [],
            })));
        }
        ["apis"] => return Ok(Route::Json(api_group_list())),
        ["apis", group] => {
            return api_group(group)
                .map(Route::Json)
                .ok_or_else(ApiError::no_route);
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::no_route()),
    };
    if rest.is_empty() {
        return resource_list(group, version)
            .map(Route::Json)
            .ok_or_else(ApiError::no_route);
    }
    let owned = |s: Option<&&str>| s.map(|s| s.to_string());
    if rest.len() >= 3
        && rest[0] == "namespaces"
        && let Some(res) = find_plural(group, version, rest[2]).filter(|&r| RESOURCES[r].namespaced)
    {
        if rest.len() > 5 {
            return Err(ApiError::no_route());
        }
        return Ok(Route::Resource(Target {
            res,
            ns: Some(rest[1].to_string()),
            name: owned(rest.get(3)),
            sub: owned(rest.get(4)),
        }));
    }
    let res = find_plural(group, version, rest[0]).ok_or_else(ApiError::no_route)?;
    if rest.len() > 3 || (RESOURCES[res].namespaced && rest.len() > 1) {
        return Err(ApiError::no_route());
    }
    Ok(Route::Resource(Target {
        res,
        ns: None,
        name: owned(rest.get(1)),
        sub: owned(rest.get(2)),
    }))
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-handoff-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_versions(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group) {
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    versions
}

fn api_group(group: &str) -> Option<Value> {
    let versions = group_versions(group);
    if group.is_empty() || versions.is_empty() {
        return None;
    }
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    Some(json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": gvs,
        "preferredVersion": gvs[0].clone(),
    }))
}

fn api_group_list() -> Value {
    let mut groups: Vec<&'static str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&r.group) {
            groups.push(r.group);
        }
    }
    let groups: Vec<Value> = groups.iter().filter_map(|g| api_group(g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.kind.to_lowercase(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        }));
        for sub in r.subresources {
            let mut v = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            });
            if *sub == "scale" {
                v["kind"] = json!("Scale");
                v["group"] = json!("autoscaling");
                v["version"] = json!("v1");
            }
            resources.push(v);
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

// ---------------------------------------------------------------------------
// HTTP handlers
// ---------------------------------------------------------------------------

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    inner.record(&method, &uri);
    let latency = inner.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(latency)).await;
    }
    if method != Method::GET {
        let budget = inner.write_budget.load(Ordering::SeqCst);
        if budget == 0 {
            return ApiError::new(
                503,
                "ServiceUnavailable",
                "the fake API server refuses further writes (FakeApi::fail_writes_after)",
            )
            .response();
        }
        if budget > 0 {
            inner.write_budget.fetch_sub(1, Ordering::SeqCst);
        }
    }
    if inner.unavailable.load(Ordering::SeqCst) || inner.closed.load(Ordering::SeqCst) {
        return ApiError::new(
            503,
            "ServiceUnavailable",
            "the fake API server is unavailable (FakeApi::set_unavailable)",
        )
        .response();
    }
    serve(&inner, &method, &uri, &headers, &body).unwrap_or_else(|e| e.response())
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

fn serve(
    inner: &Arc<Inner>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let target = match route(uri.path())? {
        Route::Json(v) if method == Method::GET => return Ok(json_response(StatusCode::OK, &v)),
        Route::Json(_) => return Err(ApiError::method_not_allowed()),
        Route::Resource(t) => t,
    };
    let query: HashMap<String, String> = Query::try_from_uri(uri).map(|q| q.0).unwrap_or_default();
    let header_str = |h: header::HeaderName| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let meta_only = header_str(header::ACCEPT).contains("as=PartialObjectMetadata");
    let content_type = header_str(header::CONTENT_TYPE);
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
    let flag = |k: &str| query.get(k).is_some_and(|v| v == "true" || v == "1");

    let res = target.res;
    let rt = &RESOURCES[res];
    let ns = target.ns.as_deref();
    let ok = |v: Value| Ok(json_response(StatusCode::OK, &render(&v, meta_only)));

    match (target.name.as_deref(), target.sub.as_deref()) {
        (None, None) => match *method {
            Method::GET => {
                let filter = Filter::from_query(ns, &query)?;
                if flag("watch") {
                    return watch_response(inner.clone(), res, filter, meta_only, &query);
                }
                let store = inner.lock();
                let items = store.select(res, &filter);
                Ok(json_response(
                    StatusCode::OK,
                    &list_body(res, items, store.rv, meta_only),
                ))
            }
            Method::POST => {
                if rt.namespaced && ns.is_none() {
                    return Err(ApiError::method_not_allowed());
                }
                let obj = parse_body(body)?;
                let created = inner.write(dry_run, |s| s.create(res, ns, obj))?;
                Ok(json_response(
                    StatusCode::CREATED,
                    &render(&created, meta_only),
                ))
            }
            Method::DELETE => {
                let filter = Filter::from_query(ns, &query)?;
                let (deleted, rv) = inner.write(dry_run, |s| {
                    let names: Vec<(Option<String>, String)> = s
                        .select(res, &filter)
                        .iter()
                        .map(|o| {
                            (
                                meta_str(o, "namespace").map(str::to_string),
                                meta_str(o, "name").unwrap_or("").to_string(),
                            )
                        })
                        .collect();
                    let deleted: Vec<Value> = names
                        .iter()
                        .filter_map(|(ns, name)| {
                            s.delete(res, ns.as_deref(), name, &Value::Null).ok()
                        })
                        .collect();
                    (deleted, s.rv)
                });
                Ok(json_response(
                    StatusCode::OK,
                    &list_body(res, deleted, rv, meta_only),
                ))
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        (Some(name), None) => match *method {
            Method::GET => ok(inner.lock().get(res, ns, name)?),
            Method::PUT => {
                let obj = parse_body(body)?;
                ok(inner.write(dry_run, |s| s.update(res, ns, name, obj, Part::Main))?)
            }
            Method::PATCH => ok(inner.write(dry_run, |s| {
                s.patch(res, ns, name, &content_type, body, Part::Main)
            })?),
            Method::DELETE => {
                let options = if body.is_empty() {
                    Value::Null
                } else {
                    parse_body(body)?
                };
                ok(inner.write(dry_run, |s| s.delete(res, ns, name, &options))?)
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        (Some(name), Some("status")) if rt.has("status") => match *method {
            Method::GET => ok(inner.lock().get(res, ns, name)?),
            Method::PUT => {
                let obj = parse_body(body)?;
                ok(inner.write(dry_run, |s| s.update(res, ns, name, obj, Part::Status))?)
            }
            Method::PATCH => ok(inner.write(dry_run, |s| {
                s.patch(res, ns, name, &content_type, body, Part::Status)
            })?),
            _ => Err(ApiError::method_not_allowed()),
        },
        (Some(name), Some("scale")) if rt.has("scale") => {
            let scale = match *method {
                Method::GET => scale_of(&inner.lock().get(res, ns, name)?),
                Method::PUT => {
                    let desired = parse_body(body)?;
                    inner.write(dry_run, |s| s.scale_update(res, ns, name, |_| Ok(desired)))?
                }
                Method::PATCH => {
                    let kind = PatchKind::from_content_type(&content_type)?;
                    let patch = kind.parse(body)?;
                    inner.write(dry_run, |s| {
                        s.scale_update(res, ns, name, |mut current| {
                            kind.apply(&mut current, &patch)
                                .map_err(|msg| ApiError::invalid(res, name, &msg))?;
                            Ok(current)
                        })
                    })?
                }
                _ => return Err(ApiError::method_not_allowed()),
            };
            Ok(json_response(StatusCode::OK, &scale))
        }
        _ => Err(ApiError::no_route()),
    }
}

// ---------------------------------------------------------------------------
// Watch
// ---------------------------------------------------------------------------

struct WatchState {
    inner: Arc<Inner>,
    res: usize,
    filter: Filter,
    meta_only: bool,
    bookmarks: bool,
    pending: VecDeque<Bytes>,
    last_rv: u64,
    rx: watch::Receiver<u64>,
    deadline: Instant,
    done: bool,
}

fn event_line(kind: &str, object: Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("serialize");
    line.push(b'\n');
    Bytes::from(line)
}

impl WatchState {
    fn event(&self, kind: &str, obj: &Value) -> Bytes {
        event_line(kind, render(obj, self.meta_only))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let rt = &RESOURCES[self.res];
        let (api_version, kind) = if self.meta_only {
            ("meta.k8s.io/v1".to_string(), "PartialObjectMetadata")
        } else {
            (rt.api_version(), rt.kind)
        };
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        event_line(
            "BOOKMARK",
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata}),
        )
    }

    fn expired(&mut self, rv: u64, compacted: u64) {
        let err = ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {rv} ({})", compacted + 1),
        );
        self.pending.push_back(event_line("ERROR", err.body()));
        self.done = true;
    }

    /// Queues the events newer than `last_rv` that this watch should see.
    fn collect(&mut self) {
        let inner = self.inner.clone();
        let store = inner.lock();
        if self.last_rv < store.compacted {
            self.expired(self.last_rv, store.compacted);
            return;
        }
        let start = store.history.partition_point(|e| e.rv <= self.last_rv);
        for ev in store.history.range(start..) {
            if ev.res != self.res {
                continue;
            }
            let now = self.filter.matches(&ev.obj);
            let kind = match ev.kind {
                "MODIFIED" => {
                    let before = ev.prev.as_ref().is_some_and(|p| self.filter.matches(p));
                    match (before, now) {
                        (true, true) => Some("MODIFIED"),
                        (false, true) => Some("ADDED"),
                        (true, false) => Some("DELETED"),
                        (false, false) => None,
                    }
                }
                other => now.then_some(other),
            };
            if let Some(kind) = kind {
                let line = self.event(kind, &ev.obj);
                self.pending.push_back(line);
            }
        }
        self.last_rv = self.last_rv.max(store.rv);
    }
}

async fn watch_next(mut st: WatchState) -> Option<(Result<Bytes, Infallible>, WatchState)> {
    loop {
        if let Some(line) = st.pending.pop_front() {
            return Some((Ok(line), st));
        }
        if st.done
            || st.inner.unavailable.load(Ordering::SeqCst)
            || st.inner.closed.load(Ordering::SeqCst)
        {
            return None;
        }
        st.rx.borrow_and_update();
        st.collect();
        if !st.pending.is_empty() || st.done {
            continue;
        }
        tokio::select! {
            changed = st.rx.changed() => {
                if changed.is_err() {
                    st.done = true;
                }
            }
            _ = tokio::time::sleep_until(st.deadline) => {
                if st.bookmarks {
                    let line = st.bookmark(st.last_rv, false);
                    st.pending.push_back(line);
                }
                st.done = true;
            }
        }
    }
}

fn watch_response(
    inner: Arc<Inner>,
    res: usize,
    filter: Filter,
    meta_only: bool,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let flag = |k: &str| query.get(k).is_some_and(|v| v == "true" || v == "1");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(290);
    let rv_param = query.get("resourceVersion").map_or("", String::as_str);
    let send_initial = flag("sendInitialEvents");

    let store = inner.lock();
    let rx = store.tick.subscribe();
    let mut st = WatchState {
        inner: inner.clone(),
        res,
        filter,
        meta_only,
        bookmarks: flag("allowWatchBookmarks"),
        pending: VecDeque::new(),
        last_rv: store.rv,
        rx,
        deadline: Instant::now() + Duration::from_secs(timeout),
        done: false,
    };
    if send_initial || rv_param.is_empty() || rv_param == "0" {
        for obj in store.select(res, &st.filter) {
            let line = st.event("ADDED", &obj);
            st.pending.push_back(line);
        }
        if send_initial {
            let line = st.bookmark(store.rv, true);
            st.pending.push_back(line);
        }
    } else {
        let rv: u64 = rv_param
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}")))?;
        if rv < store.compacted {
            st.expired(rv, store.compacted);
        }
        st.last_rv = rv;
    }
    drop(store);

    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures::stream::unfold(st, watch_next)))
        .expect("response"))
}
