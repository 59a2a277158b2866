package files

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/internal/testkit"
)

var wantStatus = testkit.WantStatus

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// box is the box of tests that need no protected directory.
var box = NewBox(nil)

func TestResolveChecksPathsLexically(t *testing.T) {
	for _, bad := range []string{"", "relative/x", "/a\x00b"} {
		_, err := box.resolve(bad, itself)
		wantStatus(t, err, http.StatusBadRequest)
	}
	if p, err := box.resolve("/a/./b/../c/", tree); err != nil || p != "/a/c" {
		t.Fatalf("%q %v", p, err)
	}
}

func TestOpenRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, _, err := box.Open(fifo, 0)
		if f != nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		wantStatus(t, err, http.StatusBadRequest)
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO blocked")
	}
	// Writing one is refused too (and does not replace it).
	_, err := box.Write(fifo, strings.NewReader("x"), 10, 0o644)
	wantStatus(t, err, http.StatusBadRequest)
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the FIFO was replaced: %v", err)
	}

	_, _, err = box.Open(dir, 0)
	wantStatus(t, err, http.StatusBadRequest)
	_, _, err = box.Open("/dev/null", 0)
	wantStatus(t, err, http.StatusBadRequest)
	_, _, err = box.Open(filepath.Join(dir, "missing"), 0)
	wantStatus(t, err, http.StatusNotFound)
	_, _, err = box.Open(filepath.Join(dir, "missing", "deeper"), 0)
	wantStatus(t, err, http.StatusNotFound)
}

func TestOpenSizeLimitAndPermission(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	mustWrite(t, p, "0123456789")
	f, size, err := box.Open(p, 10)
	if err != nil || size != 10 {
		t.Fatalf("%d %v", size, err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "0123456789" {
		t.Fatalf("%q", b)
	}
	_, _, err = box.Open(p, 9)
	wantStatus(t, err, http.StatusRequestEntityTooLarge)

	if os.Geteuid() != 0 { // root reads anything
		if err := os.Chmod(p, 0); err != nil {
			t.Fatal(err)
		}
		_, _, err = box.Open(p, 0)
		wantStatus(t, err, http.StatusForbidden)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "c.txt")
	res, err := box.Write(p, strings.NewReader("hello"), 100, 0o600)
	if err != nil || res.Size != 5 || res.Path != p {
		t.Fatalf("%+v %v", res, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("new file: %v %v", fi.Mode(), err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "a")); fi.Mode().Perm() != 0o755 {
		t.Fatalf("parent: %v", fi.Mode())
	}
	// An existing file keeps its mode.
	if _, err := box.Write(p, strings.NewReader("again"), 100, 0o777); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("existing file's mode changed to %v", fi.Mode())
	}

	// Too large: 413, the old content stays, no temporary file left.
	_, err = box.Write(p, strings.NewReader("0123456789"), 9, 0o644)
	wantStatus(t, err, http.StatusRequestEntityTooLarge)
	assertContent(t, p, "again")
	assertOnly(t, filepath.Join(dir, "a", "b"), "c.txt")

	// A cut-off body: nothing changes.
	_, err = box.Write(p, io.MultiReader(strings.NewReader("partial"), errReader{}), 100, 0o644)
	wantStatus(t, err, http.StatusBadRequest)
	assertContent(t, p, "again")
	assertOnly(t, filepath.Join(dir, "a", "b"), "c.txt")

	// A directory is refused; a file as a parent too.
	_, err = box.Write(dir, strings.NewReader("x"), 10, 0o644)
	wantStatus(t, err, http.StatusBadRequest)
	_, err = box.Write(filepath.Join(p, "under-a-file"), strings.NewReader("x"), 10, 0o644)
	wantStatus(t, err, http.StatusBadRequest)

	// Through a symlink: the target is written, the link stays.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := box.Write(link, strings.NewReader("via link"), 100, 0o644); err != nil {
		t.Fatal(err)
	}
	assertContent(t, p, "via link")
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("the symlink was replaced")
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func assertContent(t *testing.T, p, want string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil || string(b) != want {
		t.Fatalf("%s: %q %v, want %q", p, b, err, want)
	}
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Fatalf("%s holds %v, want %v", dir, got, names)
	}
}

func TestList(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "b.txt"), "bb")
	mustWrite(t, filepath.Join(dir, "a", "x.txt"), "x")
	mustWrite(t, filepath.Join(dir, "outside", "secret"), "s")
	if err := os.Symlink(filepath.Join(dir, "outside"), filepath.Join(dir, "c-link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "d-fifo"), 0o644); err != nil {
		t.Fatal(err)
	}

	l, err := box.List(dir, false, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Entry{}
	for _, e := range l.Entries {
		got[e.Name] = e
	}
	if len(l.Entries) != 5 || l.Truncated || got["a"].Type != "dir" || got["b.txt"].Type != "file" || got["b.txt"].Size != 2 ||
		got["b.txt"].Mode != 0o644 || got["c-link"].Type != "symlink" || got["d-fifo"].Type != "other" ||
		got["b.txt"].Path != filepath.Join(dir, "b.txt") || got["b.txt"].Modified.IsZero() {
		t.Fatalf("%+v", l)
	}

	l, err = box.List(dir, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range l.Entries {
		paths = append(paths, strings.TrimPrefix(e.Path, dir))
	}
	// Depth first in name order; the symlinked directory is not entered.
	if strings.Join(paths, " ") != "/a /a/x.txt /b.txt /c-link /d-fifo /outside /outside/secret" {
		t.Fatalf("recursive: %v", paths)
	}

	l, err = box.List(dir, true, 3)
	if err != nil || len(l.Entries) != 3 || !l.Truncated {
		t.Fatalf("limit: %+v %v", l, err)
	}
	l, err = box.List(filepath.Join(dir, "a"), true, 1)
	if err != nil || len(l.Entries) != 1 || l.Truncated {
		t.Fatalf("exactly the limit: %+v %v", l, err)
	}

	_, err = box.List(filepath.Join(dir, "b.txt"), false, 10)
	wantStatus(t, err, http.StatusBadRequest)
	_, err = box.List(filepath.Join(dir, "nope"), false, 10)
	wantStatus(t, err, http.StatusNotFound)
}

func TestDelete(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "full", "f"), "x")
	mustWrite(t, filepath.Join(dir, "file"), "x")
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "full"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}

	_, err := box.Delete(filepath.Join(dir, "full"), false)
	wantStatus(t, err, http.StatusConflict)
	assertContent(t, filepath.Join(dir, "full", "f"), "x")

	for _, name := range []string{"file", "empty", "link"} {
		if res, err := box.Delete(filepath.Join(dir, name), false); err != nil || !res.Deleted {
			t.Fatalf("%s: %+v %v", name, res, err)
		}
	}
	assertContent(t, filepath.Join(dir, "full", "f"), "x") // the link went, not its target
	if _, err := box.Delete(filepath.Join(dir, "full"), true); err != nil {
		t.Fatal(err)
	}
	assertOnly(t, dir)
	_, err = box.Delete(filepath.Join(dir, "full"), true)
	wantStatus(t, err, http.StatusNotFound)

	own := NewBox([]string{"/opt/sandbox-bridge/secret", "/opt/sandbox-bridge/bin"})
	_, err = own.Delete("/", true)
	wantStatus(t, err, http.StatusBadRequest)
	for _, p := range []string{"/opt", "/opt/sandbox-bridge", "/opt/sandbox-bridge/bin", "/opt/sandbox-bridge/bin/boxd"} {
		_, err := own.Delete(p, true)
		wantStatus(t, err, http.StatusForbidden)
	}
	_, err = box.Delete("/", true)
	wantStatus(t, err, http.StatusBadRequest)
}
