// Package resolver asks a pool's credential resolver (SandboxPool spec.egress.credentialResolver)
// for the headers to inject into a box's HTTPS requests to a host, so the platform can keep its
// secrets in its own vault. For an allowed CONNECT of box B to host H that has no credentials
// registered on the box, when H matches the resolver's hosts, the gateway POSTs
//
//	{"box_id", "pool", "host", "port", "tenant_id", "session_id"}
//
// with X-Sandbox-Bridge-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(key, "<t>.<body>")> (as the
// operator's webhooks sign), and reads 200 {"headers": {...}, "ttl_seconds": n} (headers checked
// like registered credentials; {} is none) or 204 (none). An answer is kept per (box, host) for the
// pool's ttlSeconds or the answer's ttl_seconds, whichever is less, in a bounded cache; errors,
// timeouts and bad answers are not kept, and the connection is refused (502): a request never
// goes out without the credentials the platform wanted on it. Header values are never logged or
// put in an error.
package resolver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"sandbox-bridge.io/gateway/policy"
)

// SignatureHeader carries the request's signature (operator/webhooks.ts SIGNATURE_HEADER).
const SignatureHeader = "X-Sandbox-Bridge-Signature"

// The CRD's defaults and bounds of ttlSeconds and timeoutSeconds.
const (
	DefaultTTLSeconds     = 300
	DefaultTimeoutSeconds = 5
	MaxTTLSeconds         = 86400
	MaxTimeoutSeconds     = 30
)

// MaxEntries is the default bound of the answer cache.
const MaxEntries = 10_000

// maxAnswer bounds an answer's body.
const maxAnswer = 64 << 10

// Spec is a pool's spec.egress.credentialResolver.
type Spec struct {
	URL            string   `json:"url"`
	Hosts          []string `json:"hosts"`
	TTLSeconds     *int     `json:"ttlSeconds,omitempty"`
	TimeoutSeconds *int     `json:"timeoutSeconds,omitempty"`
}

// Check says what is wrong with s, if anything.
func (s *Spec) Check() error {
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("url: want http(s)://host[:port]/path")
	}
	if len(s.Hosts) == 0 {
		return errors.New("hosts: none")
	}
	for _, h := range s.Hosts {
		if h == "*" {
			return errors.New("hosts: * is not allowed (name the hosts the resolver knows)")
		}
		if err := policy.ValidPattern(h); err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
	}
	if s.TTLSeconds != nil && (*s.TTLSeconds < 0 || *s.TTLSeconds > MaxTTLSeconds) {
		return fmt.Errorf("ttlSeconds: want 0 to %d", MaxTTLSeconds)
	}
	if s.TimeoutSeconds != nil && (*s.TimeoutSeconds < 1 || *s.TimeoutSeconds > MaxTimeoutSeconds) {
		return fmt.Errorf("timeoutSeconds: want 1 to %d", MaxTimeoutSeconds)
	}
	return nil
}

// TTL is how long an answer is kept at most.
func (s *Spec) TTL() time.Duration {
	if s.TTLSeconds == nil {
		return DefaultTTLSeconds * time.Second
	}
	return time.Duration(*s.TTLSeconds) * time.Second
}

// Timeout bounds one request.
func (s *Spec) Timeout() time.Duration {
	if s.TimeoutSeconds == nil {
		return DefaultTimeoutSeconds * time.Second
	}
	return time.Duration(*s.TimeoutSeconds) * time.Second
}

// Covers reports whether the resolver is asked about host (normalized).
func (s *Spec) Covers(host string) bool {
	for _, p := range s.Hosts {
		if policy.Match(p, host) {
			return true
		}
	}
	return false
}

// Query is the request's body: which box asks for which host, and the box's outbound context
// (record annotation sandbox-bridge.io/outbound-context; empty strings when unset).
type Query struct {
	BoxID     string `json:"box_id"`
	Pool      string `json:"pool"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	TenantID  string `json:"tenant_id"`
	SessionID string `json:"session_id"`
}

// Result names how Headers answered, for metrics: "headers", "none", "error" (asked), "cache".
type Result string

// Client asks resolvers and keeps their answers. It is safe for concurrent use.
type Client struct {
	// Key signs the requests; empty: nothing is asked and every lookup is an error (502), since
	// an unsigned request would let anyone who can reach the resolver ask it for secrets.
	Key []byte
	// HTTP sends the requests; nil: NewHTTPClient(nil).
	HTTP *http.Client
	// MaxEntries bounds the cache (default MaxEntries).
	MaxEntries int
	// OnResult, when set, is called once per lookup (metrics).
	OnResult func(Result)
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time

	mu      sync.Mutex
	cache   map[cacheKey]*entry
	flights map[flightKey]*flight
}

type cacheKey struct{ box, host string }

// An answer is used only for the same question: a changed resolver URL, pool or outbound
// context asks again.
type flightKey struct {
	cacheKey
	url, pool, tenant, session string
}

type entry struct {
	key     flightKey
	headers map[string]string
	expires time.Time
}

type flight struct {
	done    chan struct{}
	headers map[string]string
	err     error
}

// NewHTTPClient is the resolvers' HTTP client: never a proxy, never a redirect (a resolver that
// redirects is answering wrongly, and a redirect could send the signed question elsewhere), its
// own dialer (resolvers often run in the cluster: the gateway's refusal of private addresses is
// for the boxes' upstreams, not for the resolvers the pools name), and roots (nil: the system's)
// to verify https resolvers with.
func NewHTTPClient(roots *x509.CertPool) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout:   10 * time.Second,
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: MaxTimeoutSeconds * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Client) result(r Result) {
	if c.OnResult != nil {
		c.OnResult(r)
	}
}

// Headers returns the headers to inject for q (nil: none), from the cache or the resolver.
// Concurrent lookups of the same question share one request.
func (c *Client) Headers(ctx context.Context, spec *Spec, q Query) (map[string]string, error) {
	k := flightKey{cacheKey{q.BoxID, q.Host}, spec.URL, q.Pool, q.TenantID, q.SessionID}
	c.mu.Lock()
	if e := c.cache[k.cacheKey]; e != nil && e.key == k && c.now().Before(e.expires) {
		c.mu.Unlock()
		c.result("cache")
		return e.headers, nil
	}
	if f := c.flights[k]; f != nil {
		c.mu.Unlock()
		select {
		case <-f.done:
			return f.headers, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	if c.flights == nil {
		c.flights = map[flightKey]*flight{}
	}
	c.flights[k] = f
	c.mu.Unlock()

	headers, ttl, err := c.ask(ctx, spec, q)
	switch {
	case err != nil:
		c.result("error")
	case len(headers) == 0:
		c.result("none")
	default:
		c.result("headers")
	}
	c.mu.Lock()
	delete(c.flights, k)
	if err == nil && ttl > 0 {
		c.store(k, headers, c.now().Add(ttl))
	}
	c.mu.Unlock()
	f.headers, f.err = headers, err
	close(f.done)
	return headers, err
}

// store keeps an answer; c.mu held. A full cache drops its expired entries, then, still full, an
// arbitrary one: the bound holds whatever the boxes ask.
func (c *Client) store(k flightKey, headers map[string]string, expires time.Time) {
	max := c.MaxEntries
	if max <= 0 {
		max = MaxEntries
	}
	if c.cache == nil {
		c.cache = map[cacheKey]*entry{}
	}
	if _, ok := c.cache[k.cacheKey]; !ok && len(c.cache) >= max {
		now := c.now()
		for key, e := range c.cache {
			if !now.Before(e.expires) {
				delete(c.cache, key)
			}
		}
		for key := range c.cache {
			if len(c.cache) < max {
				break
			}
			delete(c.cache, key)
		}
	}
	c.cache[k.cacheKey] = &entry{key: k, headers: headers, expires: expires}
}

// Len is the number of answers kept (tests, metrics).
func (c *Client) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cache)
}

// Sign returns the signature header's value for body at unix time t.
func Sign(key []byte, t int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strconv.FormatInt(t, 10) + "."))
	m.Write(body)
	return "t=" + strconv.FormatInt(t, 10) + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// ask sends one request and reads the answer: the headers and how long they may be kept.
func (c *Client) ask(ctx context.Context, spec *Spec, q Query) (map[string]string, time.Duration, error) {
	if len(c.Key) == 0 {
		return nil, 0, errors.New("no resolver key (-resolver-key-file): the gateway asks no resolver unsigned")
	}
	body, err := json.Marshal(q)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, spec.URL, bytes.NewReader(body))
	if err != nil {
		return nil, 0, errors.New("the resolver URL is not usable")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sandbox-bridge-egress-gateway")
	req.Header.Set(SignatureHeader, Sign(c.Key, c.now().Unix(), body))
	hc := c.HTTP
	if hc == nil {
		hc = NewHTTPClient(nil)
	}
	resp, err := hc.Do(req)
	if err != nil {
		// The url.Error would quote the URL, which may carry a token of the platform's.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, 0, fmt.Errorf("no answer within %v", spec.Timeout())
		}
		return nil, 0, fmt.Errorf("request failed: %v", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil, spec.TTL(), nil
	case http.StatusOK:
	default:
		return nil, 0, fmt.Errorf("answered %d, want 200 or 204", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the answer: %v", err)
	}
	if len(b) > maxAnswer {
		return nil, 0, fmt.Errorf("the answer is larger than %d bytes", maxAnswer)
	}
	var a struct {
		Headers    map[string]string `json:"headers"`
		TTLSeconds *float64          `json:"ttl_seconds"`
	}
	if json.Unmarshal(b, &a) != nil {
		// No detail: a JSON error can quote the answer.
		return nil, 0, errors.New(`the answer is not {"headers": {name: string}, "ttl_seconds": number}`)
	}
	ttl := spec.TTL()
	if a.TTLSeconds != nil {
		if *a.TTLSeconds < 0 {
			return nil, 0, errors.New("the answer's ttl_seconds is negative")
		}
		if d := time.Duration(*a.TTLSeconds * float64(time.Second)); d < ttl {
			ttl = d
		}
	}
	headers := make(map[string]string, len(a.Headers))
	for name, v := range a.Headers {
		if !policy.CredentialHeader(name, v) {
			return nil, 0, fmt.Errorf("the answer's header %q is not a credential header or its value has control characters", name)
		}
		headers[http.CanonicalHeaderKey(name)] = v
	}
	if len(headers) == 0 {
		headers = nil
	}
	return headers, ttl, nil
}
