package watch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/files"
)

// setup returns a hub over a box whose own directory (like boxd's secret mount) is dir/own,
// and the directory to watch, dir/ws.
func setup(t *testing.T, cfg Config) (*Hub, string, string) {
	t.Helper()
	dir := t.TempDir()
	ws, own := filepath.Join(dir, "ws"), filepath.Join(dir, "own")
	for _, d := range []string{ws, own} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return New(files.NewBox([]string{own}), cfg), ws, own
}

func start(t *testing.T, h *Hub, p string, o Options) *Watch {
	t.Helper()
	w, err := h.Watch(p, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	if e := next(t, w); e.Type != "ready" {
		t.Fatalf("first event %+v, want ready", e)
	}
	return w
}

func next(t *testing.T, w *Watch) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("next event: %v", err)
	}
	return e
}

// collect reads events until none came for quiet.
func collect(t *testing.T, w *Watch, quiet time.Duration) []Event {
	t.Helper()
	var out []Event
	for {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		e, err := w.Next(ctx)
		cancel()
		if err != nil {
			return out
		}
		out = append(out, e)
		if e.Type == "end" {
			return out
		}
	}
}

func show(events []Event) string {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "%s %s", e.Type, e.Path)
		if e.From != "" {
			fmt.Fprintf(&b, " <- %s", e.From)
		}
		if e.Kind != "" {
			fmt.Fprintf(&b, " (%s)", e.Kind)
		}
		if e.Reason != "" || e.Dropped != 0 {
			fmt.Fprintf(&b, " [%s %d]", e.Reason, e.Dropped)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCreateWriteRenameRemoveInOrder(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	w := start(t, h, ws, Options{})
	a, b := filepath.Join(ws, "a.txt"), filepath.Join(ws, "b.txt")
	f, err := os.Create(a)
	must(t, err)
	_, err = f.WriteString("hello")
	must(t, err)
	must(t, f.Close())
	must(t, os.Chmod(a, 0o600))
	must(t, os.Rename(a, b))
	must(t, os.Remove(b))
	must(t, os.Mkdir(filepath.Join(ws, "d"), 0o755))
	got := show(collect(t, w, 500*time.Millisecond))
	want := show([]Event{
		{Type: "create", Path: a, Kind: "file"},
		{Type: "write", Path: a, Kind: "file"},
		{Type: "chmod", Path: a, Kind: "file"},
		{Type: "rename", Path: b, From: a, Kind: "file"},
		{Type: "remove", Path: b, Kind: "file"},
		{Type: "create", Path: filepath.Join(ws, "d"), Kind: "dir"},
	})
	if got != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got, want)
	}
}

// Many writes to one file within the window are one event, then one more for the writes held
// back; another file's writes are not held back by it.
func TestWritesCoalesced(t *testing.T) {
	h, ws, _ := setup(t, Config{Window: 200 * time.Millisecond})
	w := start(t, h, ws, Options{})
	p, other := filepath.Join(ws, "log"), filepath.Join(ws, "other")
	f, err := os.Create(p)
	must(t, err)
	defer f.Close()
	for i := 0; i < 500; i++ {
		_, err := f.WriteString("line\n")
		must(t, err)
	}
	must(t, os.WriteFile(other, []byte("x"), 0o644))
	events := collect(t, w, 600*time.Millisecond)
	writes := map[string]int{}
	for _, e := range events {
		if e.Type == "write" {
			writes[e.Path]++
		}
	}
	if writes[p] < 1 || writes[p] > 3 || writes[other] != 1 {
		t.Fatalf("500 writes to %s gave %d events (want 1-3), 1 to %s gave %d:\n%s", p, writes[p], other, writes[other], show(events))
	}
	// A remove comes after the writes held back before it.
	for i := 0; i < 50; i++ {
		_, err := f.WriteString("more\n")
		must(t, err)
	}
	must(t, os.Remove(p))
	events = collect(t, w, 400*time.Millisecond)
	if n := len(events); n < 2 || events[n-1].Type != "remove" || events[n-2].Type != "write" {
		t.Fatalf("writes then remove:\n%s", show(events))
	}
}

func TestRecursive(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	must(t, os.MkdirAll(filepath.Join(ws, "old", "deep"), 0o755))
	w := start(t, h, ws, Options{Recursive: true})
	// Made at once, filled before its watch can be in place: the scan sees the file.
	must(t, os.MkdirAll(filepath.Join(ws, "a", "b"), 0o755))
	must(t, os.WriteFile(filepath.Join(ws, "a", "b", "f"), []byte("x"), 0o644))
	events := collect(t, w, 500*time.Millisecond)
	seen := map[string]bool{}
	for _, e := range events {
		seen[e.Type+" "+e.Path] = true
	}
	for _, want := range []string{"create " + ws + "/a", "create " + ws + "/a/b", "create " + ws + "/a/b/f"} {
		if !seen[want] {
			t.Fatalf("no %q in\n%s", want, show(events))
		}
	}
	// A tree moved in is reported whole (its entries were there before any watch of them), and watched.
	outside := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(outside, "t", "b"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "t", "b", "f"), []byte("x"), 0o644))
	must(t, os.Rename(filepath.Join(outside, "t"), filepath.Join(ws, "t")))
	must(t, os.WriteFile(filepath.Join(ws, "t", "b", "g"), nil, 0o644))
	got := show(collect(t, w, 500*time.Millisecond))
	want := show([]Event{
		{Type: "create", Path: ws + "/t", Kind: "dir"},
		{Type: "create", Path: ws + "/t/b", Kind: "dir"},
		{Type: "create", Path: ws + "/t/b/f", Kind: "file"},
		{Type: "create", Path: ws + "/t/b/g", Kind: "file"},
	})
	if got != want {
		t.Fatalf("a tree moved in:\n%s\nwant:\n%s", got, want)
	}
	// A renamed directory's watches follow it.
	must(t, os.Rename(filepath.Join(ws, "old"), filepath.Join(ws, "new")))
	must(t, os.WriteFile(filepath.Join(ws, "new", "deep", "g"), []byte("x"), 0o644))
	got = show(collect(t, w, 500*time.Millisecond))
	want = show([]Event{
		{Type: "rename", Path: ws + "/new", From: ws + "/old", Kind: "dir"},
		{Type: "create", Path: ws + "/new/deep/g", Kind: "file"},
		{Type: "write", Path: ws + "/new/deep/g", Kind: "file"},
	})
	if got != want {
		t.Fatalf("after a directory rename:\n%s\nwant:\n%s", got, want)
	}
}

// Moved out of the watched tree is a remove (and its directory's watches go); moved in, a create.
func TestMovesInAndOut(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	outside := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(ws, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "in"), []byte("x"), 0o644))
	w := start(t, h, ws, Options{Recursive: true})
	h.mu.Lock()
	held := len(w.paths)
	h.mu.Unlock()
	must(t, os.Rename(filepath.Join(ws, "sub"), filepath.Join(outside, "sub")))
	must(t, os.WriteFile(filepath.Join(outside, "sub", "unseen"), []byte("x"), 0o644))
	must(t, os.Rename(filepath.Join(outside, "in"), filepath.Join(ws, "in")))
	got := show(collect(t, w, 500*time.Millisecond))
	want := show([]Event{{Type: "remove", Path: ws + "/sub", Kind: "dir"}, {Type: "create", Path: ws + "/in", Kind: "file"}})
	if got != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got, want)
	}
	h.mu.Lock()
	left := len(w.paths)
	h.mu.Unlock()
	if left != held-1 {
		t.Fatalf("watched directories %d -> %d: the one moved out must go", held, left)
	}
}

// A reader that falls behind gets an overflow event where events were dropped, then the
// events after it; memory stays at the queue's bound.
func TestOverflow(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	w := start(t, h, ws, Options{Queue: 16})
	for i := 0; i < 200; i++ {
		must(t, os.Mkdir(filepath.Join(ws, fmt.Sprintf("d%03d", i)), 0o755))
	}
	time.Sleep(300 * time.Millisecond) // let the reader hand everything over
	w.q.mu.Lock()
	queued := w.q.n
	w.q.mu.Unlock()
	if queued > 17 {
		t.Fatalf("%d events queued; the bound is 16 and an overflow event", queued)
	}
	events := collect(t, w, 300*time.Millisecond)
	if len(events) != 17 || events[16].Type != "overflow" || events[16].Reason != "queue" || events[16].Dropped != 200-16 {
		t.Fatalf("events:\n%s", show(events))
	}
	must(t, os.Mkdir(filepath.Join(ws, "after"), 0o755))
	if e := next(t, w); e.Type != "create" || e.Path != ws+"/after" {
		t.Fatalf("after the overflow: %+v", e)
	}
}

func TestOwnDirectoriesRefused(t *testing.T) {
	h, ws, own := setup(t, Config{})
	parent := filepath.Dir(own)
	must(t, os.Symlink(own, filepath.Join(ws, "link")))
	for _, c := range []struct {
		path      string
		recursive bool
	}{{own, false}, {own + "/..", true}, {parent, true}, {filepath.Join(ws, "link"), false}} {
		_, err := h.Watch(c.path, Options{Recursive: c.recursive})
		if e := errs.As(err); err == nil || e.Status != 403 {
			t.Fatalf("watch %s (recursive %v): %v, want 403", c.path, c.recursive, err)
		}
	}
	// The tree is fine; a symlink in it is not followed into boxd's own directory.
	w := start(t, h, ws, Options{Recursive: true})
	must(t, os.WriteFile(filepath.Join(own, "token"), []byte("x"), 0o644))
	if events := collect(t, w, 300*time.Millisecond); len(events) != 0 {
		t.Fatalf("events from boxd's own directory:\n%s", show(events))
	}
	if _, err := h.Watch("relative", Options{}); errs.As(err).Status != 400 {
		t.Fatalf("relative path: %v", err)
	}
	if _, err := h.Watch(filepath.Join(ws, "missing"), Options{}); errs.As(err).Status != 404 {
		t.Fatalf("missing path: %v", err)
	}
}

func TestLimitsAndEnd(t *testing.T) {
	h, ws, _ := setup(t, Config{MaxDirs: 4})
	must(t, os.MkdirAll(filepath.Join(ws, "a", "b", "c", "d"), 0o755))
	if _, err := h.Watch(ws, Options{Recursive: true}); errs.As(err).Status != 413 {
		t.Fatalf("5 directories with room for 4: %v, want 413", err)
	}
	w1 := start(t, h, filepath.Join(ws, "a", "b"), Options{Recursive: true}) // b, c, d: 3
	must(t, os.Mkdir(filepath.Join(ws, "a", "b", "x"), 0o755))               // the 4th
	must(t, os.Mkdir(filepath.Join(ws, "a", "b", "x", "y"), 0o755))          // no room
	events := collect(t, w1, 300*time.Millisecond)
	if !strings.Contains(show(events), "overflow  [directories 0]") {
		t.Fatalf("a directory without room must say overflow:\n%s", show(events))
	}
	w2 := start(t, h, filepath.Join(ws, "a", "b"), Options{MaxWatches: 2}) // shares b's inotify watch: no room needed
	if _, err := h.Watch(ws, Options{MaxWatches: 2}); errs.As(err).Status != 429 {
		t.Fatalf("a third watch with 2 allowed: %v, want 429", err)
	}
	h.EndAll("sleep")
	for _, w := range []*Watch{w1, w2} {
		if e := next(t, w); e.Type != "end" || e.Reason != "sleep" {
			t.Fatalf("after EndAll: %+v", e)
		}
		if _, err := w.Next(context.Background()); !errors.Is(err, io.EOF) {
			t.Fatalf("after the end: %v", err)
		}
	}
	w1.Close()
	w2.Close()
	h.mu.Lock()
	closed := h.ino == nil && len(h.refs) == 0
	h.mu.Unlock()
	if !closed {
		t.Fatal("the inotify instance must close with the last watch")
	}
	h.Close()
	if _, err := h.Watch(ws, Options{}); errs.As(err).Status != 409 {
		t.Fatalf("after Close: %v", err)
	}
}

// The watched directory removed: a remove of it, and the end.
func TestRootRemoved(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	dir := filepath.Join(ws, "dir")
	must(t, os.Mkdir(dir, 0o755))
	w := start(t, h, dir, Options{})
	must(t, os.Remove(dir))
	got := show(collect(t, w, time.Second))
	want := show([]Event{{Type: "remove", Path: dir, Kind: "dir"}, {Type: "end", Reason: "removed"}})
	if got != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got, want)
	}
}

// A single file can be watched.
func TestFile(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	p := filepath.Join(ws, "f")
	must(t, os.WriteFile(p, nil, 0o644))
	w := start(t, h, p, Options{})
	must(t, os.WriteFile(p, []byte("x"), 0o644))
	if e := next(t, w); e.Type != "write" || e.Path != p || e.Kind != "file" {
		t.Fatalf("event %+v", e)
	}
}

func TestMadeWhileScannedReportedOnce(t *testing.T) {
	h, ws, _ := setup(t, Config{})
	w := start(t, h, ws, Options{Recursive: true})
	// A file made after the new directory's watch is in place and before its scan lists it:
	// inotify and the scan both see it; the stream says it once.
	afterWatch = func(dir string) {
		if dir == ws+"/t" {
			must(t, os.WriteFile(dir+"/late", nil, 0o644))
		}
	}
	t.Cleanup(func() { afterWatch = nil })
	must(t, os.Mkdir(filepath.Join(ws, "t"), 0o755))
	got := show(collect(t, w, 500*time.Millisecond))
	want := show([]Event{
		{Type: "create", Path: ws + "/t", Kind: "dir"},
		{Type: "create", Path: ws + "/t/late", Kind: "file"},
	})
	if got != want {
		t.Fatalf("a file made while its directory was scanned:\n%s\nwant:\n%s", got, want)
	}
	// Made again after a remove, it is news again.
	must(t, os.Remove(filepath.Join(ws, "t", "late")))
	must(t, os.WriteFile(filepath.Join(ws, "t", "late"), nil, 0o644))
	got = show(collect(t, w, 500*time.Millisecond))
	want = show([]Event{
		{Type: "remove", Path: ws + "/t/late", Kind: "file"},
		{Type: "create", Path: ws + "/t/late", Kind: "file"},
	})
	if got != want {
		t.Fatalf("removed and made again:\n%s\nwant:\n%s", got, want)
	}
}
