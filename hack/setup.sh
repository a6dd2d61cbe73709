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
# offline images python:slim and airlock/python-data from Debian packages
# (a few minutes each, once). Set AIRLOCK_SETUP_SKIP_DATA=1 to skip the
# data-analysis image.
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

PKGS=(qemu-system-x86 qemu-utils erofs-utils e2fsprogs mmdebstrap ca-certificates procps
	linux-source-6.1 build-essential bc flex bison libelf-dev libssl-dev xz-utils lz4 kmod cpio busybox-static)
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

log "building bin/airlock and the guest agent bin/airlock-agent"
mkdir -p bin
go build -trimpath -o bin/airlock ./cmd/airlock
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/airlock-agent ./cmd/airlock-agent
if [ "$(id -u)" = 0 ]; then
	log "linking /usr/local/bin/airlock and airlock-agent to $ROOT/bin"
	ln -sf "$ROOT/bin/airlock" /usr/local/bin/airlock
	ln -sf "$ROOT/bin/airlock-agent" /usr/local/bin/airlock-agent
	AIRLOCK=/usr/local/bin/airlock
else
	AIRLOCK=$ROOT/bin/airlock
fi

log "guest kernels"
hack/fetch-debian-kernel.sh
hack/build-kernel.sh

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
if [ "${AIRLOCK_SETUP_SKIP_DATA:-0}" != 1 ]; then
	build_image airlock/python-data:latest python3,python3-pip,python3-numpy,python3-pandas,python3-matplotlib,ca-certificates,procps
fi

"$AIRLOCK" doctor
if [ $RUN_FIRST = 1 ]; then
	log "first box: airlock run --rm python:slim python3 -c ..."
	"$AIRLOCK" run --rm python:slim python3 -c 'import platform, sys; print("hello from a box: kernel", platform.release(), "python", sys.version.split()[0])'
fi
