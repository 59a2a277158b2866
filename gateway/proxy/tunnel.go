package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/sni"
	"sandbox-bridge.io/gateway/source"
)

// connect serves CONNECT host:port: policy, then interception (headers registered on the box or
// given by the pool's resolver) or pass-through.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request, rec *record, st *source.State, box *source.Box) {
	host, port, err := net.SplitHostPort(r.Host)
	h, ok := "", false
	if err == nil {
		h, ok = policy.Normalize(host)
	}
	if !ok || !validPort(port) {
		rec.host, rec.decision, rec.rule = r.Host, "deny", "host:invalid"
		p.refuse(w, rec, http.StatusBadRequest, "invalid_request", "CONNECT needs host:port")
		return
	}
	rec.host, rec.port = h, port
	d := policy.Decide(st.Pools[box.Pool], box.Policy(), h, false)
	rec.rule = d.Rule
	if !d.Allow {
		rec.decision = "deny"
		p.refuse(w, rec, http.StatusForbidden, "forbidden",
			fmt.Sprintf("egress to %s is not allowed for this box (rule %s)", h, d.Rule))
		return
	}
	headers, from, err := p.credentials(r.Context(), st, rec, box, h, port)
	rec.creds = from
	if from == "resolver" && err == nil && len(headers) == 0 {
		rec.creds = "resolver:none" // asked; nothing to inject, so passed through
	}
	if err != nil {
		rec.decision, rec.rule, rec.err = "error", "resolver:error", err.Error()
		p.refuse(w, rec, http.StatusBadGateway, "bad_gateway",
			fmt.Sprintf("the credential resolver of this box's pool gave no usable answer for %s", h))
		return
	}
	if len(headers) > 0 {
		p.intercept(w, rec, p.signer(st, box.Pool), h, port)
		return
	}
	p.passThrough(w, r, rec, h, port)
}

// passThrough dials the host, answers 200, checks the ClientHello's server name and splices.
func (p *Proxy) passThrough(w http.ResponseWriter, r *http.Request, rec *record, host, port string) {
	up, err := p.dial(r.Context(), "tcp", net.JoinHostPort(host, port))
	if err != nil {
		rec.decision, rec.rule, rec.err = "error", "upstream:dial", err.Error()
		p.refuse(w, rec, http.StatusBadGateway, "bad_gateway", fmt.Sprintf("could not reach %s:%s", host, port))
		return
	}
	defer up.Close()
	p.cfg.Metrics.Connected(time.Since(rec.start))
	client, ok := p.hijack(w, rec)
	if !ok {
		return
	}
	defer client.Close()
	raw, ok := p.checkHello(client, rec, host)
	if !ok {
		return
	}
	rec.decision = "allow"
	up.SetWriteDeadline(time.Now().Add(p.cfg.IdleTimeout))
	if _, err := up.Write(raw); err != nil {
		return
	}
	p.countBytes(true, int64(len(raw))) // in rec.up already (checkHello)
	defer p.track(rec, client)()
	u, d := splice(client, up, p.cfg.IdleTimeout, p.countBytes)
	rec.up += u
	rec.down += d
}

// hijack takes the box's connection and answers 200; the returned conn reads through the
// server's buffer (a client may send its ClientHello right behind the CONNECT).
func (p *Proxy) hijack(w http.ResponseWriter, rec *record) (net.Conn, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		rec.decision, rec.rule = "error", "gateway:hijack"
		p.refuse(w, rec, http.StatusInternalServerError, "internal_error", "cannot take over the connection")
		return nil, false
	}
	rec.status = http.StatusOK
	conn.SetWriteDeadline(time.Now().Add(p.cfg.HelloTimeout))
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		rec.decision, rec.rule = "error", "client:write"
		return nil, false
	}
	conn.SetWriteDeadline(time.Time{})
	return &bufConn{Conn: conn, r: brw.Reader}, true
}

// tlsAccessDenied is a fatal TLS alert record, access_denied (49): what a box refused after
// the 200 sees (the proxy can no longer answer with an HTTP status).
var tlsAccessDenied = []byte{21, 3, 3, 0, 2, 2, 49}

// checkHello reads the box's ClientHello and accepts it only when its server name is host.
// It returns the bytes read, to be replayed.
func (p *Proxy) checkHello(client net.Conn, rec *record, host string) ([]byte, bool) {
	client.SetReadDeadline(time.Now().Add(p.cfg.HelloTimeout))
	name, raw, err := sni.Peek(client)
	client.SetReadDeadline(time.Time{})
	rec.up += int64(len(raw))
	norm, _ := policy.Normalize(name)
	switch {
	case errors.Is(err, sni.ErrNotTLS):
		rec.rule = "sni:not-tls"
	case err != nil:
		rec.rule = "sni:unreadable"
	case name == "":
		rec.rule = "sni:missing"
	case norm != host:
		rec.rule = "sni:mismatch"
	default:
		return raw, true
	}
	rec.decision = "deny"
	client.SetWriteDeadline(time.Now().Add(time.Second))
	client.Write(tlsAccessDenied)
	return nil, false
}

// bufConn reads through r (a buffer holding bytes already read from Conn).
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *bufConn) CloseWrite() error { return closeWrite(c.Conn) }

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// spliceChunk is how much one copy call moves before the loop looks at the clock again.
const spliceChunk = 1 << 20

// splice copies a->b and b->a until both directions ended, passing a half-close on, and closes
// both after idle with no byte either way. count (may be nil) hears every chunk as it moves,
// up (a->b) or down; it returns the bytes copied a->b and b->a.
//
// Each direction copies with io.Copy into the destination's own connection, so between two TCP
// connections Go moves the bytes with splice(2) through a kernel pipe, never through this
// process's memory. A copy call ends at least every tick (a read deadline), so both directions
// see the other's progress: a direction with nothing to read is not idle while the other is busy
// (a long download with a silent box). The write deadline is later than the read one, so a
// deadline error before it is the read's (nothing was taken from the source); a write that
// cannot finish in idle means the destination stopped reading: the connection ends.
func splice(a, b net.Conn, idle time.Duration, count func(up bool, n int64)) (ab, ba int64) {
	tick := min(max(idle/4, 10*time.Millisecond), 5*time.Second)
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	pump := func(dst, src net.Conn, n *int64, up bool) {
		w := writerOf(dst)
		for {
			now := time.Now()
			src.SetReadDeadline(now.Add(tick))
			writeBy := now.Add(idle + tick)
			w.SetWriteDeadline(writeBy)
			k, err := io.Copy(w, &io.LimitedReader{R: src, N: spliceChunk})
			if k > 0 {
				last.Store(time.Now().UnixNano())
				*n += k
				if count != nil {
					count(up, k)
				}
			}
			switch {
			case err == nil && k == spliceChunk:
				continue // a full chunk: more may follow
			case err == nil:
				closeWrite(dst) // the source's EOF: pass the half-close on
				return
			case errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(writeBy) &&
				time.Since(time.Unix(0, last.Load())) < idle:
				continue // the read found nothing, but the other direction is busy: not idle
			}
			closeBoth()
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); pump(b, a, &ab, true) }()
	pump(a, b, &ba, false)
	wg.Wait()
	closeBoth()
	return ab, ba
}

// writerOf is the connection to write to: a bufConn's own (its buffer is only for reading), so
// io.Copy can hand the copy to the kernel.
func writerOf(c net.Conn) net.Conn {
	if bc, ok := c.(*bufConn); ok {
		return writerOf(bc.Conn)
	}
	return c
}
