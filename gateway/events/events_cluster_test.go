package events

// Against the real API server of the local cluster, skipped unless SANDBOX_BRIDGE_TEST_KUBECONFIG
// names its kubeconfig:
//
//	SANDBOX_BRIDGE_TEST_KUBECONFIG=$PWD/../.cluster/kubeconfig go test ./events -run Cluster -v

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/kube"
)

func clusterDo(t *testing.T, c *kube.Client, method, path string, query url.Values, obj any) map[string]any {
	t.Helper()
	var body []byte
	ct := ""
	if obj != nil {
		body, _ = json.Marshal(obj)
		ct = "application/json"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Do(ctx, method, path, query, "", ct, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return m
}

// The API server accepts the Event the gateway makes (validation of core/v1 Events), on a box pod
// it finds by uid, and kubectl describe would show it.
func TestClusterEvent(t *testing.T) {
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
	b := make([]byte, 3)
	rand.Read(b)
	ns := "egw-events-" + hex.EncodeToString(b)
	clusterDo(t, c, "POST", "/api/v1/namespaces", nil, map[string]any{"metadata": map[string]any{"name": ns}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if resp, err := c.Do(ctx, "DELETE", "/api/v1/namespaces/"+ns, nil, "", "", nil); err == nil {
			resp.Body.Close()
		}
	})
	// A box-like pod on a kwok node (nothing runs; it only needs to exist with a uid).
	pod := clusterDo(t, c, "POST", "/api/v1/namespaces/"+ns+"/pods", nil, map[string]any{
		"metadata": map[string]any{"name": "box-ev-0", "labels": map[string]any{"sandbox-bridge.io/box": "true", "sandbox-bridge.io/box-id": "box-ev"}},
		"spec": map[string]any{"nodeName": "node-000000", "automountServiceAccountToken": false,
			"containers": []any{map[string]any{"name": "box", "image": "registry.invalid/box:test"}}},
	})
	uid, _ := pod["metadata"].(map[string]any)["uid"].(string)
	if uid == "" {
		t.Fatalf("pod: %v", pod)
	}
	a := &Aggregator{Client: c, Tick: 50 * time.Millisecond, Instance: "test-replica"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	target := Pod{Namespace: ns, Name: "box-ev-0", UID: uid, Box: "box-ev"}
	for i := 0; i < 3; i++ {
		a.Denied(target, "evil.test", "pool.allow:none")
	}
	a.Denied(target, "other.test", "box.allow:none")
	q := url.Values{"fieldSelector": {"involvedObject.name=box-ev-0,involvedObject.kind=Pod"}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		list := clusterDo(t, c, "GET", "/api/v1/namespaces/"+ns+"/events", q, nil)
		items, _ := list["items"].([]any)
		if len(items) == 1 {
			ev := items[0].(map[string]any)
			io := ev["involvedObject"].(map[string]any)
			if ev["reason"] != Reason || ev["type"] != "Warning" || ev["count"] != float64(4) || io["uid"] != uid ||
				ev["source"].(map[string]any)["component"] != Component ||
				ev["message"] != "egress gateway refused box box-ev 4 times: evil.test x3 (pool.allow:none), other.test x1 (box.allow:none)" {
				t.Fatalf("the Event on the API server: %v", ev)
			}
			t.Logf("Event %s: %s", ev["metadata"].(map[string]any)["name"], ev["message"])
			return
		}
		if len(items) > 1 || time.Now().After(deadline) {
			t.Fatalf("%d Events for the pod", len(items))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
