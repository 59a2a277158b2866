package cabundle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	systemPEM = "-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n"
	caA       = "-----BEGIN CERTIFICATE-----\nPOOL-A\n-----END CERTIFICATE-----\n"
	caB       = "-----BEGIN CERTIFICATE-----\nPOOL-B\n-----END CERTIFICATE-----\n"
)

// configMapDir lays out dir as the kubelet projects a ConfigMap: dir/ca.crt -> ..data/ca.crt,
// ..data -> a timestamped directory holding the files.
type configMapDir struct {
	t   *testing.T
	dir string
	n   int
}

func newConfigMap(t *testing.T, content string) *configMapDir {
	c := &configMapDir{t: t, dir: t.TempDir()}
	c.swap(content)
	must(t, os.Symlink(filepath.Join("..data", "ca.crt"), filepath.Join(c.dir, "ca.crt")))
	return c
}

// swap writes a new timestamped directory, points ..data at it through a rename (the kubelet's
// atomic update), and removes the old one.
func (c *configMapDir) swap(content string) {
	c.n++
	ts := filepath.Join(c.dir, "..2026_11_27_00_00_0"+string(rune('0'+c.n)))
	must(c.t, os.Mkdir(ts, 0o755))
	must(c.t, os.WriteFile(filepath.Join(ts, "ca.crt"), []byte(content), 0o644))
	old, _ := os.Readlink(filepath.Join(c.dir, "..data"))
	must(c.t, os.Symlink(filepath.Base(ts), filepath.Join(c.dir, "..data_tmp")))
	must(c.t, os.Rename(filepath.Join(c.dir, "..data_tmp"), filepath.Join(c.dir, "..data")))
	if old != "" {
		must(c.t, os.RemoveAll(filepath.Join(c.dir, old)))
	}
}

func (c *configMapDir) source() string { return filepath.Join(c.dir, "ca.crt") }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// systemCandidates: a missing first candidate, then the bundle, then another that must not be used.
func systemCandidates(t *testing.T, content string) []string {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "second.pem"), []byte(content), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "third.pem"), []byte("NOT THIS ONE"), 0o644))
	return []string{filepath.Join(dir, "first.pem"), filepath.Join(dir, "second.pem"), filepath.Join(dir, "third.pem")}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return string(b)
}

func waitFor(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if string(b) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %q, want %q", path, b, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBundleIsSystemThenPoolCA(t *testing.T) {
	cm := newConfigMap(t, caA)
	out := filepath.Join(t.TempDir(), "ca-bundle.pem")
	w := New(Config{Source: cm.source(), Bundle: out, System: systemCandidates(t, systemPEM)})
	must(t, w.Sync())
	if got := read(t, out); got != systemPEM+"\n"+caA {
		t.Fatalf("bundle %q", got)
	}
	fi, err := os.Stat(out)
	must(t, err)
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644", fi.Mode().Perm())
	}
	// Nothing but the bundle is left in its directory (no temporary files).
	entries, err := os.ReadDir(filepath.Dir(out))
	must(t, err)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries", len(entries))
	}
}

func TestMissingCAGivesSystemAloneAndNoSystemGivesCAAlone(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ca-bundle.pem")
	must(t, New(Config{Source: filepath.Join(t.TempDir(), "absent", "ca.crt"), Bundle: out, System: systemCandidates(t, systemPEM)}).Sync())
	if got := read(t, out); got != systemPEM {
		t.Fatalf("bundle %q, want the system bundle alone", got)
	}
	cm := newConfigMap(t, caA)
	must(t, New(Config{Source: cm.source(), Bundle: out, System: []string{filepath.Join(t.TempDir(), "none.pem")}}).Sync())
	if got := read(t, out); got != caA {
		t.Fatalf("bundle %q, want the pool CA alone", got)
	}
}

func TestFollowsTheKubeletSymlinkSwapAndStopsWithItsContext(t *testing.T) {
	cm := newConfigMap(t, caA)
	out := filepath.Join(t.TempDir(), "ca-bundle.pem")
	w := New(Config{Source: cm.source(), Bundle: out, System: systemCandidates(t, systemPEM), Interval: 10 * time.Millisecond})
	must(t, w.Sync())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()

	// A rotation: old and new CA together, then the new alone.
	cm.swap(caA + caB)
	waitFor(t, out, systemPEM+"\n"+caA+caB)
	cm.swap(caB)
	waitFor(t, out, systemPEM+"\n"+caB)

	// Unchanged: the bundle is not written again (the same file, not a renamed new one).
	before := inode(t, out)
	time.Sleep(100 * time.Millisecond)
	if inode(t, out) != before {
		t.Fatal("the bundle was rewritten without a change")
	}

	// The ConfigMap goes (pool back to direct, or deleted): the system bundle alone; it comes back: again with it.
	must(t, os.Remove(cm.source()))
	waitFor(t, out, systemPEM)
	must(t, os.Symlink(filepath.Join("..data", "ca.crt"), cm.source()))
	waitFor(t, out, systemPEM+"\n"+caB)

	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// Stopped: a change is no longer written.
	cm.swap(caA)
	time.Sleep(100 * time.Millisecond)
	if got := read(t, out); got != systemPEM+"\n"+caB {
		t.Fatalf("bundle %q changed after Run stopped", got)
	}
}

func TestReadsAreBounded(t *testing.T) {
	big := strings.Repeat("x", 1000)
	out := filepath.Join(t.TempDir(), "ca-bundle.pem")
	// An oversized CA file at start: the system bundle alone; later: the bundle stays as it was.
	cm := newConfigMap(t, big)
	w := New(Config{Source: cm.source(), Bundle: out, System: systemCandidates(t, systemPEM), MaxBytes: 999})
	must(t, w.Sync())
	if got := read(t, out); got != systemPEM {
		t.Fatalf("bundle %q, want the system bundle alone", got)
	}
	cm.swap(caA)
	must(t, w.Sync())
	cm.swap(big)
	must(t, w.Sync())
	if got := read(t, out); got != systemPEM+"\n"+caA {
		t.Fatalf("bundle %q, want the last good one kept", got)
	}
	// An oversized system candidate is passed over for the next.
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "huge.pem"), []byte(big), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "ok.pem"), []byte(systemPEM), 0o644))
	cm.swap(caB)
	must(t, New(Config{Source: cm.source(), Bundle: out, System: []string{filepath.Join(dir, "huge.pem"), filepath.Join(dir, "ok.pem")}, MaxBytes: 999}).Sync())
	if got := read(t, out); got != systemPEM+"\n"+caB {
		t.Fatalf("bundle %q", got)
	}
}

// A reader never sees a partial bundle while it is rewritten (large enough that an in-place
// write would show a truncated file now and then).
func TestWritesAreAtomic(t *testing.T) {
	system := strings.Repeat("S", 3<<20)
	cm := newConfigMap(t, caA)
	out := filepath.Join(t.TempDir(), "ca-bundle.pem")
	w := New(Config{Source: cm.source(), Bundle: out, System: systemCandidates(t, system)})
	must(t, w.Sync())
	valid := map[string]bool{system + "\n" + caA: true, system + "\n" + caB: true}
	stop := make(chan struct{})
	var bad []int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := os.ReadFile(out)
			if err != nil || !valid[string(b)] {
				bad = append(bad, len(b))
			}
		}
	}()
	for i := 0; i < 20; i++ {
		if i%2 == 0 {
			cm.swap(caB)
		} else {
			cm.swap(caA)
		}
		must(t, w.Sync())
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("a reader saw %d partial bundles (sizes %v)", len(bad), bad[:min(len(bad), 5)])
	}
	if !bytes.HasSuffix([]byte(read(t, out)), []byte(caA)) {
		t.Fatal("the last CA is not in the bundle")
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	must(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}
