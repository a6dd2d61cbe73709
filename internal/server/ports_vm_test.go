package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestPublishedPortVM publishes a box's port through the API on a real
// box: the create (host_port 0, granted by a range from 0) returns the
// port bound, a server started in the box answers on 127.0.0.1:PORT of the
// host, GET and list show the bound port while it runs and the asked one
// once stopped; a host port already in use is 409 port_in_use with no box
// left behind.
func TestPublishedPortVM(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	var pol Policy
	for _, s := range []string{"127.0.0.1:0", "127.0.0.1:" + strconv.Itoa(busyPort)} {
		g, err := ParsePublishGrant(s)
		if err != nil {
			t.Fatal(err)
		}
		pol.AllowPublish = append(pol.AllowPublish, g)
	}
	ts := httptest.NewServer(New(Config{Runtime: rt, Policy: pol}).Handler(false))
	defer ts.Close()
	c := apiClient{t, ts.URL}

	var box Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage, Ports: []PortSpec{{GuestPort: 8000}}}, &box); st != 201 {
		t.Fatalf("create: %d %+v", st, box)
	}
	defer rt.Remove(context.Background(), box.ID, true)
	if len(box.Ports) != 1 || box.Ports[0].HostPort == 0 || box.Ports[0].HostIP != "127.0.0.1" || box.Ports[0].GuestPort != 8000 || box.Ports[0].Protocol != "tcp" {
		t.Fatalf("created box's ports %+v, want 127.0.0.1:PORT->8000/tcp with PORT bound", box.Ports)
	}
	bound := box.Ports[0]
	var got Box
	c.do("GET", "/v1/boxes/"+box.ID, nil, &got)
	if len(got.Ports) != 1 || got.Ports[0] != bound {
		t.Errorf("GET ports %+v, want %+v", got.Ports, bound)
	}
	var list BoxList
	c.do("GET", "/v1/boxes", nil, &list)
	if len(list.Boxes) != 1 || len(list.Boxes[0].Ports) != 1 || list.Boxes[0].Ports[0] != bound {
		t.Errorf("list %+v, want the bound port", list.Boxes)
	}

	var r ExecResult
	c.do("POST", "/v1/boxes/"+box.ID+"/exec", ExecRequest{Cmd: []string{"sh", "-c",
		"mkdir -p /srv && echo published through the API > /srv/index.html && cd /srv && nohup python3 -m http.server 8000 >/dev/null 2>&1 &"}}, &r)
	if r.ExitCode != 0 {
		t.Fatalf("start the guest's server: %+v", r)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", bound.HostPort)
	body, lastErr := "", error(nil)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(url)
		if err != nil {
			lastErr = err
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(raw)
		break
	}
	if body != "published through the API\n" {
		t.Errorf("GET %s: %q (last error %v)", url, body, lastErr)
	}

	if st := c.do("POST", "/v1/boxes/"+box.ID+"/stop", nil, &got); st != 200 {
		t.Fatalf("stop: %d", st)
	}
	if len(got.Ports) != 1 || got.Ports[0].HostPort != 0 || got.Ports[0].GuestPort != 8000 {
		t.Errorf("stopped box's ports %+v, want the asked 127.0.0.1:0->8000", got.Ports)
	}
	if _, err := http.Get(url); err == nil {
		t.Errorf("%s still answers after stop", url)
	}

	var p Problem
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage, Ports: []PortSpec{{HostPort: busyPort, GuestPort: 80}}}, &p); st != 409 || p.Code != CodePortInUse {
		t.Errorf("host port in use: %d %+v, want 409 port_in_use", st, p)
	}
	if infos, _ := rt.List(context.Background()); len(infos) != 1 {
		t.Errorf("boxes after the refused create: %+v, want only the first", infos)
	}
}
