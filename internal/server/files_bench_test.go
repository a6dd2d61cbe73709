package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkFilesAPI compares, per iteration on one box, moving 32 MiB
// through the REST files endpoints (PUT and GET /files) with the library
// calls they wrap (Box.WriteFileFrom, Box.OpenFile), and a Stat round trip
// (GET /files/stat against Box.Stat). Not a timed test:
//
//	go test -run '^$' -bench FilesAPI -benchtime 5x ./internal/server
func BenchmarkFilesAPI(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	id := env.box.ID()
	data := make([]byte, 32<<20)
	rand.Read(data)
	url := env.ts.URL + "/v1/boxes/" + id
	get := func(u string) error {
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	times := map[string][]time.Duration{}
	timed := func(name string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		times[name] = append(times[name], time.Since(t0))
	}
	for i := 0; i < b.N; i++ {
		timed("rest-put", func() error {
			req, _ := http.NewRequest("PUT", url+"/files?path=/tmp/bench.bin", bytes.NewReader(data))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		})
		timed("library-write", func() error { return env.box.WriteFileFrom(ctx, "/tmp/bench2.bin", bytes.NewReader(data), 0) })
		timed("rest-get", func() error { return get(url + "/files?path=/tmp/bench.bin") })
		timed("library-read", func() error {
			rc, _, err := env.box.OpenFile(ctx, "/tmp/bench2.bin")
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(io.Discard, rc)
			return err
		})
		for j := 0; j < 20; j++ {
			timed("rest-stat", func() error { return get(url + "/files/stat?path=/tmp/bench.bin") })
			timed("library-stat", func() error { _, err := env.box.Stat(ctx, "/tmp/bench.bin"); return err })
		}
	}
	mibs := func(d time.Duration) float64 { return float64(len(data)) / (1 << 20) / d.Seconds() }
	for _, n := range []string{"rest-put", "library-write", "rest-get", "library-read"} {
		b.ReportMetric(mibs(median(times[n])), n+"-MiB/s")
	}
	for _, n := range []string{"rest-stat", "library-stat"} {
		b.ReportMetric(float64(median(times[n]).Microseconds())/1000, n+"-ms")
	}
}
