package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/source"
)

// signer is the CA interception uses for a box of pool: the pool's own (from the State: a new
// one is in force for the next connection), else the gateway's -ca-cert, else none.
func (p *Proxy) signer(st *source.State, pool string) certs.Signer {
	if a := st.CAs[pool]; a != nil {
		return a
	}
	return p.cfg.CA
}

// intercept terminates the box's TLS with a leaf for host from ca, and forwards each
// request to the real host over TLS (verified against UpstreamRoots) with the box's credentials
// set (registered, or the resolver's answer, cached), replacing any the box sent under those
// names. The state is read again for every request: a policy or credential change, or a
// resolver answer that expired, applies to the next request on an open connection.
func (p *Proxy) intercept(w http.ResponseWriter, rec *record, ca certs.Signer, host, port string) {
	if ca == nil {
		rec.decision, rec.rule = "error", "intercept:no-ca"
		p.refuse(w, rec, http.StatusBadGateway, "bad_gateway",
			fmt.Sprintf("credentials are registered for %s but the gateway has no CA to intercept with", host))
		return
	}
	client, ok := p.hijack(w, rec)
	if !ok {
		return
	}
	defer client.Close()
	raw, ok := p.checkHello(client, rec, host)
	if !ok {
		return
	}
	rec.up -= int64(len(raw)) // counted again by the counter below, on replay
	rec.decision = "intercept"
	counted := &countConn{Conn: &bufConn{Conn: client, r: io.MultiReader(bytes.NewReader(raw), client)}, count: p.countBytes}
	tconn := tls.Server(counted, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := ca.Leaf(host)
			if err != nil && c != nil {
				p.cfg.Log.Error("CA files changed but do not load; the previous CA stays in force", "error", err.Error())
				err = nil
			}
			return c, err
		},
	})
	defer func() { rec.up += counted.in.Load(); rec.down += counted.out.Load() }()
	tconn.SetDeadline(time.Now().Add(p.cfg.HelloTimeout))
	if err := tconn.Handshake(); err != nil {
		// Typically a client that does not trust the pool's CA (or pins the host's key).
		rec.decision, rec.rule, rec.err = "error", "intercept:handshake", err.Error()
		return
	}
	tconn.SetDeadline(time.Time{})
	defer p.track(rec, client)()
	hp := hostPort(host, port, "443")
	br := bufio.NewReader(tconn)
	for {
		tconn.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			return // EOF, idle, or not HTTP/1.x: the connection ends
		}
		tconn.SetReadDeadline(time.Time{})
		rec.requests++
		if !p.exchange(tconn, req, rec, host, port, hp) {
			return
		}
	}
}

// exchange relays one request and its answer; false ends the connection.
func (p *Proxy) exchange(conn net.Conn, req *http.Request, rec *record, host, port, hp string) bool {
	defer req.Body.Close()
	st := p.cfg.Source.Current()
	box := st.Boxes[rec.box]
	if box == nil || box.Addr() != rec.client || box.Pod != rec.pod {
		writeAnswer(conn, http.StatusProxyAuthRequired, "unauthorized", "this box is no longer registered at the gateway", host, "identity")
		rec.rule = "identity"
		return false
	}
	if d := policy.Decide(st.Pools[box.Pool], box.Policy(), host, false); !d.Allow {
		writeAnswer(conn, http.StatusForbidden, "forbidden", fmt.Sprintf("egress to %s is not allowed for this box (rule %s)", host, d.Rule), host, d.Rule)
		rec.rule = d.Rule
		p.denied(rec, host, d.Rule)
		return false
	}
	if req.Header.Get("Upgrade") != "" {
		writeAnswer(conn, http.StatusNotImplemented, "not_implemented", "protocol upgrades (WebSocket) are not relayed on intercepted connections", host, "intercept:upgrade")
		return false
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		io.WriteString(conn, "HTTP/1.1 100 Continue\r\n\r\n")
		req.Header.Del("Expect")
	}
	// The request goes to the CONNECT host whatever the box wrote in Host or the target.
	req.URL.Scheme, req.URL.Host, req.Host, req.RequestURI = "https", hp, "", ""
	removeHopByHop(req.Header)
	headers, _, err := p.credentials(req.Context(), st, rec, box, host, port)
	if err != nil {
		rec.err = err.Error()
		writeAnswer(conn, http.StatusBadGateway, "bad_gateway", fmt.Sprintf("the credential resolver of this box's pool gave no usable answer for %s", host), host, "resolver:error")
		return false
	}
	for name, v := range headers {
		req.Header[name] = []string{v} // names are canonical (source.Parse, the resolver), as ReadRequest's are
	}
	start := time.Now()
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		rec.err = err.Error()
		writeAnswer(conn, http.StatusBadGateway, "bad_gateway", fmt.Sprintf("%s did not answer: TLS or connection failure", host), host, "upstream:request")
		return false
	}
	defer resp.Body.Close()
	if rec.requests == 1 {
		p.cfg.Metrics.Connected(time.Since(start))
	}
	removeHopByHop(resp.Header)
	// Answer in HTTP/1.1 whatever the host spoke; an unknown length is chunked.
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	resp.TransferEncoding = nil
	if resp.ContentLength < 0 && req.Method != http.MethodHead && resp.StatusCode >= 200 &&
		resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified {
		resp.TransferEncoding = []string{"chunked"}
	}
	// A box that stops reading is dropped after the idle timeout; a slow steady one is not.
	if err := resp.Write(&idleWriter{conn: conn, idle: p.cfg.IdleTimeout}); err != nil {
		return false
	}
	return !req.Close && !resp.Close
}

// writeAnswer writes a proxy error as an HTTP/1.1 response inside an intercepted connection.
func writeAnswer(conn net.Conn, status int, typ, message, host, rule string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]string{"type": typ, "message": message, "host": host, "rule": rule}})
	fmt.Fprintf(conn, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Egress-Rule: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), rule, len(body)+1, string(body)+"\n")
}

// countConn counts the bytes read from (up) and written to (down) the box, and tells count.
type countConn struct {
	net.Conn
	in, out atomic.Int64
	count   func(up bool, n int64)
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	c.count(true, int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	c.count(false, int64(n))
	return n, err
}

// idleWriter sets a fresh write deadline before every write.
type idleWriter struct {
	conn net.Conn
	idle time.Duration
}

func (w *idleWriter) Write(b []byte) (int, error) {
	w.conn.SetWriteDeadline(time.Now().Add(w.idle))
	return w.conn.Write(b)
}
