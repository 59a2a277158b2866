package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// tmpfsMagic is statfs's f_type of a tmpfs (a memory-backed emptyDir): its own file system,
// sized to the volume's limit, so statfs answers for the volume exactly.
const tmpfsMagic = 0x01021994

// maxWalkEntries bounds one count of a volume: past it the count stops and says it is partial.
const maxWalkEntries = 1_000_000

// diskUse is what one volume holds: bytes allocated on disk (as du counts them: a sparse
// file's holes cost nothing, a hard-linked file is counted once).
type diskUse struct {
	used    uint64
	partial bool
	// size of the file system when it is the volume's own (tmpfs), else 0.
	size uint64
}

// measure counts what the volume at path holds. A tmpfs is read with statfs; any other file
// system (a disk-backed emptyDir shares the node's disk, so statfs would answer for the node)
// is walked, without crossing into other file systems or following symlinks.
func measure(path string) (diskUse, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return diskUse{}, err
	}
	if int64(st.Type) == tmpfsMagic {
		bs := uint64(st.Bsize)
		return diskUse{used: (st.Blocks - st.Bfree) * bs, size: st.Blocks * bs}, nil
	}
	return walk(path)
}

var errEnough = errors.New("enough")

func walk(root string) (diskUse, error) {
	rootInfo, err := os.Lstat(root)
	if err != nil {
		return diskUse{}, err
	}
	dev := devOf(rootInfo)
	type inode struct{ dev, ino uint64 }
	linked := map[inode]bool{}
	var u diskUse
	n := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: skipped (box code may make anything unreadable)
		}
		if n++; n > maxWalkEntries {
			u.partial = true
			return errEnough
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if d.IsDir() && p != root && uint64(st.Dev) != dev {
			return filepath.SkipDir // another file system mounted below
		}
		if !d.IsDir() && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if linked[k] {
				return nil
			}
			if len(linked) < 100_000 {
				linked[k] = true
			}
		}
		u.used += uint64(st.Blocks) * 512
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return u, err
	}
	return u, nil
}

func devOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev)
	}
	return 0
}

// netBytes sums received and sent bytes over the interfaces of /proc/net/dev but loopback:
// the pod's network namespace, which the box's containers share.
func netBytes(file string) (rx, tx uint64, err error) {
	b, err := readFile(file)
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		r, err1 := strconv.ParseUint(f[0], 10, 64)
		t, err2 := strconv.ParseUint(f[8], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		rx += r
		tx += t
	}
	return rx, tx, nil
}

// countProcs counts the processes of the box's PID namespace (/proc's numeric entries): the
// fallback when the pids controller is not there.
func countProcs(proc string) uint64 {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return 0
	}
	var n uint64
	for _, e := range entries {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err == nil {
			n++
		}
	}
	return n
}
