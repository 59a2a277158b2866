package server

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/auth"
	"sandbox-bridge.io/boxd/files"
	"sandbox-bridge.io/boxd/frames"
	"sandbox-bridge.io/boxd/internal/testkit"
	"sandbox-bridge.io/boxd/metrics"
	"sandbox-bridge.io/boxd/ports"
	"sandbox-bridge.io/boxd/process"
	"sandbox-bridge.io/boxd/watch"
)

const token = "test-token"

type box struct {
	t       *testing.T
	url     string
	workdir string
	secret  string
	procs   *process.Manager
	logs    *bytes.Buffer
	logMu   *sync.Mutex
	// writes counts the server's writes to its connections (each one a send to the client).
	writes *atomic.Int64
}

// countingListener counts the writes made to the connections it accepts.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// newBox serves boxd on a real listener with real processes.
func newBox(t *testing.T) *box {
	t.Helper()
	secret := t.TempDir()
	if err := os.WriteFile(filepath.Join(secret, auth.TokenFile), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	checker, err := auth.Load(secret)
	if err != nil {
		t.Fatal(err)
	}
	workdir := t.TempDir()
	procs, err := process.NewManager(process.Config{Workdir: workdir}, process.NewEnv(os.Environ()))
	if err != nil {
		t.Fatal(err)
	}
	logs, mu := &bytes.Buffer{}, &sync.Mutex{}
	log := slog.New(slog.NewJSONHandler(lockedWriter{mu, logs}, nil))
	srv := httptest.NewUnstartedServer(New(Config{
		Version: "test", StartedAt: time.Now(), Auth: checker, Procs: procs, Protected: []string{secret},
		Ports: ports.New(log), Log: log,
		Watch:   watch.New(files.NewBox([]string{secret}), watch.Config{}),
		Metrics: metrics.New(metrics.Config{Volumes: []metrics.Volume{{Path: workdir, Limit: 1 << 30}}}),
	}))
	writes := &atomic.Int64{}
	srv.Listener = countingListener{srv.Listener, writes}
	srv.Start()
	t.Cleanup(func() {
		procs.Shutdown()
		srv.Close()
	})
	return &box{t: t, url: srv.URL, workdir: workdir, secret: secret, procs: procs, logs: logs, logMu: mu, writes: writes}
}

func (b *box) do(method, path string, body io.Reader, headers ...string) *http.Response {
	b.t.Helper()
	return b.doCtx(context.Background(), method, path, body, headers...)
}

func (b *box) doCtx(ctx context.Context, method, path string, body io.Reader, headers ...string) *http.Response {
	b.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, b.url+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set(auth.Header, token)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

// decode reads a JSON answer and checks its status.
func decode(t *testing.T, resp *http.Response, status int, v any) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
	}
}

// wantError checks a JSON error answer.
func wantError(t *testing.T, resp *http.Response, status int, typ string) string {
	t.Helper()
	var body struct {
		Error struct{ Type, Message string }
	}
	decode(t, resp, status, &body)
	if body.Error.Type != typ || body.Error.Message == "" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("error %+v (%s), want type %s", body.Error, resp.Header.Get("Content-Type"), typ)
	}
	return body.Error.Message
}

type frame struct {
	typ     byte
	payload []byte
}

func readFrames(t *testing.T, r io.Reader) []frame {
	t.Helper()
	var out []frame
	fr := frames.NewReader(r)
	for {
		typ, p, err := fr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, frame{typ, append([]byte(nil), p...)})
	}
}

type execResult struct {
	pid            int
	stdout, stderr string
	exit           process.Exit
	sawExit        bool
	errorFrame     string
}

func collect(t *testing.T, fs []frame) execResult {
	t.Helper()
	var r execResult
	for _, f := range fs {
		switch f.typ {
		case frames.Start:
			var s struct{ Pid int }
			_ = json.Unmarshal(f.payload, &s)
			r.pid = s.Pid
		case frames.Stdout:
			r.stdout += string(f.payload)
		case frames.Stderr:
			r.stderr += string(f.payload)
		case frames.Exit:
			r.sawExit = true
			if err := json.Unmarshal(f.payload, &r.exit); err != nil {
				t.Fatal(err)
			}
		case frames.Error:
			r.errorFrame = string(f.payload)
		}
	}
	return r
}

func (b *box) exec(req map[string]any) execResult {
	b.t.Helper()
	if _, ok := req["timeout_ms"]; !ok {
		req["timeout_ms"] = 20000
	}
	resp := b.do("POST", "/v1/exec", jsonBody(req))
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != frames.ContentType {
		body, _ := io.ReadAll(resp.Body)
		b.t.Fatalf("exec: %d %s", resp.StatusCode, body)
	}
	r := collect(b.t, readFrames(b.t, resp.Body))
	if !r.sawExit {
		b.t.Fatalf("no exit frame: %+v", r)
	}
	return r
}

func TestAuth(t *testing.T) {
	b := newBox(t)
	var health map[string]string
	decode(t, b.do("GET", "/v1/health", nil, auth.Header, ""), 200, &health)
	if health["status"] != "ok" || health["version"] != "test" || health["started_at"] == "" {
		t.Fatalf("%v", health)
	}
	for _, tok := range []string{"", "wrong", token + "x"} {
		resp := b.do("POST", "/v1/exec", jsonBody(map[string]any{"command": "true", "timeout_ms": 1000}), auth.Header, tok)
		wantError(t, resp, 401, "unauthorized")
		resp = b.do("GET", "/v1/files/list?path=/", nil, auth.Header, tok)
		wantError(t, resp, 401, "unauthorized")
	}
	wantError(t, b.do("GET", "/v1/nope", nil), 404, "not_found")
	wantError(t, b.do("GET", "/v1/exec", nil), 404, "not_found")
}

func TestExecOverHTTP(t *testing.T) {
	b := newBox(t)
	r := b.exec(map[string]any{"command": "echo hi; echo err >&2; exit 3"})
	if r.pid <= 0 || r.stdout != "hi\n" || r.stderr != "err\n" || r.exit.ExitCode != 3 || r.exit.StdoutBytes != 3 {
		t.Fatalf("%+v", r)
	}
	r = b.exec(map[string]any{
		"command": "cat; echo \" $GREETING\"", "stdin": base64.StdEncoding.EncodeToString([]byte("in")),
		"env": map[string]string{"GREETING": "hello"},
	})
	if r.stdout != "in hello\n" || r.exit.ExitCode != 0 {
		t.Fatalf("stdin and env: %+v", r)
	}
	r = b.exec(map[string]any{"command": "true", "cwd": "/nonexistent-dir"})
	if r.exit.ExitCode != 1 || !strings.Contains(r.stderr, "/nonexistent-dir") {
		t.Fatalf("missing cwd: %+v", r)
	}
	r = b.exec(map[string]any{"command": "sleep 10", "timeout_ms": 200})
	if r.exit.ExitCode != 124 || !r.exit.TimedOut {
		t.Fatalf("timeout: %+v", r)
	}
	r = b.exec(map[string]any{"command": "yes | head -c 5000", "max_output_bytes": 100})
	if len(r.stdout) != 100 || !r.exit.StdoutTruncated {
		t.Fatalf("cap: %d bytes %+v", len(r.stdout), r.exit)
	}

	wantError(t, b.do("POST", "/v1/exec", strings.NewReader("{")), 400, "invalid_request")
	wantError(t, b.do("POST", "/v1/exec", jsonBody(map[string]any{"command": "true"})), 400, "invalid_request")
	wantError(t, b.do("POST", "/v1/exec", jsonBody(map[string]any{"command": "true", "timeout_ms": 100, "stdin": "!!"})), 400, "invalid_request")
	wantError(t, b.do("POST", "/v1/exec", bytes.NewReader(make([]byte, 2<<20))), 413, "payload_too_large")
}

// A caller that reads the answer whole (the bridge's exec) asks boxd to coalesce: the same
// frames, sent in one write with a Content-Length for a short command, instead of a flush per
// frame and one for the end of the chunks. Output frames carry at most 32 KiB either way (the
// bridge's exec relay counts on it to bound what it holds).
func TestExecCoalesce(t *testing.T) {
	b := newBox(t)
	run := func(coalesce bool, command string) (execResult, *http.Response, int64, []frame) {
		t.Helper()
		before := b.writes.Load()
		resp := b.do("POST", "/v1/exec", jsonBody(map[string]any{"command": command, "timeout_ms": 20000, "coalesce": coalesce}))
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			body, _ := io.ReadAll(resp.Body)
			t.Fatalf("exec: %d %s", resp.StatusCode, body)
		}
		fs := readFrames(t, resp.Body)
		return collect(t, fs), resp, b.writes.Load() - before, fs
	}
	for _, coalesce := range []bool{false, true} {
		r, resp, writes, _ := run(coalesce, "echo hi; echo err >&2; exit 3")
		if r.pid <= 0 || r.stdout != "hi\n" || r.stderr != "err\n" || !r.sawExit || r.exit.ExitCode != 3 || r.exit.StdoutBytes != 3 {
			t.Fatalf("coalesce=%v: %+v", coalesce, r)
		}
		if coalesce && (writes != 1 || resp.ContentLength <= 0) {
			t.Fatalf("coalesced exec: %d writes, Content-Length %d; want 1 write with a length", writes, resp.ContentLength)
		}
		if !coalesce && (writes < 3 || resp.ContentLength != -1) {
			t.Fatalf("streamed exec: %d writes, Content-Length %d; want a flush per frame, chunked", writes, resp.ContentLength)
		}
		r, _, _, fs := run(coalesce, "head -c 1048576 /dev/zero")
		if len(r.stdout) != 1<<20 || r.exit.ExitCode != 0 {
			t.Fatalf("coalesce=%v: %d bytes of output, %+v", coalesce, len(r.stdout), r.exit)
		}
		for _, f := range fs {
			if len(f.payload) > 32<<10 {
				t.Fatalf("coalesce=%v: a frame of %d bytes", coalesce, len(f.payload))
			}
		}
	}
}

func TestExecClientDisconnectKills(t *testing.T) {
	b := newBox(t)
	ctx, cancel := context.WithCancel(context.Background())
	resp := b.doCtx(ctx, "POST", "/v1/exec", jsonBody(map[string]any{"command": "echo $$; exec sleep 100", "timeout_ms": 60000}))
	fr := frames.NewReader(resp.Body)
	var pid int
	for pid == 0 {
		typ, p, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if typ == frames.Stdout {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(p)))
		}
	}
	cancel()
	resp.Body.Close()
	testkit.WaitGone(t, pid, "the command")
}

func TestConcurrencyCapOverHTTP(t *testing.T) {
	b := newBox(t)
	var wg sync.WaitGroup
	statuses := make(chan int, 6)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := b.do("POST", "/v1/exec", jsonBody(map[string]any{"command": "sleep 2", "timeout_ms": 60000, "max_concurrent": 5}))
			if resp.StatusCode == 429 && resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[200] != 5 || count[429] != 1 {
		t.Fatalf("statuses %v", count)
	}
}

func TestEnvOverHTTP(t *testing.T) {
	b := newBox(t)
	var res struct{ Count int }
	decode(t, b.do("POST", "/v1/env", jsonBody(map[string]any{"set": map[string]string{"A": "1", "B": "two words"}})), 200, &res)
	if res.Count != 2 {
		t.Fatalf("%+v", res)
	}
	wantError(t, b.do("POST", "/v1/env", jsonBody(map[string]any{"set": map[string]string{"C": "3", "bad-name": "x"}})), 400, "invalid_request")
	decode(t, b.do("POST", "/v1/env", jsonBody(map[string]any{"set": map[string]string{"A": "one"}})), 200, &res)
	if res.Count != 2 {
		t.Fatalf("C was set by the refused call: %+v", res)
	}
	if r := b.exec(map[string]any{"command": `echo "$A|$B|${C:-unset}"`}); r.stdout != "one|two words|unset\n" {
		t.Fatalf("%q", r.stdout)
	}
}

func TestProcessesOverHTTP(t *testing.T) {
	b := newBox(t)
	var info process.Info
	decode(t, b.do("POST", "/v1/processes", jsonBody(map[string]any{"command": "echo ready; read line; echo got $line; exit 4", "tag": "srv"})), 201, &info)
	if info.Status != "running" || info.Tag != "srv" || info.ProcessID == "" {
		t.Fatalf("%+v", info)
	}
	id := info.ProcessID

	// A follower started now sees everything up to the exit.
	followed := make(chan execResult, 1)
	go func() {
		resp := b.do("GET", "/v1/processes/"+id+"/output?follow=true", nil)
		defer resp.Body.Close()
		followed <- collect(t, readFrames(t, resp.Body))
	}()

	var list struct{ Processes []process.Info }
	decode(t, b.do("GET", "/v1/processes", nil), 200, &list)
	if len(list.Processes) != 1 || list.Processes[0].ProcessID != id {
		t.Fatalf("%+v", list)
	}
	var written struct{ Written int }
	decode(t, b.do("POST", "/v1/processes/"+id+"/stdin?eof=true", strings.NewReader("hello\n")), 200, &written)
	if written.Written != 6 {
		t.Fatalf("%+v", written)
	}
	select {
	case r := <-followed:
		if r.stdout != "ready\ngot hello\n" || !r.sawExit || r.exit.ExitCode != 4 {
			t.Fatalf("followed: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not end")
	}

	// Replay from an offset; the start frame says where it starts.
	resp := b.do("GET", "/v1/processes/"+id+"/output?since=6", nil)
	fs := readFrames(t, resp.Body)
	resp.Body.Close()
	if fs[0].typ != frames.Start || string(fs[0].payload) != `{"dropped":0,"offset":6}` {
		t.Fatalf("start frame %d %s", fs[0].typ, fs[0].payload)
	}
	if r := collect(t, fs); r.stdout != "got hello\n" || r.exit.ExitCode != 4 {
		t.Fatalf("replay: %+v", r)
	}

	decode(t, b.do("GET", "/v1/processes/"+id, nil), 200, &info)
	if info.Status != "exited" || *info.ExitCode != 4 {
		t.Fatalf("%+v", info)
	}
	wantError(t, b.do("POST", "/v1/processes/"+id+"/stdin", strings.NewReader("x")), 409, "conflict")
	wantError(t, b.do("POST", "/v1/processes/"+id+"/signal", jsonBody(map[string]string{"signal": "TERM"})), 409, "conflict")
	wantError(t, b.do("GET", "/v1/processes/p-999", nil), 404, "not_found")
	wantError(t, b.do("GET", "/v1/processes/p-999/output", nil), 404, "not_found")
	wantError(t, b.do("GET", "/v1/processes/"+id+"/output?since=-1", nil), 400, "invalid_request")

	decode(t, b.do("POST", "/v1/processes", jsonBody(map[string]any{"command": "sleep 100"})), 201, &info)
	decode(t, b.do("POST", "/v1/processes/"+info.ProcessID+"/signal", jsonBody(map[string]string{"signal": "KILL"})), 200, &info)
	wantError(t, b.do("POST", "/v1/processes/"+info.ProcessID+"/signal", jsonBody(map[string]string{"signal": "NOPE"})), 400, "invalid_request")
	for deadline := time.Now().Add(5 * time.Second); info.Status != "exited"; {
		if time.Now().After(deadline) {
			t.Fatal("the killed process did not exit")
		}
		time.Sleep(10 * time.Millisecond)
		decode(t, b.do("GET", "/v1/processes/"+info.ProcessID, nil), 200, &info)
	}
	decode(t, b.do("POST", "/v1/processes", jsonBody(map[string]any{"command": "sleep 100", "max_processes": 1})), 201, &info)
	wantError(t, b.do("POST", "/v1/processes", jsonBody(map[string]any{"command": "sleep 100", "max_processes": 1})), 429, "rate_limited")
}

func TestFilesOverHTTP(t *testing.T) {
	b := newBox(t)
	p := filepath.Join(b.workdir, "dir", "f.bin")
	content := bytes.Repeat([]byte{0, 1, 2, 255}, 1000)
	var w struct {
		Path string
		Size int
	}
	decode(t, b.do("PUT", "/v1/files?mode=600&path="+url.QueryEscape(p), bytes.NewReader(content)), 200, &w)
	if w.Path != p || w.Size != len(content) {
		t.Fatalf("%+v", w)
	}
	resp := b.do("GET", "/v1/files?path="+url.QueryEscape(p), nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, content) || resp.ContentLength != int64(len(content)) {
		t.Fatalf("read back: %d, %d bytes", resp.StatusCode, len(got))
	}
	wantError(t, b.do("GET", "/v1/files?max_bytes=10&path="+url.QueryEscape(p), nil), 413, "payload_too_large")
	wantError(t, b.do("PUT", "/v1/files?max_bytes=10&path="+url.QueryEscape(p), bytes.NewReader(content)), 413, "payload_too_large")
	wantError(t, b.do("GET", "/v1/files?path=relative", nil), 400, "invalid_request")
	wantError(t, b.do("GET", "/v1/files?path="+url.QueryEscape(b.workdir), nil), 400, "invalid_request")
	wantError(t, b.do("GET", "/v1/files?path="+url.QueryEscape(b.workdir+"/missing"), nil), 404, "not_found")
	wantError(t, b.do("PUT", "/v1/files?mode=999&path="+url.QueryEscape(p), strings.NewReader("x")), 400, "invalid_request")

	var l struct {
		Entries   []struct{ Name, Type string }
		Truncated bool
	}
	decode(t, b.do("GET", "/v1/files/list?recursive=true&path="+url.QueryEscape(b.workdir), nil), 200, &l)
	if len(l.Entries) != 2 || l.Entries[0].Name != "dir" || l.Entries[1].Name != "f.bin" || l.Truncated {
		t.Fatalf("%+v", l)
	}
	wantError(t, b.do("GET", "/v1/files/list?limit=0&path=/", nil), 400, "invalid_request")

	wantError(t, b.do("DELETE", "/v1/files?path="+url.QueryEscape(filepath.Dir(p)), nil), 409, "conflict")
	wantError(t, b.do("DELETE", "/v1/files?recursive=true&path="+url.QueryEscape(b.secret), nil), 403, "forbidden")
	wantError(t, b.do("DELETE", "/v1/files?recursive=true&path=/", nil), 400, "invalid_request")
	var d struct {
		Deleted bool
	}
	decode(t, b.do("DELETE", "/v1/files?recursive=true&path="+url.QueryEscape(filepath.Dir(p)), nil), 200, &d)
	if !d.Deleted {
		t.Fatal("not deleted")
	}
	wantError(t, b.do("DELETE", "/v1/files?path="+url.QueryEscape(filepath.Dir(p)), nil), 404, "not_found")
}

func TestArchivesOverHTTP(t *testing.T) {
	b := newBox(t)
	src := filepath.Join(b.workdir, "src")
	for i := 0; i < 50; i++ {
		if err := os.MkdirAll(filepath.Join(src, fmt.Sprint(i%5)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(i%5), fmt.Sprint(i)), []byte(strings.Repeat("z", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resp := b.do("GET", "/v1/archive?gzip=true&path="+url.QueryEscape(src), nil)
	tgz, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/gzip" ||
		resp.Header.Get("X-Boxd-Archive-Entries") != "55" || resp.Header.Get("X-Boxd-Archive-Bytes") != strconv.Itoa(49*50/2) {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	dst := filepath.Join(b.workdir, "dst")
	var res struct {
		Entries, Bytes int
	}
	decode(t, b.do("PUT", "/v1/archive?path="+url.QueryEscape(dst), bytes.NewReader(tgz)), 200, &res)
	if res.Entries != 55 || res.Bytes != 49*50/2 {
		t.Fatalf("%+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "4", "49")); err != nil || len(b) != 49 {
		t.Fatalf("%d %v", len(b), err)
	}

	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	_ = tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	_ = tw.Close()
	wantError(t, b.do("PUT", "/v1/archive?path="+url.QueryEscape(dst), &evil), 400, "invalid_request")
	wantError(t, b.do("PUT", "/v1/archive?max_entries=3&path="+url.QueryEscape(dst), bytes.NewReader(tgz)), 413, "payload_too_large")
	wantError(t, b.do("GET", "/v1/archive?path="+url.QueryEscape(b.workdir+"/missing"), nil), 404, "not_found")
}

// Every file and archive route refuses boxd's own directories, named directly, climbed to
// with "..", or reached through symlinks box code planted; the credential never comes out.
func TestFileRoutesRefuseBoxdDirectories(t *testing.T) {
	b := newBox(t)
	ws := b.workdir
	if err := os.Symlink(b.secret, filepath.Join(ws, "l-secret")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(b.secret, auth.TokenFile), filepath.Join(ws, "l-token")); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(ws, b.secret)
	if err != nil {
		t.Fatal(err)
	}
	tarball := func() io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: auth.TokenFile, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
		_, _ = tw.Write([]byte("x"))
		_ = tw.Close()
		return &buf
	}
	for _, p := range []string{
		b.secret, filepath.Join(b.secret, auth.TokenFile), ws + "/" + rel + "/" + auth.TokenFile,
		filepath.Join(ws, "l-token"), filepath.Join(ws, "l-secret"), filepath.Join(ws, "l-secret", auth.TokenFile),
	} {
		q := url.QueryEscape(p)
		for _, call := range []struct {
			method, path string
			body         io.Reader
		}{
			{"GET", "/v1/files?path=" + q, nil},
			{"PUT", "/v1/files?path=" + q, strings.NewReader("overwritten")},
			{"GET", "/v1/files/list?path=" + q, nil},
			{"GET", "/v1/files/list?recursive=true&path=" + q, nil},
			{"GET", "/v1/archive?path=" + q, nil},
			{"PUT", "/v1/archive?path=" + q, tarball()},
			{"DELETE", "/v1/files?recursive=true&path=" + q, nil},
		} {
			if call.method == "DELETE" && (strings.HasSuffix(p, "l-token") || strings.HasSuffix(p, "l-secret")) {
				continue // deleting a planted symlink deletes the link
			}
			msg := wantError(t, b.do(call.method, call.path, call.body), 403, "forbidden")
			if !strings.Contains(msg, "boxd's own directory") || strings.Contains(msg, token) {
				t.Fatalf("%s %s: %s", call.method, call.path, msg)
			}
		}
	}
	// A listing or an archive of the directory holding the secret mount is refused too.
	parent := url.QueryEscape(filepath.Dir(b.secret))
	wantError(t, b.do("GET", "/v1/files/list?path="+parent, nil), 403, "forbidden")
	wantError(t, b.do("GET", "/v1/archive?path="+parent, nil), 403, "forbidden")
	if got, err := os.ReadFile(filepath.Join(b.secret, auth.TokenFile)); err != nil || string(got) != token {
		t.Fatalf("the token file changed: %q %v", got, err)
	}
}

// GET /v1/archive counts before sending: past max_bytes or max_entries it is 413 with the
// counts, nothing streamed; a tree that grows past them while streaming is cut off.
func TestArchiveLimitsOverHTTP(t *testing.T) {
	b := newBox(t)
	src := filepath.Join(b.workdir, "src")
	// A big file first, so the stream is still in it when the tree grows.
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a-big"), bytes.Repeat([]byte("x"), 32<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "z"), 0o755); err != nil {
		t.Fatal(err)
	}
	q := url.QueryEscape(src)
	msg := wantError(t, b.do("GET", "/v1/archive?max_entries=1&path="+q, nil), 413, "payload_too_large")
	if !strings.Contains(msg, "2 entries and 33554432 bytes") || !strings.Contains(msg, "more than 1 entries") {
		t.Fatalf("%s", msg)
	}
	msg = wantError(t, b.do("GET", "/v1/archive?max_bytes=1000&path="+q, nil), 413, "payload_too_large")
	if !strings.Contains(msg, "more than 1000 bytes") {
		t.Fatalf("%s", msg)
	}
	wantError(t, b.do("GET", "/v1/archive?max_bytes=-1&path="+q, nil), 400, "invalid_request")

	// At the limits: the whole archive, and PUT with the same limits takes it.
	resp := b.do("GET", "/v1/archive?max_entries=2&max_bytes=33554432&path="+q, nil)
	whole, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	var res struct{ Entries, Bytes int64 }
	decode(t, b.do("PUT", "/v1/archive?max_entries=2&max_bytes=33554432&path="+url.QueryEscape(filepath.Join(b.workdir, "dst")), bytes.NewReader(whole)), 200, &res)
	if res.Entries != 2 || res.Bytes != 33554432 {
		t.Fatalf("%+v", res)
	}

	// The tree grows once the answer has started (in a directory the stream has not read
	// yet: it is still sending a-big): the stream breaks.
	resp = b.do("GET", "/v1/archive?max_entries=2&path="+q, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Boxd-Archive-Entries") != "2" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	if err := os.WriteFile(filepath.Join(src, "z", "late"), []byte("c"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("a tree grown past max_entries streamed as a whole archive (%d bytes)", len(got))
	}
}

func TestPTYOverHTTP(t *testing.T) {
	b := newBox(t)
	wantError(t, b.do("GET", "/v1/pty", nil), 400, "invalid_request")

	conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := url.Values{"cols": {"100"}, "rows": {"30"}, "command": {"stty size; read x; echo got:$x"}}
	fmt.Fprintf(conn, "GET /v1/pty?%s HTTP/1.1\r\nHost: boxd\r\nConnection: Upgrade\r\nUpgrade: boxd-frames\r\n%s: %s\r\n\r\n", q.Encode(), auth.Header, token)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "boxd-frames" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	fw := frames.NewWriter(conn, nil)
	fr := frames.NewReader(br)
	var out strings.Builder
	var exit *process.Exit
	sent := false
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	for exit == nil {
		typ, p, err := fr.Next()
		if err != nil {
			t.Fatalf("%v; output so far %q", err, out.String())
		}
		switch typ {
		case frames.Stdout:
			out.Write(p)
			if !sent && strings.Contains(out.String(), "30 100") {
				sent = true
				_ = fw.Write(frames.Stdin, []byte("typed\r"))
			}
		case frames.Exit:
			exit = &process.Exit{}
			_ = json.Unmarshal(p, exit)
		}
	}
	if !strings.Contains(out.String(), "got:typed") || exit.ExitCode != 0 {
		t.Fatalf("output %q exit %+v", out.String(), exit)
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("after exit: %v, want the connection closed", err)
	}
}

func TestRequestLog(t *testing.T) {
	b := newBox(t)
	b.exec(map[string]any{"command": "echo secret-output", "env": map[string]string{"SECRET": "env-value"}})
	wantError(t, b.do("GET", "/v1/files?path=/secret-path", nil, auth.Header, "bad"), 401, "unauthorized")
	b.logMu.Lock()
	logs := b.logs.String()
	b.logMu.Unlock()
	for _, leak := range []string{"secret-output", "env-value", "secret-path", token} {
		if strings.Contains(logs, leak) {
			t.Fatalf("the log holds %q:\n%s", leak, logs)
		}
	}
	var line struct {
		Msg, Route string
		Status     int
		DurationMs *float64 `json:"duration_ms"`
	}
	first := strings.SplitN(logs, "\n", 2)[0]
	if err := json.Unmarshal([]byte(first), &line); err != nil || line.Route != "POST /v1/exec" || line.Status != 200 || line.DurationMs == nil {
		t.Fatalf("%s: %+v %v", first, line, err)
	}
}

func TestShutdownEndsStreamsWithAnErrorFrame(t *testing.T) {
	b := newBox(t)
	var info process.Info
	decode(t, b.do("POST", "/v1/processes", jsonBody(map[string]any{"command": "sleep 100"})), 201, &info)
	follow := b.do("GET", "/v1/processes/"+info.ProcessID+"/output?follow=true", nil)
	defer follow.Body.Close()
	exec := b.do("POST", "/v1/exec", jsonBody(map[string]any{"command": "sleep 100", "timeout_ms": 60000}))
	defer exec.Body.Close()
	fr := frames.NewReader(exec.Body)
	if typ, _, err := fr.Next(); err != nil || typ != frames.Start {
		t.Fatalf("%d %v", typ, err)
	}
	b.procs.Shutdown()
	for name, body := range map[string]io.Reader{"exec": exec.Body, "process output": follow.Body} {
		r := collect(t, readFrames(t, body))
		if r.sawExit || !strings.Contains(r.errorFrame, "shutting down") {
			t.Fatalf("%s: %+v", name, r)
		}
	}
}

func TestActivityCountsCallsAtWork(t *testing.T) {
	b := newBox(t)
	calls := func() int64 {
		var got struct{ Calls int64 }
		decode(t, b.do("GET", "/v1/activity", nil), http.StatusOK, &got)
		return got.Calls
	}
	if n := calls(); n != 0 {
		t.Fatalf("idle box: calls = %d, want 0", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := b.doCtx(ctx, "POST", "/v1/exec", jsonBody(map[string]any{"command": "echo started; exec sleep 100", "timeout_ms": 60000}))
	fr := frames.NewReader(resp.Body)
	for {
		typ, _, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if typ == frames.Stdout {
			break
		}
	}
	if n := calls(); n != 1 {
		t.Fatalf("during a streaming exec: calls = %d, want 1", n)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for calls() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("calls never went back to 0 after the exec ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantError(t, b.do("GET", "/v1/activity", nil, "X-Boxd-Token", "wrong"), http.StatusUnauthorized, "unauthorized")
}
