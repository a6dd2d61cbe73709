package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-run/airlock"
)

// poolCollector reports the runtime's warm pools at each scrape.
type poolCollector struct {
	rt                   *airlock.Runtime
	size, ready, claimed *prometheus.Desc
}

// SetPools adds the warm pools of rt (airlock.Options.Pool) to the
// metrics: airlock_pool_size, airlock_pool_ready and
// airlock_pool_claims_total, labelled by image and pool key.
func (m *Metrics) SetPools(rt *airlock.Runtime) {
	if m == nil || len(rt.Pools()) == 0 {
		return
	}
	l := []string{"image", "key"}
	m.reg.MustRegister(&poolCollector{rt: rt,
		size:    prometheus.NewDesc("airlock_pool_size", "Boxes a warm pool keeps ready (its target).", l, nil),
		ready:   prometheus.NewDesc("airlock_pool_ready", "Boxes of a warm pool ready to be taken.", l, nil),
		claimed: prometheus.NewDesc("airlock_pool_claims_total", "Boxes taken from a warm pool.", l, nil)})
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.size
	ch <- c.ready
	ch <- c.claimed
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.rt.Pools() {
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(p.Size), p.Image, p.Key)
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, float64(p.Ready), p.Image, p.Key)
		ch <- prometheus.MustNewConstMetric(c.claimed, prometheus.CounterValue, float64(p.Claimed), p.Image, p.Key)
	}
}
