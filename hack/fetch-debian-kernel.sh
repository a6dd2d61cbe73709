#!/usr/bin/env bash
# Fetch the distribution fallback guest kernel: the Debian cloud kernel that
# linux-image-cloud-amd64 currently depends on, as an uncompressed vmlinux (PVH
# boot with -kernel) plus the modules a box needs.
#
# Output (CACHE = ${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}):
#   $CACHE/kernel/debian-<kver>/vmlinux
#   $CACHE/kernel/debian-<kver>/modules/*.ko
#   $CACHE/kernel/debian-<kver>/modules/modules.load   (one .ko name a line, dependency order)
#   $CACHE/kernel/debian-<kver>/info                   (version=, package=, fetched=)
#   $CACHE/kernel/debian -> debian-<kver>
# Idempotent: exits at once when that kernel is already in the cache.
set -euo pipefail

CACHE=${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}
KDIR=$CACHE/kernel
META=linux-image-cloud-amd64
# Modules a box needs; their dependencies are added. Optional ones end in '?'.
WANT=(virtio_mmio virtio_blk virtio_console virtio_net erofs overlay vmw_vsock_virtio_transport 'virtio_rng?')
PKGS=(kmod lz4 xz-utils zstd util-linux)

log() { printf '[fetch-debian-kernel] %s\n' "$*" >&2; }
die() { printf '[fetch-debian-kernel] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"
	elif command -v sudo >/dev/null; then sudo "$@"
	else die "need root to run: $*"; fi
}

UPDATED=
apt_update() {
	[ -n "$UPDATED" ] && return 0
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
	UPDATED=1
}

ensure_pkgs() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing: ${missing[*]}"
	apt_update
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# linux-image-cloud-amd64 -> linux-image-6.1.0-NN-cloud-amd64
resolve_image() {
	apt-cache depends "$META" 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-cloud-amd64\)$/\1/p' | head -n1
}

PKG=$(resolve_image || true)
if [ -z "$PKG" ]; then
	log "$META not known to apt; running apt-get update"
	apt_update
	PKG=$(resolve_image || true)
fi
[ -n "$PKG" ] || die "cannot resolve the dependency of $META (is the main archive in sources.list?)"
KVER=${PKG#linux-image-}
OUT=$KDIR/debian-$KVER

if [ -s "$OUT/vmlinux" ] && [ -s "$OUT/info" ] && [ -s "$OUT/modules/modules.load" ]; then
	ln -sfn "debian-$KVER" "$KDIR/debian"
	log "cached: $OUT"
	exit 0
fi

ensure_pkgs "${PKGS[@]}"
mkdir -p "$KDIR"
exec 9>"$KDIR/.debian.lock"
flock 9
if [ -s "$OUT/vmlinux" ] && [ -s "$OUT/info" ] && [ -s "$OUT/modules/modules.load" ]; then
	ln -sfn "debian-$KVER" "$KDIR/debian"
	log "cached (fetched by a concurrent run): $OUT"
	exit 0
fi

TMP=$(mktemp -d "$KDIR/.debian-tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP" # apt-get download drops privileges to _apt when it can

log "downloading $PKG"
(cd "$TMP" && apt-get download -q "$PKG" 2>&1 | grep -v 'unsandboxed' >&2 || true)
DEB=$(ls "$TMP"/"$PKG"_*.deb 2>/dev/null | head -n1)
[ -n "$DEB" ] || die "apt-get download $PKG produced no .deb"
PKGVER=$(dpkg-deb -f "$DEB" Version)
dpkg -x "$DEB" "$TMP/root"

VMLINUZ=$TMP/root/boot/vmlinuz-$KVER
[ -f "$VMLINUZ" ] || die "no boot/vmlinuz-$KVER in $DEB"

is_elf() { [ "$(head -c4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }

# Same idea as the kernel's scripts/extract-vmlinux: find a compressed stream
# in the bzImage and decompress it until the result is an ELF file. The cloud
# kernel uses an LZ4 legacy stream (magic 02 21 4c 18); the others are covered too.
extract_vmlinux() {
	local in=$1 out=$2 magic cmd off
	for spec in '\x02\x21\x4c\x18|lz4 -dc' '\xfd\x37\x7a\x58\x5a\x00|xz -dc' \
		'\x28\xb5\x2f\xfd|zstd -dcq' '\x1f\x8b\x08|gzip -dc'; do
		magic=${spec%%|*} cmd=${spec#*|}
		for off in $(LC_ALL=C grep -aobUP "$magic" "$in" | cut -d: -f1); do
			tail -c +$((off + 1)) "$in" | $cmd >"$out" 2>/dev/null || true
			if [ -s "$out" ] && is_elf "$out"; then
				log "vmlinux: ${cmd%% *} stream at offset $off"
				return 0
			fi
		done
	done
	return 1
}

STAGE=$TMP/out
mkdir -p "$STAGE/modules"
extract_vmlinux "$VMLINUZ" "$STAGE/vmlinux" || die "could not extract an ELF vmlinux from $VMLINUZ"
cp "$TMP/root/boot/config-$KVER" "$STAGE/config" 2>/dev/null || true

# Modules: the .deb ships no modules.dep, so run depmod on the unpacked tree,
# then let modprobe compute the load order.
MODDIR=$TMP/root/lib/modules/$KVER
[ -d "$MODDIR" ] || die "no lib/modules/$KVER in $DEB"
depmod -b "$TMP/root" "$KVER"
declare -A SEEN=()
ORDER=()
for m in "${WANT[@]}"; do
	opt=
	if [[ $m == *'?' ]]; then m=${m%'?'} opt=1; fi
	if ! deps=$(modprobe -d "$TMP/root" -S "$KVER" --show-depends "$m" 2>/dev/null); then
		if [ -n "$opt" ]; then log "optional module $m not present; skipped"; continue; fi
		die "module $m not found in $PKG"
	fi
	while read -r kind path _; do
		[ "$kind" = insmod ] || continue # "builtin X": nothing to load
		[ -n "${SEEN[$path]:-}" ] && continue
		SEEN[$path]=1
		ORDER+=("$path")
	done <<<"$deps"
done
: >"$STAGE/modules/modules.load"
for path in "${ORDER[@]}"; do
	base=$(basename "$path")
	case $base in
	*.ko) cp "$path" "$STAGE/modules/$base" ;;
	*.ko.xz) base=${base%.xz}; xz -dc "$path" >"$STAGE/modules/$base" ;;
	*.ko.zst) base=${base%.zst}; zstd -dcq "$path" >"$STAGE/modules/$base" ;;
	*.ko.gz) base=${base%.gz}; gzip -dc "$path" >"$STAGE/modules/$base" ;;
	*) die "unexpected module file $path" ;;
	esac
	echo "$base" >>"$STAGE/modules/modules.load"
done
{
	echo "version=$KVER"
	echo "package=$PKG=$PKGVER"
	echo "fetched=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$STAGE/info"

rm -rf "$OUT"
mv "$STAGE" "$OUT"
ln -sfn "debian-$KVER" "$KDIR/debian"
log "kernel $KVER ($PKGVER): $OUT/vmlinux ($(stat -c %s "$OUT/vmlinux") bytes)"
log "modules (load order): $(tr '\n' ' ' <"$OUT/modules/modules.load")"
