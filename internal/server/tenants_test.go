package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/tenant"
)

// TestTenantOwn: a tenant's create is labelled with its name, its box name
// and named volumes go into its namespace (host directories do not), the
// caller's options are not changed under it, and no one may set the
// label; view shows the tenant its names and no tenant label.
func TestTenantOwn(t *testing.T) {
	ctx := context.WithValue(context.Background(), tenantCtxKey{}, &tenant.Tenant{Name: "alice"})
	labels := map[string]string{"team": "a"}
	vols := []airlock.Volume{{Source: "data", Target: "/data"}, {Source: "/srv/x", Target: "/x"}}
	o := airlock.BoxOptions{Name: "web", Labels: labels, Volumes: vols}
	if err := own(ctx, &o); err != nil {
		t.Fatal(err)
	}
	if o.Name != "alice.web" || o.Labels[TenantLabel] != "alice" || o.Labels["team"] != "a" ||
		o.Volumes[0].Source != "alice.data" || o.Volumes[1].Source != "/srv/x" {
		t.Errorf("own: %+v", o)
	}
	if _, ok := labels[TenantLabel]; ok || vols[0].Source != "data" {
		t.Error("own changed the caller's labels or volumes")
	}
	for _, c := range []context.Context{ctx, context.Background()} {
		bad := airlock.BoxOptions{Labels: map[string]string{TenantLabel: "bob"}}
		if err := own(c, &bad); err == nil {
			t.Errorf("tenant %s set the tenant label", TenantName(c))
		}
	}
	b := view(ctx, Box{Name: "alice.web", Labels: map[string]string{TenantLabel: "alice"},
		Volumes: []VolumeSpec{{Source: "alice.data", Target: "/data"}, {Source: "/srv/x", Target: "/x"}}})
	if b.Name != "web" || b.Labels != nil || b.Volumes[0].Source != "data" || b.Volumes[1].Source != "/srv/x" {
		t.Errorf("view: %+v", b)
	}
	if a := view(context.Background(), Box{Name: "alice.web", Labels: map[string]string{TenantLabel: "alice"}}); a.Name != "alice.web" || a.Labels[TenantLabel] != "alice" {
		t.Errorf("the admin's view: %+v, want names and labels as stored", a)
	}
}

// TestTenantMCPSessionBound: an MCP session id is its opener's: another
// tenant, or the admin, gets 404 on it, and a tenant gets 404 on a
// session the server never opened for it.
func TestTenantMCPSessionBound(t *testing.T) {
	mcp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Session-Id") == "" {
			w.Header().Set("Mcp-Session-Id", "s-"+TenantName(r.Context()))
		}
		w.WriteHeader(200)
	})
	s := &Server{}
	h := s.mcpTenants(mcp)
	alice := &tenant.Tenant{Name: "alice"}
	do := func(t *tenant.Tenant, session string) int {
		r := httptest.NewRequest("POST", "/mcp", nil)
		if t != nil {
			r = r.WithContext(context.WithValue(r.Context(), tenantCtxKey{}, t))
		}
		if session != "" {
			r.Header.Set("Mcp-Session-Id", session)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	do(alice, "")
	do(nil, "")
	for _, c := range []struct {
		who     *tenant.Tenant
		session string
		want    int
	}{
		{alice, "s-alice", 200},
		{&tenant.Tenant{Name: "bob"}, "s-alice", 404},
		{nil, "s-alice", 404},
		{alice, "s-admin", 404},
		{nil, "s-admin", 200},
		{alice, "never-opened", 404},
	} {
		if got := do(c.who, c.session); got != c.want {
			t.Errorf("%s on session %s: %d, want %d", TenantName(context.WithValue(context.Background(), tenantCtxKey{}, c.who)), c.session, got, c.want)
		}
	}
}
