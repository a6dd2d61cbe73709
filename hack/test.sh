#!/usr/bin/env bash
# Run airlock's tests: vet, then every package, including the tests that boot
# real boxes (QEMU; TCG where KVM is unusable). Run hack/setup.sh first: with
# AIRLOCK_REQUIRE_VM=1 (the default here) a missing QEMU, kernel or image is a
# failure, not a skip. First, every test that needs no VM (-short: the unit
# tests and the lifecycle suite on the fake driver) runs under the race
# detector. Extra arguments go to both `go test` runs (e.g. -run TestBox).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin
export AIRLOCK_REQUIRE_VM=${AIRLOCK_REQUIRE_VM:-1}
go vet ./...
go test -race -short -count=1 -timeout 30m "$@" ./...
exec go test -count=1 -timeout 60m "$@" ./...
