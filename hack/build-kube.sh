#!/usr/bin/env bash
# Build the loopback Kubernetes control plane that hack/kube-up.sh runs and the
# Kubernetes tests use: kube-apiserver, kube-scheduler, kube-controller-manager
# and kubectl from k8s.io/kubernetes, and etcd from go.etcd.io/etcd/server/v3,
# at the versions hack/kube/go.mod pins (a module of its own, so airlock's
# module does not depend on k8s.io/kubernetes).
#
# Output (CACHE = ${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}):
#   $CACHE/kube/<kubernetes version>/{kube-apiserver,kube-scheduler,kube-controller-manager,kubectl,etcd}
# Idempotent: exits at once when all five are cached. A first build takes about
# 6 minutes on 2 idle cores (plus the module download).
# Prints the binaries' directory on stdout.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}
VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$HERE/kube/go.mod")
OUT=$CACHE/kube/$VERSION
BINS=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)

log() { printf '[build-kube] %s\n' "$*" >&2; }

have_all() {
	local b
	for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
	log "cached: $OUT"
	echo "$OUT"
	exit 0
fi
command -v go >/dev/null || { [ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin; }
command -v go >/dev/null || { log "Go 1.26 or newer is required"; exit 1; }

START=$SECONDS
mkdir -p "$OUT"
TMP=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log "building Kubernetes $VERSION control plane and etcd into $OUT (several minutes, once)"
cd "$HERE/kube"
go build -trimpath -ldflags='-s -w' -o "$TMP/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kubectl \
	./etcd
# Move each into place whole, so an interrupted build never leaves a partial binary.
for b in "${BINS[@]}"; do mv -f "$TMP/$b" "$OUT/$b"; done
log "built in $((SECONDS - START)) s: $OUT"
echo "$OUT"
