package metrics

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// write lays out files (path -> content) under dir.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A container's cgroup v1 as runc mounts it (each controller's own cgroup at its mount's root,
// /proc/self/cgroup naming the full path), from a box on the real node.
var v1Files = map[string]string{
	"cgroup/cpu/cpu.cfs_quota_us":         "50000\n",
	"cgroup/cpu/cpu.cfs_period_us":        "100000\n",
	"cgroup/cpu/cpu.stat":                 "nr_periods 1204\nnr_throttled 37\nthrottled_time 2500000000\nnr_bursts 0\nburst_time 0\n",
	"cgroup/cpuacct/cpuacct.usage":        "12345678901\n",
	"cgroup/memory/memory.usage_in_bytes": "104857600\n",
	"cgroup/memory/memory.limit_in_bytes": "536870912\n",
	"cgroup/memory/memory.stat":           "cache 20971520\nrss 73400320\ntotal_cache 20971520\ntotal_rss 73400320\ntotal_inactive_file 10485760\ntotal_active_file 10485760\n",
	"cgroup/memory/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
	"cgroup/pids/pids.current":            "7\n",
	"cgroup/pids/pids.max":                "max\n",
	"proc/self/cgroup":                    "8:pids:/kubepods/pod1/abc\n4:memory:/kubepods/pod1/abc\n2:cpuacct:/kubepods/pod1/abc\n1:cpu:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\n",
	"proc/net/dev": "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n" +
		"    lo:    5000      10    0    0    0     0          0         0     5000      10    0    0    0     0       0          0\n" +
		"  eth0: 155971370    9209    0    0    0     0          0         0 156219479    9464    0    0    0     0       0          0\n",
}

// cgroup v2 with a cgroup namespace: the box's cgroup is the root.
var v2Files = map[string]string{
	"cgroup/cgroup.controllers": "cpuset cpu io memory pids\n",
	"cgroup/cpu.stat":           "usage_usec 2000000\nuser_usec 1500000\nsystem_usec 500000\nnr_periods 50\nnr_throttled 5\nthrottled_usec 750000\n",
	"cgroup/cpu.max":            "200000 100000\n",
	"cgroup/memory.current":     "209715200\n",
	"cgroup/memory.max":         "max\n",
	"cgroup/memory.stat":        "anon 104857600\nfile 104857600\ninactive_file 52428800\nactive_file 52428800\n",
	"cgroup/memory.events":      "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
	"cgroup/pids.current":       "3\n",
	"cgroup/pids.max":           "1024\n",
	"proc/self/cgroup":          "0::/\n",
	"proc/net/dev":              "Inter-|\n face |\n  eth0: 100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0\n  eth1: 1 1 0 0 0 0 0 0 2 2 0 0 0 0 0 0\n",
}

func TestCgroupV1(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, v1Files)
	cg, err := detectCgroup(filepath.Join(dir, "cgroup"), filepath.Join(dir, "proc/self/cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	if cg.version != 1 {
		t.Fatalf("version %d", cg.version)
	}
	u, err := cg.read()
	if err != nil {
		t.Fatal(err)
	}
	want := cgroupUse{
		cpuUsageNs: 12345678901, throttledNs: 2500000000, throttledPeriods: 37, cpuQuota: 50000, cpuPeriod: 100000,
		memUsage: 104857600, memLimit: 536870912, inactiveFile: 10485760, oomKills: 2, pids: 7, pidsMax: 0, hasPids: true,
	}
	if u != want {
		t.Fatalf("read\n%+v, want\n%+v", u, want)
	}
	rx, tx, err := netBytes(filepath.Join(dir, "proc/net/dev"))
	if err != nil || rx != 155971370 || tx != 156219479 {
		t.Fatalf("net %d %d %v (loopback must not count)", rx, tx, err)
	}
}

// On a host (a process not in a container, e.g. boxd's own tests) the controllers' mounts
// hold the whole hierarchy and the process's cgroup is below them, at its path.
func TestCgroupV1BelowMount(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"proc/self/cgroup": "5:memory:/a/b\n3:cpu,cpuacct:/a/b\n"}
	for p, c := range v1Files {
		if strings.HasPrefix(p, "cgroup/memory/") {
			files["cgroup/memory/a/b/"+filepath.Base(p)] = c
			files["cgroup/memory/"+filepath.Base(p)] = "0\n" // the root's: not ours
		}
		if strings.HasPrefix(p, "cgroup/cpu/") || strings.HasPrefix(p, "cgroup/cpuacct/") {
			files["cgroup/cpu,cpuacct/a/b/"+filepath.Base(p)] = c
		}
	}
	write(t, dir, files)
	cg, err := detectCgroup(filepath.Join(dir, "cgroup"), filepath.Join(dir, "proc/self/cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	u, err := cg.read()
	if err != nil {
		t.Fatal(err)
	}
	if u.memUsage != 104857600 || u.cpuUsageNs != 12345678901 || u.cpuQuota != 50000 || u.hasPids {
		t.Fatalf("read %+v", u)
	}
}

func TestCgroupV1NoLimits(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for p, c := range v1Files {
		files[p] = c
	}
	files["cgroup/cpu/cpu.cfs_quota_us"] = "-1\n"
	files["cgroup/memory/memory.limit_in_bytes"] = "9223372036854771712\n"
	files["cgroup/memory/memory.oom_control"] = "oom_kill_disable 0\nunder_oom 0\n" // a kernel before 4.13
	write(t, dir, files)
	s := New(Config{CgroupRoot: filepath.Join(dir, "cgroup"), ProcRoot: filepath.Join(dir, "proc"), Volumes: []Volume{}})
	a, err := s.Read(time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if a.CPU.LimitCores != nil || a.Memory.LimitBytes != nil || a.Memory.OOMKills != 0 || a.Processes.Limit != nil {
		t.Fatalf("limits %+v", a.Sample)
	}
}

func TestCgroupV2(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, v2Files)
	s := New(Config{CgroupRoot: filepath.Join(dir, "cgroup"), ProcRoot: filepath.Join(dir, "proc"), Volumes: []Volume{}})
	if s.Version() != "v2" {
		t.Fatalf("version %q (%v)", s.Version(), s.cgErr)
	}
	a, err := s.Read(time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	c, m, p := a.CPU, a.Memory, a.Processes
	if c.UsageSeconds != 2 || c.ThrottledSeconds != 0.75 || c.ThrottledPeriods != 5 || c.LimitCores == nil || *c.LimitCores != 2 {
		t.Fatalf("cpu %+v", c)
	}
	if m.UsedBytes != 157286400 || m.LimitBytes != nil || m.OOMKills != 1 {
		t.Fatalf("memory %+v", m)
	}
	if p.Count != 3 || p.Limit == nil || *p.Limit != 1024 {
		t.Fatalf("processes %+v", p)
	}
	if a.Network.RxBytes != 101 || a.Network.TxBytes != 202 {
		t.Fatalf("network %+v", a.Network)
	}
}

// The rate is the counter's growth over the time between readings, and the ring keeps the
// newest samples, oldest first, after since.
func TestSamplerRatesAndHistory(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, v2Files)
	s := New(Config{CgroupRoot: filepath.Join(dir, "cgroup"), ProcRoot: filepath.Join(dir, "proc"), Volumes: []Volume{}, Keep: 3})
	// Three samples taken 1 s apart (as Run would, faster), each 0.5 s of CPU more.
	start := time.Now()
	for i := 1; i <= 4; i++ {
		s.first.at = s.first.at.Add(-time.Second) // the start reading lies 1 s further back
		for j := range s.points {
			s.points[j].at = s.points[j].at.Add(-time.Second)
		}
		write(t, dir, map[string]string{"cgroup/cpu.stat": "usage_usec " + strconv.Itoa(2000000+i*500000) + "\nnr_throttled 0\nthrottled_usec 0\n"})
		smp, p, err := s.sample(s.latest())
		if err != nil {
			t.Fatal(err)
		}
		if smp.CPU.UsedCores < 0.45 || smp.CPU.UsedCores > 0.5 {
			t.Fatalf("sample %d: %v cores, want ~0.5", i, smp.CPU.UsedCores)
		}
		s.ring[s.head], s.points[s.head] = smp, p
		s.head = (s.head + 1) % len(s.ring)
		s.n = min(s.n+1, len(s.ring))
	}
	a, err := s.Read(start.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.History) != 3 {
		t.Fatalf("history %d, want the 3 kept", len(a.History))
	}
	for i, h := range a.History {
		want := float64(2000000+(i+2)*500000) / 1e6
		if h.CPU.UsageSeconds != want {
			t.Fatalf("history[%d] usage %v, want %v (oldest first)", i, h.CPU.UsageSeconds, want)
		}
	}
	if a2, _ := s.Read(time.Now().Add(time.Hour)); a2.History == nil || len(a2.History) != 0 {
		t.Fatalf("history after the last sample: %v, want []", a2.History)
	}
	if a3, _ := s.Read(time.Time{}); a3.History != nil {
		t.Fatal("no since, no history")
	}
}

// A disk-backed volume is counted by walking it: allocated blocks (a sparse file's holes are
// free), hard links once, symlinks not followed.
func TestVolumeWalk(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = 1
	}
	if err := os.WriteFile(filepath.Join(dir, "a"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "a-link")); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Symlink("/usr", filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	u, err := walk(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.used < 1<<20 || u.used > 1<<20+64<<10 {
		t.Fatalf("used %d, want 1 MiB and a little (the directory, the symlink)", u.used)
	}
}

// The cgroup this test runs in, as found on the machine: its CPU counter grows while the test
// burns CPU (whatever the cgroup version and layout here).
func TestLiveCgroup(t *testing.T) {
	s := New(Config{Volumes: []Volume{{Path: t.TempDir(), Limit: 1 << 20}}})
	if s.cg == nil {
		t.Skipf("no readable cgroup here: %v", s.cgErr)
	}
	before, err := s.Read(time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := s.Read(time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if grown := after.CPU.UsageSeconds - before.CPU.UsageSeconds; grown < 0.1 {
		t.Fatalf("%s: CPU usage grew %.3f s while the test burned 0.3 s", s.Version(), grown)
	}
	if after.Memory.UsedBytes == 0 || len(after.Disk) != 1 || after.Disk[0].LimitBytes == nil || *after.Disk[0].LimitBytes != 1<<20 {
		t.Fatalf("reading %+v", after.Sample)
	}
}
