package kubenode

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pod's containerPorts are published on the node: the node listens on
// hostIP:hostPort (the port's hostIP, else the node's IP; its hostPort,
// else its containerPort, since a pod's IP is the node's) and joins each
// TCP connection to the containerPort in the pod's box (Box.DialPort, as
// kubectl port-forward does), from when the box is made until the pod is
// done or deleted. A port that cannot be bound (another pod or process
// holds it) or is not TCP is not published: the pod runs all the same,
// with its condition PortsPublished False (reason PortConflict) and a
// Warning event that say which.

// ConditionPortsPublished is the pod condition that says whether the
// pod's containerPorts are published on the node (reason Published or
// PortConflict; the message lists them).
const ConditionPortsPublished corev1.PodConditionType = "airlock.dev/PortsPublished"

// ReasonPortConflict is the reason of a PortsPublished condition (and
// Warning event) when a port could not be published.
const ReasonPortConflict = "PortConflict"

// maxPortConns bounds the connections open at once through one pod's
// published ports; more wait in the listener's backlog.
const maxPortConns = 256

// podPorts are the listeners of one pod's published ports.
type podPorts struct {
	published []string // "ip:port->port/TCP"
	conflicts []string // why a port is not published
	ls        []net.Listener
	closeOnce sync.Once
	cancel    context.CancelFunc
}

// close stops listening (open connections end with their box).
func (pp *podPorts) close() {
	if pp == nil {
		return
	}
	pp.closeOnce.Do(func() {
		pp.cancel()
		for _, l := range pp.ls {
			l.Close()
		}
	})
}

// condition is the PortsPublished condition, or nil when the pod asks for
// no ports.
func (pp *podPorts) condition(at metav1.Time) *corev1.PodCondition {
	if pp == nil || len(pp.published)+len(pp.conflicts) == 0 {
		return nil
	}
	c := &corev1.PodCondition{Type: ConditionPortsPublished, Status: corev1.ConditionTrue, Reason: "Published",
		Message: strings.Join(pp.published, ", "), LastTransitionTime: at}
	if len(pp.conflicts) > 0 {
		c.Status, c.Reason, c.Message = corev1.ConditionFalse, ReasonPortConflict, strings.Join(pp.conflicts, "; ")
		if len(pp.published) > 0 {
			c.Message += "; published: " + strings.Join(pp.published, ", ")
		}
	}
	return c
}

// publishPorts listens on the node for each containerPort of the pod's
// container and forwards connections into box. It records what it could
// not publish (and says so with a Warning event).
func (p *Provider) publishPorts(pb *podBox, box *airlock.Box) {
	c := &pb.pod.Spec.Containers[0]
	if len(c.Ports) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	pp := &podPorts{cancel: cancel}
	sem := make(chan struct{}, maxPortConns)
	for _, cp := range c.Ports {
		host := cp.HostIP
		if host == "" {
			host = p.hostIP
		}
		if host == "" {
			host = "127.0.0.1"
		}
		port := cp.HostPort
		if port == 0 {
			port = cp.ContainerPort
		}
		addr := net.JoinHostPort(host, strconv.Itoa(int(port)))
		proto := cp.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		desc := fmt.Sprintf("%s->%d/%s", addr, cp.ContainerPort, proto)
		if proto != corev1.ProtocolTCP {
			pp.conflicts = append(pp.conflicts, desc+": only TCP ports are published")
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			pp.conflicts = append(pp.conflicts, desc+": "+err.Error())
			continue
		}
		pp.ls = append(pp.ls, l)
		pp.published = append(pp.published, desc)
		go servePort(ctx, l, box, int(cp.ContainerPort), sem)
	}
	p.mu.Lock()
	deleted := pb.deleted
	pb.ports = pp
	p.mu.Unlock()
	if deleted {
		pp.close()
		return
	}
	if len(pp.conflicts) > 0 {
		msg := "not published: " + strings.Join(pp.conflicts, "; ")
		p.event(pb.pod, corev1.EventTypeWarning, ReasonPortConflict, msg)
		p.logf("pod %s/%s: %s", pb.pod.Namespace, pb.pod.Name, msg)
	}
}

// servePort forwards each connection to l to port in box until l closes.
func servePort(ctx context.Context, l net.Listener, box *airlock.Box, port int, sem chan struct{}) {
	for {
		conn, err := l.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			conn.Close()
			return
		}
		go func() {
			defer func() { <-sem }()
			defer conn.Close()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			in, err := box.DialPort(dctx, port)
			cancel()
			if err != nil {
				return
			}
			defer in.Close()
			stop := context.AfterFunc(ctx, func() { conn.Close(); in.Close() })
			defer stop()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				io.Copy(dst, src)
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				} else {
					dst.Close()
				}
				done <- struct{}{}
			}
			go pipe(in, conn)
			go pipe(conn, in)
			<-done
			<-done
		}()
	}
}
