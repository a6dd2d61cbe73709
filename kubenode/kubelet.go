package kubenode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/gorilla/mux"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
)

// The kubelet API (what the API server calls for kubectl logs, exec,
// attach, port-forward and for /stats/summary) is virtual-kubelet's
// (node/api) over the provider's methods below.

// Stream timeouts of exec, attach and port-forward: a stream must be set
// up within streamCreationTimeout of the connection, and a connection
// with no traffic for streamIdleTimeout is closed (kubelet's default,
// --streaming-connection-idle-timeout, is 4 h).
const (
	streamCreationTimeout = 30 * time.Second
	streamIdleTimeout     = 4 * time.Hour
)

// kubeletHandler returns the kubelet API of the provider, authenticated
// and authorised by auth.
func (p *Provider) kubeletHandler(auth nodeutil.Auth) http.Handler {
	routes := api.PodHandler(api.PodHandlerConfig{
		RunInContainer:        p.RunInContainer,
		AttachToContainer:     p.AttachToContainer,
		PortForward:           p.PortForward,
		GetContainerLogs:      p.GetContainerLogs,
		GetPods:               p.GetPods,
		GetPodsFromKubernetes: p.GetPods,
		GetStatsSummary:       p.GetStatsSummary,
		GetMetricsResource:    p.GetMetricsResource,
		StreamIdleTimeout:     streamIdleTimeout,
		StreamCreationTimeout: streamCreationTimeout,
	}, false)
	// PodHandler swaps the two timeouts of port-forward: route it here
	// with them the right way round.
	r := mux.NewRouter()
	r.HandleFunc("/portForward/{namespace}/{pod}", api.HandlePortForward(p.PortForward,
		api.WithPortForwardStreamIdleTimeout(streamIdleTimeout),
		api.WithPortForwardCreationTimeout(streamCreationTimeout))).Methods("POST", "GET")
	r.NotFoundHandler = routes
	return nodeutil.WithAuth(auth, r)
}

// kubeletServer is the TLS listener of the kubelet API.
type kubeletServer struct {
	l    net.Listener
	srv  *http.Server
	port int
}

// listenKubelet binds the kubelet API's address with the serving
// certificate of certs and returns its server (not yet serving). Requests
// are authenticated as a kubelet's are in webhook mode: a client
// certificate signed by cfg.ClientCAFile (the API server's
// --kubelet-client-certificate), or a bearer token checked with a
// TokenReview; and each is authorised with a SubjectAccessReview
// (nodes/proxy, nodes/log, nodes/stats of this node). Anonymous requests
// are refused.
func listenKubelet(cfg Config, client kubernetes.Interface, p *Provider, certs *servingSource) (*kubeletServer, error) {
	var opts []nodeutil.WebhookAuthOption
	if cfg.ClientCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca", cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("kubenode: the kubelet API's client CA %s: %w", cfg.ClientCAFile, err)
		}
		opts = append(opts, func(c *nodeutil.WebhookAuthConfig) error {
			c.AuthnConfig.ClientCertificateCAContentProvider = ca
			return nil
		})
	}
	auth, err := nodeutil.WebhookAuth(client, cfg.Name, opts...)
	if err != nil {
		return nil, fmt.Errorf("kubenode: the kubelet API's authentication: %w", err)
	}
	addr := cfg.KubeletAddr
	if addr == "" {
		addr = ":" + strconv.Itoa(DefaultKubeletPort)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kubenode: the kubelet API: %w", err)
	}
	tc := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   nodeutil.DefaultServerCiphers(),
		ClientAuth:     tls.RequestClientCert, // verified by the authenticator
		GetCertificate: certs.getCertificate,
	}
	return &kubeletServer{
		l: tls.NewListener(l, tc),
		srv: &http.Server{Handler: p.kubeletHandler(auth), ReadHeaderTimeout: 30 * time.Second,
			IdleTimeout: 5 * time.Minute, ErrorLog: nil},
		port: l.Addr().(*net.TCPAddr).Port,
	}, nil
}

func (s *kubeletServer) serve() { s.srv.Serve(s.l) }

func (s *kubeletServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
	s.srv.Close()
}

// DefaultKubeletPort is the kubelet API's port when Config.KubeletAddr is
// empty, as a kubelet's.
const DefaultKubeletPort = 10250

// lookup returns the pod's entry, checking that it has the container.
func (p *Provider) lookup(namespace, podName, container string) (*podBox, error) {
	p.mu.Lock()
	pb, ok := p.pods[key(namespace, podName)]
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not known to this node", namespace, podName)
	}
	if len(pb.pod.Spec.Containers) != 1 || (container != "" && container != pb.pod.Spec.Containers[0].Name) {
		return nil, errdefs.NotFoundf("container %q is not valid for pod %s/%s", container, namespace, podName)
	}
	return pb, nil
}

// runningBox returns the box of the pod's running container, or an error
// that says why there is none.
func (p *Provider) runningBox(namespace, podName, container string) (*podBox, *airlock.Box, error) {
	pb, err := p.lookup(namespace, podName, container)
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case pb.refused != "":
		return nil, nil, errdefs.InvalidInputf("pod %s/%s was refused (%s): it has no container", namespace, podName, pb.refused)
	case pb.exited:
		return nil, nil, errdefs.InvalidInputf("container %s of pod %s/%s is not running (it terminated: %s)", pb.pod.Spec.Containers[0].Name, namespace, podName, pb.reason)
	case pb.box == nil || pb.started.IsZero():
		return nil, nil, errdefs.InvalidInputf("container %s of pod %s/%s is not running yet", pb.pod.Spec.Containers[0].Name, namespace, podName)
	}
	return pb, pb.box, nil
}

// ended reports whether the pod's container has ended (or the pod is
// gone): no more output comes.
func (p *Provider) ended(pb *podBox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pb.adopted && !pb.exited && pb.box != nil {
		p.refreshAdoptedLocked(pb)
	}
	return pb.exited || pb.deleted || pb.refused != ""
}

// GetContainerLogs serves `kubectl logs` from the pod's log on the host
// (bounded: maxPodLogBytes, rotated once): tailLines (honoured up to
// maxTailLines), sinceSeconds/sinceTime, timestamps, limitBytes, and
// follow, which streams until the container ends or the client leaves.
// previous reads the log of the container's run before its last restart
// (restartPolicy OnFailure, Always), and is refused as a kubelet refuses
// it when there is none.
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	pb, err := p.lookup(namespace, podName, containerName)
	if err != nil {
		return nil, err
	}
	path, done := p.logPath(pb.pod.UID), func() bool { return p.ended(pb) }
	if opts.Previous {
		p.mu.Lock()
		restarted := pb.restartCount > 0
		p.mu.Unlock()
		if !restarted {
			return nil, errdefs.InvalidInputf("previous terminated container %q in pod %q not found", pb.pod.Spec.Containers[0].Name, podName)
		}
		path, done = p.prevLogPath(pb.pod.UID), func() bool { return true }
	}
	since := opts.SinceTime
	if opts.SinceSeconds > 0 {
		since = time.Now().Add(-time.Duration(opts.SinceSeconds) * time.Second)
	}
	pr, pw := io.Pipe()
	lw := &logWriter{w: pw, timestamps: opts.Timestamps, limit: int64(opts.LimitBytes)}
	s := &logStream{path: path, tail: opts.Tail, since: since, follow: opts.Follow, done: done, emit: lw.emit}
	go func() {
		err := s.run(ctx)
		if errors.Is(err, errLogLimit) {
			err = nil
		}
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// RunInContainer serves `kubectl exec`: cmd runs in the pod's box (as the
// box's user, env and working directory) with the client's streams; with
// a TTY on a terminal of the client's size (resized as it is; Ctrl-C is
// SIGINT). A non-zero exit status reaches kubectl as its exit code. The
// exec ends when the client leaves.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	_, box, err := p.runningBox(namespace, podName, containerName)
	if err != nil {
		return err
	}
	if len(cmd) == 0 || cmd[0] == "" {
		return errdefs.InvalidInput("no command to run")
	}
	opts := airlock.ExecOptions{TTY: attach.TTY()}
	if w := attach.Stdout(); w != nil {
		opts.Stdout = w
	} else {
		opts.Stdout = io.Discard
	}
	if w := attach.Stderr(); w != nil {
		opts.Stderr = w
	}
	if r := attach.Stdin(); r != nil {
		opts.Stdin = r
	}
	resize := attach.Resize()
	if opts.TTY && resize != nil {
		// kubectl sends the terminal's size first: start the process on
		// a terminal of that size, so that what reads it at once sees it.
		select {
		case sz, ok := <-resize:
			if ok && sz.Height > 0 && sz.Width > 0 {
				opts.Rows, opts.Cols = int(sz.Height), int(sz.Width)
			}
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	proc, err := box.ExecStream(ctx, cmd[0], cmd[1:], opts)
	if err != nil {
		return err
	}
	if opts.Stdin == nil {
		proc.Stdin().Close()
	}
	if resize != nil {
		go func() {
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					if sz.Height > 0 && sz.Width > 0 {
						proc.Resize(int(sz.Height), int(sz.Width))
					}
				case <-proc.Done():
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	res, err := proc.Wait()
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return exitError(res.ExitCode)
	}
	return nil
}

// exitError is a non-zero exit status; it is k8s.io/utils/exec.ExitError,
// which the exec handler turns into the status kubectl exits with.
type exitError int

func (e exitError) Error() string   { return "command terminated with exit code " + strconv.Itoa(int(e)) }
func (e exitError) String() string  { return e.Error() }
func (e exitError) Exited() bool    { return true }
func (e exitError) ExitStatus() int { return int(e) }

// AttachToContainer serves `kubectl attach`: the container's output from
// now on, stdout and stderr to the client's, until the container ends or
// the client leaves. The container has no stdin or TTY to attach to (a
// pod asking for them is refused).
func (p *Provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	pb, _, err := p.runningBox(namespace, podName, containerName)
	if err != nil {
		return err
	}
	if attach.TTY() {
		return errdefs.InvalidInputf("container %s of pod %s/%s has no TTY (tty: true is not supported yet)", pb.pod.Spec.Containers[0].Name, namespace, podName)
	}
	out, errw := attach.Stdout(), attach.Stderr()
	s := &logStream{path: p.logPath(pb.pod.UID), follow: true, fromEnd: true,
		done: func() bool { return p.ended(pb) },
		emit: func(r logRecord) error {
			w := out
			if r.stream == "stderr" {
				w = errw
			}
			if w == nil {
				return nil
			}
			b := r.data
			if r.full {
				b = append(b, '\n')
			}
			_, err := w.Write(b)
			return err
		}}
	return s.run(ctx)
}

// PortForward serves `kubectl port-forward`: stream is joined to a TCP
// connection to port in the pod's box (through the box's network,
// Box.DialPort), until either side closes it.
func (p *Provider) PortForward(ctx context.Context, namespace, podName string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	_, box, err := p.runningBox(namespace, podName, "")
	if err != nil {
		return err
	}
	if port <= 0 || port > 65535 {
		return errdefs.InvalidInputf("port %d: want 1-65535", port)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := box.DialPort(dctx, int(port))
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(conn, stream)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		io.Copy(stream, conn)
		stream.Close()
		done <- struct{}{}
	}()
	select {
	case <-done:
		// One side is done; the other ends when its peer closes, or with
		// the connection (the other copy ends when conn or stream closes).
		select {
		case <-done:
		case <-ctx.Done():
		case <-time.After(streamIdleTimeout):
		}
	case <-ctx.Done():
	}
	return nil
}

// nodeIP returns the address the node reports as its InternalIP: the
// configured one, else that of the kubelet address when it names one,
// else the host's first global IPv4 address, else 127.0.0.1.
func nodeIP(cfg Config) string {
	if cfg.NodeIP != "" {
		return cfg.NodeIP
	}
	if host, _, err := net.SplitHostPort(cfg.KubeletAddr); err == nil && host != "" {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			return ip.String()
		}
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return "127.0.0.1"
}

// readProc returns the first 64 KiB of a /proc file.
func readProc(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	return strings.TrimSpace(string(b))
}
