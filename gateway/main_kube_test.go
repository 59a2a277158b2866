package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/identity"
	"sandbox-bridge.io/gateway/internal/kubetest"
)

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The whole gateway with -source=kubernetes against the list/watch double: not ready before the
// first lists, then a box at 127.0.0.1 (its pod IP in the double) decided by its pool, and a
// change of its record's narrowing in force for the next CONNECT within 1 s.
func TestServeKubernetesSource(t *testing.T) {
	api := kubetest.New(t)
	api.Put("sandboxpools", map[string]any{"metadata": map[string]any{"name": "p1"},
		"spec": map[string]any{"namespace": "sb", "egress": map[string]any{"mode": "gateway",
			"domains": map[string]any{"allow": []any{"127.0.0.1", "allowed.test"}, "deny": []any{"denied.test"}}}}})
	api.Put("pods", map[string]any{"metadata": map[string]any{"name": "box-a-0", "namespace": "sb", "uid": "uid-a-0",
		"annotations": map[string]any{"sandbox-bridge.io/boxd-nonce": "0a1b"},
		"labels":      map[string]any{"sandbox-bridge.io/box": "true", "sandbox-bridge.io/box-id": "box-a", "sandbox-bridge.io/pool": "p1"}},
		"status": map[string]any{"phase": "Running", "podIP": "127.0.0.1"}})
	record := func(annotations map[string]any) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "box-a", "namespace": "sb", "annotations": annotations,
			"labels": map[string]any{"sandbox-bridge.io/box": "true", "app.kubernetes.io/component": "box-record"}}}
	}
	api.Put("secrets", record(nil))
	api.FailNext("sandboxpools", 500, 500) // the first lists fail: not ready meanwhile

	keyFile := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef-test-key\n"), 0o600)
	keys, err := identity.LoadKeys(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	upstream, _ := net.Listen("tcp", "127.0.0.1:0") // accepts and holds connections
	defer upstream.Close()
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()

	proxyAddr, metricsAddr := freeAddr(t), freeAddr(t)
	c, err := parseFlags([]string{"-source=kubernetes", "-kube-server=" + api.URL, "-kube-namespace=sb",
		"-key-file=" + keyFile, "-listen=" + proxyAddr, "-metrics-listen=" + metricsAddr, "-allow-private-upstreams"})
	if err != nil {
		t.Fatal(err)
	}
	c.eventsTick = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c, slog.New(slog.NewJSONHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		<-done
	}()

	// The first answer of /readyz is 503 (the pools' list is failing), then 200.
	first := 0
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if first == 0 {
				first = resp.StatusCode
			}
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if first != 503 {
		t.Fatalf("first /readyz answer %d, want 503 before the first lists", first)
	}

	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("box-a-0:"+keys.Credential(identity.Pod{Namespace: "sb", Name: "box-a-0", Nonce: "0a1b"})))
	connect := func(target string) (int, string) {
		conn, err := net.Dial("tcp", proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", target, target, auth)
		resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("X-Egress-Rule")
	}
	if code, rule := connect("denied.test:443"); code != 403 || rule != "pool.deny:denied.test" {
		t.Fatalf("denied.test: %d %q", code, rule)
	}
	// The denial becomes an Event on the box's pod.
	deadline = time.Now().Add(2 * time.Second)
	for len(api.Objects("events")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no EgressDenied Event created")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ev := api.Objects("events")[0]
	if obj := ev["involvedObject"].(map[string]any); ev["reason"] != "EgressDenied" || obj["name"] != "box-a-0" || obj["uid"] != "uid-a-0" ||
		ev["message"] != "egress gateway refused box box-a 1 time: denied.test x1 (pool.deny:denied.test)" {
		t.Fatalf("Event %v", ev)
	}
	if code, _ := connect(upstream.Addr().String()); code != 200 {
		t.Fatalf("allowed 127.0.0.1: %d", code)
	}
	// The bridge narrows the box (PATCH /boxes/:id/egress writes the record's annotation).
	api.Put("secrets", record(map[string]any{"sandbox-bridge.io/egress": `{"allow":["allowed.test"]}`}))
	deadline = time.Now().Add(time.Second)
	for {
		code, rule := connect(upstream.Addr().String())
		if code == 403 && rule == "box.allow:none" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the narrowing not in force within 1 s: %d %q", code, rule)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
