package process

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/frames"
	"sandbox-bridge.io/boxd/internal/testkit"
)

func newManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	if cfg.Workdir == "" {
		cfg.Workdir = t.TempDir()
	}
	m, err := NewManager(cfg, NewEnv(os.Environ()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Shutdown)
	return m
}

// output collects an exec's events.
type output struct {
	mu             sync.Mutex
	pid            int
	stdout, stderr bytes.Buffer
	started        chan struct{}
}

func newOutput() *output { return &output{started: make(chan struct{})} }

func (o *output) Started(pid int) {
	o.mu.Lock()
	o.pid = pid
	o.mu.Unlock()
	close(o.started)
}

func (o *output) Output(stream byte, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if stream == frames.Stdout {
		o.stdout.Write(p)
	} else {
		o.stderr.Write(p)
	}
}

func (o *output) text() (string, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stdout.String(), o.stderr.String()
}

func run(t *testing.T, m *Manager, req ExecRequest) (Exit, string, string) {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = 20 * time.Second
	}
	out := newOutput()
	res, err := m.Exec(context.Background(), req, out)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Command, err)
	}
	stdout, stderr := out.text()
	return res, stdout, stderr
}

var (
	wantStatus = testkit.WantStatus
	waitGone   = testkit.WaitGone
)

func readPid(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not written", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
