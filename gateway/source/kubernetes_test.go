package source

import (
	"context"
	"encoding/base64"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/identity"
	"sandbox-bridge.io/gateway/internal/kubetest"
	"sandbox-bridge.io/gateway/internal/testpki"
	"sandbox-bridge.io/gateway/kube"
	"sandbox-bridge.io/gateway/policy"
)

func sbPool(name, ns, mode string, allow, deny []string) map[string]any {
	return map[string]any{"apiVersion": "sandbox-bridge.io/v1alpha1", "kind": "SandboxPool",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"namespace": ns, "egress": map[string]any{"mode": mode,
			"domains": map[string]any{"allow": allow, "deny": deny}}}}
}

func boxPod(ns, name, boxID, pool, ip string) map[string]any {
	labels := map[string]any{LabelBox: "true", LabelPool: pool}
	if boxID != "" {
		labels[LabelBoxID] = boxID
	}
	return map[string]any{"metadata": map[string]any{"name": name, "namespace": ns, "labels": labels,
		"uid": "uid-" + name, "annotations": map[string]any{AnnotationNonce: "n-" + name},
		"creationTimestamp": "2026-11-25T03:00:00Z"},
		"spec":   map[string]any{"containers": []any{map[string]any{"name": "box", "image": "python"}}},
		"status": map[string]any{"phase": "Running", "podIP": ip}}
}

func record(ns, boxID, egress string) map[string]any {
	md := map[string]any{"name": boxID, "namespace": ns,
		"labels": map[string]any{LabelBox: "true", LabelComponent: ComponentRecord}}
	if egress != "" {
		md["annotations"] = map[string]any{AnnotationEgress: egress}
	}
	return map[string]any{"metadata": md, "type": "Opaque", "data": map[string]any{"env": "c2VjcmV0LXZhbHVl"}}
}

func decide(s *State, ip, host string) string {
	id := s.BoxAt(netip.MustParseAddr(ip))
	b := s.Boxes[id]
	if b == nil {
		return "unknown"
	}
	d := policy.Decide(s.Pools[b.Pool], b.Policy(), host, false)
	if d.Allow {
		return "allow"
	}
	return d.Rule
}

func TestKubernetesSource(t *testing.T) {
	api := kubetest.New(t)
	api.Put("sandboxpools", sbPool("p1", "sb", "gateway", []string{"*.example.test", "api.test", "pypi.test"}, []string{"bad.example.test"}))
	api.Put("sandboxpools", sbPool("p2", "sb2", "direct", []string{"*"}, nil))
	api.Put("sandboxpools", sbPool("p3", "sb3", "gateway", []string{"*", "a.*.test"}, nil)) // invalid: allows nothing
	api.Put("pods", boxPod("sb", "box-a", "box-a", "p1", "10.0.0.1"))
	api.Put("pods", boxPod("sb", "warm-1", "", "p1", "10.0.0.2"))        // a warm pod: no box yet
	api.Put("pods", boxPod("sb2", "box-b", "box-b", "p2", "10.0.0.3"))   // a direct-mode pool's box
	api.Put("pods", boxPod("other", "box-c", "box-c", "p1", "10.0.0.4")) // outside its pool's namespace
	done := boxPod("sb", "box-d", "box-d", "p1", "10.0.0.5")
	done["status"].(map[string]any)["phase"] = "Succeeded" // its IP is free for others
	api.Put("pods", done)
	api.Put("pods", boxPod("sb", "box-e", "box-e", "p1", "10.0.0.6"))
	api.Put("pods", boxPod("sb", "box-f", "box-f", "p1", "10.0.0.6")) // the same IP as box-e
	api.Put("pods", boxPod("sb3", "box-g", "box-g", "p3", "10.0.0.7"))
	api.Put("pods", boxPod("sb", "box-h", "box-h", "p1", "10.0.0.8"))
	api.Put("secrets", record("sb", "box-a", `{"allow": ["api.test", "*.example.test"], "deny": ["x.example.test"]}`))
	api.Put("secrets", record("sb", "box-h", `{"allow": `)) // does not parse: the box allows nothing
	api.FailNext("secrets", 500, 500)                       // the records' first list fails twice

	c, err := kube.NewClient(&kube.Config{Server: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int64
	k := &Kubernetes{Client: c, OnLoad: func(bool) { loads.Add(1) }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go k.Run(ctx)
	// Not ready until every resource was listed: pools and pods are in, records not yet.
	waitFor(t, func() bool { p, q, _ := k.lists(); return p > 0 && q > 0 })
	if k.Current() != nil {
		t.Fatal("a State before the records were listed")
	}
	waitFor(t, func() bool { return k.Current() != nil })
	s := k.Current()

	ids := []string{}
	for id := range s.Boxes {
		ids = append(ids, id)
	}
	if len(s.Boxes) != 3 || s.Boxes["box-a"] == nil || s.Boxes["box-g"] == nil || s.Boxes["box-h"] == nil {
		t.Fatalf("boxes %v, want box-a, box-g, box-h (warm, direct pool, wrong namespace, finished, shared IP left out)", ids)
	}
	if got := s.Boxes["box-a"]; got.Identity() != (identity.Pod{Namespace: "sb", Name: "box-a", Nonce: "n-box-a"}) || got.UID != "uid-box-a" {
		t.Fatalf("box-a's pod: %+v uid %q", got.Identity(), got.UID)
	}
	if s.PodBox("box-a") != "box-a" || s.PodBox("warm-1") != "" {
		t.Fatalf("PodBox: %q %q", s.PodBox("box-a"), s.PodBox("warm-1"))
	}
	if _, ok := s.Pools["p2"]; ok {
		t.Fatal("a direct-mode pool is served")
	}
	for _, tc := range []struct{ ip, host, want string }{
		{"10.0.0.1", "api.test", "allow"},
		{"10.0.0.1", "www.example.test", "allow"},
		{"10.0.0.1", "pypi.test", "box.allow:none"}, // narrowed by the record
		{"10.0.0.1", "bad.example.test", "pool.deny:bad.example.test"},
		{"10.0.0.1", "x.example.test", "box.deny:x.example.test"},
		{"10.0.0.6", "api.test", "unknown"},         // two boxes claim the IP: neither
		{"10.0.0.7", "a.b.test", "pool.allow:none"}, // invalid pool lists allow nothing
		{"10.0.0.8", "api.test", "box.allow:none"},  // unparsable narrowing allows nothing
		{"10.0.0.2", "api.test", "unknown"},
	} {
		if got := decide(s, tc.ip, tc.host); got != tc.want {
			t.Errorf("%s -> %s: %s, want %s", tc.ip, tc.host, got, tc.want)
		}
	}
	// Secrets were asked for as metadata only: their data never reached the gateway.
	for _, q := range api.Requests() {
		if q.Resource == "secrets" && strings.Contains(q.LabelSelector, ComponentRecord) && !strings.Contains(q.Accept, "as=PartialObjectMetadata") {
			t.Fatalf("a Secret request without the metadata-only Accept: %+v", q)
		}
		if q.Resource == "pods" && q.LabelSelector != LabelBox+"=true,"+LabelBoxID {
			t.Fatalf("pods selector %q", q.LabelSelector)
		}
	}

	// An event that changes nothing the gateway keeps (the bridge's activity annotation) builds
	// no State; the next real change does.
	builds := k.Builds()
	busy := boxPod("sb", "box-a", "box-a", "p1", "10.0.0.1")
	busy["metadata"].(map[string]any)["annotations"].(map[string]any)["sandbox-bridge.io/last-active"] = "2026-11-25T03:10:00Z"
	api.Put("pods", busy)
	api.Put("pods", boxPod("sb", "box-z", "box-z", "p1", "10.0.0.99"))
	waitFor(t, func() bool { return k.Current().Boxes["box-z"] != nil })
	if n := k.Builds() - builds; n != 1 {
		t.Fatalf("%d States built for an annotation change and a new box, want 1", n)
	}
	api.Delete("pods", "sb", "box-z")
	waitFor(t, func() bool { return k.Current().Boxes["box-z"] == nil })

	// Changes through the watch are in force within 1 s (waitFor's bound).
	api.Put("sandboxpools", sbPool("p1", "sb", "gateway", []string{"*.example.test", "api.test", "pypi.test"}, []string{"bad.example.test", "api.test"}))
	waitFor(t, func() bool { return decide(k.Current(), "10.0.0.1", "api.test") == "pool.deny:api.test" })
	api.Put("secrets", record("sb", "box-a", `{"allow": ["pypi.test"]}`))
	waitFor(t, func() bool { return decide(k.Current(), "10.0.0.1", "pypi.test") == "allow" })
	api.Put("secrets", record("sb", "box-a", "")) // the narrowing removed: the pool's policy
	waitFor(t, func() bool { return decide(k.Current(), "10.0.0.1", "www.example.test") == "allow" })
	// The pod moves to another IP (a wake): the old IP is nobody's, the new one is box-a's.
	api.Put("pods", boxPod("sb", "box-a", "box-a", "p1", "10.0.0.9"))
	waitFor(t, func() bool { return k.Current().BoxAt(netip.MustParseAddr("10.0.0.9")) == "box-a" })
	if id := k.Current().BoxAt(netip.MustParseAddr("10.0.0.1")); id != "" {
		t.Fatalf("the old IP still maps to %q", id)
	}
	api.Delete("pods", "sb", "box-f") // box-e's IP is its own again
	waitFor(t, func() bool { return k.Current().BoxAt(netip.MustParseAddr("10.0.0.6")) == "box-e" })
	// A pool switched to direct: its boxes leave the gateway.
	api.Put("sandboxpools", sbPool("p1", "sb", "direct", nil, nil))
	waitFor(t, func() bool { return k.Current().Boxes["box-a"] == nil && k.Current().Boxes["box-e"] == nil })
	api.Delete("pods", "sb3", "box-g")
	waitFor(t, func() bool { return len(k.Current().Boxes) == 0 })
	if loads.Load() < 2 {
		t.Fatalf("OnLoad called %d times", loads.Load())
	}
}

// The API server going away keeps the last State in force; when it is back, a relist (410: the
// watch's resourceVersion was compacted meanwhile) brings changes made meanwhile.
func TestKubernetesSourceSurvivesOutage(t *testing.T) {
	api := kubetest.New(t)
	api.Put("sandboxpools", sbPool("p1", "sb", "gateway", []string{"api.test"}, nil))
	api.Put("pods", boxPod("sb", "box-a", "box-a", "p1", "10.0.0.1"))
	api.Put("pods", boxPod("sb", "box-b", "box-b", "p1", "10.0.0.2"))
	c, _ := kube.NewClient(&kube.Config{Server: api.URL})
	k := &Kubernetes{Client: c, Namespace: "sb"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go k.Run(ctx)
	waitFor(t, func() bool { return k.Current() != nil && len(k.Current().Boxes) == 2 })
	for _, q := range api.Requests() {
		if q.Resource != "sandboxpools" && q.Namespace != "sb" {
			t.Fatalf("-namespace sb, but a request for %+v", q)
		}
	}
	api.FailNext("pods", 503, 503, 503, 503)
	api.Compact(false)
	api.Delete("pods", "sb", "box-b")
	api.CloseWatches()
	time.Sleep(50 * time.Millisecond)
	if k.Current() == nil || k.Current().Boxes["box-a"] == nil {
		t.Fatal("an outage dropped the State")
	}
	waitForLong(t, 5*time.Second, func() bool { return k.Current().Boxes["box-b"] == nil && k.Current().Boxes["box-a"] != nil })
}

func waitForLong(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With Credentials, the record's egress-credentials data key gives the box its headers per
// host (normalized like the file's), a change is in force within 1 s, and a bad entry is left
// out with a warning that names the host and header, never the value.
func TestKubernetesSourceCredentials(t *testing.T) {
	api := kubetest.New(t)
	api.Put("sandboxpools", sbPool("p1", "sb", "gateway", []string{"api.test", "*.example.test"}, nil))
	api.Put("pods", boxPod("sb", "box-a", "box-a", "p1", "10.0.0.1"))
	rec := func(creds string) map[string]any {
		r := record("sb", "box-a", "")
		r["data"].(map[string]any)[CredentialsKey] = base64.StdEncoding.EncodeToString([]byte(creds))
		return r
	}
	api.Put("secrets", rec(`{"API.test.": {"authorization": "Bearer s3cret"},
		"www.example.test": {"Host": "evil.test", "X-Key": "k3y-value"}}`))
	c, _ := kube.NewClient(&kube.Config{Server: api.URL})
	var logs strings.Builder
	var mu sync.Mutex
	k := &Kubernetes{Client: c, Credentials: true, Log: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go k.Run(ctx)
	waitFor(t, func() bool { return k.Current() != nil })
	b := k.Current().Boxes["box-a"]
	if b == nil || b.Headers("api.test")["Authorization"] != "Bearer s3cret" {
		t.Fatalf("credentials for api.test not read")
	}
	if b.Headers("www.example.test") != nil {
		t.Fatal("a host with a framing header kept credentials")
	}
	if b.Allow != nil {
		t.Fatal("no egress annotation, but a narrowing")
	}
	for _, q := range api.Requests() {
		if q.Resource == "secrets" && strings.Contains(q.Accept, "PartialObjectMetadata") {
			t.Fatal("credentials need the Secret's data, but it was asked for as metadata only")
		}
	}
	api.Put("secrets", rec(`{"api.test": {"Authorization": "Bearer rotated"}}`))
	waitFor(t, func() bool {
		return k.Current().Boxes["box-a"].Headers("api.test")["Authorization"] == "Bearer rotated"
	})
	api.Put("secrets", rec(`not json s3cret`))
	waitFor(t, func() bool { return k.Current().Boxes["box-a"].Headers("api.test") == nil })
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, `header \"Host\"`) || !strings.Contains(out, "not a JSON object") {
		t.Fatalf("warnings missing: %s", out)
	}
	for _, secret := range []string{"s3cret", "k3y-value", "rotated", "evil.test"} {
		if strings.Contains(out, secret) {
			t.Fatalf("the log holds a credential value %q: %s", secret, out)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func caSecret(ns, name, pool string, ca *testpki.CA) map[string]any {
	return map[string]any{"metadata": map[string]any{"name": name, "namespace": ns,
		"labels": map[string]any{LabelComponent: ComponentEgressCA, LabelPool: pool, "app.kubernetes.io/managed-by": "sandbox-bridge"}},
		"type": "kubernetes.io/tls",
		"data": map[string]any{"tls.crt": base64.StdEncoding.EncodeToString(ca.CertPEM), "tls.key": base64.StdEncoding.EncodeToString(ca.KeyPEM)}}
}

// Each gateway pool gets the CA of its Secret, read whole even with Credentials off; the same
// content keeps the same Authority (and its leaf cache) across State builds; a new Secret is in
// force within 1 s; Secrets elsewhere or broken give no CA, with a warning quoting no key.
func TestKubernetesSourcePoolCA(t *testing.T) {
	api := kubetest.New(t)
	api.Put("sandboxpools", sbPool("p1", "sb", "gateway", []string{"api.test"}, nil))
	api.Put("sandboxpools", sbPool("p2", "sb2", "gateway", []string{"api.test"}, nil))
	api.Put("sandboxpools", sbPool("p3", "sb3", "direct", []string{"api.test"}, nil))
	ca1, ca2, other := testpki.NewCA(t, "ca one"), testpki.NewCA(t, "ca two"), testpki.NewCA(t, "other")
	api.Put("secrets", caSecret("sb", EgressCAName, "p1", ca1))
	api.Put("secrets", caSecret("sb", EgressCAName+"-x", "p1", other)) // not the pool CA's name
	api.Put("secrets", caSecret("sb2", EgressCAName, "p1", other))     // names p1 from p2's namespace
	api.Put("secrets", caSecret("sb3", EgressCAName, "p3", other))     // a direct pool
	broken := caSecret("sb2", EgressCAName, "p2", ca2)
	broken["data"].(map[string]any)["tls.key"] = base64.StdEncoding.EncodeToString(other.KeyPEM) // not the certificate's key
	c, _ := kube.NewClient(&kube.Config{Server: api.URL})
	var logs strings.Builder
	var mu sync.Mutex
	k := &Kubernetes{Client: c, Credentials: false, Log: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go k.Run(ctx)
	waitFor(t, func() bool { return k.Current() != nil })
	s := k.Current()
	if a := s.CAs["p1"]; a == nil || a.CA().Subject.CommonName != "ca one" {
		t.Fatalf("p1's CA: %v", s.CAs)
	}
	if len(s.CAs) != 1 {
		t.Fatalf("CAs for %d pools, want p1's only", len(s.CAs))
	}
	for _, q := range api.Requests() {
		if q.Resource == "secrets" && strings.Contains(q.LabelSelector, ComponentEgressCA) && strings.Contains(q.Accept, "PartialObjectMetadata") {
			t.Fatal("the CA Secrets were asked for as metadata only: they need their data")
		}
	}
	first := s.CAs["p1"]
	api.Put("pods", boxPod("sb", "box-a", "box-a", "p1", "10.0.0.1")) // another build, the same Secret
	waitFor(t, func() bool { return k.Current().Boxes["box-a"] != nil })
	if k.Current().CAs["p1"] != first {
		t.Fatal("an unchanged CA Secret got a new Authority (its leaf cache lost)")
	}
	// Rotation: the Secret's new signer is p1's CA for the next connection.
	api.Put("secrets", caSecret("sb", EgressCAName, "p1", ca2))
	waitFor(t, func() bool { a := k.Current().CAs["p1"]; return a != nil && a.CA().Subject.CommonName == "ca two" })
	api.Put("secrets", broken)
	api.Delete("secrets", "sb", EgressCAName)
	waitFor(t, func() bool { return k.Current().CAs["p1"] == nil })
	if len(k.Current().CAs) != 0 {
		t.Fatal("a Secret whose key is not its certificate's gave p2 a CA")
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, `pool \"p2\": CA Secret sb2/`+EgressCAName+` does not load`) {
		t.Fatalf("no warning for p2's broken CA Secret: %s", out)
	}
	for _, pemText := range [][]byte{ca1.KeyPEM, ca2.KeyPEM, other.KeyPEM} {
		if strings.Contains(out, string(pemText[40:80])) {
			t.Fatal("the log quotes a CA key")
		}
	}
}

// A pool's credentialResolver and a record's outbound context reach the State (the context with
// the records as metadata only: it is an annotation); a resolver that does not check is left out
// with a warning, as is an outbound context that does not parse.
func TestKubernetesSourceResolverAndOutbound(t *testing.T) {
	api := kubetest.New(t)
	p1 := sbPool("p1", "sb", "gateway", []string{"*.vault.test"}, nil)
	p1["spec"].(map[string]any)["egress"].(map[string]any)["credentialResolver"] = map[string]any{
		"url": "http://resolver.platform.svc:8080/egress", "hosts": []any{"*.vault.test"}, "ttlSeconds": 60, "timeoutSeconds": 2}
	p2 := sbPool("p2", "sb", "gateway", []string{"*"}, nil)
	p2["spec"].(map[string]any)["egress"].(map[string]any)["credentialResolver"] = map[string]any{"url": "http://r/", "hosts": []any{"*"}}
	api.Put("sandboxpools", p1)
	api.Put("sandboxpools", p2)
	api.Put("pods", boxPod("sb", "box-a", "box-a", "p1", "10.0.0.1"))
	api.Put("pods", boxPod("sb", "box-b", "box-b", "p1", "10.0.0.2"))
	ra := record("sb", "box-a", "")
	ra["metadata"].(map[string]any)["annotations"] = map[string]any{AnnotationOutbound: `{"tenant_id":"t-1","session_id":"s-1"}`}
	rb := record("sb", "box-b", "")
	rb["metadata"].(map[string]any)["annotations"] = map[string]any{AnnotationOutbound: `{"tenant_id":`}
	api.Put("secrets", ra)
	api.Put("secrets", rb)
	c, _ := kube.NewClient(&kube.Config{Server: api.URL})
	var logs strings.Builder
	var mu sync.Mutex
	k := &Kubernetes{Client: c, Log: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go k.Run(ctx)
	waitFor(t, func() bool { return k.Current() != nil })
	s := k.Current()
	r := s.Resolvers["p1"]
	if r == nil || r.URL != "http://resolver.platform.svc:8080/egress" || r.TTL() != time.Minute || r.Timeout() != 2*time.Second || !r.Covers("api.vault.test") {
		t.Fatalf("p1's resolver: %+v", r)
	}
	if s.Resolvers["p2"] != nil {
		t.Fatal("a resolver asked about * was kept")
	}
	if got := s.Boxes["box-a"].Outbound; got != (Outbound{TenantID: "t-1", SessionID: "s-1"}) {
		t.Fatalf("box-a's outbound context: %+v", got)
	}
	if got := s.Boxes["box-b"].Outbound; got != (Outbound{}) {
		t.Fatalf("box-b's unparsable outbound context: %+v", got)
	}
	// The platform sets another session's context: in force at once.
	ra["metadata"].(map[string]any)["annotations"] = map[string]any{AnnotationOutbound: `{"tenant_id":"t-1","session_id":"s-2"}`}
	api.Put("secrets", ra)
	waitFor(t, func() bool { return k.Current().Boxes["box-a"].Outbound.SessionID == "s-2" })
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, `pool \"p2\": credentialResolver: hosts: * is not allowed`) || !strings.Contains(out, `box \"box-b\": annotation `+AnnotationOutbound) {
		t.Fatalf("warnings missing: %s", out)
	}
}
