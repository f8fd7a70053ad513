//! A kube-proxy for the test's network namespace: each Service's ClusterIP and port, listened on
//! (the address put on `lo`), sends every new connection to one endpoint that is ready and not
//! terminating, chosen when the connection opens, and keeps an established connection where it
//! is however the endpoints change afterwards: what iptables/IPVS with conntrack do.
//!
//! Forwarding is byte for byte in both directions, and a half-close is passed on as a half-close
//! (a FIN from one side becomes a `shutdown(Write)` towards the other), as NAT passes a FIN; a
//! reset or read error on one side resets the other. Where a real kube-proxy differs: with no
//! endpoint, iptables rejects the SYN (connection refused); here the connection is accepted and
//! reset at once, which a client sees as a reset on its first read or write.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One endpoint of a Service, as the endpoints controller would list it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub pod: String,
    pub addr: SocketAddr,
}

/// Where a Service's connections go: asked on every new connection.
pub type Resolver = Arc<dyn Fn() -> Vec<Endpoint> + Send + Sync>;

/// One Service port being proxied; stops listening when dropped (established connections go on
/// until either side closes).
pub struct ServicePort {
    pub name: String,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    stopped: Arc<AtomicBool>,
    /// Connections opened, and connections that found no endpoint.
    pub connections: Arc<AtomicU64>,
    pub refused: Arc<AtomicU64>,
    /// Which pod each connection went to, in order, for a test to check the spread.
    pub routed: Arc<Mutex<Vec<String>>>,
    /// Every connection's life: pod, opened, and how each direction ended.
    pub log: Arc<Mutex<Vec<ConnectionLog>>>,
}

/// One proxied connection, in wall-clock time (to set beside the pods' own logs).
#[derive(Debug, Clone)]
pub struct ConnectionLog {
    pub pod: String,
    pub opened: std::time::SystemTime,
    /// (when, what): "server FIN", "client FIN", "server reset", "client reset", "server
    /// gone", "client gone", "connect failed".
    pub ends: Vec<(std::time::SystemTime, &'static str)>,
    /// The protocols the client offered in its TLS ClientHello (ALPN), read off the wire.
    pub alpn_offered: Vec<String>,
    /// When the client last sent bytes (its last request): how long a connection had been idle
    /// when the pod closed it. (The pod's own last bytes are its TLS close_notify.)
    pub last_from_client: Option<std::time::SystemTime>,
}

impl ConnectionLog {
    /// Whether the pod closed it first (a FIN or reset from its side before the client's).
    pub fn closed_by_pod(&self) -> Option<std::time::SystemTime> {
        self.ends
            .first()
            .filter(|(_, what)| what.starts_with("server"))
            .map(|(t, _)| *t)
    }
}

impl ServicePort {
    /// Listen on `cluster_ip:port` (which must already be on `lo`) and proxy to `resolve()`.
    pub fn start(name: &str, cluster_ip: Ipv4Addr, port: u16, resolve: Resolver) -> ServicePort {
        let listener = TcpListener::bind((cluster_ip, port))
            .unwrap_or_else(|e| panic!("kube-proxy for {name}: bind {cluster_ip}:{port}: {e}"));
        listener.set_nonblocking(true).expect("nonblocking");
        let stopped = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let routed = Arc::new(Mutex::new(Vec::new()));
        let log: Arc<Mutex<Vec<ConnectionLog>>> = Arc::new(Mutex::new(Vec::new()));
        let (s, c, r, ro, lg) = (
            stopped.clone(),
            connections.clone(),
            refused.clone(),
            routed.clone(),
            log.clone(),
        );
        let counter = AtomicU64::new(0);
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(_) => continue,
                };
                let _ = client.set_nonblocking(false);
                c.fetch_add(1, Ordering::Relaxed);
                let endpoints = resolve();
                if endpoints.is_empty() {
                    r.fetch_add(1, Ordering::Relaxed);
                    reset(&client);
                    continue;
                }
                // Random in kube-proxy's iptables mode; round-robin here, so that a test run
                // spreads the same way every time.
                let n = counter.fetch_add(1, Ordering::Relaxed) as usize;
                let ep = endpoints[n % endpoints.len()].clone();
                ro.lock().unwrap().push(ep.pod.clone());
                let entry = {
                    let mut l = lg.lock().unwrap();
                    l.push(ConnectionLog {
                        pod: ep.pod.clone(),
                        opened: std::time::SystemTime::now(),
                        ends: Vec::new(),
                        alpn_offered: Vec::new(),
                        last_from_client: None,
                    });
                    l.len() - 1
                };
                let (lg, lg2) = (lg.clone(), lg.clone());
                let note: Note = Arc::new(move |what| {
                    lg.lock().unwrap()[entry]
                        .ends
                        .push((std::time::SystemTime::now(), what));
                });
                // Each chunk the client sends; the first is its ClientHello.
                let sent: Sent = Arc::new(move |bytes: &[u8]| {
                    let c = &mut lg2.lock().unwrap()[entry];
                    if c.last_from_client.is_none() {
                        c.alpn_offered = client_hello_alpn(bytes);
                    }
                    c.last_from_client = Some(std::time::SystemTime::now());
                });
                std::thread::spawn(move || forward(client, ep.addr, note, sent));
            }
        });
        ServicePort {
            name: name.to_string(),
            cluster_ip,
            port,
            stopped,
            connections,
            refused,
            routed,
            log,
        }
    }
}

type Note = Arc<dyn Fn(&'static str) + Send + Sync>;
type Sent = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// The ALPN protocol names in a TLS ClientHello record (empty if it is not one, or has none).
pub fn client_hello_alpn(b: &[u8]) -> Vec<String> {
    let parse = || -> Option<Vec<String>> {
        // record header (5), handshake header (4), version (2), random (32)
        if *b.first()? != 0x16 || *b.get(5)? != 0x01 {
            return None;
        }
        let mut i = 5 + 4 + 2 + 32;
        let sid = *b.get(i)? as usize;
        i += 1 + sid;
        let suites = u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]) as usize;
        i += 2 + suites;
        let comp = *b.get(i)? as usize;
        i += 1 + comp;
        let ext_end = i + 2 + u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]) as usize;
        i += 2;
        while i + 4 <= ext_end.min(b.len()) {
            let ty = u16::from_be_bytes([b[i], b[i + 1]]);
            let len = u16::from_be_bytes([b[i + 2], b[i + 3]]) as usize;
            let data = b.get(i + 4..i + 4 + len)?;
            if ty == 0x0010 {
                let mut out = Vec::new();
                let mut j = 2;
                while j < data.len() {
                    let n = data[j] as usize;
                    out.push(String::from_utf8_lossy(data.get(j + 1..j + 1 + n)?).into_owned());
                    j += 1 + n;
                }
                return Some(out);
            }
            i += 4 + len;
        }
        Some(Vec::new())
    };
    parse().unwrap_or_default()
}

impl ServicePort {
    /// The pod the latest connection went to.
    pub fn last_routed(&self) -> Option<String> {
        self.routed.lock().unwrap().last().cloned()
    }

    /// Every ALPN protocol list the clients offered, once each.
    pub fn alpn_offered(&self) -> Vec<Vec<String>> {
        let mut out: Vec<Vec<String>> = Vec::new();
        for c in self.log.lock().unwrap().iter() {
            if !out.contains(&c.alpn_offered) {
                out.push(c.alpn_offered.clone());
            }
        }
        out
    }

    /// `name: N connections (pod ×n, …), M without an endpoint`.
    pub fn summary(&self) -> String {
        let mut by_pod: BTreeMap<String, usize> = BTreeMap::new();
        for p in self.routed.lock().unwrap().iter() {
            *by_pod.entry(p.clone()).or_default() += 1;
        }
        format!(
            "{}: {} connections ({}), {} without an endpoint",
            self.name,
            self.connections.load(Ordering::Relaxed),
            by_pod
                .iter()
                .map(|(p, n)| format!("{p} x{n}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.refused.load(Ordering::Relaxed)
        )
    }
}

impl Drop for ServicePort {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// Close with a reset (SO_LINGER 0), as a refused or broken NAT'd connection looks.
fn reset(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    use std::os::fd::AsRawFd as _;
    // SAFETY: a valid socket fd and a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = s.shutdown(Shutdown::Both);
}

fn forward(client: TcpStream, to: SocketAddr, note: Note, sent: Sent) {
    let server = match TcpStream::connect_timeout(&to, Duration::from_secs(3)) {
        Ok(s) => s,
        Err(_) => {
            // The pod went away between the choice and the connect: what a client sees from
            // a NAT'd SYN to a dead pod is a timeout or a refusal; a reset is the nearest.
            note("connect failed");
            reset(&client);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let (c2, s2) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let n2 = note.clone();
    let up = std::thread::spawn(move || pipe(c2, s2, "client", n2, Some(sent)));
    pipe(server, client, "server", note, None);
    let _ = up.join();
}

/// Copy `from` → `to` until EOF (then half-close `to`) or an error (then reset both); each
/// chunk goes to `sent` too.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    side: &'static str,
    note: Note,
    sent: Option<Sent>,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let read = from.read(&mut buf);
        if let (Some(sent), Ok(n @ 1..)) = (&sent, &read) {
            sent(&buf[..*n]);
        }
        match read {
            Ok(0) => {
                note(if side == "server" {
                    "server FIN"
                } else {
                    "client FIN"
                });
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    note(if side == "server" {
                        "client gone"
                    } else {
                        "server gone"
                    });
                    reset(&from);
                    return;
                }
            }
            Err(_) => {
                note(if side == "server" {
                    "server reset"
                } else {
                    "client reset"
                });
                reset(&to);
                return;
            }
        }
    }
}

/// The Services of one namespace as the API server holds them: name → (ClusterIP, selector,
/// ports as `(port, targetPort)`; a named targetPort is left for the caller to resolve).
pub fn services(list: &serde_json::Value) -> BTreeMap<String, ServiceView> {
    let mut out = BTreeMap::new();
    for s in list["items"].as_array().into_iter().flatten() {
        let name = s["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Some(ip) = s["spec"]["clusterIP"]
            .as_str()
            .and_then(|ip| ip.parse().ok())
        else {
            continue;
        };
        let selector = s["spec"]["selector"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let ports = s["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| ServicePortView {
                name: p["name"].as_str().unwrap_or_default().to_string(),
                port: p["port"].as_u64().unwrap_or_default() as u16,
                target_port: p["targetPort"].clone(),
            })
            .collect();
        out.insert(
            name,
            ServiceView {
                cluster_ip: ip,
                selector,
                ports,
            },
        );
    }
    out
}

#[derive(Debug, Clone)]
pub struct ServiceView {
    pub cluster_ip: Ipv4Addr,
    pub selector: BTreeMap<String, String>,
    pub ports: Vec<ServicePortView>,
}

#[derive(Debug, Clone)]
pub struct ServicePortView {
    pub name: String,
    pub port: u16,
    /// A number or a container port's name, as written in the Service.
    pub target_port: serde_json::Value,
}
