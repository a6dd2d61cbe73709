#!/usr/bin/env bash
# Run airlock's tests: vet, then every package, including the tests that boot
# real boxes (QEMU; TCG where KVM is unusable). Run hack/setup.sh first: with
# AIRLOCK_REQUIRE_VM=1 (the default here) a missing QEMU, kernel or image is a
# failure, not a skip. First, every test that needs no VM (-short: the unit
# tests and the lifecycle suite on the fake driver) runs under the race
# detector, built as released (no test-only faults: they must be absent and
# refused there). Then every test runs, built with -tags airlock_testfaults
# (the test-only faults and seams, e.g. the wedged agent of
# TestHostileWedgedAgentAndKilledVM; tests that need them skip, saying so,
# without the tag). Extra arguments go to both `go test` runs (e.g. -run
# TestBox).
# Then the Python SDK's tests (pytest in sdk/python/.venv, made by setup.sh)
# run against a real airlock serve; AIRLOCK_SKIP_PYTHON=1 skips them. Then
# the TypeScript SDK's: its generated API types are checked against
# api/openapi.json, it is built and its node --test tests run against a real
# airlock serve (sdk/typescript/node_modules from setup.sh);
# AIRLOCK_SKIP_TS=1 skips them.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin
export AIRLOCK_REQUIRE_VM=${AIRLOCK_REQUIRE_VM:-1}
# Every stage runs even when an earlier one fails (a Go failure must not
# hide the SDKs' results); the script fails if any did, naming them.
failed=()
stage() {
	local name=$1
	shift
	echo "== $name" >&2
	if ! "$@"; then
		failed+=("$name")
		echo "== $name: FAILED" >&2
	fi
}
stage "go vet" go vet ./...
stage "go vet (test faults)" go vet -tags airlock_testfaults ./...
stage "go test -race -short" go test -race -short -count=1 -timeout 30m "$@" ./...
stage "go test (with VMs, test faults)" go test -tags airlock_testfaults -count=1 -timeout 60m "$@" ./...
if [ "${AIRLOCK_SKIP_PYTHON:-0}" != 1 ]; then
	if [ ! -x sdk/python/.venv/bin/python ]; then
		echo "sdk/python/.venv missing: run hack/setup.sh (or AIRLOCK_SKIP_PYTHON=1)" >&2
		failed+=("python sdk (no venv)")
	else
		stage "python sdk (pytest)" sdk/python/.venv/bin/python -m pytest -q sdk/python/tests
	fi
fi
if [ "${AIRLOCK_SKIP_TS:-0}" != 1 ]; then
	if [ ! -d sdk/typescript/node_modules ]; then
		echo "sdk/typescript/node_modules missing: run hack/setup.sh (or AIRLOCK_SKIP_TS=1)" >&2
		failed+=("typescript sdk (no node_modules)")
	else
		stage "typescript sdk" bash -c 'cd sdk/typescript && npm run -s check-gen && npm test'
	fi
fi
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAILED stages:' >&2
	printf ' [%s]' "${failed[@]}" >&2
	echo >&2
	exit 1
fi
echo "all stages passed" >&2
