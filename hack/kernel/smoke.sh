#!/usr/bin/env bash
# Smoke test: boot each guest kernel on QEMU -M microvm with a tiny busybox
# initramfs, a virtio-blk disk and a virtio-serial port named airlock.agent;
# report whether /dev/vda and the port appear and the launch -> MARK-INIT time.
#
# Usage: hack/kernel/smoke.sh [VMLINUX[:MODULES_DIR]]...
# Default: the custom kernel ($CACHE/kernel/vmlinux-airlock, everything built in)
# and the Debian fallback ($CACHE/kernel/debian/vmlinux + debian/modules).
# Env: SMOKE_ACCEL (default tcg), SMOKE_OUT (console logs, default /tmp/airlock-smoke).
set -euo pipefail

CACHE=${AIRLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock}
ACCEL=${SMOKE_ACCEL:-tcg}
LOGDIR=${SMOKE_OUT:-/tmp/airlock-smoke}
APPEND="console=ttyS0 quiet tsc_early_khz=2800000 no_timer_check reboot=t panic=-1 mitigations=off nokaslr"
PKGS=(qemu-system-x86 busybox-static cpio)

log() { printf '[smoke] %s\n' "$*" >&2; }
die() { printf '[smoke] ERROR: %s\n' "$*" >&2; exit 1; }

ensure_pkgs() {
	local missing=() p sudo=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	[ "$(id -u)" = 0 ] || sudo=(sudo)
	log "installing: ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}
ensure_pkgs "${PKGS[@]}"

if [ $# -eq 0 ]; then
	set -- "$CACHE/kernel/vmlinux-airlock" "$CACHE/kernel/debian/vmlinux:$CACHE/kernel/debian/modules"
fi

TMP=$(mktemp -d /tmp/airlock-smoke.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$LOGDIR"
truncate -s 1M "$TMP/disk.img"

# Base initramfs tree: static busybox, its applets, and /init.
BASE=$TMP/base
mkdir -p "$BASE"/{bin,dev,proc,sys,modules}
cp /bin/busybox "$BASE/bin/busybox"
for a in $("$BASE/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$BASE/bin/$a"; done
cat >"$BASE/init" <<'EOF'
#!/bin/sh
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t proc proc /proc
mount -t sysfs sysfs /sys
read up _ </proc/uptime
echo "MARK-START uptime=$up"
if [ -s /modules/modules.load ]; then
	while read -r m; do
		[ -n "$m" ] && { insmod "/modules/$m" || echo "INSMOD-FAILED $m"; }
	done </modules/modules.load
fi
read up _ </proc/uptime
echo "MARK-INIT uptime=$up"
i=0
while [ ! -b /dev/vda ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
echo "DEVS: $(ls /dev/vd* 2>/dev/null | tr '\n' ' ')"
for n in /sys/class/virtio-ports/*/name; do
	[ -f "$n" ] && echo "PORT: $(basename "$(dirname "$n")") $(cat "$n")"
done
echo "UNAME: $(uname -r)"
echo MARK-DONE
reboot -f
EOF
chmod 755 "$BASE/init"

fail=0
for spec in "$@"; do
	kernel=${spec%%:*} moddir=
	[[ $spec == *:* ]] && moddir=${spec#*:}
	kernel=$(readlink -f "$kernel")
	[ -s "$kernel" ] || { log "kernel not found: $spec"; fail=1; continue; }
	name=$(basename "$kernel")
	[ "$name" = vmlinux ] && name=$(basename "$(dirname "$kernel")")

	root=$TMP/root-$name
	cp -a "$BASE" "$root"
	if [ -n "$moddir" ]; then
		[ -s "$moddir/modules.load" ] || die "no modules.load in $moddir"
		cp "$moddir"/*.ko "$moddir/modules.load" "$root/modules/"
	fi
	(cd "$root" && find . | cpio -o -H newc --quiet) >"$TMP/initrd-$name.cpio"

	console=$LOGDIR/$name.log
	start=${EPOCHREALTIME/./}
	t_start=- t_init=- rc=0
	# Wall time from just before launching qemu to each MARK- line on the serial console.
	while IFS= read -r line; do
		line=${line%$'\r'}
		now=${EPOCHREALTIME/./}
		ms=$(((now - start) / 1000))
		printf '%6d ms | %s\n' "$ms" "$line"
		case $line in
		MARK-START*) t_start=$ms ;;
		MARK-INIT*) t_init=$ms ;;
		esac
	done < <(timeout 60 qemu-system-x86_64 -accel "$ACCEL" -M microvm -cpu max -m 256 -smp 1 \
		-nodefaults -no-user-config -display none -no-reboot -serial stdio \
		-kernel "$kernel" -initrd "$TMP/initrd-$name.cpio" -append "$APPEND" \
		-drive id=d0,file="$TMP/disk.img",format=raw,if=none,readonly=on \
		-device virtio-blk-device,drive=d0 -device virtio-serial-device \
		-chardev socket,id=ch0,path="$TMP/agent-$name.sock",server=on,wait=off \
		-device virtserialport,chardev=ch0,name=airlock.agent 2>&1; echo "QEMU-EXIT rc=$?") >"$console"
	total=$(((${EPOCHREALTIME/./} - start) / 1000))
	cat "$console" >&2
	rc=$(sed -n 's/^.*QEMU-EXIT rc=\([0-9]*\).*$/\1/p' "$console" | tail -n1)
	vda=no port=no
	grep -q '^.*| DEVS:.*/dev/vda' "$console" && vda=yes
	grep -q '^.*| PORT: .* airlock\.agent$' "$console" && port=yes
	up=$(sed -n 's/^.*| MARK-INIT uptime=//p' "$console")
	printf '[smoke] %-45s start=%s ms init=%s ms (guest uptime %s s) total=%s ms qemu_rc=%s vda=%s airlock.agent=%s insmod_failures=%s log=%s\n' \
		"$name" "$t_start" "$t_init" "${up:--}" "$total" "${rc:-?}" "$vda" "$port" \
		"$(grep -c 'INSMOD-FAILED' "$console" || true)" "$console"
	if [ "$vda" != yes ] || [ "$port" != yes ] || [ "$t_init" = - ]; then fail=1; fi
done
exit $fail
