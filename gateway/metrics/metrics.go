// Package metrics keeps the gateway's counters and writes them in the Prometheus text format
// (version 0.0.4), by hand: a few counters, one gauge and one histogram need no library.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Buckets of the connect latency histogram, in seconds.
var Buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Metrics of one gateway.
type Metrics struct {
	mu        sync.Mutex
	decisions map[[2]string]uint64 // (kind, decision) -> count
	reloads   map[string]uint64    // result -> count
	resolver  map[string]uint64    // credential resolver requests: result -> count
	events    map[string]uint64    // denial Events: result -> count
	cacheHits uint64               // credential lookups answered from the resolver cache

	BytesUp, BytesDown atomic.Uint64
	Active             atomic.Int64

	hist  []uint64 // per bucket, not cumulative; last is +Inf
	sum   float64
	count uint64
}

// New returns empty metrics.
func New() *Metrics {
	return &Metrics{decisions: map[[2]string]uint64{}, reloads: map[string]uint64{}, resolver: map[string]uint64{},
		events: map[string]uint64{}, hist: make([]uint64, len(Buckets)+1)}
}

// Decision counts one decision: kind "connect" or "http", decision "allow", "intercept",
// "deny", "unauthenticated" or "error".
func (m *Metrics) Decision(kind, decision string) {
	m.mu.Lock()
	m.decisions[[2]string{kind, decision}]++
	m.mu.Unlock()
}

// Reload counts a policy load attempt.
func (m *Metrics) Reload(ok bool) {
	r := "ok"
	if !ok {
		r = "error"
	}
	m.mu.Lock()
	m.reloads[r]++
	m.mu.Unlock()
}

// Resolver counts one credential lookup of a pool's resolver: "headers", "none" or "error" (a
// request was sent), or "cache" (answered from the cache).
func (m *Metrics) Resolver(result string) {
	m.mu.Lock()
	if result == "cache" {
		m.cacheHits++
	} else {
		m.resolver[result]++
	}
	m.mu.Unlock()
}

// Event counts one denial Event: "created", "failed" (the API server refused or did not answer)
// or "dropped" (more boxes with denials at once than the aggregator keeps).
func (m *Metrics) Event(result string) {
	m.mu.Lock()
	m.events[result]++
	m.mu.Unlock()
}

// Connected observes the time from a request's arrival to its upstream connection (for an
// intercepted connection, the first request's round trip to the answer's headers).
func (m *Metrics) Connected(d time.Duration) {
	s := d.Seconds()
	i := sort.SearchFloat64s(Buckets, s) // first bucket >= s
	m.mu.Lock()
	m.hist[i]++
	m.sum += s
	m.count++
	m.mu.Unlock()
}

// WriteTo writes the text exposition.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	m.mu.Lock()
	b.WriteString("# HELP egress_gateway_decisions_total Proxy decisions by request kind and outcome.\n# TYPE egress_gateway_decisions_total counter\n")
	keys := make([][2]string, 0, len(m.decisions))
	for k := range m.decisions {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		fmt.Fprintf(&b, "egress_gateway_decisions_total{kind=%q,decision=%q} %d\n", k[0], k[1], m.decisions[k])
	}
	b.WriteString("# HELP egress_gateway_policy_loads_total Policy source loads by result.\n# TYPE egress_gateway_policy_loads_total counter\n")
	for _, r := range []string{"ok", "error"} {
		fmt.Fprintf(&b, "egress_gateway_policy_loads_total{result=%q} %d\n", r, m.reloads[r])
	}
	b.WriteString("# HELP egress_gateway_resolver_requests_total Requests to the pools' credential resolvers by result (headers, none, error).\n# TYPE egress_gateway_resolver_requests_total counter\n")
	for _, r := range []string{"headers", "none", "error"} {
		fmt.Fprintf(&b, "egress_gateway_resolver_requests_total{result=%q} %d\n", r, m.resolver[r])
	}
	b.WriteString("# HELP egress_gateway_resolver_cache_hits_total Credential lookups answered from the resolver cache (no request).\n# TYPE egress_gateway_resolver_cache_hits_total counter\n")
	fmt.Fprintf(&b, "egress_gateway_resolver_cache_hits_total %d\n", m.cacheHits)
	b.WriteString("# HELP egress_gateway_denial_events_total Aggregated EgressDenied Events on box pods by result (created, failed, dropped).\n# TYPE egress_gateway_denial_events_total counter\n")
	for _, r := range []string{"created", "failed", "dropped"} {
		fmt.Fprintf(&b, "egress_gateway_denial_events_total{result=%q} %d\n", r, m.events[r])
	}
	b.WriteString("# HELP egress_gateway_connect_seconds Time from a proxy request to its upstream connection (intercepted: to the first answer's headers).\n# TYPE egress_gateway_connect_seconds histogram\n")
	var cum uint64
	for i, le := range Buckets {
		cum += m.hist[i]
		fmt.Fprintf(&b, "egress_gateway_connect_seconds_bucket{le=\"%g\"} %d\n", le, cum)
	}
	cum += m.hist[len(Buckets)]
	fmt.Fprintf(&b, "egress_gateway_connect_seconds_bucket{le=\"+Inf\"} %d\n", cum)
	fmt.Fprintf(&b, "egress_gateway_connect_seconds_sum %g\negress_gateway_connect_seconds_count %d\n", m.sum, m.count)
	m.mu.Unlock()
	b.WriteString("# HELP egress_gateway_bytes_total Bytes relayed, up (box to host) and down.\n# TYPE egress_gateway_bytes_total counter\n")
	fmt.Fprintf(&b, "egress_gateway_bytes_total{direction=\"up\"} %d\negress_gateway_bytes_total{direction=\"down\"} %d\n", m.BytesUp.Load(), m.BytesDown.Load())
	b.WriteString("# HELP egress_gateway_active_connections Proxy connections open now.\n# TYPE egress_gateway_active_connections gauge\n")
	fmt.Fprintf(&b, "egress_gateway_active_connections %d\n", m.Active.Load())
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

// Handler serves /metrics, /healthz (the process answers) and /readyz (ready() is true: a
// policy is loaded and the listeners are up).
func (m *Metrics) Handler(ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		m.WriteTo(w)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready() {
			http.Error(w, "not ready: no policy loaded yet", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}
