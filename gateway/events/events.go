// Package events turns bursts of egress denials into aggregated Kubernetes Events on the box's
// pod, so whoever runs the box sees, with kubectl describe pod or the bridge's Event reader, which
// hosts it was refused and by which rule. One core/v1 Event per box pod per Interval (1 min) per
// gateway replica at most, however many connections were refused: reason EgressDenied, type
// Warning, source.component sandbox-bridge-egress-gateway, count, first and last timestamps, and
// a message naming up to five hosts with their counts and rules. Only host names and rule names
// are kept: never a path, query or header (the proxy hands over nothing else).
//
// Memory is bounded: at most MaxPods pods with pending denials (more are dropped and counted),
// at most maxHosts (host, rule) pairs per pod (more are counted as "more"), and the time of the
// last Event per pod only for Interval.
package events

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"sandbox-bridge.io/gateway/kube"
)

// The Event's fixed fields.
const (
	Reason    = "EgressDenied"
	Type      = "Warning"
	Component = "sandbox-bridge-egress-gateway"
)

const (
	maxHosts       = 32   // (host, rule) pairs counted one by one per pod and burst
	messageHosts   = 5    // named in the message
	maxMessage     = 1024 // bytes
	defaultMaxPods = 10_000
)

// Pod is the box pod an Event is about.
type Pod struct {
	Namespace, Name, UID string
	Box                  string // the box id, for the message
}

type hostRule struct{ host, rule string }

type burst struct {
	pod         Pod
	count       int
	first, last time.Time
	hosts       map[hostRule]int
	more        int // denials of pairs beyond maxHosts
}

// Aggregator counts denials per pod and creates the Events. Denied is safe for concurrent use
// and never blocks on the API server; Run sends.
type Aggregator struct {
	Client *kube.Client
	// Interval is the least time between two Events of one pod from this replica (default 1 min).
	Interval time.Duration
	// Tick is how often pending denials are looked at (default 5 s): a first denial's Event
	// waits at most this long, gathering the rest of its burst.
	Tick time.Duration
	// MaxPods bounds the pods with pending denials (default 10,000).
	MaxPods int
	// Instance is the replica's name (reportingInstance; the pod's name, HOSTNAME).
	Instance string
	Log      *slog.Logger
	// OnResult, when set, is told each Event's fate: "created", "failed", or "dropped" (a denial
	// of a pod beyond MaxPods).
	OnResult func(string)
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time

	mu      sync.Mutex
	pending map[string]*burst    // pod key -> denials not yet in an Event
	sent    map[string]time.Time // pod key -> when its last Event was sent (kept for Interval)
}

func (a *Aggregator) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Aggregator) interval() time.Duration {
	if a.Interval > 0 {
		return a.Interval
	}
	return time.Minute
}

func (a *Aggregator) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.Default()
}

func (a *Aggregator) result(r string) {
	if a.OnResult != nil {
		a.OnResult(r)
	}
}

// Denied counts one refused connection or request of pod's box to host by rule.
func (a *Aggregator) Denied(pod Pod, host, rule string) {
	if pod.Name == "" || pod.Namespace == "" {
		return
	}
	k := pod.Namespace + "/" + pod.Name + "/" + pod.UID
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.pending[k]
	if b == nil {
		max := a.MaxPods
		if max <= 0 {
			max = defaultMaxPods
		}
		if len(a.pending) >= max {
			a.result("dropped")
			return
		}
		if a.pending == nil {
			a.pending = map[string]*burst{}
		}
		b = &burst{pod: pod, first: now, hosts: map[hostRule]int{}}
		a.pending[k] = b
	}
	b.count++
	b.last = now
	hr := hostRule{host, rule}
	if _, ok := b.hosts[hr]; ok || len(b.hosts) < maxHosts {
		b.hosts[hr]++
	} else {
		b.more++
	}
}

// Run sends the Events due every Tick until ctx ends.
func (a *Aggregator) Run(ctx context.Context) {
	tick := a.Tick
	if tick <= 0 {
		tick = 5 * time.Second
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, b := range a.due() {
			a.send(ctx, b)
		}
	}
}

// due takes the bursts of pods whose last Event is at least Interval old (or that never had
// one) out of pending, and forgets send times older than Interval.
func (a *Aggregator) due() []*burst {
	now := a.now()
	iv := a.interval()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, at := range a.sent {
		if now.Sub(at) >= iv {
			delete(a.sent, k)
		}
	}
	var out []*burst
	for k, b := range a.pending {
		if _, recent := a.sent[k]; recent {
			continue
		}
		out = append(out, b)
		delete(a.pending, k)
		if a.sent == nil {
			a.sent = map[string]time.Time{}
		}
		a.sent[k] = now
	}
	return out
}

// send creates one Event; a failure is logged and counted, not retried (the next burst makes
// another).
func (a *Aggregator) send(ctx context.Context, b *burst) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev := event(b.pod, b, a.Instance)
	err := a.Client.Create(ctx, "/api/v1/namespaces/"+url.PathEscape(b.pod.Namespace)+"/events", ev)
	if err != nil {
		a.result("failed")
		a.log().Warn("denial Event not created", "namespace", b.pod.Namespace, "pod", b.pod.Name, "denials", b.count, "error", err.Error())
		return
	}
	a.result("created")
}

// event is the core/v1 Event for a burst of pod's denials.
func event(pod Pod, b *burst, instance string) map[string]any {
	ev := map[string]any{
		"apiVersion": "v1",
		"kind":       "Event",
		"metadata":   map[string]any{"generateName": pod.Name + ".egress-", "namespace": pod.Namespace},
		"involvedObject": map[string]any{
			"apiVersion": "v1", "kind": "Pod", "namespace": pod.Namespace, "name": pod.Name, "uid": pod.UID,
		},
		"reason":             Reason,
		"type":               Type,
		"message":            message(pod, b),
		"count":              b.count,
		"firstTimestamp":     b.first.UTC().Format(time.RFC3339),
		"lastTimestamp":      b.last.UTC().Format(time.RFC3339),
		"source":             map[string]any{"component": Component},
		"reportingComponent": Component,
	}
	if instance != "" {
		ev["reportingInstance"] = instance
	}
	return ev
}

// message names the most refused hosts: "egress gateway refused box box-7f3a 12 times:
// evil.test x7 (pool.allow:none), x.test x3 (box.deny:x.test), and 2 more".
func message(pod Pod, b *burst) string {
	type item struct {
		hostRule
		n int
	}
	items := make([]item, 0, len(b.hosts))
	for hr, n := range b.hosts {
		items = append(items, item{hr, n})
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].n != items[j].n {
			return items[i].n > items[j].n
		}
		if items[i].host != items[j].host {
			return items[i].host < items[j].host
		}
		return items[i].rule < items[j].rule
	})
	who := "box " + pod.Box
	if pod.Box == "" {
		who = "pod " + pod.Name
	}
	var sb strings.Builder
	times := "times"
	if b.count == 1 {
		times = "time"
	}
	fmt.Fprintf(&sb, "egress gateway refused %s %d %s:", who, b.count, times)
	rest := b.more
	for i, it := range items {
		if i >= messageHosts {
			rest += it.n
			continue
		}
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, " %s x%d (%s)", it.host, it.n, it.rule)
	}
	if rest > 0 {
		fmt.Fprintf(&sb, ", and %d more", rest)
	}
	msg := sb.String()
	if len(msg) > maxMessage {
		msg = msg[:maxMessage-3] + "..."
	}
	return msg
}
