package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// defaultPoolSize is the size of a --pool IMAGE without =N.
const defaultPoolSize = 2

// parsePools reads --pool values, IMAGE[=N], into CodeBox pools (a box
// of IMAGE with the default options and an idle Python context kernel;
// see codebox.Pool): boxes the server creates with those options come
// from them.
func parsePools(vals []string) ([]airlock.PoolOptions, error) {
	var out []airlock.PoolOptions
	for _, v := range vals {
		img, n := v, defaultPoolSize
		if i := strings.LastIndexByte(v, '='); i >= 0 {
			var err error
			img = v[:i]
			if n, err = strconv.Atoi(v[i+1:]); err != nil || n < 1 || n > airlock.MaxPoolSize {
				return nil, fmt.Errorf("--pool %q: want IMAGE[=N] with N in 1..%d", v, airlock.MaxPoolSize)
			}
		}
		if img == "" {
			return nil, fmt.Errorf("--pool %q: want IMAGE[=N]", v)
		}
		out = append(out, codebox.Pool(codebox.Options{BoxOptions: airlock.BoxOptions{Image: img}}, n))
	}
	return out, nil
}

// logPools logs once every pool is full or held back by a cap (or says
// why not, after a minute), until ctx ends.
func logPools(ctx context.Context, rt *airlock.Runtime, log *slog.Logger) {
	if len(rt.Pools()) == 0 {
		return
	}
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := rt.WaitPools(wctx)
	for _, p := range rt.Pools() {
		if err == nil && p.Ready < p.Size && p.HeldBack != "" {
			log.Warn("warm pool held back", "image", p.Image, "size", p.Size, "ready", p.Ready, "why", p.HeldBack)
		} else if err == nil {
			log.Info("warm pool ready", "image", p.Image, "size", p.Size, "template", p.Template, "after", time.Since(t0).Round(time.Millisecond))
		} else if ctx.Err() == nil {
			log.Warn("warm pool not full", "image", p.Image, "size", p.Size, "ready", p.Ready, "error", p.LastError)
		}
	}
}
