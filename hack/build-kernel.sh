#!/usr/bin/env bash
# Build the airlock guest kernel (uncompressed vmlinux, PVH boot) from Debian's
# linux-source-6.1 with hack/kernel/airlock-guest.config on top of tinyconfig and
# the source patches in hack/kernel/patches/ (applied in name order).
#
# Output (CACHE = ${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}):
#   $CACHE/kernel/vmlinux-airlock-<source version>-<sha256(fragment + patches)[:12]>
#   $CACHE/kernel/vmlinux-airlock-<...>.info     (version=, config_sha256=, built=, release=)
#   $CACHE/kernel/vmlinux-airlock-<...>.config   (the full .config used)
#   $CACHE/kernel/vmlinux-airlock -> the current one
# Build tree: $CACHE/kernel/build/linux-source-6.1 (reused, so an unchanged or
# slightly changed config rebuilds fast). Full log: $CACHE/kernel/build/build.log.
# Idempotent: exits at once when the keyed vmlinux is already cached.
set -euo pipefail

START=$SECONDS
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FRAG=${AIRLOCK_KERNEL_CONFIG:-$HERE/kernel/airlock-guest.config}
CACHE=${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}
KDIR=$CACHE/kernel
BUILD=$KDIR/build
SRC_PKG=linux-source-6.1
SRC_TAR=/usr/src/linux-source-6.1.tar.xz
PKGS=(linux-source-6.1 build-essential patch bc flex bison libelf-dev libssl-dev xz-utils util-linux)

log() { printf '[build-kernel] %s\n' "$*" >&2; }
die() { printf '[build-kernel] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"
	elif command -v sudo >/dev/null; then sudo "$@"
	else die "need root to run: $*"; fi
}

# Install the apt packages that are missing; `apt-get update` only if something is.
ensure_pkgs() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing: ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

[ -f "$FRAG" ] || die "config fragment not found: $FRAG"

# Parse the fragment: `CONFIG_X=y  # comment` and `# CONFIG_X is not set  # comment`.
ENABLE=() DISABLE=()
while IFS= read -r line; do
	if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=y([[:space:]]|$) ]]; then
		ENABLE+=("${BASH_REMATCH[1]#CONFIG_}")
	elif [[ $line =~ ^#[[:space:]]*(CONFIG_[A-Za-z0-9_]+)[[:space:]]+is[[:space:]]+not[[:space:]]+set ]]; then
		DISABLE+=("${BASH_REMATCH[1]#CONFIG_}")
	elif [[ $line =~ ^CONFIG_ ]]; then
		die "unsupported fragment line (only =y and 'is not set'): $line"
	fi
done <"$FRAG"
[ ${#ENABLE[@]} -gt 0 ] || die "no CONFIG_*=y lines in $FRAG"

shopt -s nullglob
PATCHES=("$HERE"/kernel/patches/*.patch)
shopt -u nullglob
# The build is keyed by the fragment and the patches together.
CONFIG_SHA=$(cat "$FRAG" "${PATCHES[@]}" | sha256sum | cut -d' ' -f1)
PATCH_SHA=$(cat /dev/null "${PATCHES[@]}" | sha256sum | cut -d' ' -f1)

src_version() { dpkg-query -W -f='${Version}' "$SRC_PKG" 2>/dev/null || true; }
SRC_VER=$(src_version)

# Fast path: already built for this source version + fragment.
if [ -n "$SRC_VER" ]; then
	NAME=vmlinux-airlock-$SRC_VER-${CONFIG_SHA:0:12}
	if [ -s "$KDIR/$NAME" ] && [ -s "$KDIR/$NAME.info" ]; then
		ln -sfn "$NAME" "$KDIR/vmlinux-airlock"
		log "cached: $KDIR/$NAME"
		exit 0
	fi
fi

ensure_pkgs "${PKGS[@]}"
SRC_VER=$(src_version)
[ -n "$SRC_VER" ] || die "$SRC_PKG is not installed"
[ -f "$SRC_TAR" ] || die "$SRC_TAR not found"
NAME=vmlinux-airlock-$SRC_VER-${CONFIG_SHA:0:12}
OUT=$KDIR/$NAME

mkdir -p "$BUILD"
# One build at a time per cache (CI jobs may race).
exec 9>"$KDIR/.build.lock"
if ! flock -n 9; then
	log "another build holds $KDIR/.build.lock; waiting"
	flock 9
fi
if [ -s "$OUT" ] && [ -s "$OUT.info" ]; then
	ln -sfn "$NAME" "$KDIR/vmlinux-airlock"
	log "cached (built by a concurrent run): $OUT"
	exit 0
fi

# Source tree: reused when it is from the same source package version and
# carries the same patches (.airlock-patches: the patch set's sha256; none
# when absent, "partial" while they are being applied).
TREE=$BUILD/linux-source-6.1
EMPTY_SHA=$(sha256sum </dev/null | cut -d' ' -f1)
unpack_tree() {
	log "unpacking $SRC_TAR (source $SRC_VER)"
	rm -rf "$TREE" "$BUILD/.unpack"
	mkdir -p "$BUILD/.unpack"
	tar -C "$BUILD/.unpack" -xf "$SRC_TAR"
	mv "$BUILD/.unpack/linux-source-6.1" "$TREE"
	rmdir "$BUILD/.unpack"
	echo "$SRC_VER" >"$TREE/.airlock-source-version"
}
applied=
if [ -d "$TREE" ]; then
	applied=$(cat "$TREE/.airlock-patches" 2>/dev/null || true)
	if [ "$applied" = "$EMPTY_SHA" ]; then applied=; fi
fi
if [ -d "$TREE" ] && [ "$(cat "$TREE/.airlock-source-version" 2>/dev/null)" != "$SRC_VER" ]; then
	log "source tree is from another version"
	unpack_tree
	applied=
elif [ -d "$TREE" ] && [ -n "$applied" ] && [ "$applied" != "$PATCH_SHA" ]; then
	log "source tree carries other patches"
	unpack_tree
	applied=
elif [ ! -d "$TREE" ]; then
	unpack_tree
else
	log "reusing source tree $TREE"
fi

cd "$TREE"
if [ "$applied" != "$PATCH_SHA" ] && [ "$PATCH_SHA" != "$EMPTY_SHA" ]; then
	echo partial >.airlock-patches
	for p in "${PATCHES[@]}"; do
		log "applying $(basename "$p")"
		patch -p1 --forward --batch --quiet <"$p" || die "patch $p does not apply to linux-source $SRC_VER"
	done
fi
echo "$PATCH_SHA" >.airlock-patches
# ARCH must be x86_64 here: with the default ARCH=x86, tinyconfig yields a 32-bit config.
# No build time, user, host or build count in the kernel's version string: two hosts
# building this config from the same Debian source with the same compiler should get
# the same vmlinux, which a memory snapshot moved between them needs (docs/export.md).
export KBUILD_BUILD_TIMESTAMP="Thu Jan  1 00:00:00 UTC 1970" KBUILD_BUILD_USER=airlock KBUILD_BUILD_HOST=airlock KBUILD_BUILD_VERSION=1
MK=(make ARCH=x86_64)
log "configuring: tinyconfig + $(basename "$FRAG") (${#ENABLE[@]} on, ${#DISABLE[@]} off), ${#PATCHES[@]} source patches, sha256 ${CONFIG_SHA:0:12}"
"${MK[@]}" -s tinyconfig >/dev/null
ARGS=()
for o in "${ENABLE[@]}"; do ARGS+=(--enable "$o"); done
for o in "${DISABLE[@]}"; do ARGS+=(--disable "$o"); done
# Two passes: some options only become settable once their parent menu is on.
for _ in 1 2; do
	scripts/config --file .config "${ARGS[@]}"
	"${MK[@]}" -s olddefconfig >/dev/null
done

bad=()
for o in "${ENABLE[@]}"; do
	if ! grep -q "^CONFIG_$o=y\$" .config; then
		bad+=("CONFIG_$o (wanted y, got: $(grep -E "^(# )?CONFIG_$o[= ]" .config || echo 'absent'))")
	fi
done
for o in "${DISABLE[@]}"; do
	if grep -qE "^CONFIG_$o=[ym]\$" .config; then
		bad+=("CONFIG_$o (wanted off, got: $(grep "^CONFIG_$o=" .config))")
	fi
done
if [ ${#bad[@]} -gt 0 ]; then
	log "the fragment did not apply; these options differ in .config:"
	printf '  %s\n' "${bad[@]}" >&2
	die "config verification failed (${#bad[@]} options)"
fi
grep -q '^CONFIG_64BIT=y$' .config || die "not a 64-bit config"
log "config ok: $(grep -c '=y$' .config) options =y"

JOBS=$(nproc)
log "building vmlinux with make -j$JOBS (log: $BUILD/build.log)"
BSTART=$SECONDS
# Progress: one line per 100 compiled files; warnings and errors shown as they come.
"${MK[@]}" -j"$JOBS" vmlinux 2>&1 | tee "$BUILD/build.log" | {
	n=0
	while IFS= read -r l; do
		case $l in
		"  CC "* | "  AS "* | "  HOSTCC "*)
			n=$((n + 1))
			if [ $((n % 100)) -eq 0 ]; then log "  $n files compiled ($((SECONDS - BSTART)) s)"; fi
			;;
		*warning:* | *error:* | *Error* | *"No rule"*) printf '%s\n' "$l" >&2 ;;
		esac
	done
	log "  $n files compiled in total"
} || die "make vmlinux failed; see $BUILD/build.log"
[ -s vmlinux ] || die "make succeeded but vmlinux is missing"

RELEASE=$("${MK[@]}" -s kernelrelease)
TMP=$OUT.tmp.$$
trap 'rm -f "$TMP" "$OUT.info.tmp"' EXIT
strip --strip-debug -o "$TMP" vmlinux
cp .config "$OUT.config"
{
	echo "version=$SRC_VER"
	echo "config_sha256=$CONFIG_SHA"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "release=$RELEASE"
} >"$OUT.info.tmp"
mv "$TMP" "$OUT"
mv "$OUT.info.tmp" "$OUT.info"
ln -sfn "$NAME" "$KDIR/vmlinux-airlock"

BANNER=$(strings "$OUT" | grep -m1 '^Linux version .*#[0-9]' || true)
log "built $OUT ($(stat -c %s "$OUT") bytes)"
log "$BANNER"
log "wall time: $((SECONDS - START)) s (make: $((SECONDS - BSTART)) s)"
