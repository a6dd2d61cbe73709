package image_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/airlock-run/airlock/internal/image"
)

func TestCheckAddrTravelsInTheContext(t *testing.T) {
	if image.CheckAddrOf(context.Background()) != nil {
		t.Fatal("a check in a bare context")
	}
	refused := errors.New("refused")
	ctx := image.WithCheckAddr(context.Background(), func(host string, addr netip.Addr) error { return refused })
	f := image.CheckAddrOf(ctx)
	if f == nil || f("registry", netip.MustParseAddr("10.0.0.1")) != refused {
		t.Error("the check put in the context is not the one read from it")
	}
}
