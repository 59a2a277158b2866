// Package metrics reads what the box uses — CPU, memory, processes from its own cgroup (v1 or
// v2, detected), disk from /workspace and /tmp, network bytes from /proc/net/dev — and keeps
// the last 10 minutes of it at 5 s resolution (Sampler). Inside a container /sys/fs/cgroup is
// the container's own cgroup, so nothing here needs a privilege or the node.
package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cgroupUse is one reading of the cgroup's counters. Cumulative counters only: rates are the
// sampler's business.
type cgroupUse struct {
	cpuUsageNs       uint64
	throttledNs      uint64
	throttledPeriods uint64
	// cpuQuota / cpuPeriod in microseconds; quota < 0: no limit.
	cpuQuota, cpuPeriod int64
	memUsage            uint64
	// memLimit 0: no limit.
	memLimit     uint64
	inactiveFile uint64
	oomKills     uint64
	pids         uint64
	// pidsMax 0: no limit.
	pidsMax uint64
	// hasPids: the pids controller was there (else the sampler counts /proc).
	hasPids bool
}

// cgroup is where the box's own cgroup files are: v2 one directory, v1 one per controller.
type cgroup struct {
	version int
	// dirs by controller ("cpu", "cpuacct", "memory", "pids"); v2: all the same directory.
	dirs map[string]string
}

// unlimited is the v1 "no limit" (PAGE_COUNTER_MAX pages, rounded): anything at or above it.
const unlimited = uint64(1) << 62

// detectCgroup finds the box's cgroup under root (normally /sys/fs/cgroup), reading which one
// the process is in from procSelfCgroup (/proc/self/cgroup). v2 when root holds
// cgroup.controllers. For each controller the directory is root[/controller]/<path> when that
// exists (a process on a host, or a cgroup namespace shows the full path), else root[/controller]
// itself (a container without a cgroup namespace, whose own cgroup is mounted there).
func detectCgroup(root, procSelfCgroup string) (*cgroup, error) {
	paths, err := selfCgroups(procSelfCgroup)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		dir := pick([]string{filepath.Join(root, paths[""]), root}, "memory.current", "cpu.stat")
		if dir == "" {
			return nil, fmt.Errorf("cgroup v2 at %s: neither %s nor it holds memory.current or cpu.stat", root, filepath.Join(root, paths[""]))
		}
		return &cgroup{version: 2, dirs: map[string]string{"cpu": dir, "cpuacct": dir, "memory": dir, "pids": dir}}, nil
	}
	cg := &cgroup{version: 1, dirs: map[string]string{}}
	for ctrl, file := range map[string]string{"cpu": "cpu.cfs_quota_us", "cpuacct": "cpuacct.usage", "memory": "memory.usage_in_bytes", "pids": "pids.current"} {
		var cands []string
		for _, mount := range mountNames(paths, ctrl) {
			cands = append(cands, filepath.Join(root, mount, paths[ctrl]), filepath.Join(root, mount))
		}
		if dir := pick(cands, file); dir != "" {
			cg.dirs[ctrl] = dir
		}
	}
	if cg.dirs["memory"] == "" || cg.dirs["cpuacct"] == "" {
		return nil, fmt.Errorf("no cgroup v1 memory and cpuacct controllers under %s", root)
	}
	return cg, nil
}

// selfCgroups parses /proc/self/cgroup: "N:controllers:path" lines, into path by controller
// ("" for the v2 line, "0::/path"); a line of several controllers ("cpu,cpuacct") gives each,
// and the joined name too (the mount may be named after it).
func selfCgroups(file string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		paths[parts[1]] = parts[2]
		for _, c := range strings.Split(parts[1], ",") {
			paths[c] = parts[2]
		}
	}
	return paths, nil
}

// mountNames are the names a v1 controller's hierarchy may be mounted under: its own, and the
// joined name of the line it is on ("cpu,cpuacct").
func mountNames(paths map[string]string, ctrl string) []string {
	names := []string{ctrl}
	for k := range paths {
		if strings.Contains(k, ",") && k != ctrl {
			for _, c := range strings.Split(k, ",") {
				if c == ctrl {
					names = append(names, k)
				}
			}
		}
	}
	return names
}

// pick returns the first directory of cands holding file.
func pick(cands []string, files ...string) string {
	for _, d := range cands {
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(d, f)); err == nil {
				return d
			}
		}
	}
	return ""
}

// read takes one reading. A counter a kernel does not have (oom_kill before 4.13, pids without
// its controller) reads as 0; a file that should be there and is not is an error.
func (c *cgroup) read() (cgroupUse, error) {
	if c.version == 2 {
		return c.readV2()
	}
	return c.readV1()
}

func (c *cgroup) readV1() (u cgroupUse, err error) {
	cpu, acct, mem, pids := c.dirs["cpu"], c.dirs["cpuacct"], c.dirs["memory"], c.dirs["pids"]
	if u.cpuUsageNs, err = readUint(filepath.Join(acct, "cpuacct.usage")); err != nil {
		return u, err
	}
	u.cpuQuota, u.cpuPeriod = -1, 100_000
	if cpu != "" {
		stat, err := readKV(filepath.Join(cpu, "cpu.stat"))
		if err != nil {
			return u, err
		}
		u.throttledNs, u.throttledPeriods = stat["throttled_time"], stat["nr_throttled"]
		if q, err := readInt(filepath.Join(cpu, "cpu.cfs_quota_us")); err == nil {
			u.cpuQuota = q
		}
		if p, err := readInt(filepath.Join(cpu, "cpu.cfs_period_us")); err == nil && p > 0 {
			u.cpuPeriod = p
		}
	}
	if u.memUsage, err = readUint(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return u, err
	}
	if l, err := readUint(filepath.Join(mem, "memory.limit_in_bytes")); err == nil && l < unlimited {
		u.memLimit = l
	}
	stat, err := readKV(filepath.Join(mem, "memory.stat"))
	if err != nil {
		return u, err
	}
	u.inactiveFile = stat["total_inactive_file"]
	if oom, err := readKV(filepath.Join(mem, "memory.oom_control")); err == nil {
		u.oomKills = oom["oom_kill"]
	}
	if pids != "" {
		u.hasPids = true
		u.pids, _ = readUint(filepath.Join(pids, "pids.current"))
		u.pidsMax, _ = readMax(filepath.Join(pids, "pids.max"))
	}
	return u, nil
}

func (c *cgroup) readV2() (u cgroupUse, err error) {
	dir := c.dirs["memory"]
	stat, err := readKV(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return u, err
	}
	u.cpuUsageNs = stat["usage_usec"] * 1000
	u.throttledNs = stat["throttled_usec"] * 1000
	u.throttledPeriods = stat["nr_throttled"]
	u.cpuQuota, u.cpuPeriod = -1, 100_000
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.max")); err == nil {
		// "max 100000" or "50000 100000"
		f := strings.Fields(string(b))
		if len(f) == 2 {
			if p, err := strconv.ParseInt(f[1], 10, 64); err == nil && p > 0 {
				u.cpuPeriod = p
			}
			if q, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				u.cpuQuota = q
			}
		}
	}
	if u.memUsage, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
		return u, err
	}
	u.memLimit, _ = readMax(filepath.Join(dir, "memory.max"))
	mstat, err := readKV(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return u, err
	}
	u.inactiveFile = mstat["inactive_file"]
	if ev, err := readKV(filepath.Join(dir, "memory.events")); err == nil {
		u.oomKills = ev["oom_kill"]
	}
	if n, err := readUint(filepath.Join(dir, "pids.current")); err == nil {
		u.hasPids = true
		u.pids = n
		u.pidsMax, _ = readMax(filepath.Join(dir, "pids.max"))
	}
	return u, nil
}

// readFile reads a small kernel file (all of these are a page or so), at most 1 MiB of it.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 1<<20))
}

func readUint(path string) (uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

func readInt(path string) (int64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// readMax reads a limit that may be "max" (0: no limit).
func readMax(path string) (uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if n >= unlimited {
		return 0, nil
	}
	return n, nil
}

// readKV reads "key value" lines (cpu.stat, memory.stat, memory.events, memory.oom_control).
func readKV(path string) (map[string]uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return nil, err
	}
	kv := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			kv[f[0]] = n
		}
	}
	if len(kv) == 0 {
		return nil, errors.New(path + ": no counters")
	}
	return kv, nil
}
