//go:build tools

// Package agentsandbox pins the agent-sandbox controller that
// hack/build-kube.sh builds (go mod tidy keeps its dependencies because of
// this import); it is never compiled.
package agentsandbox

import _ "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
