#!/usr/bin/env bash
# Build the loopback Kubernetes control plane that hack/kube-up.sh runs and the
# Kubernetes tests use: kube-apiserver, kube-scheduler, kube-controller-manager
# and kubectl from k8s.io/kubernetes, and etcd from go.etcd.io/etcd/server/v3,
# at the versions hack/kube/go.mod pins (a module of its own, so airlock's
# module does not depend on k8s.io/kubernetes); and the agent-sandbox
# controller (sigs.k8s.io/agent-sandbox, cmd/agent-sandbox-controller) with
# its CRDs (k8s/crds of its module zip), at the version hack/agent-sandbox/go.mod
# pins (another module: it needs client-go v0.36).
#
# Output (CACHE = ${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}):
#   $CACHE/kube/<kubernetes version>/{kube-apiserver,kube-scheduler,kube-controller-manager,kubectl,etcd}
#   $CACHE/kube/agent-sandbox/<version>/{agent-sandbox-controller,crds/*.yaml}
# Idempotent: skips what is cached. A first build takes about 6 minutes on 2
# idle cores for Kubernetes and 2-4 for agent-sandbox (plus the module download).
# Prints the binaries' directory on stdout.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}
VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$HERE/kube/go.mod")
OUT=$CACHE/kube/$VERSION
BINS=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)
AS_VERSION=$(awk '{for (i = 1; i < NF; i++) if ($i == "sigs.k8s.io/agent-sandbox" && $(i+1) ~ /^v/) {print $(i+1); exit}}' "$HERE/agent-sandbox/go.mod")
[ -n "$AS_VERSION" ] || { echo "[build-kube] hack/agent-sandbox/go.mod names no sigs.k8s.io/agent-sandbox version" >&2; exit 1; }
AS_OUT=$CACHE/kube/agent-sandbox/$AS_VERSION

log() { printf '[build-kube] %s\n' "$*" >&2; }

have_all() {
	local b
	for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
command -v go >/dev/null || { [ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin; }
command -v go >/dev/null || { log "Go 1.26 or newer is required"; exit 1; }

if have_all; then
	log "cached: $OUT"
else
	START=$SECONDS
	mkdir -p "$OUT"
	TMP=$(mktemp -d "$OUT/.build.XXXXXX")
	trap 'rm -rf "$TMP"' EXIT
	log "building Kubernetes $VERSION control plane and etcd into $OUT (several minutes, once)"
	(cd "$HERE/kube" && go build -trimpath -ldflags='-s -w' -o "$TMP/" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kubectl \
		./etcd)
	# Move each into place whole, so an interrupted build never leaves a partial binary.
	for b in "${BINS[@]}"; do mv -f "$TMP/$b" "$OUT/$b"; done
	log "built in $((SECONDS - START)) s: $OUT"
fi

if [ -x "$AS_OUT/agent-sandbox-controller" ] && [ -d "$AS_OUT/crds" ]; then
	log "cached: $AS_OUT"
else
	START=$SECONDS
	mkdir -p "$AS_OUT"
	ASTMP=$(mktemp -d "$AS_OUT/.build.XXXXXX")
	trap 'rm -rf "${TMP:-}" "$ASTMP"' EXIT
	log "building agent-sandbox $AS_VERSION controller into $AS_OUT (a few minutes, once)"
	(cd "$HERE/agent-sandbox" && go build -trimpath -ldflags='-s -w' -o "$ASTMP/" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller)
	SRC=$(cd "$HERE/agent-sandbox" && go mod download -json "sigs.k8s.io/agent-sandbox@$AS_VERSION" | awk -F'"' '$2 == "Dir" {print $4}')
	[ -d "$SRC/k8s/crds" ] || { log "no k8s/crds in $SRC"; exit 1; }
	mkdir -p "$ASTMP/crds" && cp "$SRC"/k8s/crds/*.yaml "$ASTMP/crds/" && chmod 644 "$ASTMP"/crds/*.yaml
	rm -rf "$AS_OUT/crds"
	mv "$ASTMP/crds" "$AS_OUT/crds"
	mv -f "$ASTMP/agent-sandbox-controller" "$AS_OUT/agent-sandbox-controller"
	log "built in $((SECONDS - START)) s: $AS_OUT"
fi
echo "$OUT"
