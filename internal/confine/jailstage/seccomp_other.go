//go:build !amd64

package jailstage

// toolSeccomp: the tools' seccomp filter exists on amd64 only.
func toolSeccomp() error { return nil }

// NoSetIDFilter: the filter against setuid files exists on amd64 only.
func NoSetIDFilter() error { return nil }
