#!/usr/bin/env bash
# Start a Kubernetes control plane on loopback for trying airlock nodes on
# one machine and for the Kubernetes tests: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler (built by hack/build-kube.sh),
# every one listening on 127.0.0.1 only, on free ports picked at start.
#
#   hack/kube-up.sh DIR     start it; state, certificates, logs in DIR
#   hack/kube-down.sh DIR   stop it
#
# Writes DIR/kubeconfig (cluster-admin, a static token), DIR/env (with the
# serving pair for `airlock node`'s kubelet API on 127.0.0.1, signed by the
# cluster CA, which the API server checks nodes against) and waits until the
# API server answers /readyz (exit 1 with the logs' tails if it does not
# within AIRLOCK_KUBE_UP_TIMEOUT seconds, default 90). Certificates (a CA,
# the API server's serving pair and its client pair for the kubelet API,
# a serving pair for nodes on 127.0.0.1, the service-account key pair) are
# made with openssl in DIR/pki. Binaries: $AIRLOCK_KUBE_BIN, else
# ~/.cache/airlock/kube/<version> (hack/build-kube.sh prints it).
# AIRLOCK_KUBE_NODE_GRACE=SECONDS, when set, is the controller manager's
# --node-monitor-grace-period (checked every second): a node whose lease
# is that old is NotReady and its pods are evicted (tests of node loss;
# the default is Kubernetes' 50 s).
set -euo pipefail

DIR=${1:?usage: hack/kube-up.sh DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}
VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$HERE/kube/go.mod")
BIN=${AIRLOCK_KUBE_BIN:-$CACHE/kube/$VERSION}
TIMEOUT=${AIRLOCK_KUBE_UP_TIMEOUT:-90}

log() { printf '[kube-up] %s\n' "$*" >&2; }
die() { printf '[kube-up] ERROR: %s\n' "$*" >&2; exit 1; }

for b in etcd kube-apiserver kube-controller-manager kube-scheduler; do
	[ -x "$BIN/$b" ] || die "$BIN/$b is missing: run hack/setup.sh (or hack/build-kube.sh)"
done
command -v openssl >/dev/null || die "openssl is required"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
[ -f "$DIR/pids" ] && [ -s "$DIR/pids" ] && die "$DIR/pids exists: a control plane may run there (hack/kube-down.sh $DIR)"
mkdir -p "$DIR/pki" "$DIR/logs"

# free_port prints a TCP port of 127.0.0.1 that nothing listens on now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ETCD_PORT=$(free_port) PEER_PORT=$(free_port) API_PORT=$(free_port)
CM_PORT=$(free_port) SCHED_PORT=$(free_port)

PKI=$DIR/pki
if [ ! -f "$PKI/apiserver.crt" ]; then
	log "certificates in $PKI (openssl)"
	openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=airlock-kube-ca" \
		-keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
		-keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >"$PKI/apiserver.ext"
	openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 3650 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" 2>/dev/null
	# The API server's client certificate for the kubelet API of nodes
	# (kubectl logs, exec, port-forward), and a serving pair for nodes on
	# this host: `airlock node --tls-cert-file DIR/pki/node.crt
	# --tls-private-key-file DIR/pki/node.key --client-ca-file DIR/pki/ca.crt`.
	# Without the pair a node asks the CSR API (--serving-cert csr): the
	# controller manager signs approved kubelet-serving CSRs with this CA.
	openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
		-keyout "$PKI/kubelet-client.key" -out "$PKI/kubelet-client.csr" 2>/dev/null
	printf 'extendedKeyUsage=clientAuth\n' >"$PKI/kubelet-client.ext"
	openssl x509 -req -in "$PKI/kubelet-client.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 3650 -extfile "$PKI/kubelet-client.ext" -out "$PKI/kubelet-client.crt" 2>/dev/null
	openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:airlock" \
		-keyout "$PKI/node.key" -out "$PKI/node.csr" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$PKI/node.ext"
	openssl x509 -req -in "$PKI/node.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 3650 -extfile "$PKI/node.ext" -out "$PKI/node.crt" 2>/dev/null
	openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	# A static cluster-admin token for the kubeconfig, the scheduler and the controller manager.
	TOKEN=$(openssl rand -hex 24)
	printf '%s,admin,admin,"system:masters"\n' "$TOKEN" >"$PKI/tokens.csv"
	chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
fi
TOKEN=$(cut -d, -f1 "$PKI/tokens.csv")

cat >"$DIR/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: airlock
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: airlock
  context: {cluster: airlock, user: admin}
current-context: airlock
KC
chmod 600 "$DIR/kubeconfig"

: >"$DIR/pids"
trap '"$HERE/kube-down.sh" "$DIR"' ERR
start() { # NAME ARGS...: run in the background, its pid in DIR/pids, output in DIR/logs/NAME.log
	local name=$1
	shift
	setsid "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
	echo "$! $name" >>"$DIR/pids"
}
fail() {
	local f
	for f in "$DIR"/logs/*.log; do printf '\n--- %s (tail)\n' "$f" >&2; tail -n 15 "$f" >&2; done
	"$HERE/kube-down.sh" "$DIR" || true
	die "$*"
}

log "etcd on 127.0.0.1:$ETCD_PORT"
# --unsafe-no-fsync: a throwaway cluster for tests; durability is not wanted.
start etcd "$BIN/etcd" --name kube --data-dir "$DIR/etcd" \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
	--initial-cluster "kube=http://127.0.0.1:$PEER_PORT" --unsafe-no-fsync --log-level warn

log "kube-apiserver on https://127.0.0.1:$API_PORT"
start kube-apiserver "$BIN/kube-apiserver" \
	--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
	--bind-address 127.0.0.1 --secure-port "$API_PORT" --advertise-address 127.0.0.1 \
	--endpoint-reconciler-type none \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
	--authorization-mode Node,RBAC \
	--service-account-issuer https://kubernetes.default.svc \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
	--kubelet-client-certificate "$PKI/kubelet-client.crt" --kubelet-client-key "$PKI/kubelet-client.key" \
	--kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
	--cert-dir "$DIR/apiserver-certs"

ready=0
API_PID=$(awk '$2 == "kube-apiserver" {print $1}' "$DIR/pids")
for _ in $(seq $((TIMEOUT * 4))); do
	kill -0 "$API_PID" 2>/dev/null || fail "kube-apiserver exited"
	if curl -sf --cacert "$PKI/ca.crt" -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1; then
		ready=1
		break
	fi
	sleep 0.25
done
[ $ready = 1 ] || fail "kube-apiserver did not answer /readyz within ${TIMEOUT}s"

log "kube-controller-manager and kube-scheduler"
start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$DIR/kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$CM_PORT" --leader-elect=false \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
	--service-cluster-ip-range 10.0.0.0/24 --use-service-account-credentials=false \
	${AIRLOCK_KUBE_NODE_GRACE:+--node-monitor-grace-period "${AIRLOCK_KUBE_NODE_GRACE}s" --node-monitor-period 1s}
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$DIR/kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false

sleep 0.5
while read -r pid name; do
	kill -0 "$pid" 2>/dev/null || fail "$name exited at start"
done <"$DIR/pids"
cat >"$DIR/env" <<ENV
KUBECONFIG=$DIR/kubeconfig
KUBE_API=https://127.0.0.1:$API_PORT
KUBE_BIN=$BIN
NODE_TLS_CERT=$PKI/node.crt
NODE_TLS_KEY=$PKI/node.key
NODE_CLIENT_CA=$PKI/ca.crt
ENV
log "ready: KUBECONFIG=$DIR/kubeconfig ($BIN/kubectl)"
