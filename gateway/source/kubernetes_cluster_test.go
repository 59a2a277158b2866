package source

// Against the real API server of the local cluster (test/cluster/, kwok nodes give pods IPs),
// skipped unless SANDBOX_BRIDGE_TEST_KUBECONFIG names its kubeconfig:
//
//	SANDBOX_BRIDGE_TEST_KUBECONFIG=$PWD/../.cluster/kubeconfig go test ./source -run Cluster -v

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/netip"
	"os"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/internal/testpki"
	"sandbox-bridge.io/gateway/kube"
)

type cluster struct {
	t *testing.T
	c *kube.Client
}

func newCluster(t *testing.T) *cluster {
	p := os.Getenv("SANDBOX_BRIDGE_TEST_KUBECONFIG")
	if p == "" {
		t.Skip("SANDBOX_BRIDGE_TEST_KUBECONFIG not set")
	}
	cfg, err := kube.LoadKubeconfig(p, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{t: t, c: c}
}

// do sends obj (nil: no body) and decodes the answer into a map.
func (k *cluster) do(method, path string, obj any) (map[string]any, error) {
	var body []byte
	ct := ""
	if obj != nil {
		body, _ = json.Marshal(obj)
		ct = "application/json"
		if method == http.MethodPatch {
			ct = "application/merge-patch+json"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := k.c.Do(ctx, method, path, nil, "", ct, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return m, nil
}

func (k *cluster) must(method, path string, obj any) map[string]any {
	k.t.Helper()
	m, err := k.do(method, path, obj)
	if err != nil {
		k.t.Fatalf("%s %s: %v", method, path, err)
	}
	return m
}

func randomName(prefix string) string {
	b := make([]byte, 3)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// namespace makes a namespace deleted at the end of the test.
func (k *cluster) namespace() string {
	ns := randomName("egw-test-")
	k.must("POST", "/api/v1/namespaces", map[string]any{"metadata": map[string]any{"name": ns}})
	k.t.Cleanup(func() { k.do("DELETE", "/api/v1/namespaces/"+ns, nil) })
	return ns
}

// boxPodSpec is a box-like pod on a kwok node (which gives it an IP and Running without running
// anything), restricted-compliant in case the namespace enforces it.
func clusterPod(ns, boxID, pool string) map[string]any {
	p := boxPod(ns, boxID, boxID, pool, "")
	delete(p, "status")
	delete(p["metadata"].(map[string]any), "creationTimestamp")
	f := false
	tr := true
	p["spec"] = map[string]any{
		"nodeName":                     "node-000000",
		"automountServiceAccountToken": false,
		"securityContext":              map[string]any{"runAsNonRoot": true, "runAsUser": 65534, "seccompProfile": map[string]any{"type": "RuntimeDefault"}},
		"containers": []any{map[string]any{"name": "box", "image": "registry.invalid/box:test",
			"resources": map[string]any{"limits": map[string]any{"cpu": "100m", "memory": "64Mi"}},
			"securityContext": map[string]any{"allowPrivilegeEscalation": f, "readOnlyRootFilesystem": tr,
				"capabilities": map[string]any{"drop": []any{"ALL"}}}}},
	}
	return p
}

func podIP(k *cluster, ns, name string) string {
	k.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		m, err := k.do("GET", "/api/v1/namespaces/"+ns+"/pods/"+name, nil)
		if err == nil {
			st, _ := m["status"].(map[string]any)
			if ip, _ := st["podIP"].(string); ip != "" {
				return ip
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	k.t.Fatalf("pod %s/%s got no IP (are the kwok nodes up?)", ns, name)
	return ""
}

// The reflector against the real API server: the list and watch queries it sends are accepted,
// Secrets come as metadata only (no data), and changes arrive within 1 s.
func TestClusterReflector(t *testing.T) {
	k := newCluster(t)
	ns := k.namespace()
	k.must("POST", "/api/v1/namespaces/"+ns+"/secrets", record(ns, "box-r1", `{"allow":["api.test"]}`))
	type seen struct {
		Annotation string
		HasData    bool
	}
	r := &kube.Reflector[seen]{
		Client: k.c, Path: "/api/v1/namespaces/" + ns + "/secrets",
		Query:  map[string][]string{"labelSelector": {LabelBox + "=true," + LabelComponent + "=" + ComponentRecord}},
		Accept: kube.MetadataListAccept, WatchAccept: kube.MetadataWatchAccept, PageSize: 1,
		Decode: func(raw json.RawMessage) (seen, bool, error) {
			var o struct {
				Metadata struct{ Annotations map[string]string } `json:"metadata"`
				Data     map[string]string                       `json:"data"`
			}
			err := json.Unmarshal(raw, &o)
			return seen{o.Metadata.Annotations[AnnotationEgress], o.Data != nil}, true, err
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	get := func(name string) (seen, bool) {
		var v seen
		var ok bool
		r.Range(func(key string, s seen) {
			if key == ns+"/"+name {
				v, ok = s, true
			}
		})
		return v, ok
	}
	waitFor(t, r.Synced)
	if v, ok := get("box-r1"); !ok || v.Annotation != `{"allow":["api.test"]}` || v.HasData {
		t.Fatalf("listed %+v %v (want the annotation and no data)", v, ok)
	}
	k.must("POST", "/api/v1/namespaces/"+ns+"/secrets", record(ns, "box-r2", ""))
	waitFor(t, func() bool { _, ok := get("box-r2"); return ok })
	k.must("PATCH", "/api/v1/namespaces/"+ns+"/secrets/box-r1",
		map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationEgress: `{"allow":[]}`}}})
	waitFor(t, func() bool { v, _ := get("box-r1"); return v.Annotation == `{"allow":[]}` && !v.HasData })
	k.must("DELETE", "/api/v1/namespaces/"+ns+"/secrets/box-r2", nil)
	waitFor(t, func() bool { _, ok := get("box-r2"); return !ok })
	if r.Lists.Load() != 1 {
		t.Fatalf("lists = %d", r.Lists.Load())
	}
}

// The whole source against the real API server: a gateway-mode SandboxPool, a box pod on a kwok
// node and its record; pool and box changes in force within 1 s. Skipped while the installed CRD
// has no spec.egress.mode (the API server prunes the field).
func TestClusterSource(t *testing.T) {
	k := newCluster(t)
	ns := k.namespace()
	pool := randomName("egw-test-")
	p := sbPool(pool, ns, "gateway", []string{"*.example.test", "api.test"}, []string{"bad.example.test"})
	p["spec"].(map[string]any)["warm"] = map[string]any{"count": 0}
	got := k.must("POST", PoolResourcePath, p)
	t.Cleanup(func() { k.do("DELETE", PoolResourcePath+"/"+pool, nil) })
	var back struct {
		Spec struct {
			Egress struct{ Mode string } `json:"egress"`
		} `json:"spec"`
	}
	b, _ := json.Marshal(got)
	json.Unmarshal(b, &back)
	if back.Spec.Egress.Mode != "gateway" {
		t.Skip("the installed SandboxPool CRD has no spec.egress.mode yet (the API server pruned it)")
	}
	rec := record(ns, "box-c1", `{"allow":["api.test"]}`)
	rec["data"].(map[string]any)[CredentialsKey] = base64.StdEncoding.EncodeToString([]byte(`{"api.test":{"Authorization":"Bearer t0ken"}}`))
	k.must("POST", "/api/v1/namespaces/"+ns+"/secrets", rec)
	k.must("POST", "/api/v1/namespaces/"+ns+"/pods", clusterPod(ns, "box-c1", pool))
	ip := netip.MustParseAddr(podIP(k, ns, "box-c1"))
	// The pool's CA Secret, as the operator writes it (kubernetes.io/tls, PKCS#8 P-256).
	ca := testpki.NewCA(t, "egress CA "+pool)
	k.must("POST", "/api/v1/namespaces/"+ns+"/secrets", caSecret(ns, EgressCAName, pool, ca))

	src := &Kubernetes{Client: k.c, Namespace: ns, Credentials: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx)
	waitForLong(t, 10*time.Second, func() bool { return src.Current() != nil && src.Current().BoxAt(ip) == "box-c1" })
	s := src.Current()
	if d := decide(s, ip.String(), "api.test"); d != "allow" {
		t.Fatalf("api.test: %s", d)
	}
	if d := decide(s, ip.String(), "www.example.test"); d != "box.allow:none" {
		t.Fatalf("www.example.test: %s (the record narrows to api.test)", d)
	}
	if s.Boxes["box-c1"].Headers("api.test")["Authorization"] != "Bearer t0ken" {
		t.Fatal("the record's credentials were not read")
	}
	if a := s.CAs[pool]; a == nil || a.CA().Subject.CommonName != "egress CA "+pool {
		t.Fatal("the pool's CA Secret was not read")
	}
	if b := s.Boxes["box-c1"]; b.Pod != "box-c1" || b.Namespace != ns || b.Nonce != "n-box-c1" || b.UID == "" {
		t.Fatalf("box-c1's pod identity: %+v", b.Identity())
	}
	// A runtime change of the box's narrowing (what PATCH /boxes/:id/egress writes) and of the
	// pool (kubectl edit sbp): each in force within 1 s.
	start := time.Now()
	k.must("PATCH", "/api/v1/namespaces/"+ns+"/secrets/box-c1",
		map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationEgress: `{"allow":["www.example.test"]}`}}})
	waitFor(t, func() bool { return decide(src.Current(), ip.String(), "www.example.test") == "allow" })
	t.Logf("record PATCH sent to in force: %v", time.Since(start))
	start = time.Now()
	k.must("PATCH", PoolResourcePath+"/"+pool,
		map[string]any{"spec": map[string]any{"egress": map[string]any{"domains": map[string]any{"deny": []any{"www.example.test"}}}}})
	waitFor(t, func() bool {
		return decide(src.Current(), ip.String(), "www.example.test") == "pool.deny:www.example.test"
	})
	t.Logf("pool PATCH sent to in force: %v", time.Since(start))
	k.must("DELETE", "/api/v1/namespaces/"+ns+"/pods/box-c1", map[string]any{"gracePeriodSeconds": 0})
	waitForLong(t, 10*time.Second, func() bool { return src.Current().BoxAt(ip) == "" })
}
