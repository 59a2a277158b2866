package server

import (
	"bytes"
	"crypto/rand"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/auth"
	"sandbox-bridge.io/boxd/files"
)

// tcpBox serves boxd's routes on a plain TCP listener (no wrapper around its connections), so
// an archive goes out as it does in a box: onto the connection, file contents with sendfile.
func tcpBox(t *testing.T) (base, workdir string) {
	t.Helper()
	secret := t.TempDir()
	if err := os.WriteFile(filepath.Join(secret, auth.TokenFile), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	checker, err := auth.Load(secret)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{
		Version: "test", StartedAt: time.Now(), Auth: checker, Protected: []string{secret},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	t.Cleanup(srv.Close)
	return srv.URL, t.TempDir()
}

func getArchive(t *testing.T, base, query string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/v1/archive?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(auth.Header, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// An uncompressed archive sent onto the connection (chunks written by boxd, contents with
// sendfile) is the same tar, byte for byte, as the one written into a buffer, with the same
// headers; the connection is not reused after it.
func TestArchiveSentOntoTheConnection(t *testing.T) {
	base, ws := tcpBox(t)
	src := filepath.Join(ws, "src")
	random := make([]byte, 3<<20+123)
	_, _ = rand.Read(random)
	for name, body := range map[string]string{
		"big.bin":         string(random),
		"a/small.txt":     "small",
		"a/b/edge.txt":    strings.Repeat("e", 64<<10),
		"a/b/less.txt":    strings.Repeat("l", 64<<10-1),
		"empty":           "",
		"z/last-big.data": strings.Repeat("0123456789", 100_000),
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(src, "big.bin"), filepath.Join(src, "a", "big-again")); err != nil {
		t.Fatal(err)
	}
	a, err := files.NewBox(nil).PrepareArchive(src, files.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	err = a.WriteTo(&want, false)
	a.Close()
	if err != nil {
		t.Fatal(err)
	}

	for range 2 {
		resp := getArchive(t, base, "path="+url.QueryEscape(src))
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
		if h := resp.Header; h.Get("Content-Type") != "application/x-tar" || h.Get("X-Boxd-Archive-Entries") != "10" ||
			h.Get("X-Boxd-Archive-Bytes") != "4276927" || resp.TransferEncoding[0] != "chunked" || !resp.Close {
			t.Fatalf("%v %v close=%v", h, resp.TransferEncoding, resp.Close)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("the archive differs: %d bytes, want %d", len(got), want.Len())
		}
	}
}

// A file that shrinks while its contents are sent, or a tree that grows past the limits, breaks
// the transfer off (no last chunk): the reader sees an error, never a short archive that looks
// whole. (The reader reads a-big's header, then changes the tree, then reads on: until then the
// connection's buffers hold boxd back in a-big's contents.)
func TestArchiveOntoTheConnectionBreaksOff(t *testing.T) {
	for _, change := range []string{"shrink", "grow"} {
		base, ws := tcpBox(t)
		src := filepath.Join(ws, "src")
		if err := os.MkdirAll(filepath.Join(src, "z"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "a-big"), bytes.Repeat([]byte("x"), 64<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		resp := getArchive(t, base, "max_entries=2&path="+url.QueryEscape(src))
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		// a-big's header arrives only once boxd has opened and measured it: the change lands
		// while its contents are on their way, never before boxd looked (that archive is whole).
		first := make([]byte, 512)
		if _, err := io.ReadFull(resp.Body, first); err != nil || !bytes.HasPrefix(first, []byte("a-big\x00")) {
			t.Fatalf("%s: first header %q %v", change, first[:16], err)
		}
		var err error
		if change == "shrink" {
			err = os.Truncate(filepath.Join(src, "a-big"), 1<<20)
		} else {
			err = os.WriteFile(filepath.Join(src, "z", "late"), []byte("c"), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatalf("%s: a broken archive read as whole (%d bytes)", change, len(got))
		}
	}
}
