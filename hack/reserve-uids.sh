#!/usr/bin/env bash
# Reserve the host uid/gid range whose ids boxes' QEMUs run as when airlock
# runs as root (one uid per running box; see docs/confinement.md): an entry
# "airlock:START:65536" in /etc/subuid and /etc/subgid. START is above every
# range already there and at least 1879048192 (0x70000000), far above the
# uids of real users. Idempotent: an existing entry is kept. Needs root.
set -euo pipefail
COUNT=65536
for f in /etc/subuid /etc/subgid; do touch "$f"; done
if grep -q '^airlock:' /etc/subuid && grep -q '^airlock:' /etc/subgid; then
	exit 0
fi
start=$(awk -F: 'BEGIN{m=1879048192} NF==3 && $2+$3>m {m=$2+$3} END{print m}' /etc/subuid /etc/subgid)
for f in /etc/subuid /etc/subgid; do
	sed -i '/^airlock:/d' "$f"
	if [ -s "$f" ] && [ -n "$(tail -c1 "$f")" ]; then echo >>"$f"; fi
	echo "airlock:$start:$COUNT" >>"$f"
done
echo "reserved uids and gids $start-$((start + COUNT - 1)) for box QEMUs (airlock in /etc/subuid, /etc/subgid)" >&2
