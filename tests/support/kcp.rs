//! A stand-in for kcp in front of a second kube-apiserver: what handoff reads of kcp, and
//! nothing more. Not kcp; it assumes these kcp behaviours (docs/src/tasks/kcp.md):
//! - a logical cluster's API is served under `/clusters/<name>/` (here: exactly one logical
//!   cluster, the one given to `start`, mapped onto the whole second API server; any other name
//!   gets a 404 Status, as an unknown workspace does);
//! - `/clusters/*/api/v1/namespaces` lists and watches namespaces across logical clusters, each
//!   item (and each watch event's object) carrying the `kcp.io/cluster` annotation that names
//!   its logical cluster; nothing else is served under `*`;
//! - namespaces carry the soft-finalizer annotations users and kcp's controllers set.
//!
//! It speaks plain HTTP to handoff (the kubeconfig it writes has `server: http://127.0.0.1:…`
//! and a token it ignores) and forwards over HTTPS as the second API server's admin. `stop`
//! closes the listener and every open connection, watches included: "kcp is down".
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::{BodyExt as _, Full, StreamBody};

use super::apiserver::ApiServer;
use super::proxy::{BoxError, ForwardError, Out, Proxy, forward};

pub struct KcpStandIn {
    pub port: u16,
    pub cluster: String,
    proxy: Proxy,
}

impl KcpStandIn {
    /// Serve logical cluster `cluster` (and `*`) from `api`, on a free loopback port.
    pub fn start(api: &ApiServer, cluster: &str) -> KcpStandIn {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(api.kubeconfig(super::apiserver::ADMIN))
                .expect("admin kubeconfig");
        let name = cluster.to_string();
        let proxy = Proxy::start(kubeconfig, true, move |req, client| {
            let name = name.clone();
            async move { handle(req, client, &name).await }
        });
        KcpStandIn {
            port: proxy.port,
            cluster: cluster.to_string(),
            proxy,
        }
    }

    pub fn url(&self) -> String {
        self.proxy.url()
    }

    /// A kubeconfig for the stand-in's base URL (or, with `workspace`, a workspace's URL, as
    /// kcp's own kubeconfigs are), written into `dir`.
    pub fn kubeconfig(&self, dir: &Path, workspace: Option<&str>) -> PathBuf {
        let server = match workspace {
            Some(ws) => format!("{}/clusters/{ws}", self.url()),
            None => self.url(),
        };
        self.proxy.write_kubeconfig(
            &dir.join(format!("kcp-kubeconfig-{}", self.port)),
            &server,
            None,
        )
    }

    /// kcp goes away: the listener and every connection close.
    pub fn stop(&mut self) {
        self.proxy.stop();
    }
}

fn status(code: u16, message: &str) -> Out {
    let reason = if code == 404 {
        "NotFound"
    } else {
        "BadRequest"
    };
    super::proxy::status(code, reason, message)
}
async fn handle(
    req: http::Request<hyper::body::Incoming>,
    client: kube::Client,
    cluster: &str,
) -> Out {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let Some(rest) = path.strip_prefix("/clusters/") else {
        return status(404, "the stand-in serves only /clusters/<name>/…");
    };
    let (name, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let wildcard = name == "*";
    if wildcard {
        if rest != "api/v1/namespaces" {
            return status(404, "the stand-in serves only namespaces under /clusters/*");
        }
    } else if name != cluster {
        return status(404, &format!("logical cluster {name:?} not found"));
    }
    let target = match &query {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    let watch = query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let (parts, body) = req.into_parts();
    let response = match forward(&client, &parts, &target, body).await {
        Ok(r) => r,
        Err(ForwardError::Body(e)) => return status(400, &e),
        Err(ForwardError::Send(e)) => return status(502, &e),
    };
    let (parts, body) = response.into_parts();
    let mut out = http::Response::builder().status(parts.status);
    if let Some(v) = parts.headers.get(http::header::CONTENT_TYPE) {
        out = out.header(http::header::CONTENT_TYPE, v);
    }
    if !wildcard || !parts.status.is_success() {
        return out
            .body(body.map_err(|e| Box::new(e) as BoxError).boxed_unsync())
            .expect("response");
    }
    let cluster = cluster.to_string();
    if !watch {
        // A list: every item names its logical cluster.
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return status(502, &e.to_string()),
        };
        let mut list: serde_json::Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => return status(502, &e.to_string()),
        };
        if let Some(items) = list["items"].as_array_mut() {
            for item in items {
                annotate(item, &cluster);
            }
        }
        return out
            .body(
                Full::new(Bytes::from(list.to_string()))
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )
            .expect("response");
    }
    // A watch: one JSON event per line; each event's object names its logical cluster.
    let mut pending: Vec<u8> = Vec::new();
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| Box::new(e) as BoxError)?;
        pending.extend_from_slice(&chunk);
        let mut out = Vec::new();
        while let Some(i) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            match serde_json::from_slice::<serde_json::Value>(&line) {
                Ok(mut event) => {
                    if event["object"]["kind"] != "Status" {
                        annotate(&mut event["object"], &cluster);
                    }
                    out.extend_from_slice(event.to_string().as_bytes());
                    out.push(b'\n');
                }
                Err(_) => out.extend_from_slice(&line),
            }
        }
        Ok::<_, BoxError>(hyper::body::Frame::data(Bytes::from(out)))
    });
    out.body(StreamBody::new(stream).boxed_unsync())
        .expect("response")
}

fn annotate(object: &mut serde_json::Value, cluster: &str) {
    let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) else {
        return;
    };
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| serde_json::json!({}));
    if annotations.is_null() {
        *annotations = serde_json::json!({});
    }
    annotations["kcp.io/cluster"] = cluster.into();
}
