package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-run/airlock"
)

// poolCollector reports the runtime's warm pools at each scrape.
type poolCollector struct {
	rt                                      *airlock.Runtime
	size, ready, claimed, evicted, heldBack *prometheus.Desc
}

// SetPools adds the warm pools of rt (airlock.Options.Pool) to the
// metrics: airlock_pool_size, airlock_pool_ready,
// airlock_pool_claims_total, airlock_pool_evictions_total and
// airlock_pool_held_back, labelled by image and pool key.
func (m *Metrics) SetPools(rt *airlock.Runtime) {
	if m == nil || len(rt.Pools()) == 0 {
		return
	}
	l := []string{"image", "key"}
	m.reg.MustRegister(&poolCollector{rt: rt,
		size:     prometheus.NewDesc("airlock_pool_size", "Boxes a warm pool keeps ready (its target).", l, nil),
		ready:    prometheus.NewDesc("airlock_pool_ready", "Boxes of a warm pool ready to be taken.", l, nil),
		claimed:  prometheus.NewDesc("airlock_pool_claims_total", "Boxes taken from a warm pool.", l, nil),
		evicted:  prometheus.NewDesc("airlock_pool_evictions_total", "Ready pool boxes removed to make room for a box started past a cap.", l, nil),
		heldBack: prometheus.NewDesc("airlock_pool_held_back", "1 while a cap (host caps, --max-boxes) keeps a warm pool from filling.", l, nil)})
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.size
	ch <- c.ready
	ch <- c.claimed
	ch <- c.evicted
	ch <- c.heldBack
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.rt.Pools() {
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(p.Size), p.Image, p.Key)
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, float64(p.Ready), p.Image, p.Key)
		ch <- prometheus.MustNewConstMetric(c.claimed, prometheus.CounterValue, float64(p.Claimed), p.Image, p.Key)
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(p.Evicted), p.Image, p.Key)
		held := 0.0
		if p.HeldBack != "" {
			held = 1
		}
		ch <- prometheus.MustNewConstMetric(c.heldBack, prometheus.GaugeValue, held, p.Image, p.Key)
	}
}
