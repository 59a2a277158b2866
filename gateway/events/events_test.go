package events

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/internal/kubetest"
	"sandbox-bridge.io/gateway/kube"
)

type results struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *results) add(s string) { r.mu.Lock(); r.n[s]++; r.mu.Unlock() }
func (r *results) get(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[s]
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func eventsOf(api *kubetest.Server, pod string) []map[string]any {
	var out []map[string]any
	for _, e := range api.Objects("events") {
		if e["involvedObject"].(map[string]any)["name"] == pod {
			out = append(out, e)
		}
	}
	return out
}

// A burst of denials is one Event per pod, with the count, the hosts most refused and their
// rules; more denials within the interval wait for it, and make one more Event after it.
func TestAggregatedEvents(t *testing.T) {
	api := kubetest.New(t)
	c, _ := kube.NewClient(&kube.Config{Server: api.URL})
	r := &results{n: map[string]int{}}
	a := &Aggregator{Client: c, Interval: 700 * time.Millisecond, Tick: 50 * time.Millisecond, Instance: "egress-gateway-7d9f-x2", OnResult: r.add}
	podA := Pod{Namespace: "sb", Name: "box-a-0", UID: "uid-a", Box: "box-a"}
	podB := Pod{Namespace: "sb", Name: "box-b-0", UID: "uid-b", Box: "box-b"}
	for i := 0; i < 7; i++ {
		a.Denied(podA, "evil.test", "pool.allow:none")
	}
	for i := 0; i < 3; i++ {
		a.Denied(podA, "x.example.test", "box.deny:x.example.test")
	}
	for i := 0; i < 6; i++ {
		a.Denied(podA, fmt.Sprintf("h%d.test", i), "pool.allow:none")
	}
	a.Denied(podB, "api.test", "sni:mismatch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	waitFor(t, 2*time.Second, func() bool { return len(api.Objects("events")) == 2 })
	ev := eventsOf(api, "box-a-0")[0]
	io := ev["involvedObject"].(map[string]any)
	md := ev["metadata"].(map[string]any)
	if ev["reason"] != Reason || ev["type"] != "Warning" || io["uid"] != "uid-a" || io["kind"] != "Pod" || io["namespace"] != "sb" ||
		md["namespace"] != "sb" || ev["count"] != float64(16) || ev["source"].(map[string]any)["component"] != Component ||
		ev["reportingInstance"] != "egress-gateway-7d9f-x2" || ev["firstTimestamp"] == "" || ev["lastTimestamp"] == "" {
		t.Fatalf("event %v", ev)
	}
	msg := ev["message"].(string)
	want := "egress gateway refused box box-a 16 times: evil.test x7 (pool.allow:none), x.example.test x3 (box.deny:x.example.test), h0.test x1 (pool.allow:none), h1.test x1 (pool.allow:none), h2.test x1 (pool.allow:none), and 3 more"
	if msg != want {
		t.Fatalf("message\n%q\nwant\n%q", msg, want)
	}
	if m := eventsOf(api, "box-b-0")[0]["message"]; m != "egress gateway refused box box-b 1 time: api.test x1 (sni:mismatch)" {
		t.Fatalf("box-b's message %q", m)
	}
	// More denials at once: no Event until the interval since the last one has passed.
	sent := time.Now()
	a.Denied(podA, "evil.test", "pool.allow:none")
	a.Denied(podA, "evil.test", "pool.allow:none")
	time.Sleep(300 * time.Millisecond)
	if n := len(eventsOf(api, "box-a-0")); n != 1 {
		t.Fatalf("%d Events for box-a within the interval", n)
	}
	waitFor(t, 2*time.Second, func() bool { return len(eventsOf(api, "box-a-0")) == 2 })
	if d := time.Since(sent); d < 350*time.Millisecond {
		t.Fatalf("the second Event came %v after the first denials, before the interval", d)
	}
	var second map[string]any
	for _, e := range eventsOf(api, "box-a-0") {
		if e["count"] == float64(2) {
			second = e
		}
	}
	if second == nil || second["message"] != "egress gateway refused box box-a 2 times: evil.test x2 (pool.allow:none)" {
		t.Fatalf("the second Event: %v", eventsOf(api, "box-a-0"))
	}
	if r.get("created") != 3 || r.get("failed") != 0 {
		t.Fatalf("results %v", r.n)
	}
	for _, q := range api.Requests() {
		if q.Method == "POST" && (q.Resource != "events" || q.Namespace != "sb") {
			t.Fatalf("a POST to %+v", q)
		}
	}
}

// Memory is bounded: pods beyond MaxPods are dropped and counted, (host, rule) pairs beyond 32
// per pod are counted as "more"; a refused create is counted, logged, not retried.
func TestBoundsAndFailures(t *testing.T) {
	api := kubetest.New(t)
	c, _ := kube.NewClient(&kube.Config{Server: api.URL})
	r := &results{n: map[string]int{}}
	a := &Aggregator{Client: c, Interval: time.Hour, Tick: 20 * time.Millisecond, MaxPods: 3, OnResult: r.add}
	for i := 0; i < 5; i++ {
		a.Denied(Pod{Namespace: "sb", Name: fmt.Sprintf("box-%d", i), UID: "u"}, "evil.test", "pool.allow:none")
	}
	for i := 0; i < 100; i++ {
		a.Denied(Pod{Namespace: "sb", Name: "box-0", UID: "u"}, fmt.Sprintf("h%03d.test", i), "pool.allow:none")
	}
	a.mu.Lock()
	pods, pairs, more := len(a.pending), len(a.pending["sb/box-0/u"].hosts), a.pending["sb/box-0/u"].more
	a.mu.Unlock()
	if pods != 3 || r.get("dropped") != 2 || pairs != maxHosts || more != 101-maxHosts {
		t.Fatalf("pods %d, dropped %d, pairs %d, more %d", pods, r.get("dropped"), pairs, more)
	}
	api.FailNext("events", 403, 403, 403)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	waitFor(t, 2*time.Second, func() bool { return r.get("failed") == 3 })
	time.Sleep(100 * time.Millisecond)
	if len(api.Objects("events")) != 0 || r.get("created") != 0 {
		t.Fatalf("%d events, %v", len(api.Objects("events")), r.n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) != 0 || len(a.sent) != 3 {
		t.Fatalf("after the flush: %d pending, %d sent", len(a.pending), len(a.sent))
	}
}

// The message is bounded and names hosts and rules only.
func TestMessageBounded(t *testing.T) {
	b := &burst{count: 1, hosts: map[hostRule]int{{strings.Repeat("a", 250) + ".test", strings.Repeat("r", 900)}: 1}}
	if m := message(Pod{Name: "p"}, b); len(m) > maxMessage {
		t.Fatalf("message of %d bytes", len(m))
	}
}
