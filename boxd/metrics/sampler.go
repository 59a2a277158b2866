package metrics

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"sandbox-bridge.io/boxd/errs"
)

// Volume is a directory whose use is reported (/workspace, /tmp) and its limit in bytes (the
// emptyDir's sizeLimit, which a disk-backed volume's statfs does not show; 0: unknown).
type Volume struct {
	Path  string
	Limit uint64
}

// Config of a Sampler. Zero values take the defaults.
type Config struct {
	CgroupRoot string        // /sys/fs/cgroup
	ProcRoot   string        // /proc (self/cgroup, net/dev, the PID fallback)
	Volumes    []Volume      // /workspace and /tmp by default
	Interval   time.Duration // 5 s
	Keep       int           // 120 samples: 10 minutes at 5 s
}

// Sample is the box's use at one moment. Counters (usage, throttling, OOM kills, network) are
// totals since the box's container started; used_cores is the rate over the interval before
// the sample.
type Sample struct {
	Time      time.Time  `json:"time"`
	CPU       CPU        `json:"cpu"`
	Memory    Memory     `json:"memory"`
	Disk      []DiskUse  `json:"disk"`
	Processes Processes  `json:"processes"`
	Network   NetworkUse `json:"network"`
}

type CPU struct {
	UsedCores        float64  `json:"used_cores"`
	UsageSeconds     float64  `json:"usage_seconds"`
	LimitCores       *float64 `json:"limit_cores"`
	ThrottledSeconds float64  `json:"throttled_seconds"`
	ThrottledPeriods uint64   `json:"throttled_periods"`
}

type Memory struct {
	// UsedBytes is the working set: usage less inactive file cache, which the kernel reclaims
	// before it would OOM-kill (what the kubelet counts too).
	UsedBytes  uint64  `json:"used_bytes"`
	LimitBytes *uint64 `json:"limit_bytes"`
	OOMKills   uint64  `json:"oom_kills"`
}

type DiskUse struct {
	Path       string  `json:"path"`
	UsedBytes  uint64  `json:"used_bytes"`
	LimitBytes *uint64 `json:"limit_bytes"`
	// Partial: the volume holds more entries than one count covers; used_bytes is a lower bound.
	Partial bool `json:"partial,omitempty"`
}

type Processes struct {
	Count uint64  `json:"count"`
	Limit *uint64 `json:"limit"`
}

type NetworkUse struct {
	RxBytes uint64 `json:"rx_bytes"`
	TxBytes uint64 `json:"tx_bytes"`
}

// Answer is GET /v1/metrics: the box's use now, and with since, the samples kept after it.
type Answer struct {
	Sample
	Cgroup          string   `json:"cgroup"`
	IntervalSeconds float64  `json:"interval_seconds"`
	History         []Sample `json:"history,omitzero"`
}

// point is what a CPU rate is computed from.
type point struct {
	at    time.Time // monotonic
	cpuNs uint64
}

// Sampler reads the box's use on demand and every Interval into a ring of Keep samples.
type Sampler struct {
	cfg    Config
	cg     *cgroup
	cgErr  error
	mu     sync.Mutex
	ring   []Sample
	points []point // beside ring
	head   int     // next slot
	n      int
	first  point // the reading at start: the base of the first rate
	// disks as last measured, when, and what measuring cost (its cadence follows the cost).
	disks     []DiskUse
	diskAt    time.Time
	diskEvery time.Duration
}

// New returns a sampler; its cgroup is found now. Call Run to keep history.
func New(cfg Config) *Sampler {
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = "/sys/fs/cgroup"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Volumes == nil {
		cfg.Volumes = []Volume{{Path: "/workspace"}, {Path: "/tmp"}}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 120
	}
	s := &Sampler{cfg: cfg, ring: make([]Sample, cfg.Keep), points: make([]point, cfg.Keep), diskEvery: cfg.Interval}
	s.cg, s.cgErr = detectCgroup(cfg.CgroupRoot, filepath.Join(cfg.ProcRoot, "self", "cgroup"))
	if s.cg != nil {
		if u, err := s.cg.read(); err == nil {
			s.first = point{time.Now(), u.cpuUsageNs}
		}
	}
	return s
}

// Version is "v1" or "v2" ("" when no cgroup was found).
func (s *Sampler) Version() string {
	if s.cg == nil {
		return ""
	}
	return "v" + string(rune('0'+s.cg.version))
}

// Run samples every Interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.mu.Lock()
			if smp, p, err := s.sample(s.latest()); err == nil {
				s.ring[s.head], s.points[s.head] = smp, p
				s.head = (s.head + 1) % len(s.ring)
				s.n = min(s.n+1, len(s.ring))
			}
			s.mu.Unlock()
		}
	}
}

// Read answers the box's use now and, with since (non-zero), the samples kept after it.
func (s *Sampler) Read(since time.Time) (Answer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The rate now is over the time since the last sample, or the one before when that is
	// less than a second ago (a rate over a few milliseconds says little).
	base := s.latest()
	if time.Since(base.at) < time.Second && s.n > 1 {
		base = s.points[(s.head-2+2*len(s.ring))%len(s.ring)]
	}
	cur, _, err := s.sample(base)
	if err != nil {
		return Answer{}, err
	}
	a := Answer{Sample: cur, Cgroup: s.Version(), IntervalSeconds: s.cfg.Interval.Seconds()}
	if !since.IsZero() {
		a.History = []Sample{}
		for i := 0; i < s.n; i++ {
			smp := s.ring[(s.head-s.n+i+len(s.ring))%len(s.ring)]
			if smp.Time.After(since) {
				a.History = append(a.History, smp)
			}
		}
	}
	return a, nil
}

// latest is the newest sample's point, or the start's.
func (s *Sampler) latest() point {
	if s.n == 0 {
		return s.first
	}
	return s.points[(s.head-1+len(s.ring))%len(s.ring)]
}

// sample takes one reading, its CPU rate over the time since base. Holds s.mu.
func (s *Sampler) sample(base point) (Sample, point, error) {
	if s.cg == nil {
		return Sample{}, point{}, errs.Internal("the box's cgroup cannot be read: %v", s.cgErr)
	}
	u, err := s.cg.read()
	now := time.Now()
	if err != nil {
		return Sample{}, point{}, errs.Internal("reading the box's cgroup: %v", err)
	}
	p := point{now, u.cpuUsageNs}
	smp := Sample{Time: now.UTC().Truncate(time.Millisecond)}
	if dt := now.Sub(base.at).Seconds(); !base.at.IsZero() && dt > 0 && u.cpuUsageNs >= base.cpuNs {
		smp.CPU.UsedCores = round3(float64(u.cpuUsageNs-base.cpuNs) / 1e9 / dt)
	}
	smp.CPU.UsageSeconds = round3(float64(u.cpuUsageNs) / 1e9)
	smp.CPU.ThrottledSeconds = round3(float64(u.throttledNs) / 1e9)
	smp.CPU.ThrottledPeriods = u.throttledPeriods
	if u.cpuQuota > 0 && u.cpuPeriod > 0 {
		c := round3(float64(u.cpuQuota) / float64(u.cpuPeriod))
		smp.CPU.LimitCores = &c
	}
	smp.Memory.UsedBytes = u.memUsage - min(u.memUsage, u.inactiveFile)
	smp.Memory.LimitBytes = limit(u.memLimit)
	smp.Memory.OOMKills = u.oomKills
	if u.hasPids {
		smp.Processes = Processes{Count: u.pids, Limit: limit(u.pidsMax)}
	} else {
		smp.Processes.Count = countProcs(s.cfg.ProcRoot)
	}
	smp.Network.RxBytes, smp.Network.TxBytes, _ = netBytes(filepath.Join(s.cfg.ProcRoot, "net", "dev"))
	smp.Disk = s.volumes(now)
	return smp, p, nil
}

// volumes answers the volumes' use, counted again when the last count is older than its
// cadence: the interval, or 50 times what the last count took, so counting a big workspace
// costs the box at most 2% of a core.
func (s *Sampler) volumes(now time.Time) []DiskUse {
	if s.disks != nil && now.Sub(s.diskAt) < s.diskEvery {
		return s.disks
	}
	started := time.Now()
	out := make([]DiskUse, 0, len(s.cfg.Volumes))
	for _, v := range s.cfg.Volumes {
		d := DiskUse{Path: v.Path, LimitBytes: limit(v.Limit)}
		if u, err := measure(v.Path); err == nil {
			d.UsedBytes, d.Partial = u.used, u.partial
			if d.LimitBytes == nil {
				d.LimitBytes = limit(u.size)
			}
		}
		out = append(out, d)
	}
	s.disks, s.diskAt = out, now
	s.diskEvery = max(s.cfg.Interval, 50*time.Since(started))
	return out
}

func limit(n uint64) *uint64 {
	if n == 0 {
		return nil
	}
	return &n
}

func round3(f float64) float64 {
	return float64(int64(f*1000+0.5)) / 1000
}
