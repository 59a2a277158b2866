package process

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// ExecIDVar marks every process of one exec, background process or terminal: children inherit
// it even when they leave the process group or session (setsid), so KillTree finds them.
const ExecIDVar = "SANDBOX_EXEC_ID"

// killTree SIGKILLs every process whose session id is sid (0: none) or whose environment
// carries ExecIDVar=execID, reading /proc directly (no ps or grep in the image). Processes may
// fork while a pass runs, so passes repeat until one finds nobody new.
func killTree(sid int, execID string) {
	needle := []byte(ExecIDVar + "=" + execID + "\x00")
	self := os.Getpid()
	killed := map[int]bool{}
	buf := make([]byte, 0, 4096)
	for pass := 0; pass < 50; pass++ {
		found := 0
		for _, pid := range listPids() {
			if pid == self || killed[pid] {
				continue
			}
			var match bool
			buf, match = matches(pid, sid, needle, buf)
			if match {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				killed[pid] = true
				found++
			}
		}
		if found == 0 {
			return
		}
	}
}

func listPids() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		if pid, err := strconv.Atoi(n); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// matches reports whether pid is alive (not a zombie) and in session sid or marked by needle.
func matches(pid, sid int, needle, buf []byte) ([]byte, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	buf, err := readInto(dir+"/stat", buf)
	if err != nil {
		return buf, false
	}
	state, session, ok := parseStat(buf)
	if !ok || state == 'Z' || state == 'X' {
		return buf, false
	}
	if sid > 0 && session == sid {
		return buf, true
	}
	// Readable for processes of our own uid (and for root); others cannot be ours.
	buf, err = readInto(dir+"/environ", buf)
	if err != nil {
		return buf, false
	}
	return buf, bytes.HasPrefix(buf, needle) || bytes.Contains(buf, append([]byte{0}, needle...))
}

// parseStat returns the state and session id from /proc/<pid>/stat. The command name (field 2)
// is in parentheses and may itself contain spaces and parentheses, so fields are counted from
// the last ')'.
func parseStat(b []byte) (state byte, session int, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	fields := bytes.Fields(b[i+2:]) // state ppid pgrp session ...
	if len(fields) < 4 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	session, err := strconv.Atoi(string(fields[3]))
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], session, true
}

func readInto(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil || n == 0 {
			return buf, nil
		}
	}
}
