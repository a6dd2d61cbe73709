//go:build tools

// Package kube pins the Kubernetes control-plane commands that
// hack/build-kube.sh builds (go mod tidy keeps their dependencies because of
// these imports); it is never compiled.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
