package server

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock-run/airlock"
)

// Metrics are the server's Prometheus metrics, every family prefixed
// airlock_. It implements airlock.Observer, so the library's events (box
// starts, execs, VM deaths, image pulls, whoever caused them) are counted
// once; pass it as airlock.Options.Observer when opening the runtime and
// as Config.Metrics. A nil *Metrics records nothing.
type Metrics struct {
	reg *prometheus.Registry

	boxStarts     *prometheus.CounterVec
	boxStartSecs  prometheus.Histogram
	execs         *prometheus.CounterVec
	execSecs      prometheus.Histogram
	execFailures  *prometheus.CounterVec
	execOutBytes  prometheus.Counter
	vmDeaths      *prometheus.CounterVec
	imagePulls    *prometheus.CounterVec
	httpRequests  *prometheus.CounterVec
	httpSecs      *prometheus.HistogramVec
	boxesByState  *prometheus.GaugeVec
	runtimeSource func(context.Context) ([]airlock.BoxInfo, error)
}

// NewMetrics creates the metric families. version labels
// airlock_build_info.
func NewMetrics(version string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "airlock_build_info", Help: "Always 1; labels name the build."},
		[]string{"version", "goversion"})
	build.WithLabelValues(version, runtime.Version()).Set(1)
	f(build)
	m.boxStarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_box_starts_total", Help: "Box boots, by result (ok, error)."}, []string{"result"})
	m.boxStartSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_box_start_seconds", Help: "Time from Start to a ready agent (cold boots).",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 120}})
	m.execs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_execs_total", Help: "Execs that ended, by result (ok: ran to an exit status; timeout; error: could not be carried out)."}, []string{"result"})
	m.execSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "airlock_exec_seconds", Help: "Exec duration, host side.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}})
	m.execFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_exec_failures_total", Help: "Execs that could not be carried out, by cause (box_died, box_not_running, box_paused, canceled, timeout, other)."}, []string{"cause"})
	m.execOutBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_exec_output_bytes_total", Help: "Bytes of exec output (stdout and stderr) received from guests."})
	m.vmDeaths = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_vm_deaths_total", Help: "Box VMs that ended unexpectedly, by cause (kernel_panic, out_of_memory, agent_failed, qemu_exited, other)."}, []string{"cause"})
	m.imagePulls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_image_pulls_total", Help: "Image pulls, by result (ok, error)."}, []string{"result"})
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_http_requests_total", Help: "API requests, by method, route and status."}, []string{"method", "route", "status"})
	m.httpSecs = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "airlock_http_request_seconds", Help: "API request duration, by route.",
		Buckets: prometheus.DefBuckets}, []string{"route"})
	m.boxesByState = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "airlock_boxes", Help: "Boxes of the served home, by state (at the last scrape)."}, []string{"state"})
	for _, c := range []prometheus.Collector{m.boxStarts, m.boxStartSecs, m.execs, m.execSecs, m.execFailures, m.execOutBytes,
		m.vmDeaths, m.imagePulls, m.httpRequests, m.httpSecs, m.boxesByState} {
		f(c)
	}
	for _, st := range []airlock.BoxState{airlock.BoxCreated, airlock.BoxRunning, airlock.BoxStopped} {
		m.boxesByState.WithLabelValues(string(st))
	}
	m.boxStarts.WithLabelValues("ok")
	m.execs.WithLabelValues("ok")
	return m
}

// Handler serves the metrics in the Prometheus text format. When a runtime
// source is set (SetRuntime), each scrape first refreshes airlock_boxes.
func (m *Metrics) Handler() http.Handler {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.runtimeSource != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			if infos, err := m.runtimeSource(ctx); err == nil {
				m.boxStates(infos)
			}
			cancel()
		}
		h.ServeHTTP(w, r)
	})
}

// SetRuntime makes each scrape count the boxes of rt by state.
func (m *Metrics) SetRuntime(rt *airlock.Runtime) { m.runtimeSource = rt.List }

func (m *Metrics) boxStates(infos []airlock.BoxInfo) {
	if m == nil {
		return
	}
	n := map[airlock.BoxState]int{airlock.BoxCreated: 0, airlock.BoxRunning: 0, airlock.BoxStopped: 0}
	for _, i := range infos {
		n[i.State]++
	}
	for st, c := range n {
		m.boxesByState.WithLabelValues(string(st)).Set(float64(c))
	}
}

func (m *Metrics) request(method, route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	m.httpRequests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	m.httpSecs.WithLabelValues(route).Observe(d.Seconds())
}

// BoxStarted implements airlock.Observer.
func (m *Metrics) BoxStarted(e airlock.BoxStartEvent) {
	if m == nil {
		return
	}
	if e.Err != nil {
		m.boxStarts.WithLabelValues("error").Inc()
		return
	}
	m.boxStarts.WithLabelValues("ok").Inc()
	m.boxStartSecs.Observe(e.Duration.Seconds())
}

// ExecEnded implements airlock.Observer.
func (m *Metrics) ExecEnded(e airlock.ExecEvent) {
	if m == nil {
		return
	}
	m.execSecs.Observe(e.Duration.Seconds())
	m.execOutBytes.Add(float64(e.OutputBytes))
	switch {
	case e.Err != nil:
		m.execs.WithLabelValues("error").Inc()
		m.execFailures.WithLabelValues(failureCause(e.Err)).Inc()
	case e.TimedOut:
		m.execs.WithLabelValues("timeout").Inc()
	default:
		m.execs.WithLabelValues("ok").Inc()
	}
}

// BoxDied implements airlock.Observer.
func (m *Metrics) BoxDied(e airlock.BoxDiedEvent) {
	if m == nil {
		return
	}
	m.vmDeaths.WithLabelValues(deathCause(e.Cause)).Inc()
}

// deathCause turns DiedError.Cause (free text with pids and panic
// messages) into a bounded label.
func deathCause(cause string) string {
	switch {
	case strings.Contains(cause, "kernel panic"):
		return "kernel_panic"
	case strings.Contains(cause, "out of memory"):
		return "out_of_memory"
	case strings.Contains(cause, "agent"):
		return "agent_failed"
	case strings.Contains(cause, "QEMU"):
		return "qemu_exited"
	}
	return "other"
}

// ImagePulled implements airlock.Observer.
func (m *Metrics) ImagePulled(e airlock.ImagePullEvent) {
	if m == nil {
		return
	}
	if e.Err != nil {
		m.imagePulls.WithLabelValues("error").Inc()
		return
	}
	m.imagePulls.WithLabelValues("ok").Inc()
}

func failureCause(err error) string {
	switch {
	case errors.Is(err, airlock.ErrBoxDied):
		return "box_died"
	case errors.Is(err, airlock.ErrBoxNotRunning):
		return "box_not_running"
	case errors.Is(err, airlock.ErrBoxPaused):
		return "box_paused"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}
