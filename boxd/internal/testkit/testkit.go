// Package testkit holds the checks boxd's tests share.
package testkit

import (
	"os"
	"strconv"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/errs"
)

// WantStatus fails unless err is an error that answers with status.
func WantStatus(t testing.TB, err error, status int) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error with status %d, got none", status)
	}
	if got := errs.As(err).Status; got != status {
		t.Fatalf("status %d (%v), want %d", got, err, status)
	}
}

// WaitGone waits until pid no longer exists at all (killed, and reaped by boxd's reaper).
func WaitGone(t testing.TB, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) is still there", what, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
