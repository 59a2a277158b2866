package resolver

// Against real resolver servers on loopback (HTTPS and HTTP), which check the signature the way
// the platform's would (test/support/egress-resolver.mjs does the same in the cluster tests).

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const testKey = "resolver-signing-key-0123456789abcdef"

// resolverHost is a platform's resolver: it verifies each request's signature and timestamp and
// answers what answer says for the decoded query.
type resolverHost struct {
	*httptest.Server
	mu       sync.Mutex
	queries  []Query
	badSigs  int
	answer   func(q Query) (status int, body string)
	reqDelay time.Duration
}

var sigRE = regexp.MustCompile(`^t=(\d+),v1=([0-9a-f]{64})$`)

func newResolverHost(t *testing.T, tlsOn bool, answer func(Query) (int, string)) *resolverHost {
	r := &resolverHost{answer: answer}
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		// Independent of Sign: the documented scheme, written out.
		m := sigRE.FindStringSubmatch(req.Header.Get(SignatureHeader))
		ok := false
		if m != nil {
			ts, _ := strconv.ParseInt(m[1], 10, 64)
			mac := hmac.New(sha256.New, []byte(testKey))
			mac.Write([]byte(m[1] + "." + string(body)))
			ok = hmac.Equal([]byte(hex.EncodeToString(mac.Sum(nil))), []byte(m[2])) && time.Since(time.Unix(ts, 0)).Abs() < 5*time.Minute
		}
		var q Query
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&q); err != nil || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			ok = false
		}
		r.mu.Lock()
		if !ok {
			r.badSigs++
		}
		r.queries = append(r.queries, q)
		delay := r.reqDelay
		r.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		status, out := r.answer(q)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, out)
	})
	if tlsOn {
		r.Server = httptest.NewTLSServer(h)
	} else {
		r.Server = httptest.NewServer(h)
	}
	t.Cleanup(r.Close)
	return r
}

func (r *resolverHost) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queries)
}

func ptr(n int) *int { return &n }

func spec(u string, ttl int) *Spec {
	return &Spec{URL: u, Hosts: []string{"api.vault.test", "*.models.test"}, TTLSeconds: ptr(ttl), TimeoutSeconds: ptr(1)}
}

func (r *resolverHost) client() *Client {
	hc := r.Server.Client() // trusts the test server's certificate
	hc.CheckRedirect = NewHTTPClient(nil).CheckRedirect
	return &Client{Key: []byte(testKey), HTTP: hc}
}

var q1 = Query{BoxID: "box-a", Pool: "p1", Host: "api.vault.test", Port: 443, TenantID: "t-1", SessionID: "s-1"}

// A signed request over HTTPS with the documented body; the answer's headers; kept for the
// answer's ttl_seconds when it is less than the pool's, and for the pool's when that is less.
func TestSignedRequestAndTTL(t *testing.T) {
	ttlAnswer := 1.0
	r := newResolverHost(t, true, func(q Query) (int, string) {
		return 200, fmt.Sprintf(`{"headers": {"authorization": "Bearer v4ult-%s", "X-Tenant": "%s"}, "ttl_seconds": %g}`, q.SessionID, q.TenantID, ttlAnswer)
	})
	c := r.client()
	var results []Result
	var mu sync.Mutex
	c.OnResult = func(x Result) { mu.Lock(); results = append(results, x); mu.Unlock() }
	h, err := c.Headers(context.Background(), spec(r.URL, 300), q1)
	if err != nil {
		t.Fatal(err)
	}
	if h["Authorization"] != "Bearer v4ult-s-1" || h["X-Tenant"] != "t-1" || len(h) != 2 {
		t.Fatalf("headers %v", h)
	}
	if r.badSigs != 0 || r.queries[0] != q1 {
		t.Fatalf("the resolver saw %d bad signatures, query %+v", r.badSigs, r.queries[0])
	}
	// Within the TTL: from the cache, no request.
	if h2, _ := c.Headers(context.Background(), spec(r.URL, 300), q1); h2["Authorization"] != "Bearer v4ult-s-1" || r.count() != 1 {
		t.Fatalf("a second lookup within the TTL asked again (%d requests)", r.count())
	}
	// Another host of the same box, another box, another session: each its own question.
	q2 := q1
	q2.Host = "gpu.models.test"
	q3 := q1
	q3.BoxID = "box-b"
	q4 := q1
	q4.SessionID = "s-2"
	for _, q := range []Query{q2, q3, q4} {
		if _, err := c.Headers(context.Background(), spec(r.URL, 300), q); err != nil {
			t.Fatal(err)
		}
	}
	if r.count() != 4 {
		t.Fatalf("%d requests for 4 questions", r.count())
	}
	// The answer's ttl_seconds (1 s) is less than the pool's (300 s): asked again after 1 s.
	// (q4 replaced q1's answer: one entry per box and host, for the last context asked about.)
	if c.Headers(context.Background(), spec(r.URL, 300), q2); r.count() != 4 {
		t.Fatalf("q2 again within its TTL: %d requests", r.count())
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := c.Headers(context.Background(), spec(r.URL, 300), q2); err != nil || r.count() != 5 {
		t.Fatalf("after the answer's TTL: %v, %d requests", err, r.count())
	}
	// The pool's ttlSeconds (1 s) is less than the answer's (300 s).
	ttlAnswer = 300
	q5 := q1
	q5.BoxID = "box-c"
	c.Headers(context.Background(), spec(r.URL, 1), q5)
	c.Headers(context.Background(), spec(r.URL, 1), q5)
	if r.count() != 6 {
		t.Fatalf("%d requests, want 6", r.count())
	}
	time.Sleep(1100 * time.Millisecond)
	c.Headers(context.Background(), spec(r.URL, 1), q5)
	if r.count() != 7 {
		t.Fatalf("after the pool's TTL: %d requests, want 7", r.count())
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Count(fmt.Sprint(results), "cache") != 3 || strings.Count(fmt.Sprint(results), "headers") != 7 {
		t.Fatalf("results %v", results)
	}
}

// 204 and {} are "none", kept like an answer; over plain HTTP too.
func TestNoneAnswers(t *testing.T) {
	r := newResolverHost(t, false, func(q Query) (int, string) {
		if q.Host == "api.vault.test" {
			return 204, ""
		}
		return 200, `{"headers": {}}`
	})
	c := r.client()
	for _, host := range []string{"api.vault.test", "x.models.test"} {
		q := q1
		q.Host = host
		for i := 0; i < 2; i++ {
			h, err := c.Headers(context.Background(), spec(r.URL, 300), q)
			if err != nil || h != nil {
				t.Fatalf("%s: %v %v", host, h, err)
			}
		}
	}
	if r.count() != 2 {
		t.Fatalf("%d requests, want 2 (none is kept too)", r.count())
	}
}

// Errors, timeouts, redirects and bad answers are errors (the proxy answers 502), never kept,
// and never quote a header value.
func TestErrorsAreNotKept(t *testing.T) {
	target := newResolverHost(t, false, func(Query) (int, string) { return 200, `{"headers": {"Authorization": "Bearer x"}}` })
	cases := map[string]func(Query) (int, string){
		"500":            func(Query) (int, string) { return 500, `{"error": "vault down"}` },
		"not json":       func(Query) (int, string) { return 200, `Bearer s3cret` },
		"framing header": func(Query) (int, string) { return 200, `{"headers": {"Host": "s3cret.test"}}` },
		"newline value":  func(Query) (int, string) { return 200, `{"headers": {"X-Key": "s3cret\nInjected: 1"}}` },
		"number value":   func(Query) (int, string) { return 200, `{"headers": {"X-Key": 12345}}` },
		"negative ttl":   func(Query) (int, string) { return 200, `{"headers": {"X-Key": "s3cret"}, "ttl_seconds": -1}` },
		"too large": func(Query) (int, string) {
			return 200, `{"headers": {"X-Key": "` + strings.Repeat("s3cret", 20000) + `"}}`
		},
		"401": func(Query) (int, string) { return 401, `` },
	}
	for name, answer := range cases {
		r := newResolverHost(t, false, answer)
		c := r.client()
		for i := 0; i < 2; i++ {
			h, err := c.Headers(context.Background(), spec(r.URL, 300), q1)
			if err == nil || h != nil {
				t.Fatalf("%s: %v %v, want an error", name, h, err)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("%s: the error quotes the answer: %v", name, err)
			}
		}
		if r.count() != 2 || c.Len() != 0 {
			t.Fatalf("%s: %d requests, %d kept: an error was kept", name, r.count(), c.Len())
		}
	}
	// A redirect is not followed: the signed question goes nowhere else.
	redirect := newResolverHost(t, false, nil)
	redirect.Config.Handler = http.RedirectHandler(target.URL, http.StatusTemporaryRedirect)
	if _, err := redirect.client().Headers(context.Background(), spec(redirect.URL, 300), q1); err == nil || !strings.Contains(err.Error(), "307") {
		t.Fatalf("a redirect: %v", err)
	}
	if target.count() != 0 {
		t.Fatal("the redirect was followed")
	}
	// Slower than timeoutSeconds (1 s).
	slow := newResolverHost(t, false, func(Query) (int, string) { return 204, "" })
	slow.reqDelay = 1500 * time.Millisecond
	start := time.Now()
	if _, err := slow.client().Headers(context.Background(), spec(slow.URL, 300), q1); err == nil || !strings.Contains(err.Error(), "within 1s") {
		t.Fatalf("a slow resolver: %v", err)
	}
	if d := time.Since(start); d > 1400*time.Millisecond {
		t.Fatalf("the timeout took %v", d)
	}
	// No key: nothing is asked.
	c := target.client()
	c.Key = nil
	if _, err := c.Headers(context.Background(), spec(target.URL, 300), q1); err == nil || target.count() != 0 {
		t.Fatalf("without a key: %v, %d requests", err, target.count())
	}
}

// The cache is bounded, and concurrent lookups of one question share one request.
func TestCacheBoundAndSharedRequests(t *testing.T) {
	r := newResolverHost(t, false, func(Query) (int, string) { return 200, `{"headers": {"X-Key": "k"}}` })
	r.reqDelay = 100 * time.Millisecond
	c := r.client()
	c.MaxEntries = 3
	var wg sync.WaitGroup
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if h, err := c.Headers(context.Background(), spec(r.URL, 300), q1); err != nil || h["X-Key"] != "k" {
				t.Errorf("concurrent lookup: %v %v", h, err)
			}
		}()
	}
	wg.Wait()
	if r.count() != 1 {
		t.Fatalf("10 concurrent lookups of one question made %d requests", r.count())
	}
	r.reqDelay = 0
	for i := 0; i < 8; i++ {
		q := q1
		q.BoxID = fmt.Sprintf("box-%d", i)
		c.Headers(context.Background(), spec(r.URL, 300), q)
		if c.Len() > 3 {
			t.Fatalf("%d entries kept, bound 3", c.Len())
		}
	}
}

func TestSpecCheck(t *testing.T) {
	good := Spec{URL: "http://vault.platform.svc:8080/egress", Hosts: []string{"api.test", "*.models.test", "10.0.0.1"}}
	if err := good.Check(); err != nil || good.TTL() != 300*time.Second || good.Timeout() != 5*time.Second {
		t.Fatalf("good spec: %v %v %v", err, good.TTL(), good.Timeout())
	}
	if !good.Covers("x.models.test") || good.Covers("models.test") || good.Covers("other.test") {
		t.Fatal("Covers")
	}
	for name, s := range map[string]Spec{
		"scheme":  {URL: "ftp://x/", Hosts: []string{"a.test"}},
		"no host": {URL: "https:///x", Hosts: []string{"a.test"}},
		"star":    {URL: "https://x/", Hosts: []string{"*"}},
		"pattern": {URL: "https://x/", Hosts: []string{"a.*.test"}},
		"none":    {URL: "https://x/"},
		"ttl":     {URL: "https://x/", Hosts: []string{"a.test"}, TTLSeconds: ptr(-1)},
		"timeout": {URL: "https://x/", Hosts: []string{"a.test"}, TimeoutSeconds: ptr(0)},
	} {
		if err := s.Check(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}
