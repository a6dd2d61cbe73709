#!/usr/bin/env bash
# Stop the control plane hack/kube-up.sh started in DIR: SIGTERM to each of
# its processes (pids in DIR/pids), SIGKILL to any still there after 10 s.
# Leaves DIR (certificates, logs, etcd data) for a look; remove it yourself.
set -euo pipefail
DIR=${1:?usage: hack/kube-down.sh DIR}
[ -f "$DIR/pids" ] || exit 0
pids=()
while read -r pid name; do
	# Only our own: the process must still be the binary we started.
	if kill -0 "$pid" 2>/dev/null && grep -qa -- "$name" "/proc/$pid/cmdline" 2>/dev/null; then
		pids+=("$pid")
	fi
done <"$DIR/pids"
# Scheduler and controller manager first, etcd last.
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
for _ in $(seq 100); do
	alive=0
	for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
	[ $alive = 0 ] && break
	sleep 0.1
done
for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
rm -f "$DIR/pids"
