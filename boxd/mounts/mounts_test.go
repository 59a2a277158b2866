package mounts

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandbox-bridge.io/boxd/auth"
)

type sidecar struct {
	t        *testing.T
	url      string
	mem, rw  string
	local    bool // whether the peer counts as the pod itself
	tokenHdr string
}

func newSidecar(t *testing.T) *sidecar {
	t.Helper()
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	must(t, os.MkdirAll(secret, 0o755))
	must(t, os.WriteFile(filepath.Join(secret, "token"), []byte("tok\n"), 0o600))
	checker, err := auth.Load(secret)
	must(t, err)
	s := &sidecar{t: t, mem: filepath.Join(dir, "memory"), rw: filepath.Join(dir, "memory-rw"), tokenHdr: "tok"}
	must(t, os.MkdirAll(s.mem, 0o755))
	must(t, os.MkdirAll(s.rw, 0o755))
	h := New(Config{Version: "test", Auth: checker, Memory: s.mem, RW: s.rw, MaxFileBytes: 1024,
		Local: func(net.IP) bool { return s.local },
		Log:   slog.New(slog.NewJSONHandler(io.Discard, nil))})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (s *sidecar) do(method, path string, body string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	must(s.t, err)
	req.Header.Set(auth.Header, s.tokenHdr)
	res, err := http.DefaultClient.Do(req)
	must(s.t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (s *sidecar) ok(method, path, body string) string {
	s.t.Helper()
	code, out := s.do(method, path, body)
	if code != 200 {
		s.t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
	return out
}

func TestReadOnlyStoreIsStagedThenSwappedIn(t *testing.T) {
	s := newSidecar(t)
	s.ok("POST", "/v1/memory/notes/stage?read_only=true", "")
	s.ok("PUT", "/v1/memory/notes/stage/file?read_only=true&path=a/b.md", "hello")
	if _, err := os.Stat(filepath.Join(s.mem, "notes")); !os.IsNotExist(err) {
		t.Fatal("the store is visible before its commit")
	}
	s.ok("POST", "/v1/memory/notes/commit?read_only=true", "")
	got, err := os.ReadFile(filepath.Join(s.mem, "notes/a/b.md"))
	must(t, err)
	if string(got) != "hello" {
		t.Fatalf("got %q", got)
	}
	// A refresh replaces the whole store: a file gone from the store goes from the box.
	s.ok("POST", "/v1/memory/notes/stage?read_only=true", "")
	s.ok("PUT", "/v1/memory/notes/stage/file?read_only=true&path=c.md", "new")
	s.ok("POST", "/v1/memory/notes/commit?read_only=true", "")
	if _, err := os.Stat(filepath.Join(s.mem, "notes/a/b.md")); !os.IsNotExist(err) {
		t.Fatal("an old file survived the refresh")
	}
	entries, _ := os.ReadDir(s.mem)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("left over: %s", e.Name())
		}
	}
}

func TestReadWriteStoreIsALinkIntoTheWritableVolume(t *testing.T) {
	s := newSidecar(t)
	s.ok("POST", "/v1/memory/work/stage?read_only=false", "")
	s.ok("PUT", "/v1/memory/work/stage/file?read_only=false&path=x.txt", "1")
	s.ok("POST", "/v1/memory/work/commit?read_only=false", "")
	target, err := os.Readlink(filepath.Join(s.mem, "work"))
	must(t, err)
	if target != filepath.Join(s.rw, "work") {
		t.Fatalf("link to %s", target)
	}
	// What box code writes there is listed and read back; symlinks are not store files and
	// never lead a read out of the store.
	must(t, os.WriteFile(filepath.Join(s.rw, "work/sub.txt"), []byte("box wrote"), 0o644))
	must(t, os.WriteFile(filepath.Join(s.mem, "outside"), []byte("secret"), 0o644))
	must(t, os.Symlink(filepath.Join(s.mem, "outside"), filepath.Join(s.rw, "work/escape")))
	var listed struct{ Files []fileEntry }
	must(t, json.Unmarshal([]byte(s.ok("GET", "/v1/memory/work/files", "")), &listed))
	if len(listed.Files) != 2 || listed.Files[0].Path != "sub.txt" || listed.Files[1].Path != "x.txt" {
		t.Fatalf("listed %+v", listed.Files)
	}
	if got := s.ok("GET", "/v1/memory/work/file?path=sub.txt", ""); got != "box wrote" {
		t.Fatalf("read %q", got)
	}
	if code, _ := s.do("GET", "/v1/memory/work/file?path=escape", ""); code == 200 {
		t.Fatal("a symlink out of the store was followed")
	}
	// The store's directory itself swapped for a link out of the volume: not followed either.
	must(t, os.RemoveAll(filepath.Join(s.rw, "work")))
	must(t, os.Symlink(s.mem, filepath.Join(s.rw, "work")))
	for _, p := range []string{"/v1/memory/work/files", "/v1/memory/work/file?path=outside"} {
		if code, body := s.do("GET", p, ""); code == 200 {
			t.Fatalf("GET %s through a planted link: %s", p, body)
		}
	}
	// Nor a staging directory swapped for a link into the read-only volume while a store is filled.
	s.ok("POST", "/v1/memory/w2/stage?read_only=false", "")
	must(t, os.RemoveAll(filepath.Join(s.rw, ".stage-w2")))
	must(t, os.Symlink(s.mem, filepath.Join(s.rw, ".stage-w2")))
	if code, _ := s.do("PUT", "/v1/memory/w2/stage/file?read_only=false&path=planted", "x"); code == 200 {
		t.Fatal("a file was written through a planted link")
	}
	if _, err := os.Stat(filepath.Join(s.mem, "planted")); !os.IsNotExist(err) {
		t.Fatal("the read-only volume got a file")
	}
}

func TestRefusals(t *testing.T) {
	s := newSidecar(t)
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/memory/..x/stage?read_only=true"},
		{"POST", "/v1/memory/.hidden/stage?read_only=true"},
		{"POST", "/v1/memory/ok/stage?read_only=maybe"},
		{"PUT", "/v1/memory/ok/stage/file?read_only=true&path=../x"},
		{"PUT", "/v1/memory/ok/stage/file?read_only=true&path=/etc/x"},
		{"PUT", "/v1/memory/ok/stage/file?read_only=true&path=a/./b"},
	} {
		if code, body := s.do(c.method, c.path, ""); code != 400 {
			t.Errorf("%s %s: %d %s", c.method, c.path, code, body)
		}
	}
	s.ok("POST", "/v1/memory/ok/stage?read_only=true", "")
	if code, _ := s.do("PUT", "/v1/memory/ok/stage/file?read_only=true&path=big", strings.Repeat("x", 2000)); code != 413 {
		t.Errorf("an oversized file: %d", code)
	}
	s.tokenHdr = "wrong"
	if code, _ := s.do("GET", "/v1/memory/ok/files", ""); code != 401 {
		t.Errorf("wrong token: %d", code)
	}
	// Box code shares the pod's network namespace and can read the credential: refused by address.
	s.tokenHdr, s.local = "tok", true
	if code, _ := s.do("GET", "/v1/health", ""); code != 403 {
		t.Errorf("a call from the pod itself: %d", code)
	}
}

func TestLocalAddress(t *testing.T) {
	if !LocalAddress(net.ParseIP("127.0.0.1")) || !LocalAddress(net.ParseIP("::1")) {
		t.Fatal("loopback is local")
	}
	if LocalAddress(net.ParseIP("203.0.113.9")) {
		t.Fatal("a documentation address is not ours")
	}
}
