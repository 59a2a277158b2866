package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/internal/kubetest"
)

func pod(name string, labels map[string]any) map[string]any {
	return map[string]any{"metadata": map[string]any{"name": name, "namespace": "ns", "labels": labels},
		"status": map[string]any{"podIP": "10.0.0.1"}}
}

var boxLabel = map[string]any{"sandbox-bridge.io/box": "true"}

func newReflector(t *testing.T, api *kubetest.Server) (*Reflector[string], *atomic.Int64) {
	t.Helper()
	c, err := NewClient(&Config{Server: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	var changes atomic.Int64
	r := &Reflector[string]{
		Client: c, Path: "/api/v1/namespaces/ns/pods",
		Query: map[string][]string{"labelSelector": {"sandbox-bridge.io/box=true"}},
		Decode: func(raw json.RawMessage) (string, bool, error) {
			var o struct {
				Metadata struct{ Name string }  `json:"metadata"`
				Status   struct{ PodIP string } `json:"status"`
			}
			err := json.Unmarshal(raw, &o)
			return o.Metadata.Name + "@" + o.Status.PodIP, true, err
		},
		OnChange: func() { changes.Add(1) },
		PageSize: 2, Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}
	return r, &changes
}

func items(r *Reflector[string]) map[string]string {
	m := map[string]string{}
	r.Range(func(k, v string) { m[k] = v })
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Second) // the gateway's promise: a change in force within 1 s
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("within 1 s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestReflectorListWatchBookmarkRelist(t *testing.T) {
	api := kubetest.New(t)
	for i := range 3 {
		api.Put("pods", pod(fmt.Sprintf("box-%d", i), boxLabel))
	}
	api.Put("pods", pod("not-a-box", map[string]any{"app": "x"}))
	// Not ready until the first list is in: the first two lists fail.
	api.FailNext("pods", 503, 500)
	r, changes := newReflector(t, api)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	if r.Synced() {
		t.Fatal("synced before any list")
	}
	waitFor(t, "first list", r.Synced)
	if got := items(r); len(got) != 3 || got["ns/box-1"] != "box-1@10.0.0.1" {
		t.Fatalf("after list: %v", got)
	}
	// Paged: 3 objects in pages of 2 is a second request with the continue token.
	paged := false
	for _, q := range api.Requests() {
		if !q.Watch && q.Continue != "" && q.Limit == "2" {
			paged = true
		}
	}
	if !paged {
		t.Fatalf("the list was not paged: %+v", api.Requests())
	}

	// Watch events: add, modify, delete.
	api.Put("pods", pod("box-3", boxLabel))
	waitFor(t, "ADDED", func() bool { return items(r)["ns/box-3"] != "" })
	p := pod("box-0", boxLabel)
	p["status"] = map[string]any{"podIP": "10.0.0.9"}
	api.Put("pods", p)
	waitFor(t, "MODIFIED", func() bool { return items(r)["ns/box-0"] == "box-0@10.0.0.9" })
	api.Delete("pods", "ns", "box-1")
	waitFor(t, "DELETED", func() bool { _, ok := items(r)["ns/box-1"]; return !ok })
	if changes.Load() < 4 {
		t.Fatalf("OnChange called %d times", changes.Load())
	}

	// Every event moves the resourceVersion on: a watch that ends resumes after the last event.
	eventRV := lastRV(api)
	waitFor(t, "resourceVersion of the last event", func() bool { return r.ResourceVersion() == eventRV })
	api.CloseWatches()
	waitFor(t, "re-watch from the last event", func() bool {
		q := api.Requests()
		last := q[len(q)-1]
		return last.Watch && last.ResourceVersion == eventRV
	})

	// A BOOKMARK moves the resourceVersion on; a watch the server ends resumes from it, no list.
	api.Bookmark("pods")
	bookmarkRV := ""
	waitFor(t, "bookmark", func() bool {
		bookmarkRV = r.ResourceVersion()
		return bookmarkRV == lastRV(api)
	})
	api.CloseWatches()
	waitFor(t, "re-watch from the bookmark", func() bool {
		q := api.Requests()
		last := q[len(q)-1]
		return last.Watch && last.ResourceVersion == bookmarkRV && last.Status == 200
	})
	if n := r.Lists.Load(); n != 1 {
		t.Fatalf("a watch that ended cleanly made %d lists, want 1", n)
	}

	// 410 as an ERROR event on the open watch: list again (what was deleted meanwhile is gone).
	api.Compact(true)
	api.Delete("pods", "ns", "box-2")
	waitFor(t, "relist after ERROR 410", func() bool { return r.Lists.Load() == 2 })
	waitFor(t, "box-2 gone after relist", func() bool { _, ok := items(r)["ns/box-2"]; return !ok })

	// 410 as the watch's HTTP status (the resourceVersion is older than the watch cache).
	api.Compact(false)
	api.CloseWatches()
	waitFor(t, "relist after HTTP 410", func() bool { return r.Lists.Load() == 3 })
	api.Put("pods", pod("box-4", boxLabel))
	waitFor(t, "box-4 after relist", func() bool { return items(r)["ns/box-4"] != "" })
	if r.Relists.Load() != 2 {
		t.Fatalf("relists = %d, want 2", r.Relists.Load())
	}

	// Failures back off and recover; the store stays in force meanwhile.
	api.FailNext("pods", 500, 500, 500)
	api.CloseWatches()
	time.Sleep(20 * time.Millisecond)
	if !r.Synced() || len(items(r)) != 3 {
		t.Fatalf("a failing API server changed the store: %v", items(r))
	}
	api.Put("pods", pod("box-5", boxLabel))
	waitFor(t, "recovery after 500s", func() bool { return items(r)["ns/box-5"] != "" })
	if got := items(r); len(got) != 4 || got["ns/not-a-box"] != "" {
		t.Fatalf("final store %v", got)
	}
}

func lastRV(api *kubetest.Server) string {
	// The double's resourceVersion after the bookmark is its newest; read it from a list.
	c, _ := NewClient(&Config{Server: api.URL})
	resp, err := c.Get(context.Background(), "/api/v1/namespaces/ns/pods", nil, "")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var l struct {
		Metadata struct{ ResourceVersion string } `json:"metadata"`
	}
	json.NewDecoder(resp.Body).Decode(&l)
	return l.Metadata.ResourceVersion
}

func TestReflectorBackoffGrows(t *testing.T) {
	api := kubetest.New(t)
	api.FailNext("pods", 500, 500, 500, 500, 500, 500)
	r, _ := newReflector(t, api)
	r.Backoff, r.MaxBackoff = 20*time.Millisecond, 80*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go r.Run(ctx)
	deadline := time.Now().Add(3 * time.Second)
	for !r.Synced() {
		if time.Now().After(deadline) {
			t.Fatal("never synced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// 6 failures at 20, 40, 80, 80, 80, 80 ms (each between half and 1.5 times that): >= 190 ms.
	if el := time.Since(start); el < 190*time.Millisecond {
		t.Fatalf("6 failed lists retried within %v: no backoff", el)
	}
}

// A continue token that expires mid-list (410) starts the list over, from its first page.
func TestReflectorContinueExpired(t *testing.T) {
	api := kubetest.New(t)
	for i := range 3 {
		api.Put("pods", pod(fmt.Sprintf("box-%d", i), boxLabel))
	}
	api.ExpireNextContinue()
	r, _ := newReflector(t, api)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	waitFor(t, "list", r.Synced)
	firstPages := 0
	for _, q := range api.Requests() {
		if !q.Watch && q.Continue == "" {
			firstPages++
		}
	}
	if firstPages != 2 || len(items(r)) != 3 || r.Lists.Load() != 1 {
		t.Fatalf("first pages %d (want 2), items %v, lists %d", firstPages, items(r), r.Lists.Load())
	}
}
