package proxy

import (
	"context"
	"net"
	"sync"
	"time"

	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/source"
)

// An open tunnel (pass-through or intercepted), kept so that a policy change that no longer
// allows it closes it: narrowing a box's egress takes effect on open connections too, not only
// on new ones.
type tunnel struct {
	rec  *record
	conn net.Conn // the box's connection; closing it ends the tunnel (and its upstream side)

	once sync.Once
}

type tunnels struct {
	mu  sync.Mutex
	set map[*tunnel]struct{}
}

// track registers an open tunnel until the returned func is called.
func (p *Proxy) track(rec *record, conn net.Conn) func() {
	t := &tunnel{rec: rec, conn: conn}
	p.open.mu.Lock()
	if p.open.set == nil {
		p.open.set = map[*tunnel]struct{}{}
	}
	p.open.set[t] = struct{}{}
	p.open.mu.Unlock()
	return func() {
		p.open.mu.Lock()
		delete(p.open.set, t)
		p.open.mu.Unlock()
	}
}

// revoke closes the open tunnels st no longer allows (box gone, moved to another IP, or host
// not allowed) and returns how many.
func (p *Proxy) revoke(st *source.State) int {
	p.open.mu.Lock()
	var closing []*tunnel
	for t := range p.open.set {
		if rule := stillAllowed(st, t.rec, t.rec.host); rule != "" {
			t.once.Do(func() { t.rec.revoked = rule })
			closing = append(closing, t)
		}
	}
	p.open.mu.Unlock()
	for _, t := range closing {
		t.conn.Close()
	}
	return len(closing)
}

// stillAllowed returns "" when the box of rec (the same pod at the same address) may still reach
// host under st, else the rule.
func stillAllowed(st *source.State, rec *record, host string) string {
	box := st.Boxes[rec.box]
	if box == nil || box.Addr() != rec.client || box.Pod != rec.pod {
		return "identity"
	}
	if d := policy.Decide(st.Pools[box.Pool], box.Policy(), host, false); !d.Allow {
		return d.Rule
	}
	return ""
}

// Run closes open tunnels a new state no longer allows, checking for a new state every 100 ms,
// until ctx ends. Without it, a change applies to new connections (and to the next request of an
// intercepted one) only.
func (p *Proxy) Run(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	last := p.cfg.Source.Current()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cur := p.cfg.Source.Current(); cur != last && cur != nil {
			last = cur
			if n := p.revoke(cur); n > 0 {
				p.cfg.Log.Info("egress tunnels closed by a policy change", "count", n)
			}
		}
	}
}
