package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/frames"
)

func (b *box) raise(epoch int) (calls int64) {
	b.t.Helper()
	var got struct{ Epoch, Calls int64 }
	decode(b.t, b.do("POST", "/v1/fence", jsonBody(map[string]any{"epoch": epoch})), http.StatusOK, &got)
	if got.Epoch != int64(epoch) {
		b.t.Fatalf("raised epoch %d, answered %d", epoch, got.Epoch)
	}
	return got.Calls
}

func (b *box) lift(epoch int) bool {
	b.t.Helper()
	var got struct{ Lifted bool }
	decode(b.t, b.do("DELETE", "/v1/fence?epoch="+strconv.Itoa(epoch), nil), http.StatusOK, &got)
	return got.Lifted
}

// A fence refuses every call that may change the box, before it starts, names its epoch, and
// lets reads through; only an epoch at least its own lifts it.
func TestFenceRefusesWritesUntilLifted(t *testing.T) {
	b := newBox(t)
	file := filepath.Join(b.workdir, "a.txt")
	if calls := b.raise(5); calls != 0 {
		t.Fatalf("idle box: calls = %d", calls)
	}
	b.raise(5) // again: idempotent

	writes := []struct {
		method, path string
		body         string
	}{
		{"PUT", "/v1/files?path=" + file, "data"},
		{"DELETE", "/v1/files?path=" + file, ""},
		{"POST", "/v1/exec", `{"command":"echo hi > ` + file + `","timeout_ms":5000}`},
		{"POST", "/v1/env", `{"set":{"A":"1"}}`},
		{"POST", "/v1/processes", `{"command":"sleep 1"}`},
		{"PUT", "/v1/archive?path=" + b.workdir, ""},
		{"GET", "/v1/pty", ""},
	}
	for _, c := range writes {
		resp := b.do(c.method, c.path, strings.NewReader(c.body))
		if got := resp.Header.Get(FenceHeader); got != "5" {
			t.Errorf("%s %s: %s header %q, want 5", c.method, c.path, FenceHeader, got)
		}
		wantError(t, resp, http.StatusConflict, "conflict")
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("a fenced write changed the box: %v", err)
	}
	var act struct{ Calls, Fence int64 }
	decode(t, b.do("GET", "/v1/activity", nil), http.StatusOK, &act)
	if act.Fence != 5 {
		t.Fatalf("activity while fenced: %+v", act)
	}
	// Reads pass.
	decode(t, b.do("GET", "/v1/files/list?path="+b.workdir, nil), http.StatusOK, nil)
	decode(t, b.do("GET", "/v1/processes", nil), http.StatusOK, nil)

	// An older epoch neither fences anew nor lifts.
	wantError(t, b.do("POST", "/v1/fence", jsonBody(map[string]any{"epoch": 4})), http.StatusConflict, "conflict")
	wantError(t, b.do("DELETE", "/v1/fence?epoch=4", nil), http.StatusConflict, "conflict")
	wantError(t, b.do("POST", "/v1/fence", jsonBody(map[string]any{"epoch": 0})), http.StatusBadRequest, "invalid_request")

	if !b.lift(5) {
		t.Fatal("lift(5) did not lift")
	}
	if b.lift(5) {
		t.Fatal("a second lift reported a fence")
	}
	decode(t, b.do("PUT", "/v1/files?path="+file, strings.NewReader("data")), http.StatusOK, nil)

	// A newer epoch replaces an older one, and a lift with a newer epoch lifts it.
	b.raise(6)
	b.raise(9)
	if !b.lift(12) {
		t.Fatal("lift(12) did not lift fence 9")
	}
	// Once a newer epoch was seen, an older one can neither fence again nor lift (its holder
	// lost the lease to whoever lifted with 12).
	wantError(t, b.do("POST", "/v1/fence", jsonBody(map[string]any{"epoch": 10})), http.StatusConflict, "conflict")
	wantError(t, b.do("DELETE", "/v1/fence?epoch=11", nil), http.StatusConflict, "conflict")
	b.raise(13)
	b.lift(13)
	wantError(t, b.do("GET", "/v1/activity", nil, "X-Boxd-Token", "wrong"), http.StatusUnauthorized, "unauthorized")
	wantError(t, b.do("POST", "/v1/fence", jsonBody(map[string]any{"epoch": 20}), "X-Boxd-Token", "wrong"), http.StatusUnauthorized, "unauthorized")
}

// The fence answers the calls at work when it went up: a sleep gives up on a box with any.
func TestFenceCountsCallsAtWork(t *testing.T) {
	b := newBox(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := b.doCtx(ctx, "POST", "/v1/exec", jsonBody(map[string]any{"command": "echo started; exec sleep 100", "timeout_ms": 60000}))
	defer resp.Body.Close()
	fr := frames.NewReader(resp.Body)
	for {
		typ, _, err := fr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if typ == frames.Stdout {
			break
		}
	}
	if calls := b.raise(1); calls != 1 {
		t.Fatalf("with an exec at work: calls = %d, want 1", calls)
	}
}

// Background processes are stopped while the fence is up and continue once it is lifted.
func TestFenceFreezesBackgroundProcesses(t *testing.T) {
	b := newBox(t)
	counter := filepath.Join(b.workdir, "n")
	decode(t, b.do("POST", "/v1/processes", jsonBody(map[string]any{
		"command": "i=0; while :; do i=$((i+1)); echo $i > " + counter + ".tmp; mv " + counter + ".tmp " + counter + "; sleep 0.02; done",
	})), http.StatusCreated, nil)
	read := func() string {
		for deadline := time.Now().Add(5 * time.Second); ; {
			if b, err := os.ReadFile(counter); err == nil && len(b) > 0 {
				return string(b)
			}
			if time.Now().After(deadline) {
				t.Fatal("the process never wrote its counter")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	read()
	b.raise(3)
	time.Sleep(100 * time.Millisecond) // a write under way when the fence went up lands
	frozen := read()
	time.Sleep(400 * time.Millisecond)
	if again := read(); again != frozen {
		t.Fatalf("the counter moved under the fence: %q -> %q", frozen, again)
	}
	b.lift(3)
	time.Sleep(400 * time.Millisecond)
	if thawed := read(); thawed == frozen {
		t.Fatalf("the counter did not move after the lift: %q", thawed)
	}
}
