package proxy

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/internal/testpki"
	"sandbox-bridge.io/gateway/source"
)

// withCAs is a Source adding per-pool CAs to another's States, as source.Kubernetes gives them
// from the pools' Secrets. A State is made once per (inner State, CA set), like a real source.
type withCAs struct {
	inner source.Source
	cas   atomic.Pointer[map[string]*certs.Authority]
	last  atomic.Pointer[[3]any] // inner State, CA set, the State made of them
}

func (w *withCAs) set(cas map[string]*certs.Authority) { w.cas.Store(&cas) }

func (w *withCAs) Current() *source.State {
	in, cas := w.inner.Current(), w.cas.Load()
	if l := w.last.Load(); l != nil && l[0] == in && l[1] == cas {
		return l[2].(*source.State)
	}
	out := *in
	out.CAs = *cas
	w.last.Store(&[3]any{in, cas, &out})
	return &out
}

// Interception uses the box's pool's CA, a new CA is in force for the next connection, and a
// pool without one (and no -ca-cert) refuses hosts that need interception with 502.
func TestPoolCA(t *testing.T) {
	w := &withCAs{}
	h := newHarness(t, func(c *Config) {
		w.inner = c.Source
		c.Source, c.CA = w, nil
	})
	ca1, ca2 := testpki.NewCA(t, "pool ca one"), testpki.NewCA(t, "pool ca two")
	h.extraRoots = append(h.extraRoots, ca1.Cert, ca2.Cert)
	a1, err := certs.FromPEM(ca1.CertPEM, ca1.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := certs.FromPEM(ca2.CertPEM, ca2.KeyPEM)
	w.set(map[string]*certs.Authority{"p": a1})
	resp, body := h.get("box-a", "https://secure.test/", nil)
	if resp.StatusCode != 200 || issuer(resp) != "pool ca one" {
		t.Fatalf("with the pool's CA: %d %q, a leaf issued by %q", resp.StatusCode, body, issuer(resp))
	}
	if v, _ := h.lastVisit(); v.authorization != secretToken {
		t.Fatal("the registered header was not injected")
	}
	// The pool's Secret rotated: the next connection gets a leaf of the new CA.
	w.set(map[string]*certs.Authority{"p": a2})
	if resp, _ := h.get("box-a", "https://secure.test/", nil); issuer(resp) != "pool ca two" {
		t.Fatalf("after the CA changed: a leaf issued by %q", issuer(resp))
	}
	// Another pool's CA is not this pool's.
	w.set(map[string]*certs.Authority{"other": a1})
	resp, _, _ = h.connect("secure.test:443", h.basic("box-a"))
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Egress-Rule") != "intercept:no-ca" {
		t.Fatalf("no CA for the pool: %d %q %s", resp.StatusCode, resp.Header.Get("X-Egress-Rule"), b)
	}
	// Pass-through needs no CA.
	if resp, _ := h.get("box-a", "https://api.test/", nil); resp.StatusCode != 200 || issuer(resp) != "host ca" {
		t.Fatalf("pass-through without a CA: %d %q", resp.StatusCode, issuer(resp))
	}
}
