package source

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const doc = `{
  "pools": {"p": {"allow": ["*.example.test", "api.test"], "deny": ["bad.example.test"],
                  "credentialResolver": {"url": "https://vault.test/egress", "hosts": ["*.example.test"], "ttlSeconds": 30}}},
  "boxes": {
    "box-a": {"pool": "p", "ip": "10.0.0.1", "pod": "box-a-0", "namespace": "sb", "nonce": "0a", "outboundContext": {"tenant_id": "t", "session_id": "s"}, "allow": ["api.test", "other.test"],
              "credentials": {"API.test.": {"authorization": "Bearer s3cret"}}}
  }
}`

func TestParse(t *testing.T) {
	s, warnings, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if id := s.BoxAt(netip.MustParseAddr("::ffff:10.0.0.1")); id != "box-a" {
		t.Fatalf("BoxAt = %q", id)
	}
	if h := s.Boxes["box-a"].Headers("api.test"); h["Authorization"] != "Bearer s3cret" {
		t.Fatalf("credentials not normalized by host and header name: %v", len(h))
	}
	if r := s.Resolvers["p"]; r == nil || r.TTL() != 30*time.Second || !r.Covers("www.example.test") || s.Boxes["box-a"].Outbound.SessionID != "s" {
		t.Fatalf("resolver %+v, outbound %+v", r, s.Boxes["box-a"].Outbound)
	}
	if s.PodBox("box-a-0") != "box-a" || s.Boxes["box-a"].Identity().Nonce != "0a" {
		t.Fatalf("the box's pod: %q %+v", s.PodBox("box-a-0"), s.Boxes["box-a"].Identity())
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "other.test") {
		t.Fatalf("warnings = %q", warnings)
	}
	const pod = `"pod":"b-0","namespace":"sb","nonce":"1"`
	bad := map[string]string{
		"unknown pool":   `{"pools":{},"boxes":{"b":{"pool":"x","ip":"10.0.0.1",` + pod + `}}}`,
		"bad ip":         `{"pools":{"p":{}},"boxes":{"b":{"pool":"p","ip":"nope",` + pod + `}}}`,
		"duplicate ip":   `{"pools":{"p":{}},"boxes":{"a":{"pool":"p","ip":"10.0.0.1",` + pod + `},"b":{"pool":"p","ip":"10.0.0.1","pod":"b-1","namespace":"sb","nonce":"2"}}}`,
		"bad pattern":    `{"pools":{"p":{"allow":["a.*.test"]}}}`,
		"framing header": `{"pools":{"p":{}},"boxes":{"b":{"pool":"p","ip":"10.0.0.1",` + pod + `,"credentials":{"a.test":{"Host":"x"}}}}}`,
		"newline value":  `{"pools":{"p":{}},"boxes":{"b":{"pool":"p","ip":"10.0.0.1",` + pod + `,"credentials":{"a.test":{"X-Key":"a\nb"}}}}}`,
		"no nonce":       `{"pools":{"p":{}},"boxes":{"b":{"pool":"p","ip":"10.0.0.1","pod":"b-0","namespace":"sb"}}}`,
		"no pod":         `{"pools":{"p":{}},"boxes":{"b":{"pool":"p","ip":"10.0.0.1","namespace":"sb","nonce":"1"}}}`,
		"not json":       `{`,
		"resolver *":     `{"pools":{"p":{"credentialResolver":{"url":"https://r/","hosts":["*"]}}}}`,
	}
	good := `{"pools":{"p":{}},"boxes":{"b":{"pool":"p","ip":"10.0.0.1",` + pod + `}}}`
	if _, _, err := Parse([]byte(good)); err != nil {
		t.Fatalf("the base of the bad cases must parse: %v", err)
	}
	for name, d := range bad {
		if _, _, err := Parse([]byte(d)); err == nil {
			t.Errorf("%s: want an error", name)
		} else if strings.Contains(err.Error(), "a\nb") {
			t.Errorf("%s: the error quotes a header value", name)
		}
	}
}

func TestFileReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &File{Path: p, Interval: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.Run(ctx)
	waitFor(t, func() bool { return f.Current() != nil })
	// An invalid document leaves the last good state in force.
	os.WriteFile(p, []byte(`{"pools":`), 0o600)
	time.Sleep(100 * time.Millisecond)
	if f.Current() == nil || f.Current().Boxes["box-a"] == nil {
		t.Fatal("a bad document replaced the good state")
	}
	// Atomic replace (rename), as a Secret volume or a careful writer does.
	tmp := p + ".tmp"
	os.WriteFile(tmp, []byte(`{"pools":{"p":{}},"boxes":{}}`), 0o600)
	os.Rename(tmp, p)
	waitFor(t, func() bool { return len(f.Current().Boxes) == 0 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 1 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
