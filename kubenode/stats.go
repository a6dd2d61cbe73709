package kubenode

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Stats (/stats/summary, /metrics/resource) come from the host: a box is
// its VM process (BoxInfo.PID), so a pod's CPU is that process's CPU time
// (/proc/PID/stat), its memory the process's resident set (/proc/PID/statm:
// the guest's memory as the host backs it) and its disk the writable layer
// (BoxInfo.DiskBytes).

// clockTicks is the unit of /proc CPU times (USER_HZ; 100 on Linux).
const clockTicks = 100

// cpuSample is a CPU time (ns) read at a time, to compute a rate from.
type cpuSample struct {
	at time.Time
	ns uint64
}

// podUsage is one pod's usage now.
type podUsage struct {
	pb       *podBox
	cpuNs    uint64
	nanoCore uint64
	rss      uint64
	disk     uint64
	at       time.Time
}

// procCPU returns the CPU time (ns) and resident memory (bytes) of process
// pid.
func procCPU(pid int) (cpuNs, rss uint64, ok bool) {
	stat := readProc("/proc/" + strconv.Itoa(pid) + "/stat")
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, 0, false
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64) // utime, field 14
	st, _ := strconv.ParseUint(f[12], 10, 64) // stime, field 15
	cpuNs = (ut + st) * (1e9 / clockTicks)
	if m := strings.Fields(readProc("/proc/" + strconv.Itoa(pid) + "/statm")); len(m) > 1 {
		pages, _ := strconv.ParseUint(m[1], 10, 64)
		rss = pages * uint64(os.Getpagesize())
	}
	return cpuNs, rss, true
}

// usage samples every running pod's box.
func (p *Provider) usage(ctx context.Context) []podUsage {
	p.mu.Lock()
	var pbs []*podBox
	for _, pb := range p.pods {
		if pb.box != nil && !pb.exited {
			pbs = append(pbs, pb)
		}
	}
	p.mu.Unlock()
	var out []podUsage
	for _, pb := range pbs {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := pb.box.Info(ictx)
		cancel()
		if err != nil || info.PID == 0 {
			continue
		}
		cpu, rss, ok := procCPU(info.PID)
		if !ok {
			continue
		}
		u := podUsage{pb: pb, cpuNs: cpu, rss: rss, disk: uint64(max(info.DiskBytes, 0)), at: time.Now()}
		p.mu.Lock()
		if p.cpuLast == nil {
			p.cpuLast = map[types.UID]cpuSample{}
		}
		if last, ok := p.cpuLast[pb.pod.UID]; ok && u.at.After(last.at) && cpu >= last.ns {
			u.nanoCore = uint64(float64(cpu-last.ns) / u.at.Sub(last.at).Seconds())
		}
		p.cpuLast[pb.pod.UID] = cpuSample{at: u.at, ns: cpu}
		p.mu.Unlock()
		out = append(out, u)
	}
	// Forget the samples of pods gone.
	p.mu.Lock()
	for uid := range p.cpuLast {
		found := false
		for _, pb := range p.pods {
			if pb.pod.UID == uid {
				found = true
				break
			}
		}
		if !found {
			delete(p.cpuLast, uid)
		}
	}
	p.mu.Unlock()
	return out
}

// nodeUsage reads the host's CPU time (ns, all CPUs, busy) and memory.
func nodeUsage() (cpuNs, memTotal, memAvail uint64) {
	for _, line := range strings.Split(readProc("/proc/stat"), "\n") {
		if f := strings.Fields(line); len(f) > 8 && f[0] == "cpu" {
			for i, v := range f[1:] {
				if i == 3 || i == 4 { // idle, iowait
					continue
				}
				n, _ := strconv.ParseUint(v, 10, 64)
				cpuNs += n * (1e9 / clockTicks)
			}
			break
		}
	}
	for _, line := range strings.Split(readProc("/proc/meminfo"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			memTotal = kb << 10
		case "MemAvailable:":
			memAvail = kb << 10
		}
	}
	return
}

// GetStatsSummary serves /stats/summary: the node's CPU, memory and the
// airlock home's file system, and per pod (and its one container) the
// CPU, memory and disk of its box.
func (p *Provider) GetStatsSummary(ctx context.Context) (*statsv1alpha1.Summary, error) {
	now := metav1.Now()
	u64 := func(v uint64) *uint64 { return &v }
	cpuNs, total, avail := nodeUsage()
	p.mu.Lock()
	var nodeRate uint64
	if p.nodeCPULast.at.Before(now.Time) && !p.nodeCPULast.at.IsZero() && cpuNs >= p.nodeCPULast.ns {
		nodeRate = uint64(float64(cpuNs-p.nodeCPULast.ns) / now.Sub(p.nodeCPULast.at).Seconds())
	}
	p.nodeCPULast = cpuSample{at: now.Time, ns: cpuNs}
	p.mu.Unlock()
	s := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{
		NodeName:  p.nodeName,
		StartTime: metav1.NewTime(p.started),
		CPU:       &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: u64(cpuNs), UsageNanoCores: u64(nodeRate)},
		Memory: &statsv1alpha1.MemoryStats{Time: now, AvailableBytes: u64(avail), UsageBytes: u64(total - avail),
			WorkingSetBytes: u64(total - avail)},
	}}
	var st unix.Statfs_t
	if unix.Statfs(p.rt.Home(), &st) == nil {
		bs := uint64(st.Bsize)
		s.Node.Fs = &statsv1alpha1.FsStats{Time: now, AvailableBytes: u64(st.Bavail * bs), CapacityBytes: u64(st.Blocks * bs),
			UsedBytes: u64((st.Blocks - st.Bfree) * bs), InodesFree: u64(st.Ffree), Inodes: u64(st.Files), InodesUsed: u64(st.Files - st.Ffree)}
	}
	for _, u := range p.usage(ctx) {
		pod := u.pb.pod
		t := metav1.NewTime(u.at)
		cpu := &statsv1alpha1.CPUStats{Time: t, UsageCoreNanoSeconds: u64(u.cpuNs), UsageNanoCores: u64(u.nanoCore)}
		mem := &statsv1alpha1.MemoryStats{Time: t, UsageBytes: u64(u.rss), WorkingSetBytes: u64(u.rss), RSSBytes: u64(u.rss)}
		fs := &statsv1alpha1.FsStats{Time: t, UsedBytes: u64(u.disk)}
		p.mu.Lock()
		started := u.pb.started
		p.mu.Unlock()
		s.Pods = append(s.Pods, statsv1alpha1.PodStats{
			PodRef:    statsv1alpha1.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)},
			StartTime: metav1.NewTime(started),
			Containers: []statsv1alpha1.ContainerStats{{Name: pod.Spec.Containers[0].Name, StartTime: metav1.NewTime(started),
				CPU: cpu, Memory: mem, Rootfs: fs}},
			CPU: cpu, Memory: mem, EphemeralStorage: fs,
		})
	}
	return s, nil
}

// GetMetricsResource serves /metrics/resource (what metrics-server
// scrapes): the node's and each container's CPU time and working set, in
// the kubelet's metric names.
func (p *Provider) GetMetricsResource(ctx context.Context) ([]*dto.MetricFamily, error) {
	nowMs := time.Now().UnixMilli()
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	str := func(s string) *string { return &s }
	lbl := func(kv ...string) []*dto.LabelPair {
		var out []*dto.LabelPair
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, &dto.LabelPair{Name: str(kv[i]), Value: str(kv[i+1])})
		}
		return out
	}
	metric := func(v float64, isCounter bool, labels []*dto.LabelPair) *dto.Metric {
		m := &dto.Metric{Label: labels, TimestampMs: &nowMs}
		if isCounter {
			m.Counter = &dto.Counter{Value: &v}
		} else {
			m.Gauge = &dto.Gauge{Value: &v}
		}
		return m
	}
	cpuNs, total, avail := nodeUsage()
	fams := []*dto.MetricFamily{
		{Name: str("node_cpu_usage_seconds_total"), Help: str("Cumulative CPU time of the node, in core-seconds"), Type: &counter,
			Metric: []*dto.Metric{metric(float64(cpuNs)/1e9, true, nil)}},
		{Name: str("node_memory_working_set_bytes"), Help: str("Working set of the node, in bytes"), Type: &gauge,
			Metric: []*dto.Metric{metric(float64(total-avail), false, nil)}},
	}
	ccpu := &dto.MetricFamily{Name: str("container_cpu_usage_seconds_total"), Help: str("Cumulative CPU time of the container (its box), in core-seconds"), Type: &counter}
	cmem := &dto.MetricFamily{Name: str("container_memory_working_set_bytes"), Help: str("Working set of the container (its box's resident memory), in bytes"), Type: &gauge}
	pcpu := &dto.MetricFamily{Name: str("pod_cpu_usage_seconds_total"), Help: str("Cumulative CPU time of the pod, in core-seconds"), Type: &counter}
	pmem := &dto.MetricFamily{Name: str("pod_memory_working_set_bytes"), Help: str("Working set of the pod, in bytes"), Type: &gauge}
	for _, u := range p.usage(ctx) {
		pod := u.pb.pod
		cl := lbl("container", pod.Spec.Containers[0].Name, "namespace", pod.Namespace, "pod", pod.Name)
		pl := lbl("namespace", pod.Namespace, "pod", pod.Name)
		ccpu.Metric = append(ccpu.Metric, metric(float64(u.cpuNs)/1e9, true, cl))
		cmem.Metric = append(cmem.Metric, metric(float64(u.rss), false, cl))
		pcpu.Metric = append(pcpu.Metric, metric(float64(u.cpuNs)/1e9, true, pl))
		pmem.Metric = append(pmem.Metric, metric(float64(u.rss), false, pl))
	}
	return append(fams, ccpu, cmem, pcpu, pmem), nil
}
