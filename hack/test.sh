#!/usr/bin/env bash
# Run airlock's tests: vet, then every package, including the tests that boot
# real boxes (QEMU; TCG where KVM is unusable). Run hack/setup.sh first: with
# AIRLOCK_REQUIRE_VM=1 (the default here) a missing QEMU, kernel or image is a
# failure, not a skip. First, every test that needs no VM (-short: the unit
# tests and the lifecycle suite on the fake driver) runs under the race
# detector. Extra arguments go to both `go test` runs (e.g. -run TestBox).
# Then the Python SDK's tests (pytest in sdk/python/.venv, made by setup.sh)
# run against a real airlock serve; AIRLOCK_SKIP_PYTHON=1 skips them. Then
# the TypeScript SDK's: its generated API types are checked against
# api/openapi.json, it is built and its node --test tests run against a real
# airlock serve (sdk/typescript/node_modules from setup.sh);
# AIRLOCK_SKIP_TS=1 skips them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x /usr/local/go/bin/go ] && export PATH=$PATH:/usr/local/go/bin
export AIRLOCK_REQUIRE_VM=${AIRLOCK_REQUIRE_VM:-1}
go vet ./...
go test -race -short -count=1 -timeout 30m "$@" ./...
go test -count=1 -timeout 60m "$@" ./...
if [ "${AIRLOCK_SKIP_PYTHON:-0}" != 1 ]; then
	if [ ! -x sdk/python/.venv/bin/python ]; then
		echo "sdk/python/.venv missing: run hack/setup.sh (or AIRLOCK_SKIP_PYTHON=1)" >&2
		exit 1
	fi
	sdk/python/.venv/bin/python -m pytest -q sdk/python/tests
fi
if [ "${AIRLOCK_SKIP_TS:-0}" != 1 ]; then
	if [ ! -d sdk/typescript/node_modules ]; then
		echo "sdk/typescript/node_modules missing: run hack/setup.sh (or AIRLOCK_SKIP_TS=1)" >&2
		exit 1
	fi
	(cd sdk/typescript && npm run -s check-gen && npm test)
fi
