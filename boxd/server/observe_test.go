package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/watch"
)

// watchStream opens a watch and returns a function reading its next event (failing after 5 s).
func (b *box) watchStream(ctx context.Context, query string) (*http.Response, func() watch.Event) {
	b.t.Helper()
	resp := b.doCtx(ctx, "GET", "/v1/files/watch?"+query, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		b.t.Fatalf("watch: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	lines := make(chan watch.Event, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var e watch.Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				panic(err)
			}
			lines <- e
		}
	}()
	return resp, func() watch.Event {
		b.t.Helper()
		select {
		case e, ok := <-lines:
			if !ok {
				return watch.Event{Type: "<closed>"}
			}
			return e
		case <-time.After(5 * time.Second):
			b.t.Fatal("no watch event within 5 s")
		}
		return watch.Event{}
	}
}

func TestWatchRoute(t *testing.T) {
	b := newBox(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, next := b.watchStream(ctx, "recursive=true&path="+url.QueryEscape(b.workdir))
	defer resp.Body.Close()
	if e := next(); e.Type != "ready" || e.Path != b.workdir {
		t.Fatalf("first line %+v", e)
	}
	p := filepath.Join(b.workdir, "f.txt")
	if err := os.WriteFile(p, []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"create", "write"} {
		if e := next(); e.Type != want || e.Path != p || e.Kind != "file" {
			t.Fatalf("event %+v, want %s %s", e, want, p)
		}
	}
	// An open watch is not a call at work: idle sleep is not held off by it.
	var act struct{ Calls int64 }
	decode(t, b.do("GET", "/v1/activity", nil), 200, &act)
	if act.Calls != 0 {
		t.Fatalf("calls at work with only a watch open: %d", act.Calls)
	}
	// A sleep's fence ends it; one opened while the fence is up ends at once.
	b.raise(1)
	if e := next(); e.Type != "end" || e.Reason != "sleep" {
		t.Fatalf("after the fence: %+v", e)
	}
	if e := next(); e.Type != "<closed>" {
		t.Fatalf("after the end: %+v", e)
	}
	resp2, next2 := b.watchStream(ctx, "path="+url.QueryEscape(b.workdir))
	defer resp2.Body.Close()
	if e1, e2 := next2(), next2(); e1.Type != "ready" || e2.Type != "end" || e2.Reason != "sleep" {
		t.Fatalf("a watch under the fence: %+v %+v", e1, e2)
	}
	b.lift(1)
}

func TestWatchRouteRefusals(t *testing.T) {
	b := newBox(t)
	for _, c := range []struct {
		query  string
		status int
		typ    string
	}{
		{"", 400, "invalid_request"},
		{"path=relative", 400, "invalid_request"},
		{"path=" + url.QueryEscape(b.workdir) + "&queue=0", 400, "invalid_request"},
		{"path=" + url.QueryEscape(b.workdir) + "&recursive=maybe", 400, "invalid_request"},
		{"path=" + url.QueryEscape(filepath.Join(b.workdir, "missing")), 404, "not_found"},
		{"path=" + url.QueryEscape(b.secret), 403, "forbidden"},
	} {
		wantError(t, b.do("GET", "/v1/files/watch?"+c.query, nil), c.status, c.typ)
	}
	// The bound of watches per box, as the bridge passes it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, next := b.watchStream(ctx, "max_watches=1&path="+url.QueryEscape(b.workdir))
	defer resp.Body.Close()
	next()
	// A second one is refused at once (bounded: a bound not kept would stream, not hang the test).
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	wantError(t, b.doCtx(ctx2, "GET", "/v1/files/watch?max_watches=1&path="+url.QueryEscape(b.workdir), nil), 429, "rate_limited")
}

func TestMetricsRoute(t *testing.T) {
	b := newBox(t)
	if err := os.WriteFile(filepath.Join(b.workdir, "data"), make([]byte, 256<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	var m struct {
		Time   time.Time
		Cgroup string
		CPU    struct {
			UsageSeconds float64 `json:"usage_seconds"`
		}
		Memory struct {
			UsedBytes uint64 `json:"used_bytes"`
		}
		Disk []struct {
			Path       string
			UsedBytes  uint64  `json:"used_bytes"`
			LimitBytes *uint64 `json:"limit_bytes"`
		}
		History *[]json.RawMessage
	}
	decode(t, b.do("GET", "/v1/metrics", nil), 200, &m)
	if m.Cgroup == "" || m.CPU.UsageSeconds <= 0 || m.Memory.UsedBytes == 0 || m.History != nil || time.Since(m.Time) > time.Minute {
		t.Fatalf("metrics %+v", m)
	}
	if len(m.Disk) != 1 || m.Disk[0].Path != b.workdir || m.Disk[0].UsedBytes < 256<<10 || m.Disk[0].LimitBytes == nil || *m.Disk[0].LimitBytes != 1<<30 {
		t.Fatalf("disk %+v", m.Disk)
	}
	decode(t, b.do("GET", "/v1/metrics?since="+url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339)), nil), 200, &m)
	if m.History == nil {
		t.Fatal("since given: history must be there (empty until the first sample)")
	}
	wantError(t, b.do("GET", "/v1/metrics?since=yesterday", nil), 400, "invalid_request")
	var act struct{ Calls int64 }
	decode(t, b.do("GET", "/v1/activity", nil), 200, &act)
	if act.Calls != 0 {
		t.Fatalf("calls at work: %d", act.Calls)
	}
}
