// Package ports carries HTTP requests, and connections upgraded from them (WebSocket), to a port
// a process in the box listens on, on the box's loopback (PROTOCOL.md "Ports"). Nothing in the box
// has to listen on a public interface, and the box's NetworkPolicy stays as it is: the bridge
// reaches boxd's one port, boxd dials 127.0.0.1 (or ::1) inside the box.
//
// The proxy is net/http/httputil's ReverseProxy: hop-by-hop headers removed both ways, upgrades
// (101) copied both ways, server-sent events and other answers without a length flushed as they
// come. Around it: the connection bound per box (429), an optional byte rate per box (transfers
// are slowed, not refused), boxd's own headers kept from the app both ways, and boxd's own answers
// (errors) told apart from the app's by a marker the app's answers carry.
package ports

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sandbox-bridge.io/boxd/errs"
)

// Pattern is the route's path (as the request log names it); Prefix is what every port path starts with.
const (
	Pattern = "/v1/ports/{port}/{path...}"
	Prefix  = "/v1/ports/"
)

// Headers of the protocol, read from boxd's caller and never passed to the app.
const (
	// MaxConnsHeader: requests (and upgraded connections) through the box's ports at once.
	MaxConnsHeader = "X-Boxd-Port-Max-Connections"
	// RateHeader: bytes per second through the box's ports, both ways together; 0 or absent: no limit.
	RateHeader = "X-Boxd-Port-Bytes-Per-Second"
	// ProxiedHeader marks every answer that comes from the app (value "1"); boxd's own answers
	// (bad port, over the limit, nothing listening, a fence) do not carry it.
	ProxiedHeader = "X-Boxd-Proxied"
)

// DefaultMaxConns bounds connections when the caller names no limit.
const DefaultMaxConns = 256

// Proxy serves Pattern. One per boxd: the bounds it keeps are the box's.
type Proxy struct {
	reserved  map[int]bool
	transport *http.Transport
	log       *slog.Logger

	mu   sync.Mutex
	open int
	rate *bucket
}

// New returns the proxy. reserved are ports no request may reach (boxd's own).
func New(log *slog.Logger, reserved ...int) *Proxy {
	p := &Proxy{reserved: map[int]bool{}, log: log, rate: &bucket{}}
	for _, port := range reserved {
		p.reserved[port] = true
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	p.transport = &http.Transport{
		// Whatever address the URL names, the app is dialled on the loopback: 127.0.0.1 first, then
		// ::1 (a server bound to "localhost" may be on either).
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			c, err := dialer.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", port))
			if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
				if c6, err6 := dialer.DialContext(ctx, "tcp6", net.JoinHostPort("::1", port)); err6 == nil {
					return c6, nil
				}
			}
			return c, err
		},
		// Connections to the app are kept for the next request (the bridge keeps its own to boxd).
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		// Bodies pass as they are: compressed or not is between the caller and the app.
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
	}
	return p
}

// Close drops the idle connections to apps.
func (p *Proxy) Close() { p.transport.CloseIdleConnections() }

// Open answers how many requests and upgraded connections are passing through the ports now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// ServeHTTP proxies r to the port its path names. r.URL.Path starts with Prefix.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	port, rest, err := p.target(r.URL)
	if err != nil {
		writeError(w, err)
		return
	}
	maxConns, err := headerInt(r.Header, MaxConnsHeader, DefaultMaxConns)
	if err == nil && maxConns == 0 {
		err = errs.Invalid("%s must be > 0", MaxConnsHeader)
	}
	rate, rerr := headerInt(r.Header, RateHeader, 0)
	if err == nil {
		err = rerr
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if !p.acquire(maxConns) {
		writeError(w, errs.TooMany("the box has %d connections open through its ports, its limit; retry", maxConns))
		return
	}
	defer p.release()
	p.rate.setRate(rate)

	rp := &httputil.ReverseProxy{
		Rewrite:        func(pr *httputil.ProxyRequest) { p.rewrite(pr, port, rest) },
		Transport:      p.transport,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   func(w http.ResponseWriter, r *http.Request, err error) { p.failed(w, r, port, err) },
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	rp.ServeHTTP(w, r)
}

// target parses the port and the rest of the path (escaped as it came, "/" at least).
func (p *Proxy) target(u *url.URL) (int, *url.URL, error) {
	escaped := u.EscapedPath()
	after, ok := strings.CutPrefix(escaped, Prefix)
	if !ok {
		return 0, nil, errs.NotFound("no route %s", u.Path)
	}
	digits, rest, _ := strings.Cut(after, "/")
	port, err := strconv.Atoi(digits)
	if err != nil || port < 1 || port > 65535 || digits != strconv.Itoa(port) {
		return 0, nil, errs.Invalid("the port must be a number from 1 to 65535, not %q", digits)
	}
	if p.reserved[port] {
		return 0, nil, errs.New(http.StatusForbidden, "port %d is boxd's own; it cannot be reached through the ports route", port)
	}
	out, err := url.Parse("/" + rest)
	if err != nil {
		return 0, nil, errs.Invalid("the path is not a valid URL path: %v", err)
	}
	out.RawQuery = u.RawQuery
	return port, out, nil
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest, port int, rest *url.URL) {
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	pr.Out.URL.Path, pr.Out.URL.RawPath = rest.Path, rest.RawPath
	pr.Out.URL.RawQuery = rest.RawQuery
	// The app is addressed as a local server (dev servers refuse hosts they do not know); the
	// host the caller used is in X-Forwarded-Host, set by the bridge with -For and -Proto, which
	// boxd passes on (only the bridge reaches boxd).
	pr.Out.Host = "localhost:" + strconv.Itoa(port)
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v := pr.In.Header.Values(h); len(v) > 0 {
			pr.Out.Header[h] = v
		}
	}
	for name := range pr.Out.Header {
		if strings.HasPrefix(strings.ToLower(name), "x-boxd-") {
			delete(pr.Out.Header, name) // the box credential and the limits are boxd's, not the app's
		}
	}
	// 100-continue was between the bridge and boxd (a call the fence refuses leaves its body unsent).
	pr.Out.Header.Del("Expect")
	if pr.Out.Body != nil && p.rate.limited() {
		pr.Out.Body = &rateReader{ReadCloser: pr.Out.Body, b: p.rate}
	}
}

func (p *Proxy) modifyResponse(res *http.Response) error {
	for name := range res.Header {
		if strings.HasPrefix(strings.ToLower(name), "x-boxd-") {
			delete(res.Header, name) // an app cannot speak for boxd (a fence, a marker)
		}
	}
	res.Header.Set(ProxiedHeader, "1")
	if !p.rate.limited() {
		return nil
	}
	if rwc, ok := res.Body.(io.ReadWriteCloser); ok && res.StatusCode == http.StatusSwitchingProtocols {
		res.Body = &rateConn{ReadWriteCloser: rwc, b: p.rate}
	} else {
		res.Body = &rateReader{ReadCloser: res.Body, b: p.rate}
	}
	return nil
}

// failed answers what went wrong before the app's answer began; after that the connection is
// cut (ReverseProxy's doing), so the caller never takes a part for the whole.
func (p *Proxy) failed(w http.ResponseWriter, r *http.Request, port int, err error) {
	if r.Context().Err() != nil {
		return // the caller went away: nobody to tell
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		writeError(w, errs.New(http.StatusBadGateway, "nothing listens on port %d in the box (connection refused on 127.0.0.1 and ::1)", port))
	default:
		p.log.Debug("port request failed", "port", port, "error", err.Error())
		writeError(w, errs.New(http.StatusBadGateway, "port %d in the box did not answer: %s", port, shortError(err)))
	}
}

func (p *Proxy) acquire(limit int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if int64(p.open) >= limit {
		return false
	}
	p.open++
	return true
}

func (p *Proxy) release() {
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

func headerInt(h http.Header, name string, def int64) (int64, error) {
	v := h.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errs.Invalid("%s must be a non-negative integer", name)
	}
	return n, nil
}

// shortError is an error's text without the proxy's own address in it (the message goes to the caller).
func shortError(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "the connection was closed before an answer"
	}
	return err.Error()
}

// writeError is the server's JSON error answer (PROTOCOL.md "Errors"), without the marker.
func writeError(w http.ResponseWriter, err error) {
	e := errs.As(err)
	h := w.Header()
	for name := range h {
		delete(h, name)
	}
	if e.Status == http.StatusTooManyRequests {
		h.Set("Retry-After", "1")
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": e.Type, "message": e.Message}})
}
