package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/resolver"
)

const resolverKey = "resolver-key-of-the-platform-0123456789"

// platformResolver is a platform's credential resolver on loopback: it verifies the signature
// (written out here, independent of the gateway's code) and answers as status says.
type platformResolver struct {
	*httptest.Server
	mu      sync.Mutex
	queries []map[string]any
	bad     int
	status  int
}

var signature = regexp.MustCompile(`^t=(\d+),v1=([0-9a-f]{64})$`)

func newPlatformResolver(t *testing.T) *platformResolver {
	r := &platformResolver{status: 200}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		m := signature.FindStringSubmatch(req.Header.Get("X-Sandbox-Bridge-Signature"))
		ok := false
		if m != nil {
			ts, _ := strconv.ParseInt(m[1], 10, 64)
			mac := hmac.New(sha256.New, []byte(resolverKey))
			mac.Write([]byte(m[1] + "." + string(body)))
			ok = hex.EncodeToString(mac.Sum(nil)) == m[2] && time.Since(time.Unix(ts, 0)).Abs() < time.Minute
		}
		var q map[string]any
		json.Unmarshal(body, &q)
		r.mu.Lock()
		r.queries = append(r.queries, q)
		if !ok {
			r.bad++
		}
		status := r.status
		r.mu.Unlock()
		switch {
		case !ok:
			w.WriteHeader(401)
		case status == 200:
			io.WriteString(w, `{"headers": {"authorization": "Bearer res0lved-token"}, "ttl_seconds": 1}`)
		default:
			w.WriteHeader(status)
		}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *platformResolver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queries)
}

// A pool's resolver supplies the headers for a host the box has none registered for: the
// connection is intercepted and the host receives them; the answer is kept for its TTL; the
// registered credentials of another host win and the resolver is not asked about it; a resolver
// error is 502 resolver:error and not kept; "none" passes through. No value reaches the log.
func TestResolverCredentials(t *testing.T) {
	rs := newPlatformResolver(t)
	h := newHarness(t, func(c *Config) {
		c.Resolver = &resolver.Client{Key: []byte(resolverKey), HTTP: resolver.NewHTTPClient(nil)}
	})
	doc := strings.Replace(basePolicy, `"plainHttp": ["plain.test"]`, `"plainHttp": ["plain.test"],
    "credentialResolver": {"url": "`+rs.URL+`/egress", "hosts": ["api.test", "secure.test"], "ttlSeconds": 60, "timeoutSeconds": 2}`, 1)
	doc = strings.Replace(doc, `"nonce": "a1",`, `"nonce": "a1", "outboundContext": {"tenant_id": "tenant-1", "session_id": "session-1"},`, 1)
	h.setPolicy(doc)
	waitUntil(t, func() bool { return h.proxy.cfg.Source.Current().Resolvers["p"] != nil })

	resp, body := h.get("box-a", "https://api.test/", http.Header{"Authorization": {"Bearer box-own"}})
	if resp.StatusCode != 200 || issuer(resp) != "gateway ca" {
		t.Fatalf("a resolver host: %d %q, leaf by %q (want intercepted)", resp.StatusCode, body, issuer(resp))
	}
	if v, _ := h.lastVisit(); v.authorization != "Bearer res0lved-token" {
		t.Fatalf("the host got Authorization %q, want the resolver's", v.authorization)
	}
	rs.mu.Lock()
	q, bad := rs.queries[0], rs.bad
	rs.mu.Unlock()
	want := map[string]any{"box_id": "box-a", "pool": "p", "host": "api.test", "port": float64(443), "tenant_id": "tenant-1", "session_id": "session-1"}
	if bad != 0 || len(q) != len(want) {
		t.Fatalf("the resolver saw %d bad signatures, query %v", bad, q)
	}
	for k, v := range want {
		if q[k] != v {
			t.Fatalf("query %v, want %v", q, want)
		}
	}
	if d := h.waitDecision("api.test"); d["decision"] != "intercept" || d["credentials"] != "resolver" {
		t.Fatalf("decision log: %v", d)
	}
	// Within the answer's TTL (1 s): no request.
	h.get("box-a", "https://api.test/", nil)
	if rs.count() != 1 {
		t.Fatalf("%d resolver requests within the TTL, want 1", rs.count())
	}
	// Registered credentials win: secure.test is not asked about.
	h.get("box-a", "https://secure.test/", nil)
	if v, _ := h.lastVisit(); v.authorization != secretToken || rs.count() != 1 {
		t.Fatalf("secure.test got %q; %d resolver requests", v.authorization, rs.count())
	}
	// After the TTL it asks again; the resolver fails: 502, and the failure is not kept.
	rs.mu.Lock()
	rs.status = 503
	rs.mu.Unlock()
	time.Sleep(1100 * time.Millisecond)
	for i := 0; i < 2; i++ {
		resp, _, _ := h.connect("api.test:443", h.basic("box-a"))
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Egress-Rule") != "resolver:error" {
			t.Fatalf("a failing resolver: %d %q", resp.StatusCode, resp.Header.Get("X-Egress-Rule"))
		}
	}
	if rs.count() != 3 {
		t.Fatalf("%d resolver requests, want 3 (errors are not kept)", rs.count())
	}
	// "None" (204): passed through, never decrypted.
	rs.mu.Lock()
	rs.status = 204
	rs.mu.Unlock()
	if resp, _ := h.get("box-a", "https://api.test/", nil); resp.StatusCode != 200 || issuer(resp) != "host ca" {
		t.Fatalf("resolver says none: %d, leaf by %q", resp.StatusCode, issuer(resp))
	}
	if strings.Contains(h.logText(), "res0lved") {
		t.Fatal("a resolved header value reached the log")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
