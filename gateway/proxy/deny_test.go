package proxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"sandbox-bridge.io/gateway/source"
)

// Refusals of an identified box reach OnDeny (the denial Events) with the box's pod, the host
// and the rule only: never a path or query; unidentified requests and malformed targets do not.
func TestOnDeny(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	h := newHarness(t, func(c *Config) {
		c.OnDeny = func(boxID string, box *source.Box, host, rule string) {
			mu.Lock()
			calls = append(calls, fmt.Sprintf("%s/%s/%s %s %s", boxID, box.Namespace, box.Pod, host, rule))
			mu.Unlock()
		}
	})
	// Plain HTTP to a TLS-only host, with a path and query that must not be passed on.
	req, _ := http.NewRequest("GET", "http://api.test/secret/path?token=s3cret", nil)
	resp, err := h.client("box-a").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h.connect("denied.test:443", h.basic("box-a"))
	h.connect("bad.example.test:443", h.basic("box-a"))
	// SNI mismatch inside an allowed CONNECT.
	if resp, c, _ := h.connect("api.test:443", h.basic("box-a")); resp.StatusCode == 200 {
		tls.Client(c, &tls.Config{ServerName: "a.example.test", InsecureSkipVerify: true}).Handshake()
	}
	// Not counted: no identity, a malformed target, an allowed host.
	h.connect("denied.test:443", "")
	resp, _, _ = h.connect("not a host:443", h.basic("box-a"))
	io.Copy(io.Discard, resp.Body)
	h.get("box-a", "https://a.example.test/", nil)
	h.waitDecisions("a.example.test", 1)
	h.waitDecisions("api.test", 2)
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"box-a/sb/box-a-pod api.test plainHttp:none",
		"box-a/sb/box-a-pod denied.test pool.allow:none",
		"box-a/sb/box-a-pod bad.example.test pool.deny:bad.example.test",
		"box-a/sb/box-a-pod api.test sni:mismatch",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("OnDeny calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}
