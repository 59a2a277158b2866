package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/source"
)

// forward serves an absolute http:// request, where the policy allows plain HTTP to its host.
// Credentials are never injected here: they travel only inside TLS the gateway intercepts.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, rec *record, st *source.State, box *source.Box) {
	if r.URL.Scheme != "http" || r.URL.Host == "" {
		rec.decision, rec.rule = "deny", "request:not-absolute-http"
		p.refuse(w, rec, http.StatusBadRequest, "invalid_request",
			"the gateway forwards absolute http:// URLs; use CONNECT for https")
		return
	}
	host, port := r.URL.Hostname(), r.URL.Port()
	if port == "" {
		port = "80"
	}
	h, ok := policy.Normalize(host)
	rec.host, rec.port = host, port
	if !ok || !validPort(port) {
		rec.decision, rec.rule = "deny", "host:invalid"
		p.refuse(w, rec, http.StatusBadRequest, "invalid_request", "invalid host or port")
		return
	}
	rec.host = h
	d := policy.Decide(st.Pools[box.Pool], box.Policy(), h, true)
	rec.rule = d.Rule
	if !d.Allow {
		rec.decision = "deny"
		p.refuse(w, rec, http.StatusForbidden, "forbidden",
			fmt.Sprintf("plain HTTP to %s is not allowed for this box (rule %s)", h, d.Rule))
		return
	}
	if r.Header.Get("Upgrade") != "" {
		rec.decision, rec.rule = "deny", "http:upgrade"
		p.refuse(w, rec, http.StatusNotImplemented, "not_implemented", "protocol upgrades are not relayed over plain HTTP")
		return
	}
	rec.decision = "allow"
	out := r.Clone(r.Context())
	out.URL.Host, out.Host, out.RequestURI = hostPort(h, port, "80"), "", ""
	removeHopByHop(out.Header)
	body := &countReader{r: r.Body}
	if r.ContentLength != 0 {
		out.Body = body
	}
	resp, err := p.transport.RoundTrip(out)
	rec.up = body.n
	if err != nil {
		rec.decision, rec.rule, rec.err = "error", "upstream:request", err.Error()
		p.refuse(w, rec, http.StatusBadGateway, "bad_gateway", fmt.Sprintf("%s did not answer", h))
		return
	}
	defer resp.Body.Close()
	p.cfg.Metrics.Connected(time.Since(rec.start))
	removeHopByHop(resp.Header)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	rec.status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				break
			}
			rec.down += int64(n)
			p.countBytes(false, int64(n))
			rc.Flush() // stream (server-sent events, long polls)
		}
		if err != nil {
			break
		}
	}
	rec.up = body.n
	p.countBytes(true, body.n)
}

type countReader struct {
	r io.ReadCloser
	n int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countReader) Close() error { return c.r.Close() }

// hopByHop are the headers of one connection (RFC 9110 7.6.1), never relayed.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopByHop deletes the hop-by-hop headers and those the Connection header names.
func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}
