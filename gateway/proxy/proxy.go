// Package proxy is the gateway's data path: an HTTP proxy that boxes reach through HTTP_PROXY /
// HTTPS_PROXY. Every request is identified (pod name and credential in Proxy-Authorization, and
// the pod IP the connection comes from), decided by package policy against the current state of
// package source, logged (one JSON line per connection or plain request, never a header value)
// and counted. Then:
//
//   - CONNECT host:port, no credentials registered for (box, host): the gateway dials the host,
//     answers 200, reads the box's TLS ClientHello (package sni), refuses it unless its server
//     name is the CONNECT host, and splices the two connections without decrypting (tunnel.go);
//   - CONNECT to a host with registered headers: the gateway terminates TLS with a leaf from the
//     pool's CA, forwards each request over TLS to the real host with the headers set, and
//     relays the answers (intercept.go);
//   - an absolute http:// request: forwarded only where the policy allows plain HTTP (forward.go).
package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/identity"
	"sandbox-bridge.io/gateway/metrics"
	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/resolver"
	"sandbox-bridge.io/gateway/source"
)

// Config of a Proxy.
type Config struct {
	Source source.Source
	Keys   *identity.Keys
	// CA mints intercepted hosts' leaves for boxes of pools the State has no CA for (a pool's
	// own CA, State.CAs, wins); nil with none in the State turns interception off for the pool (a
	// box with credentials for a host is then refused there with 502: its requests would go out
	// without them).
	CA certs.Signer
	// Resolver asks the pools' credential resolvers (State.Resolvers); nil: a pool's resolver
	// hosts are refused (502).
	Resolver *resolver.Client
	// UpstreamRoots verify the real hosts of intercepted connections; nil: the system roots.
	UpstreamRoots *x509.CertPool
	// Dial opens upstream connections; nil: a net.Dialer. The address is "host:port" as asked.
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	Log     *slog.Logger
	Metrics *metrics.Metrics
	// OnDeny, when set, is told each refusal of an identified box (the policy, the SNI check, the
	// connection bound), with the host name and the rule only: the denial Events (package
	// events). It must not block.
	OnDeny func(boxID string, box *source.Box, host, rule string)
	// IdleTimeout closes a connection with no byte either way for this long (default 5 min);
	// HelloTimeout bounds the wait for the box's ClientHello or TLS handshake (default 10 s);
	// DialTimeout bounds an upstream dial (default 10 s).
	IdleTimeout, HelloTimeout, DialTimeout time.Duration
	// MaxConnsPerBox bounds one box's open connections and requests (default 256): past it, 429.
	// One box cannot take every file descriptor and buffer of a gateway replica.
	MaxConnsPerBox int
}

// Proxy is the http.Handler serving boxes.
type Proxy struct {
	cfg       Config
	transport *http.Transport
	open      tunnels

	mu     sync.Mutex
	perBox map[string]int
}

// New returns a Proxy.
func New(cfg Config) *Proxy {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConnsPerBox <= 0 {
		cfg.MaxConnsPerBox = 256
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	p := &Proxy{cfg: cfg, perBox: map[string]int{}}
	p.transport = &http.Transport{
		Proxy:                 nil, // never the gateway's own HTTP(S)_PROXY
		DialContext:           p.dial,
		TLSClientConfig:       &tls.Config{RootCAs: cfg.UpstreamRoots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1000,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   cfg.HelloTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // relay bodies as the host encodes them
	}
	return p
}

func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	return p.cfg.Dial(ctx, network, addr)
}

// record is what the decision log says about one connection or plain request.
type record struct {
	start     time.Time
	kind      string // "connect" or "http"
	client    netip.Addr
	box, host string
	pod       string      // the box's pod the connection was authenticated as
	boxRef    *source.Box // the box as identified (its pod, for denial Events)
	port      string
	decision  string // allow, intercept, deny, unauthenticated, error
	rule      string
	status    int
	up, down  int64
	requests  int
	revoked   string // the rule that closed this open tunnel after a policy change
	claimed   string // the known box id an unauthenticated request claimed
	creds     string // where injected credentials came from: registered, resolver
	err       string // what failed, for "error" decisions (never a header value)
}

// countBytes adds relayed bytes to the metrics as they move (not when a connection ends, so a
// long download shows in rates while it runs).
func (p *Proxy) countBytes(up bool, n int64) {
	if up {
		p.cfg.Metrics.BytesUp.Add(uint64(n))
	} else {
		p.cfg.Metrics.BytesDown.Add(uint64(n))
	}
}

func (p *Proxy) finish(rec *record) {
	p.cfg.Metrics.Decision(rec.kind, rec.decision)
	if rec.decision == "deny" {
		p.denied(rec, rec.host, rec.rule)
	}
	attrs := []any{
		"kind", rec.kind, "box", rec.box, "client", rec.client.String(), "host", rec.host, "port", rec.port,
		"decision", rec.decision, "rule", rec.rule, "status", rec.status,
		"bytes_up", rec.up, "bytes_down", rec.down,
		"duration_ms", float64(time.Since(rec.start).Microseconds()) / 1000,
	}
	if rec.requests > 0 {
		attrs = append(attrs, "requests", rec.requests)
	}
	if rec.revoked != "" {
		attrs = append(attrs, "revoked", rec.revoked)
	}
	if rec.creds != "" {
		attrs = append(attrs, "credentials", rec.creds)
	}
	if rec.claimed != "" {
		attrs = append(attrs, "claimed_box", rec.claimed)
	}
	if rec.err != "" {
		attrs = append(attrs, "error", rec.err)
	}
	p.cfg.Log.Info("egress", attrs...)
}

// ServeHTTP identifies the box, then hands the request to connect or forward.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.cfg.Metrics.Active.Add(1)
	defer p.cfg.Metrics.Active.Add(-1)
	rec := &record{start: time.Now(), kind: "http"}
	if r.Method == http.MethodConnect {
		rec.kind = "connect"
	}
	defer p.finish(rec)
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		rec.client = ap.Addr().Unmap()
	}
	// Until the request is decided, the log names the host as asked (CONNECT target or URL).
	rec.host = r.URL.Hostname()
	if r.Method == http.MethodConnect {
		rec.host = r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			rec.host = h
		}
	}
	st := p.cfg.Source.Current()
	if st == nil {
		rec.decision, rec.rule = "error", "gateway:not-ready"
		p.refuse(w, rec, http.StatusServiceUnavailable, "cluster_unavailable", "the gateway has no policy loaded yet")
		return
	}
	// Identity: the box pod at the connection's address, named in the user field, with the
	// credential bound to that pod (namespace, name, nonce).
	user, pass, _ := identity.ParseBasic(r.Header.Get("Proxy-Authorization"))
	boxID := st.BoxAt(rec.client)
	box := st.Boxes[boxID]
	if box == nil || user != box.Pod || !p.cfg.Keys.Valid(box.Identity(), pass) {
		// One answer for a missing credential, a bad one, an unknown pod and a good one used
		// from another address: the box learns nothing about which it was.
		rec.decision, rec.rule = "unauthenticated", "identity"
		// Only a known box is logged: a misplaced credential in the user field never is.
		rec.claimed = st.PodBox(user)
		w.Header().Set("Proxy-Authenticate", `Basic realm="`+identity.Realm+`"`)
		p.refuse(w, rec, http.StatusProxyAuthRequired, "unauthorized",
			"a box's proxy credential is required (Proxy-Authorization: Basic pod-name:credential) from the box pod's own address")
		return
	}
	rec.box, rec.pod, rec.boxRef = boxID, box.Pod, box
	if !p.acquire(boxID) {
		rec.decision, rec.rule = "deny", "box:connections"
		w.Header().Set("Retry-After", "1")
		p.refuse(w, rec, http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("this box has %d connections open through the gateway, the most it may", p.cfg.MaxConnsPerBox))
		return
	}
	defer p.release(boxID)
	if r.Method == http.MethodConnect {
		p.connect(w, r, rec, st, box)
		return
	}
	p.forward(w, r, rec, st, box)
}

// denied tells OnDeny of a refusal of rec's box to reach host by rule. Requests the gateway
// could not read as a host (malformed targets) are not counted: their "host" is whatever the box
// wrote.
func (p *Proxy) denied(rec *record, host, rule string) {
	if p.cfg.OnDeny == nil || rec.boxRef == nil || rule == "host:invalid" || rule == "request:not-absolute-http" {
		return
	}
	if h, ok := policy.Normalize(host); ok && h == host {
		p.cfg.OnDeny(rec.box, rec.boxRef, host, rule)
	}
}

// refuse writes a proxy error answer: the DESIGN's JSON error plus X-Egress-Decision and
// X-Egress-Rule headers (a CONNECT client often shows only the status and headers).
func (p *Proxy) refuse(w http.ResponseWriter, rec *record, status int, typ, message string) {
	rec.status = status
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Egress-Decision", rec.decision)
	if rec.rule != "" {
		h.Set("X-Egress-Rule", rec.rule)
	}
	h.Set("Connection", "close")
	w.WriteHeader(status)
	body := map[string]any{"error": map[string]string{"type": typ, "message": message, "host": rec.host, "rule": rec.rule}}
	json.NewEncoder(w).Encode(body)
}

// hostPort joins host and port, leaving the default port of scheme out (as a Host header has it).
func hostPort(host, port, defaultPort string) string {
	if port == defaultPort {
		if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
			return "[" + host + "]"
		}
		return host
	}
	return net.JoinHostPort(host, port)
}

func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n < 65536 && strconv.Itoa(n) == port
}

func (p *Proxy) acquire(box string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perBox[box] >= p.cfg.MaxConnsPerBox {
		return false
	}
	p.perBox[box]++
	return true
}

func (p *Proxy) release(box string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perBox[box]--; p.perBox[box] <= 0 {
		delete(p.perBox, box)
	}
}
