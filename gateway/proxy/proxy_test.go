package proxy

// End-to-end tests on real sockets, loopback only: the gateway, its test hosts (TLS servers with
// certificates from a CA made here) and the "box" (the test's client) all listen on or dial
// 127.0.0.1. Test host names resolve to loopback through Config.Dial, never through DNS.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/identity"
	"sandbox-bridge.io/gateway/internal/testpki"
	"sandbox-bridge.io/gateway/metrics"
	"sandbox-bridge.io/gateway/source"
)

const (
	secretToken = "Bearer s3cret-token-never-logged"
	secretKey   = "k3y-value-never-logged"
)

const basePolicy = `{
  "pools": {"p": {
    "allow": ["api.test", "*.example.test", "secure.test", "plain.test", "big.test", "rogue.test"],
    "deny": ["bad.example.test"],
    "plainHttp": ["plain.test"]
  }},
  "boxes": {
    "box-a": {"pool": "p", "ip": "127.0.0.1", "pod": "box-a-pod", "namespace": "sb", "nonce": "a1",
              "credentials": {"secure.test": {"Authorization": "` + secretToken + `", "x-api-key": "` + secretKey + `"},
                              "rogue.test": {"Authorization": "` + secretToken + `"}}},
    "box-b": {"pool": "p", "ip": "127.0.0.9", "pod": "box-b-pod", "namespace": "sb", "nonce": "b1"}
  }
}`

// seen is what a test host received.
type seen struct {
	serverName, host, authorization, apiKey, proxyAuth string
}

type harness struct {
	t          testing.TB
	policyPath string
	keys       *identity.Keys
	gwCA       *testpki.CA
	hostCA     *testpki.CA
	proxyAddr  string
	metrics    *metrics.Metrics
	proxy      *Proxy
	tlsAddr    string // every TLS test host name leads here
	plainAddr  string // plain.test and api.test over plain HTTP lead here

	mu         sync.Mutex
	routes     map[string]string   // host name -> address, before the defaults
	extraRoots []*x509.Certificate // more CAs the box's client trusts
	log        bytes.Buffer
	visits     []seen
	dialled    []string
}

func (h *harness) Write(b []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.Write(b)
}

func (h *harness) logText() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

func (h *harness) lastVisit() (seen, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.visits) == 0 {
		return seen{}, 0
	}
	return h.visits[len(h.visits)-1], len(h.visits)
}

func newHarness(t testing.TB, opts ...func(*Config)) *harness {
	h := &harness{t: t, gwCA: testpki.NewCA(t, "gateway ca"), hostCA: testpki.NewCA(t, "host ca")}
	dir := t.TempDir()
	var err error
	if h.keys, err = identity.NewKeys([]byte(strings.Repeat("test-key-", 5))); err != nil {
		t.Fatal(err)
	}
	record := func(w http.ResponseWriter, r *http.Request) {
		s := seen{host: r.Host, authorization: r.Header.Get("Authorization"), apiKey: r.Header.Get("X-Api-Key"),
			proxyAuth: r.Header.Get("Proxy-Authorization")}
		if r.TLS != nil {
			s.serverName = r.TLS.ServerName
		}
		h.mu.Lock()
		if len(h.visits) < 1000 {
			h.visits = append(h.visits, s)
		}
		h.mu.Unlock()
		if r.URL.Path == "/bench" {
			chunk := bytes.Repeat([]byte("x"), 256<<10)
			w.Header().Set("Content-Length", fmt.Sprint(64<<20))
			for i := 0; i < 256; i++ { // 64 MiB
				w.Write(chunk)
			}
			return
		}
		if r.URL.Path == "/big" {
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			for i := 0; i < 32; i++ { // 2 MiB, unknown length: chunked
				w.Write(chunk)
			}
			return
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "hello from %s (%d bytes up)", r.Host, len(body))
	}
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(record))
	leaf := h.hostCA.Leaf(t, "api.test", "a.example.test", "bad.example.test", "example.test", "secure.test", "big.test", "denied.test")
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	tlsSrv.Config.ErrorLog = stdlog.New(io.Discard, "", 0) // refused tunnels end handshakes early
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	h.tlsAddr = tlsSrv.Listener.Addr().String()
	plainSrv := httptest.NewServer(http.HandlerFunc(record))
	t.Cleanup(plainSrv.Close)
	h.plainAddr = plainSrv.Listener.Addr().String()
	if !strings.HasPrefix(h.tlsAddr, "127.0.0.1:") || !strings.HasPrefix(h.plainAddr, "127.0.0.1:") {
		t.Fatalf("test hosts must listen on 127.0.0.1: %s %s", h.tlsAddr, h.plainAddr)
	}

	h.policyPath = filepath.Join(dir, "policy.json")
	h.setPolicy(basePolicy)
	src := &source.File{Path: h.policyPath, Interval: 50 * time.Millisecond, Log: slog.New(slog.NewJSONHandler(h, nil))}
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go src.Run(ctx)

	caCert, caKey := h.gwCA.Write(t, dir, "gateway-ca")
	ca, err := certs.LoadFiles(caCert, caKey)
	if err != nil {
		t.Fatal(err)
	}
	h.metrics = metrics.New()
	cfg := Config{
		Source: src, Keys: h.keys, CA: ca, UpstreamRoots: h.hostCA.Pool(), Log: slog.New(slog.NewJSONHandler(h, nil)),
		Metrics: h.metrics, IdleTimeout: 5 * time.Second, HelloTimeout: 2 * time.Second,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			h.mu.Lock()
			h.dialled = append(h.dialled, addr)
			h.mu.Unlock()
			target := h.tlsAddr
			if port == "80" {
				target = h.plainAddr
			}
			if host == "unreachable.example.test" {
				target = "127.0.0.1:1" // nothing listens there
			}
			h.mu.Lock()
			if r, ok := h.routes[host]; ok {
				target = r
			}
			h.mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, network, target) // loopback only
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	p := New(cfg)

	h.proxy = p
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	h.proxyAddr = l.Addr().String()
	return h
}

func (h *harness) setPolicy(doc string) {
	tmp := h.policyPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.policyPath); err != nil {
		h.t.Fatal(err)
	}
}

// client is a box's HTTP client: proxy with box's credential, trusting both CAs (so the
// issuer of what it sees, not a verification failure, tells pass-through from interception).
func (h *harness) client(box string) *http.Client {
	roots := x509.NewCertPool()
	roots.AddCert(h.hostCA.Cert)
	roots.AddCert(h.gwCA.Cert)
	for _, c := range h.extraRoots {
		roots.AddCert(c)
	}
	pod := podOf(box)
	proxyURL := &url.URL{Scheme: "http", Host: h.proxyAddr, User: url.UserPassword(pod.Name, h.keys.Credential(pod))}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(proxyURL),
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DisableKeepAlives: true,
	}}
}

func (h *harness) get(box, rawURL string, hdr http.Header) (*http.Response, string) {
	h.t.Helper()
	req, _ := http.NewRequest("GET", rawURL, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := h.client(box).Do(req)
	if err != nil {
		h.t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("GET %s body: %v", rawURL, err)
	}
	return resp, string(b)
}

// connect sends a raw CONNECT (auth "" = no Proxy-Authorization) and returns the answer and
// the connection (open when the answer is 200).
func (h *harness) connect(target, auth string) (*http.Response, net.Conn, *bufio.Reader) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.proxyAddr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		h.t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, c, br
}

func (h *harness) basic(box string) string {
	return basicOf(podOf(box).Name, h.keys.Credential(podOf(box)))
}

// podOf is the pod a test box of basePolicy runs in (its proxy credential is bound to it).
func podOf(box string) identity.Pod {
	nonce := map[string]string{"box-a": "a1", "box-b": "b1", "box-c": "c1"}[box]
	return identity.Pod{Namespace: "sb", Name: box + "-pod", Nonce: nonce}
}

func basicOf(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// decisions returns the decision log's lines for host.
func (h *harness) decisions(host string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(h.logText(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "egress" && m["host"] == host {
			out = append(out, m)
		}
	}
	return out
}

// waitDecision waits for the log line of a finished connection (written as the handler ends).
func (h *harness) waitDecision(host string) map[string]any {
	h.t.Helper()
	return h.waitDecisions(host, 1)
}

// waitDecisions waits for n log lines for host and returns the last.
func (h *harness) waitDecisions(host string, n int) map[string]any {
	h.t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if d := h.decisions(host); len(d) >= n {
			return d[len(d)-1]
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("no decision logged for %s; log:\n%s", host, h.logText())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func issuer(resp *http.Response) string {
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		return ""
	}
	return resp.TLS.PeerCertificates[0].Issuer.CommonName
}

func TestAllowedPassThrough(t *testing.T) {
	h := newHarness(t)
	resp, body := h.get("box-a", "https://api.test/", http.Header{"Authorization": {"Bearer box-own"}})
	if resp.StatusCode != 200 || body != "hello from api.test (0 bytes up)" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if got := issuer(resp); got != "host ca" {
		t.Fatalf("pass-through must show the host's own certificate, got one issued by %q", got)
	}
	v, _ := h.lastVisit()
	if v.serverName != "api.test" || v.authorization != "Bearer box-own" {
		t.Fatalf("the host must get the box's own TLS and headers untouched: %+v", v)
	}
	d := h.waitDecision("api.test")
	if d["decision"] != "allow" || d["box"] != "box-a" || d["rule"] != "pool.allow:api.test" ||
		d["bytes_up"].(float64) <= 0 || d["bytes_down"].(float64) <= 0 {
		t.Fatalf("decision log: %v", d)
	}

	// A 2 MiB download arrives whole through the splice.
	resp, body = h.get("box-a", "https://big.test/big", nil)
	if resp.StatusCode != 200 || len(body) != 2<<20 {
		t.Fatalf("big download: %d, %d bytes", resp.StatusCode, len(body))
	}
	if d := h.waitDecision("big.test"); d["bytes_down"].(float64) < 2<<20 {
		t.Fatalf("bytes down not counted: %v", d)
	}
}

func TestDeniedHost(t *testing.T) {
	h := newHarness(t)
	resp, _, _ := h.connect("denied.test:443", h.basic("box-a"))
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || resp.Header.Get("X-Egress-Rule") != "pool.allow:none" ||
		resp.Header.Get("X-Egress-Decision") != "deny" || !strings.Contains(string(body), "denied.test") {
		t.Fatalf("got %d %v %s", resp.StatusCode, resp.Header, body)
	}
	h.mu.Lock()
	dialled := len(h.dialled)
	h.mu.Unlock()
	if dialled != 0 {
		t.Fatal("a denied host must not be dialled")
	}
	if d := h.waitDecision("denied.test"); d["decision"] != "deny" || d["status"].(float64) != 403 {
		t.Fatalf("decision log: %v", d)
	}
	// Through a real client too: the request fails, nothing reaches a host.
	if _, err := h.client("box-a").Get("https://denied.test/"); err == nil {
		t.Fatal("a client reached a denied host")
	}
	if _, n := h.lastVisit(); n != 0 {
		t.Fatal("a test host was reached")
	}
}

func TestWildcardAndDenyWins(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		target string
		status int
		rule   string
	}{
		{"a.example.test:443", 200, ""},
		{"deep.a.example.test:443", 200, ""},
		{"example.test:443", 403, "pool.allow:none"}, // *.example.test does not match the apex
		{"bad.example.test:443", 403, "pool.deny:bad.example.test"},
		{"BAD.Example.Test.:443", 403, "pool.deny:bad.example.test"},
	}
	for _, c := range cases {
		resp, _, _ := h.connect(c.target, h.basic("box-a"))
		if resp.StatusCode != c.status || resp.Header.Get("X-Egress-Rule") != c.rule {
			t.Errorf("CONNECT %s: %d rule %q, want %d %q", c.target, resp.StatusCode, resp.Header.Get("X-Egress-Rule"), c.status, c.rule)
		}
	}
	// And the full path to a wildcard-allowed host works.
	if resp, body := h.get("box-a", "https://a.example.test/", nil); resp.StatusCode != 200 || !strings.Contains(body, "a.example.test") {
		t.Fatalf("wildcard host: %d %q", resp.StatusCode, body)
	}
}

func TestSNIMismatchAndMissingRefused(t *testing.T) {
	h := newHarness(t)
	for _, sniName := range []string{"a.example.test", ""} {
		resp, c, _ := h.connect("api.test:443", h.basic("box-a"))
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT api.test: %d", resp.StatusCode)
		}
		// The box asks for another (even allowed) name inside the tunnel, or for none.
		tc := tls.Client(c, &tls.Config{ServerName: sniName, InsecureSkipVerify: true})
		err := tc.Handshake()
		if err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Fatalf("SNI %q inside CONNECT api.test: handshake %v, want the gateway's access_denied alert", sniName, err)
		}
	}
	if _, n := h.lastVisit(); n != 0 {
		t.Fatal("a request reached the host through a mismatched tunnel")
	}
	h.waitDecisions("api.test", 2)
	rules := []string{}
	for _, d := range h.decisions("api.test") {
		rules = append(rules, d["rule"].(string))
	}
	sort.Strings(rules) // each connection is logged when it ends, in whichever order they end
	if strings.Join(rules, ",") != "sni:mismatch,sni:missing" {
		t.Fatalf("decision log rules %q", rules)
	}
	// Not TLS at all inside the tunnel.
	resp, c, _ := h.connect("api.test:443", h.basic("box-a"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if b, _ := io.ReadAll(c); !bytes.Equal(b, tlsAccessDenied) {
		t.Fatalf("plain text in a tunnel: got %q", b)
	}
}

func TestMissingOrBadCredential407(t *testing.T) {
	h := newHarness(t)
	cred := h.keys.Credential(podOf("box-a"))
	for name, auth := range map[string]string{
		"none":                              "",
		"wrong credential":                  basicOf("box-a-pod", cred[:len(cred)-2]+"AA"),
		"unknown pod":                       basicOf("box-z-pod", h.keys.Credential(identity.Pod{Namespace: "sb", Name: "box-z-pod", Nonce: "z1"})),
		"not basic":                         "Bearer " + cred,
		"box id as user":                    basicOf("box-a", cred),
		"box-b's credential as box-a's pod": basicOf("box-a-pod", h.keys.Credential(podOf("box-b"))),
		// The box's previous pod (before a wake: another nonce) or a namesake in another namespace.
		"a previous pod's":    basicOf("box-a-pod", h.keys.Credential(identity.Pod{Namespace: "sb", Name: "box-a-pod", Nonce: "a0"})),
		"another namespace's": basicOf("box-a-pod", h.keys.Credential(identity.Pod{Namespace: "sb2", Name: "box-a-pod", Nonce: "a1"})),
	} {
		resp, _, _ := h.connect("api.test:443", auth)
		if resp.StatusCode != 407 || !strings.HasPrefix(resp.Header.Get("Proxy-Authenticate"), "Basic ") {
			t.Errorf("%s: %d %v", name, resp.StatusCode, resp.Header)
		}
	}
	// A credential misplaced into the user field (the box id into the password) is not logged.
	h.connect("api.test:443", basicOf(cred, "box-a-pod"))
	h.waitDecisions("api.test", 9)
	if strings.Contains(h.logText(), cred) {
		t.Fatal("a credential reached the log")
	}
}

func TestAnotherBoxsCredentialFromThisIPRefused(t *testing.T) {
	h := newHarness(t)
	// box-b's credential is valid, but box-b's pod IP is 127.0.0.9 and this connection comes
	// from 127.0.0.1 (box-a's address): a stolen credential is useless elsewhere.
	resp, _, _ := h.connect("api.test:443", h.basic("box-b"))
	if resp.StatusCode != 407 {
		t.Fatalf("box-b's credential from box-a's address: %d", resp.StatusCode)
	}
	if d := h.waitDecision("api.test"); d["decision"] != "unauthenticated" || d["client"] != "127.0.0.1" || d["claimed_box"] != "box-b" {
		t.Fatalf("decision log: %v", d)
	}
	// The same credential with box-a's own is accepted from here.
	if resp, _, _ := h.connect("api.test:443", h.basic("box-a")); resp.StatusCode != 200 {
		t.Fatalf("box-a: %d", resp.StatusCode)
	}
}

func TestInterceptionInjectsRegisteredHeaders(t *testing.T) {
	h := newHarness(t)
	req := http.Header{"Authorization": {"Bearer box-own"}, "X-Other": {"kept"}}
	resp, body := h.get("box-a", "https://secure.test/path?q=1", req)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "hello from secure.test") {
		t.Fatalf("intercepted GET: %d %q", resp.StatusCode, body)
	}
	if got := issuer(resp); got != "gateway ca" {
		t.Fatalf("an intercepted host must be served with a leaf from the gateway's CA, got %q", got)
	}
	v, _ := h.lastVisit()
	if v.authorization != secretToken || v.apiKey != secretKey {
		t.Fatalf("the registered headers must replace the box's: %+v", v)
	}
	if v.serverName != "secure.test" || v.host != "secure.test" || v.proxyAuth != "" {
		t.Fatalf("the host must be reached over TLS as itself, with no proxy credential: %+v", v)
	}
	// A request body goes up; the box's Host header cannot redirect an intercepted request.
	post, _ := http.NewRequest("POST", "https://secure.test/upload", strings.NewReader(strings.Repeat("b", 100000)))
	post.Host = "elsewhere.test"
	presp, err := h.client("box-a").Do(post)
	if err != nil {
		t.Fatal(err)
	}
	pbody, _ := io.ReadAll(presp.Body)
	presp.Body.Close()
	if string(pbody) != "hello from secure.test (100000 bytes up)" {
		t.Fatalf("POST through interception: %q", pbody)
	}
	// The same box to a host without registered headers: pass-through, never decrypted.
	resp, _ = h.get("box-a", "https://api.test/", nil)
	if got := issuer(resp); got != "host ca" {
		t.Fatalf("a host without credentials must not be intercepted, got a leaf issued by %q", got)
	}
	// Another box without credentials for secure.test goes through untouched as well.
	log := h.logText()
	if strings.Contains(log, "s3cret") || strings.Contains(log, secretKey) {
		t.Fatalf("a header value reached the log:\n%s", log)
	}
	if d := h.waitDecision("secure.test"); d["decision"] != "intercept" {
		t.Fatalf("decision log: %v", d)
	}
}

func TestPolicyChangeWithoutRestart(t *testing.T) {
	h := newHarness(t)
	if resp, _, _ := h.connect("api.test:443", h.basic("box-a")); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	// Narrow box-a to a.example.test only; deny api.test for the pool.
	h.setPolicy(strings.Replace(strings.Replace(basePolicy, `"deny": ["bad.example.test"]`, `"deny": ["bad.example.test", "api.test"]`, 1),
		`"box-b": {`, `"box-c": {"pool": "p", "ip": "127.0.0.3", "pod": "box-c-pod", "namespace": "sb", "nonce": "c1"}, "box-b": {`, 1))
	start := time.Now()
	for {
		resp, _, _ := h.connect("api.test:443", h.basic("box-a"))
		if resp.StatusCode == 403 && resp.Header.Get("X-Egress-Rule") == "pool.deny:api.test" {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("the new policy was not in force within 1 s (still %d)", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("policy change in force after %v", time.Since(start).Round(time.Millisecond))
	// Credentials change the same way: removed, secure.test is passed through again.
	h.setPolicy(strings.Replace(basePolicy, `"credentials"`, `"nocredentials"`, 1))
	start = time.Now()
	for {
		resp, _ := h.get("box-a", "https://secure.test/", nil)
		if issuer(resp) == "host ca" {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatal("removing credentials was not in force within 1 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPlainHTTP(t *testing.T) {
	h := newHarness(t)
	resp, body := h.get("box-a", "http://plain.test/", http.Header{"Connection": {"X-Drop"}, "X-Drop": {"1"}})
	if resp.StatusCode != 200 || body != "hello from plain.test (0 bytes up)" {
		t.Fatalf("plain.test: %d %q", resp.StatusCode, body)
	}
	v, _ := h.lastVisit()
	if v.proxyAuth != "" {
		t.Fatal("the proxy credential was forwarded to the host")
	}
	// api.test is allowed over TLS only.
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	r2, err := h.client("box-a").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 403 || r2.Header.Get("X-Egress-Rule") != "plainHttp:none" {
		t.Fatalf("plain HTTP to a TLS-only host: %d %q", r2.StatusCode, r2.Header.Get("X-Egress-Rule"))
	}
	// Never an injected credential over plain HTTP, even for a host that has some.
	if d := h.waitDecision("plain.test"); d["decision"] != "allow" || d["kind"] != "http" {
		t.Fatalf("decision log: %v", d)
	}
}

func TestUpstreamFailure502AndMetrics(t *testing.T) {
	h := newHarness(t)
	resp, _, _ := h.connect("unreachable.example.test:443", h.basic("box-a"))
	if resp.StatusCode != 502 || resp.Header.Get("X-Egress-Rule") != "upstream:dial" {
		t.Fatalf("unreachable host: %d %v", resp.StatusCode, resp.Header)
	}
	h.get("box-a", "https://api.test/", nil)
	h.waitDecision("api.test")
	var b strings.Builder
	h.metrics.WriteTo(&b)
	for _, want := range []string{
		`egress_gateway_decisions_total{kind="connect",decision="allow"} 1`,
		`egress_gateway_decisions_total{kind="connect",decision="error"} 1`,
		`egress_gateway_connect_seconds_count 1`,
		`egress_gateway_active_connections 0`,
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
}

func TestPolicyChangeClosesOpenTunnels(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.proxy.Run(ctx)
	open := func(host string) (*bufio.Reader, net.Conn) {
		resp, c, _ := h.connect(host+":443", h.basic("box-a"))
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT %s: %d", host, resp.StatusCode)
		}
		roots := x509.NewCertPool()
		roots.AddCert(h.hostCA.Cert)
		roots.AddCert(h.gwCA.Cert)
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots})
		br := bufio.NewReader(tc)
		io.WriteString(tc, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("first request on the tunnel to %s: %v", host, err)
		}
		io.Copy(io.Discard, resp.Body)
		return br, tc
	}
	apiReader, _ := open("api.test")       // pass-through
	secureReader, _ := open("secure.test") // intercepted
	keptReader, kept := open("a.example.test")
	// Deny both hosts; a.example.test stays allowed.
	h.setPolicy(strings.Replace(basePolicy, `"deny": ["bad.example.test"]`, `"deny": ["bad.example.test", "api.test", "secure.test"]`, 1))
	start := time.Now()
	for name, br := range map[string]*bufio.Reader{"api.test": apiReader, "secure.test": secureReader} {
		if _, err := br.ReadByte(); err == nil {
			t.Fatalf("%s: the tunnel sent a byte instead of closing", name)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("%s: closed only after %v", name, d)
		}
		if d := h.waitDecision(name); d["revoked"] != "pool.deny:"+name {
			t.Fatalf("%s: decision log %v", name, d)
		}
	}
	// The still-allowed tunnel still works.
	io.WriteString(kept, "GET / HTTP/1.1\r\nHost: a.example.test\r\n\r\n")
	if resp, err := http.ReadResponse(keptReader, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("an allowed tunnel was disturbed: %v", err)
	}
}

// BenchmarkDownload: 64 MiB over loopback, direct from the test host, through pass-through,
// through interception (go test ./proxy -run XXX -bench Download).
func BenchmarkDownload(b *testing.B) {
	h := newHarness(b)
	roots := x509.NewCertPool()
	roots.AddCert(h.hostCA.Cert)
	direct := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, h.tlsAddr)
		},
	}}
	for name, c := range map[string]*http.Client{"direct": direct, "passthrough": h.client("box-a"), "intercepted": h.client("box-a")} {
		host := "big.test"
		if name == "intercepted" {
			host = "secure.test"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for i := 0; i < b.N; i++ {
				resp, err := c.Get("https://" + host + "/bench")
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != 64<<20 {
					b.Fatalf("%d bytes", n)
				}
			}
		})
	}
}

// The gateway sends a credential only to the real host: an upstream whose certificate does not
// verify against the trusted roots gets nothing, and the box gets a 502.
func TestInterceptionVerifiesTheHost(t *testing.T) {
	h := newHarness(t)
	rogueCA := testpki.NewCA(t, "rogue ca")
	var got []string
	var mu sync.Mutex
	rogue := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	rogue.TLS = &tls.Config{Certificates: []tls.Certificate{rogueCA.Leaf(t, "rogue.test")}}
	rogue.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	rogue.StartTLS()
	defer rogue.Close()
	h.mu.Lock()
	h.routes = map[string]string{"rogue.test": rogue.Listener.Addr().String()}
	h.mu.Unlock()
	resp, body := h.get("box-a", "https://rogue.test/", nil)
	if resp.StatusCode != 502 || resp.Header.Get("X-Egress-Rule") != "upstream:request" {
		t.Fatalf("an unverifiable host: %d %q", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 0 {
		t.Fatalf("the rogue host received a request: %q", got)
	}
	if d := h.waitDecision("rogue.test"); !strings.Contains(fmt.Sprint(d["error"]), "certificate") {
		t.Fatalf("decision log: %v", d)
	}
}

func TestConnectionsPerBoxBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConnsPerBox = 2 })
	var first net.Conn
	for i := 0; i < 2; i++ {
		resp, c, _ := h.connect("api.test:443", h.basic("box-a"))
		if resp.StatusCode != 200 {
			t.Fatalf("tunnel %d: %d", i, resp.StatusCode)
		}
		if i == 0 {
			first = c
		}
	}
	resp, _, _ := h.connect("api.test:443", h.basic("box-a"))
	if resp.StatusCode != 429 || resp.Header.Get("X-Egress-Rule") != "box:connections" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third tunnel: %d %v", resp.StatusCode, resp.Header)
	}
	// A closed tunnel gives its place back.
	first.Close()
	deadline := time.Now().Add(time.Second)
	for {
		resp, _, _ := h.connect("api.test:443", h.basic("box-a"))
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed tunnel's place was not given back: %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
