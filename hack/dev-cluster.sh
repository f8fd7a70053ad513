#!/usr/bin/env bash
# A development API server on this machine: etcd and kube-apiserver from envtest's binaries, on
# free loopback ports, with an admin kubeconfig. Nothing else runs (no controller-manager, no
# scheduler, no kubelet), which is all handoff needs: it is an admission webhook.
#
#   hack/dev-cluster.sh start DIR   # ~3 s; prints DIR/kubeconfig once /readyz answers ok
#   hack/dev-cluster.sh stop DIR    # stops the two processes recorded in DIR; DIR stays
#
# KUBEBUILDER_ASSETS names the folder holding `etcd` and `kube-apiserver`
# (`setup-envtest use -p path` prints one). Needs bash, curl and openssl.
#
# DIR gets: ca.crt/ca.key (the API server's CA), apiserver.crt/.key (serving 127.0.0.1,
# localhost), sa.key/sa.pub (service-account tokens), tokens.csv (user `admin` in
# system:masters, a random token), kubeconfig (that admin, CA embedded), audit-policy.yaml and
# audit.log (writes and deletes at Metadata level: a webhook's audit annotations land there),
# etcd-data/, etcd.log, kube-apiserver.log, etcd.pid, kube-apiserver.pid.
#
# The kube-apiserver flags are the tests' (tests/support/apiserver.rs): token auth, RBAC, the
# service-account key pair, --cert-dir in DIR, and the ServiceAccount admission plugin off (no
# controller-manager creates the `default` ServiceAccount that it would wait for).
set -euo pipefail

usage() {
    echo "usage: $0 start DIR | stop DIR" >&2
    exit 2
}
[ $# -eq 2 ] && [ -n "$2" ] || usage
cmd=$1

# pid_of NAME: the recorded PID of NAME, if that process still runs and is NAME started for DIR
# (a PID the system reused for something else is not ours to signal).
pid_of() {
    local pid args
    pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    args=$(ps -p "$pid" -o args= 2>/dev/null) || return 1
    [[ $args == *"$1"* && $args == *"$dir/"* ]] || return 1
    echo "$pid"
}

# stop_one NAME: SIGTERM, up to 10 s, then SIGKILL.
stop_one() {
    local pid i
    pid=$(pid_of "$1") || { rm -f "$dir/$1.pid"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 100); do
        pid_of "$1" >/dev/null || break
        sleep 0.1
    done
    if pid_of "$1" >/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$dir/$1.pid"
    echo "dev-cluster: $1 stopped (pid $pid)" >&2
}

stop_all() {
    stop_one kube-apiserver
    stop_one etcd
}

case $cmd in
stop)
    [ -d "$2" ] || { echo "dev-cluster: no folder $2" >&2; exit 1; }
    dir=$(cd "$2" && pwd)
    stop_all
    exit 0
    ;;
start) ;;
*) usage ;;
esac

mkdir -p "$2"
dir=$(cd "$2" && pwd)
assets=${KUBEBUILDER_ASSETS:-}
if [ -z "$assets" ]; then
    echo "dev-cluster: KUBEBUILDER_ASSETS is not set; it names envtest's binaries: export KUBEBUILDER_ASSETS=\$(setup-envtest use -p path)" >&2
    exit 1
fi
for b in etcd kube-apiserver; do
    [ -x "$assets/$b" ] || { echo "dev-cluster: $assets/$b is missing or not executable" >&2; exit 1; }
done
for tool in curl openssl; do
    command -v "$tool" >/dev/null || { echo "dev-cluster: $tool is not on PATH" >&2; exit 1; }
done
for n in etcd kube-apiserver; do
    if pid=$(pid_of "$n"); then
        echo "dev-cluster: $n already runs for $dir (pid $pid): $0 stop $dir first" >&2
        exit 1
    fi
done

fail() {
    echo "dev-cluster: $*" >&2
    local log
    for log in etcd kube-apiserver; do
        [ -f "$dir/$log.log" ] && { echo "--- last lines of $dir/$log.log" >&2; tail -n 20 "$dir/$log.log" >&2; }
    done
    stop_all
    exit 1
}

# ---- certificates, keys, the admin's token ----
cat >"$dir/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,digitalSignature,keyCertSign,cRLSign
[serving]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc
EOF
(
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 30 -subj /CN=dev-cluster-ca \
        -config "$dir/openssl.cnf" -extensions ca -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    openssl req -new -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -config "$dir/openssl.cnf" \
        -keyout "$dir/apiserver.key" -out "$dir/apiserver.csr" 2>/dev/null
    openssl x509 -req -sha256 -days 30 -in "$dir/apiserver.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -set_serial "0x$(openssl rand -hex 8)" -extfile "$dir/openssl.cnf" -extensions serving \
        -out "$dir/apiserver.crt" 2>/dev/null
    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
    openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
    token=$(openssl rand -hex 24)
    echo "$token,admin,admin,\"system:masters\"" >"$dir/tokens.csv"
) || fail "openssl could not make the certificates"
token=$(cut -d, -f1 "$dir/tokens.csv")
cat >"$dir/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
EOF

# ---- ports ----
# Random in 20000-31999 (below Linux's ephemeral range, so outgoing connections do not take it)
# and nobody answering on it. Another process may still bind it first: then the start is
# retried on a new port.
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 12000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}

# launch NAME ARGS...: in the background, its output in DIR/NAME.log, its PID in DIR/NAME.pid.
launch() {
    local name=$1
    shift
    "$assets/$name" "$@" </dev/null >"$dir/$name.log" 2>&1 &
    echo $! >"$dir/$name.pid"
}

# wait_up NAME PROBE...: until PROBE succeeds (0), NAME exits (1) or 60 s pass (2).
wait_up() {
    local name=$1 i
    shift
    for i in $(seq 300); do
        pid_of "$name" >/dev/null || return 1
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 2
}

etcd_ok() { curl -fsS --max-time 2 "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"'; }
api_ok() {
    [ "$(curl -sS --max-time 3 --cacert "$dir/ca.crt" -H "Authorization: Bearer $token" \
        "https://127.0.0.1:$api_port/readyz")" = ok ]
}

mkdir -p "$dir/etcd-data"
for attempt in 1 2 3 4 5; do
    etcd_port=$(free_port)
    launch etcd --data-dir="$dir/etcd-data" \
        --listen-client-urls="http://127.0.0.1:$etcd_port" \
        --advertise-client-urls="http://127.0.0.1:$etcd_port" \
        --listen-peer-urls=http://127.0.0.1:0 --unsafe-no-fsync=true
    rc=0
    wait_up etcd etcd_ok || rc=$?
    [ $rc -eq 0 ] && break
    [ $rc -eq 1 ] && grep -q "address already in use" "$dir/etcd.log" && [ $attempt -lt 5 ] && continue
    fail "etcd did not start"
done

for attempt in 1 2 3 4 5; do
    api_port=$(free_port)
    launch kube-apiserver \
        --etcd-servers="http://127.0.0.1:$etcd_port" \
        --bind-address=127.0.0.1 --secure-port="$api_port" --advertise-address=127.0.0.1 \
        --cert-dir="$dir" \
        --tls-cert-file="$dir/apiserver.crt" --tls-private-key-file="$dir/apiserver.key" \
        --client-ca-file="$dir/ca.crt" \
        --token-auth-file="$dir/tokens.csv" \
        --authorization-mode=RBAC \
        --service-cluster-ip-range=10.0.0.0/24 \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$dir/sa.pub" \
        --service-account-signing-key-file="$dir/sa.key" \
        --disable-admission-plugins=ServiceAccount \
        --endpoint-reconciler-type=none \
        --allow-privileged=true \
        --audit-policy-file="$dir/audit-policy.yaml" \
        --audit-log-path="$dir/audit.log"
    rc=0
    wait_up kube-apiserver api_ok || rc=$?
    [ $rc -eq 0 ] && break
    [ $rc -eq 1 ] && grep -q "address already in use" "$dir/kube-apiserver.log" && [ $attempt -lt 5 ] && continue
    fail "kube-apiserver did not start"
done

(
    umask 077
    cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(openssl base64 -A <"$dir/ca.crt")
users:
- name: admin
  user:
    token: $token
contexts:
- name: dev
  context:
    cluster: dev
    user: admin
    namespace: default
current-context: dev
EOF
)
echo "dev-cluster: kube-apiserver https://127.0.0.1:$api_port (pid $(cat "$dir/kube-apiserver.pid")), etcd http://127.0.0.1:$etcd_port (pid $(cat "$dir/etcd.pid"))" >&2
echo "$dir/kubeconfig"
