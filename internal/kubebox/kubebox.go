// Package kubebox is the contract between airlock gateway
// (internal/gateway) and airlock node (kubenode) on the objects of a
// Kubernetes cluster: the names, labels and annotations by which a gateway
// finds a node's airlock API and a pod's box, and the box options a
// gateway puts on a pod for its node. Both sides read the cluster only;
// the gateway keeps no state of its own.
package kubebox

import (
	"encoding/json"
	"fmt"
)

const (
	// BoxNamePrefix starts the name of every box that runs a pod: the box
	// is named BoxNamePrefix + the pod's UID (BoxName), so a restarted
	// node finds the boxes of its pods and a gateway computes a pod's box
	// from the pod alone.
	BoxNamePrefix = "k8s-"

	// APIAnnotation, on a Node, is the base URL of that node's airlock
	// API (http://IP:PORT), served for the node's own boxes with the
	// node token (airlock node --api-listen).
	APIAnnotation = "airlock.dev/api"

	// OptionsAnnotation, on a pod, holds the box options a pod spec cannot
	// carry (Options, as JSON). A pod with it is a box made through the
	// API: its node runs no main command in it, and the pod runs until it
	// is deleted or the box stops.
	OptionsAnnotation = "airlock.dev/box-options"

	// IDLabel, on a pod made by a gateway, is the box's id (12 hex
	// digits; the pod is named PodNamePrefix + id). Gateways list the
	// pods with this label.
	IDLabel = "airlock.dev/box-id"
	// NameLabel, on such a pod, is the box's name when it has one (as its
	// tenant named it: names are unique per tenant).
	NameLabel = "airlock.dev/box-name"
	// TenantLabel, on such a pod, names the tenant the box is for (a
	// token of the gateway's --tenants file); pods without it are the
	// admin's. A tenant's requests see only the pods with its name, and
	// its quotas count them.
	TenantLabel = "airlock.dev/tenant"

	// PodNamePrefix starts the name of a pod made by a gateway.
	PodNamePrefix = "box-"

	// RuntimeClass is the RuntimeClass that steers pods to airlock nodes
	// (deploy/kubernetes/runtimeclass.yaml).
	RuntimeClass = "airlock"

	// ReasonPolicyDenied is the reason of a box's pod that its node
	// refused for its grants (a host directory volume outside airlock
	// node --allow-volume): the gateway answers 403 policy_denied with
	// the message.
	ReasonPolicyDenied = "PolicyDenied"

	// MaxOptionsBytes bounds OptionsAnnotation (Kubernetes bounds all of a
	// pod's annotations to 256 KiB).
	MaxOptionsBytes = 64 << 10
)

// BoxName is the name of the box that runs the pod with this UID.
func BoxName(podUID string) string { return BoxNamePrefix + podUID }

// Options are the box options a gateway carries in OptionsAnnotation:
// what a pod spec has no field for. Image, env, working directory, user
// and size are in the pod spec (container image, env, workingDir,
// securityContext, resources.limits).
type Options struct {
	// Network is the box's network mode (public, allowlist, none; empty:
	// public).
	Network string `json:"network,omitempty"`
	// AllowNet are an allowlist network's destinations.
	AllowNet []string `json:"allow_net,omitempty"`
	// DiskSizeMiB is the writable layer's size (0: airlock's default).
	DiskSizeMiB int `json:"disk_size_mib,omitempty"`
	// User of every exec, as airlock takes it (name, uid, name:group);
	// the pod's runAsUser only holds numbers.
	User string `json:"user,omitempty"`
	// TTL, IdleTimeout and Lease are the box's lifetimes in seconds (0:
	// none), enforced by the node's airlock; the box removed, its pod
	// fails.
	TTL         float64 `json:"ttl,omitempty"`
	IdleTimeout float64 `json:"idle_timeout,omitempty"`
	Lease       float64 `json:"lease,omitempty"`
	// IdleAction is what IdleTimeout does: remove (empty), stop or
	// suspend. A suspended box's pod stays Running: the next call
	// through the node's API resumes it.
	IdleAction string `json:"idle_action,omitempty"`
	// AutoRemove is the box's auto_remove: a gateway that stops the box
	// (POST /v1/boxes/{id}/stop) then deletes its pod, so the box is
	// removed, as airlock serve removes it. Nodes do not read it.
	AutoRemove bool `json:"auto_remove,omitempty"`
	// AllowHostPorts are ports of the node's 127.0.0.1 the box may reach
	// (airlock.BoxOptions.AllowHostPorts).
	AllowHostPorts []int `json:"allow_host_ports,omitempty"`
	// Ports are published by the node's airlock (airlock.PortMapping):
	// HostIP and HostPort are the node's; a HostPort of 0 is a free port
	// picked at each start, shown by the node's box. The scheduler does
	// not see them (they are not the container's hostPorts).
	Ports []Port `json:"ports,omitempty"`
	// Volumes are host directories of the node and the node's named
	// volumes (airlock.Volume), attached by the node's airlock.
	Volumes []Volume `json:"volumes,omitempty"`
	// Secrets are the box's secrets by environment variable name, their
	// hosts here and their values in the Secret SecretsFrom (key: the
	// name), which the node reads (a value never sits in the pod).
	Secrets map[string]SecretHosts `json:"secrets,omitempty"`
	// SecretsFrom names the Secret, in the pod's namespace, that holds the
	// values of Secrets; the node waits for it (ContainerCreating).
	SecretsFrom string `json:"secrets_from,omitempty"`
	// FromSnapshot restores the node's memory snapshot of this name
	// instead of booting the image (airlock.BoxOptions.FromSnapshot); the
	// pod is bound to the node that holds it.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// Port is a published port of Options (airlock.PortMapping).
type Port struct {
	HostIP    string `json:"host_ip,omitempty"`
	HostPort  int    `json:"host_port"`
	GuestPort int    `json:"guest_port"`
	Protocol  string `json:"protocol,omitempty"`
}

// Volume is a volume of Options (airlock.Volume).
type Volume struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// SecretHosts are the hosts a secret of Options is sent to.
type SecretHosts struct {
	Hosts []string `json:"hosts"`
}

// ParseOptions reads OptionsAnnotation's value.
func ParseOptions(s string) (Options, error) {
	var o Options
	if len(s) > MaxOptionsBytes {
		return o, fmt.Errorf("annotation %s: %d bytes, more than %d", OptionsAnnotation, len(s), MaxOptionsBytes)
	}
	if err := json.Unmarshal([]byte(s), &o); err != nil {
		return o, fmt.Errorf("annotation %s: %v", OptionsAnnotation, err)
	}
	if o.TTL < 0 || o.IdleTimeout < 0 || o.Lease < 0 || o.DiskSizeMiB < 0 {
		return o, fmt.Errorf("annotation %s: negative ttl, idle_timeout, lease or disk_size_mib", OptionsAnnotation)
	}
	switch o.IdleAction {
	case "", "remove", "stop", "suspend":
	default:
		return o, fmt.Errorf("annotation %s: idle_action %q: want remove, stop or suspend", OptionsAnnotation, o.IdleAction)
	}
	if len(o.Secrets) > 0 && o.SecretsFrom == "" {
		return o, fmt.Errorf("annotation %s: secrets without secrets_from (the Secret that holds their values)", OptionsAnnotation)
	}
	return o, nil
}

// Format is the annotation's value for o.
func (o Options) Format() string {
	b, _ := json.Marshal(o)
	return string(b)
}
