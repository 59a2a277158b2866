package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestExposition(t *testing.T) {
	m := New()
	m.Decision("connect", "allow")
	m.Decision("connect", "allow")
	m.Decision("http", "deny")
	m.Reload(true)
	m.BytesUp.Add(10)
	m.BytesDown.Add(20)
	m.Active.Add(1)
	m.Connected(3 * time.Millisecond)
	m.Connected(20 * time.Second)
	m.Resolver("headers")
	m.Resolver("error")
	m.Resolver("cache")
	m.Resolver("cache")
	m.Event("created")
	var b strings.Builder
	m.WriteTo(&b)
	out := b.String()
	for _, want := range []string{
		`egress_gateway_decisions_total{kind="connect",decision="allow"} 2`,
		`egress_gateway_decisions_total{kind="http",decision="deny"} 1`,
		`egress_gateway_policy_loads_total{result="ok"} 1`,
		`egress_gateway_connect_seconds_bucket{le="0.0025"} 0`,
		`egress_gateway_connect_seconds_bucket{le="0.005"} 1`,
		`egress_gateway_connect_seconds_bucket{le="10"} 1`,
		`egress_gateway_connect_seconds_bucket{le="+Inf"} 2`,
		`egress_gateway_connect_seconds_count 2`,
		`egress_gateway_bytes_total{direction="down"} 20`,
		`egress_gateway_active_connections 1`,
		`egress_gateway_resolver_requests_total{result="headers"} 1`,
		`egress_gateway_resolver_requests_total{result="none"} 0`,
		`egress_gateway_resolver_requests_total{result="error"} 1`,
		`egress_gateway_resolver_cache_hits_total 2`,
		`egress_gateway_denial_events_total{result="created"} 1`,
		`egress_gateway_denial_events_total{result="failed"} 0`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	ready := false
	h := m.Handler(func() bool { return ready })
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/metrics": 200} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("%s = %d, want %d", path, rec.Code, want)
		}
	}
	ready = true
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 200 {
		t.Errorf("/readyz when ready = %d", rec.Code)
	}
}
