package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/ports"
)

// The ports route as boxd serves it: behind the token, the request log and the fence.

func appPort(t *testing.T, h http.HandlerFunc) int {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	port, err := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func TestPortPathsReachTheAppUncleanedWithAnyMethod(t *testing.T) {
	b := newBox(t)
	var got string
	port := appPort(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.Method + " " + r.URL.EscapedPath()
		fmt.Fprint(w, "app")
	})
	for _, c := range []struct{ method, path string }{{"PROPFIND", "/dav//a/../b"}, {"OPTIONS", "/"}, {"GET", "/x%2Fy"}} {
		resp := b.do(c.method, fmt.Sprintf("/v1/ports/%d%s", port, c.path), nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || got != c.method+" "+c.path {
			t.Fatalf("%s %s: %d, the app saw %q", c.method, c.path, resp.StatusCode, got)
		}
	}
	// The request log names the route, never the app's path.
	b.logMu.Lock()
	logs := b.logs.String()
	b.logMu.Unlock()
	if !strings.Contains(logs, ports.Pattern) || strings.Contains(logs, "/dav") {
		t.Fatalf("request log: %s", logs)
	}
	wantError(t, b.do("GET", fmt.Sprintf("/v1/ports/%d/", port), nil, "X-Boxd-Token", "wrong"), http.StatusUnauthorized, "unauthorized")
}

// Port traffic may change the box whatever its method: a sleep's fence refuses it before it
// reaches the app, and an open port request is a call at work (idle sleep leaves the box awake).
func TestPortTrafficIsFencedAndCountedAsWork(t *testing.T) {
	b := newBox(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	reached := 0
	port := appPort(t, func(w http.ResponseWriter, r *http.Request) {
		reached++
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		fmt.Fprint(w, "app")
	})
	url := fmt.Sprintf("/v1/ports/%d", port)

	done := make(chan int, 1)
	go func() {
		resp := b.do("GET", url+"/slow", nil)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-entered:
	case status := <-done:
		t.Fatalf("the slow request did not reach the app: %d", status)
	}
	if calls := b.raise(3); calls != 1 {
		t.Fatalf("calls at work with a port request open: %d", calls)
	}
	resp := b.do("GET", url+"/", nil)
	if resp.Header.Get(FenceHeader) != "3" {
		t.Fatalf("fenced GET through a port: %d %v", resp.StatusCode, resp.Header)
	}
	wantError(t, resp, http.StatusConflict, "conflict")
	close(release)
	if status := <-done; status != http.StatusOK {
		t.Fatalf("the request at work when the fence went up: %d", status)
	}
	if reached != 1 {
		t.Fatalf("the app was reached %d times, want 1 (the fenced call must not reach it)", reached)
	}
	b.lift(3)
	resp = b.do("GET", url+"/", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || reached != 2 {
		t.Fatalf("after the fence: %d, reached %d", resp.StatusCode, reached)
	}
}
