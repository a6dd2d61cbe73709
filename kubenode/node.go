// Package kubenode makes a host a Kubernetes node whose pods run as airlock
// boxes (`airlock node`). It registers the node through virtual-kubelet
// (github.com/virtual-kubelet/virtual-kubelet: node status, conditions and
// the node lease) and runs each pod bound to it as one box (Provider).
//
// The node carries the label and the NoSchedule taint
// airlock.dev/runtime=true, so only pods that ask for airlock land on it:
// the RuntimeClass "airlock" of deploy/kubernetes adds the matching
// nodeSelector and toleration to every pod that names it
// (runtimeClassName: airlock). See docs/kubernetes.md.
package kubenode

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// RuntimeLabel is the label (value "true") and the key of the NoSchedule
// taint that an airlock node carries.
const RuntimeLabel = "airlock.dev/runtime"

// Config describes a node.
type Config struct {
	// Name is the Node's name (required).
	Name string
	// Client talks to the cluster (required): see nodeutil.ClientsetFromEnv
	// for one from a kubeconfig, or rest.InClusterConfig.
	Client kubernetes.Interface
	// Runtime runs the boxes (required); the caller closes it after Run.
	Runtime *airlock.Runtime
	// LogDir holds the containers' output; default Runtime.Home()/kube/logs.
	LogDir string
	// Logf, when set, receives a line per pod event (refused, started,
	// exited, deleted, adopted).
	Logf func(format string, args ...any)
	// Ready, when set, is called once the node is registered and Ready.
	Ready func()

	// The kubelet API (kubectl logs, exec, attach, port-forward;
	// /stats/summary) is served over TLS with the certificate that
	// ServingCert says: ServingCertFile (the pair TLSCertFile and
	// TLSKeyFile: a certificate for NodeIP signed by a CA the API server
	// trusts, its --kubelet-certificate-authority), ServingCertCSR (one
	// from the cluster's CSR API, kept and renewed in the airlock home) or
	// ServingCertSelf (self-signed). Empty means ServingCertFile when
	// TLSCertFile is set; otherwise the kubelet API is not served and
	// those commands fail.
	ServingCert             string
	TLSCertFile, TLSKeyFile string
	// ClientCAFile, when set, is the CA of the client certificates the
	// kubelet API accepts (the API server's --kubelet-client-certificate);
	// bearer tokens are checked with TokenReviews. Every request is
	// authorised with a SubjectAccessReview, as a kubelet in webhook mode
	// does; anonymous requests are refused.
	ClientCAFile string
	// KubeletAddr is the kubelet API's listen address (default
	// ":10250"; a port of 0 picks a free one, which the Node reports).
	KubeletAddr string
	// NodeIP is the node's InternalIP, where the API server reaches the
	// kubelet API (default: KubeletAddr's host when it names one, else
	// the host's first global IPv4 address, else 127.0.0.1).
	NodeIP string
	// APIAddr, when set, is the address (host:port) of the node's airlock
	// API for its own boxes (airlock node --api-listen), advertised on the
	// Node as annotation kubebox.APIAnnotation (http://HOST:PORT; an
	// unspecified host is NodeIP) so that airlock gateway finds it.
	APIAddr string
	// AllowVolumeDirs are the host directories under which a box made
	// through the API (airlock gateway) may attach host directory volumes
	// (airlock node --allow-volume); empty: none.
	AllowVolumeDirs []string
}

// Run registers the node and runs its pods as boxes until ctx ends. At
// start it adopts the boxes of pods still bound to this node and removes
// those whose pod is gone (Provider.Adopt). Boxes keep running after Run
// returns (a restarted node adopts them); deleting the Node does not
// remove them. A pod's command runs on an exec stream of this process: one
// still running when the process exits ends with it (the Runtime's
// Close, or Provider.Stop), and a restarted node applies the pod's
// restartPolicy to that end (Provider.Adopt); keeping commands across a
// restart is a later slice.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Name == "" || cfg.Client == nil || cfg.Runtime == nil {
		return fmt.Errorf("kubenode: Name, Client and Runtime are required")
	}
	if cfg.LogDir == "" {
		cfg.LogDir = filepath.Join(cfg.Runtime.Home(), "kube", "logs")
	}
	prov, err := NewProvider(cfg.Runtime, cfg.LogDir, cfg.Logf)
	if err != nil {
		return err
	}
	defer prov.Stop()
	// The pods' events (and virtual-kubelet's pod controller's) go to
	// the API as a kubelet's do, from component kubelet on this host.
	eb := record.NewBroadcaster()
	eb.StartRecordingToSink(&corev1client.EventSinkImpl{Interface: cfg.Client.CoreV1().Events(metav1.NamespaceAll)})
	defer eb.Shutdown()
	recorder := eb.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.Name})
	prov.SetRecorder(recorder)
	prov.nodeName = cfg.Name
	prov.SetAPI(cfg.Client, nodeIP(cfg))
	prov.SetAllowVolumeDirs(cfg.AllowVolumeDirs)
	pods, err := cfg.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", cfg.Name).String(),
	})
	if err != nil {
		return fmt.Errorf("kubenode: listing the pods of node %s: %w", cfg.Name, err)
	}
	if err := prov.Adopt(ctx, pods.Items); err != nil {
		return fmt.Errorf("kubenode: adopting boxes: %w", err)
	}
	if cfg.ServingCert == "" && (cfg.TLSCertFile != "" || cfg.TLSKeyFile != "") {
		cfg.ServingCert = ServingCertFile
	}
	var kubelet *kubeletServer
	if cfg.ServingCert != "" {
		certs, err := servingCert(ctx, cfg, cfg.Client, filepath.Join(cfg.Runtime.Home(), "kube", "pki"), nodeIP(cfg))
		if err != nil {
			return err
		}
		defer certs.stop()
		kubelet, err = listenKubelet(cfg, cfg.Client, prov, certs)
		if err != nil {
			return err
		}
		defer kubelet.close()
		go kubelet.serve()
	} else if cfg.Logf != nil {
		cfg.Logf("no serving certificate for the kubelet API: kubectl logs, exec, attach and port-forward will not reach this node")
	}
	capacity := Capacity(cfg.Runtime)
	n, err := nodeutil.NewNode(cfg.Name, func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		prov.setListers(pc)
		return prov, nil, nil
	}, func(c *nodeutil.NodeConfig) error {
		c.Client = cfg.Client
		c.KubeconfigPath = ""
		c.HTTPListenAddr = "127.0.0.1:0" // unused: the kubelet API is served by listenKubelet
		c.NumWorkers = max(2, runtime.NumCPU())
		c.EventRecorder = recorder
		// The provider resolves env itself (resolveEnv), so that a pod
		// whose env cannot be made shows CreateContainerConfigError.
		c.SkipDownwardAPIResolution = true
		spec := &c.NodeSpec
		spec.Labels[RuntimeLabel] = "true"
		spec.Labels[corev1.LabelOSStable] = runtime.GOOS
		spec.Labels[corev1.LabelArchStable] = runtime.GOARCH
		if u := apiURL(cfg); u != "" {
			if spec.Annotations == nil {
				spec.Annotations = map[string]string{}
			}
			spec.Annotations[kubebox.APIAnnotation] = u
		}
		spec.Spec.Taints = append(spec.Spec.Taints, corev1.Taint{Key: RuntimeLabel, Value: "true", Effect: corev1.TaintEffectNoSchedule})
		spec.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP(cfg)}}
		if kubelet != nil {
			spec.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(kubelet.port)
		}
		spec.Status.Capacity = capacity
		spec.Status.Allocatable = capacity
		spec.Status.NodeInfo = corev1.NodeSystemInfo{
			OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
			KubeletVersion: "v1.37.2-airlock", ContainerRuntimeVersion: "airlock",
		}
		return nil
	})
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-n.Ready():
			if cfg.Ready != nil {
				cfg.Ready()
			}
		case <-n.Done():
		}
	}()
	err = n.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Capacity is what the node offers, from the host and airlock's capacity
// rules (airlock.Runtime.Capacity): CPUs of the host, the memory cap of
// running boxes, the free space of the airlock home's file system, and
// one pod per box the host may run.
func Capacity(rt *airlock.Runtime) corev1.ResourceList {
	boxes, memMiB := rt.Capacity()
	var disk int64
	var st unix.Statfs_t
	if unix.Statfs(rt.Home(), &st) == nil {
		disk = int64(st.Bavail) * int64(st.Bsize)
	}
	return corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(int64(memMiB)<<20, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(disk, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(int64(boxes), resource.DecimalSI),
	}
}

// apiURL is the URL the Node advertises for its airlock API ("" without
// one): Config.APIAddr with an unspecified host replaced by the NodeIP.
func apiURL(cfg Config) string {
	if cfg.APIAddr == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(cfg.APIAddr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = nodeIP(cfg)
	}
	return "http://" + net.JoinHostPort(host, port)
}
