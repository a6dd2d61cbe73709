#!/usr/bin/env bash
# Set up airlock on a fresh Debian 12 / Ubuntu machine, then run a first
# command in a box. Idempotent: a second run only rebuilds what changed.
#
#   hack/setup.sh            install everything and run a first box
#   hack/setup.sh --no-run   install everything, run nothing (CI)
#
# It installs the Debian packages airlock uses (QEMU, erofs-utils, e2fsprogs,
# mmdebstrap, the kernel source and build tools), builds bin/airlock and the
# static guest agent bin/airlock-agent (and links both into /usr/local/bin
# when run as root), fetches Debian's cloud kernel (the fallback), builds the
# airlock guest kernel (about 7 minutes on 2 cores, once), and builds the
# offline images python:slim, airlock/net-clients (HTTP clients, for the
# secrets tests) and airlock/python-data from Debian packages (a few minutes
# each, once), builds the loopback Kubernetes control plane
# for airlock node (hack/build-kube.sh, about 6 minutes, once), makes sdk/python/.venv with the Python SDK
# and its test tools, and installs (npm ci) and builds the TypeScript SDK in
# sdk/typescript (Node.js 20 or newer: Debian's nodejs when new enough).
# Set AIRLOCK_SETUP_SKIP_DATA=1 to skip the data-analysis image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
RUN_FIRST=1
[ "${1:-}" = "--no-run" ] && RUN_FIRST=0

log() { printf '\n==> %s\n' "$*" >&2; }
as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"
	elif command -v sudo >/dev/null; then sudo "$@"
	else echo "need root for: $*" >&2; exit 1; fi
}

# qemu-system-x86 pulls in qemu-system-common, which ships /usr/lib/qemu/virtiofsd
# (the C one) for virtio-fs volumes (AIRLOCK_VOLUME_TRANSPORT=virtiofs).
PKGS=(qemu-system-x86 qemu-utils erofs-utils e2fsprogs mmdebstrap ca-certificates procps openssl curl
	linux-source-6.1 build-essential bc flex bison libelf-dev libssl-dev xz-utils lz4 kmod cpio busybox-static
	python3 python3-venv)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing Debian packages: ${missing[*]}"
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

log "uid range for box QEMUs (/etc/subuid, /etc/subgid)"
as_root hack/reserve-uids.sh

if ! command -v go >/dev/null; then
	[ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null || { echo "Go 1.26 or newer is required (https://go.dev/dl/); Debian's golang package is too old" >&2; exit 1; }

log "building bin/airlock, the guest agent bin/airlock-agent and the network helper bin/airlock-net"
mkdir -p bin
go build -trimpath -o bin/airlock ./cmd/airlock
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/airlock-agent ./cmd/airlock-agent
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/airlock-net ./cmd/airlock-net
if [ "$(id -u)" = 0 ]; then
	log "linking /usr/local/bin/airlock, airlock-agent and airlock-net to $ROOT/bin"
	ln -sf "$ROOT/bin/airlock" /usr/local/bin/airlock
	ln -sf "$ROOT/bin/airlock-agent" /usr/local/bin/airlock-agent
	ln -sf "$ROOT/bin/airlock-net" /usr/local/bin/airlock-net
	AIRLOCK=/usr/local/bin/airlock
else
	AIRLOCK=$ROOT/bin/airlock
fi

# The Python SDK and its test tools (pytest, pytest-asyncio, openai), in a
# virtualenv of this checkout that hack/test.sh uses.
log "Python SDK: sdk/python/.venv with airlock-box (editable) and its test tools"
[ -x sdk/python/.venv/bin/python ] || python3 -m venv sdk/python/.venv
sdk/python/.venv/bin/pip install -q --disable-pip-version-check -e "sdk/python[test]"
# E2B's own SDKs, at pinned versions, for the E2B API's tests
# (internal/e2b: TestE2BSDK drives them against airlock serve --e2b).
sdk/python/.venv/bin/pip install -q --disable-pip-version-check e2b==2.63.0 e2b-code-interpreter==2.11.5

# The TypeScript SDK (sdk/typescript): its locked dependencies and a build,
# which hack/test.sh tests. Node.js 20+ is needed; Debian 12's nodejs is 18.
node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ "$(node_major)" -lt 20 ] || ! command -v npm >/dev/null; then
	cand=$(apt-cache policy nodejs 2>/dev/null | awk '/Candidate:/ {print $2}' | sed 's/^[0-9]*://; s/\..*//')
	if [ "${cand:-0}" -ge 20 ] 2>/dev/null; then
		log "installing Debian packages: nodejs npm"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
	fi
fi
if [ "$(node_major)" -lt 20 ] || ! command -v npm >/dev/null; then
	echo "Node.js 20 or newer with npm is required for sdk/typescript (https://nodejs.org/en/download, or NodeSource's Debian packages)" >&2
	exit 1
fi
log "TypeScript SDK: npm ci and build in sdk/typescript"
(cd sdk/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run -s build)

# E2B's own Node SDKs, pinned (internal/e2b/testdata/node/package-lock.json),
# for TestE2BNodeSDK.
log "E2B's Node SDKs for the E2B API's tests: npm ci in internal/e2b/testdata/node"
(cd internal/e2b/testdata/node && npm ci --no-audit --no-fund --loglevel=error)

log "guest kernels"
hack/fetch-debian-kernel.sh
hack/build-kernel.sh

# The loopback Kubernetes control plane (etcd, kube-apiserver, -scheduler,
# -controller-manager, kubectl) for airlock nodes and their tests, and the
# agent-sandbox controller with its CRDs (TestKubeAgentSandbox): built once
# into the airlock cache (about 6 + 2-4 minutes on 2 cores), skipped when cached.
log "Kubernetes control plane for airlock node (hack/build-kube.sh)"
hack/build-kube.sh >/dev/null

have_image() { "$AIRLOCK" images 2>/dev/null | awk '{print $1":"$2}' | grep -qx "$1"; }
build_image() { # TAG PACKAGES
	if have_image "$1" || have_image "docker.io/library/$1"; then
		echo "image $1 present" >&2
	else
		log "building image $1 from Debian packages: $2"
		"$AIRLOCK" image build-debian --tag "$1" --packages "$2"
	fi
}
build_image python:slim python3,python3-pip,ca-certificates,procps
# The HTTP clients users run in boxes, for the secrets tests (curl, requests,
# httpx, Node's fetch).
build_image airlock/net-clients:1 python3,python3-requests,python3-httpx,curl,nodejs,ca-certificates
if [ "${AIRLOCK_SETUP_SKIP_DATA:-0}" != 1 ]; then
	build_image airlock/python-data:latest python3,python3-pip,python3-numpy,python3-pandas,python3-matplotlib,ca-certificates,procps
fi

"$AIRLOCK" doctor
if [ $RUN_FIRST = 1 ]; then
	log "first box: airlock run --rm python:slim python3 -c ..."
	"$AIRLOCK" run --rm python:slim python3 -c 'import platform, sys; print("hello from a box: kernel", platform.release(), "python", sys.version.split()[0])'
fi
