package pty

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/frames"
	"sandbox-bridge.io/boxd/internal/testkit"
	"sandbox-bridge.io/boxd/process"
)

// term is the client side of a terminal session.
type term struct {
	t      *testing.T
	conn   net.Conn
	fw     *frames.Writer
	mu     sync.Mutex
	out    bytes.Buffer
	pid    int
	exit   *process.Exit
	closed chan struct{}
}

func open(t *testing.T, m *process.Manager, req Request) *term {
	t.Helper()
	sess, err := Start(m, req)
	if err != nil {
		t.Fatal(err)
	}
	server, client := net.Pipe()
	go sess.Serve(server, bufio.NewReadWriter(bufio.NewReader(server), bufio.NewWriter(server)))
	tm := &term{t: t, conn: client, fw: frames.NewWriter(client, nil), closed: make(chan struct{})}
	go tm.read()
	t.Cleanup(func() { client.Close() })
	return tm
}

func (tm *term) read() {
	defer close(tm.closed)
	fr := frames.NewReader(tm.conn)
	for {
		typ, p, err := fr.Next()
		if err != nil {
			return
		}
		tm.mu.Lock()
		switch typ {
		case frames.Start:
			var s struct{ Pid int }
			_ = json.Unmarshal(p, &s)
			tm.pid = s.Pid
		case frames.Stdout:
			tm.out.Write(p)
		case frames.Exit:
			var e process.Exit
			_ = json.Unmarshal(p, &e)
			tm.exit = &e
		}
		tm.mu.Unlock()
	}
}

func (tm *term) send(typ byte, p string) {
	tm.t.Helper()
	if err := tm.fw.Write(typ, []byte(p)); err != nil {
		tm.t.Fatal(err)
	}
}

// waitFor waits until the terminal output contains s.
func (tm *term) waitFor(s string) {
	tm.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tm.mu.Lock()
		got := tm.out.String()
		tm.mu.Unlock()
		if strings.Contains(got, s) {
			return
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("terminal output %q never contained %q", got, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (tm *term) waitExit() process.Exit {
	tm.t.Helper()
	select {
	case <-tm.closed:
	case <-time.After(10 * time.Second):
		tm.t.Fatal("the terminal did not end")
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tm.exit == nil {
		tm.t.Fatalf("no exit frame; output %q", tm.out.String())
	}
	return *tm.exit
}

func newManager(t *testing.T) *process.Manager {
	m, err := process.NewManager(process.Config{Workdir: t.TempDir()}, process.NewEnv(os.Environ()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Shutdown)
	return m
}

func TestInteractiveRead(t *testing.T) {
	m := newManager(t)
	tm := open(t, m, Request{Cols: 80, Rows: 24, Command: `printf 'name? '; read name; echo "hello, $name"; tty; echo "TERM=$TERM"; exit 5`})
	tm.waitFor("name? ")
	tm.send(frames.Stdin, "world\r")
	tm.waitFor("hello, world")
	exit := tm.waitExit()
	out := tm.out.String()
	if exit.ExitCode != 5 || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "TERM=xterm-256color") {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
	if tm.pid <= 0 || exit.StdoutBytes != int64(len(out)) {
		t.Fatalf("pid %d, stdout_bytes %d for %d bytes", tm.pid, exit.StdoutBytes, len(out))
	}
}

func TestResizeChangesSttySize(t *testing.T) {
	m := newManager(t)
	tm := open(t, m, Request{Cols: 80, Rows: 24, Command: `stty size; read x; stty size; read x`})
	tm.waitFor("24 80")
	tm.send(frames.Resize, `{"cols":132,"rows":43}`)
	tm.send(frames.Stdin, "\r")
	tm.waitFor("43 132")
	tm.send(frames.EOF, "") // ^D: read gets end of input
	if exit := tm.waitExit(); exit.ExitCode != 1 {
		t.Fatalf("read at EOF should fail: %+v", exit)
	}
}

func TestDroppedConnectionKillsTheTerminal(t *testing.T) {
	m := newManager(t)
	// The background sleep ignores SIGHUP, so only boxd's tree kill can end it (not the hangup
	// the kernel sends when the shell, the terminal's session leader, dies).
	tm := open(t, m, Request{Cols: 80, Rows: 24, Command: `trap '' HUP; sleep 100 & echo "bg=$!."; sleep 100`})
	tm.waitFor(".") // the whole number, not just its first digits
	tm.mu.Lock()
	shell, out := tm.pid, tm.out.String()
	tm.mu.Unlock()
	m1 := regexp.MustCompile(`bg=([0-9]+)\.`).FindStringSubmatch(out)
	if m1 == nil {
		t.Fatalf("no background pid in %q", out)
	}
	bg, err := strconv.Atoi(m1[1])
	if err != nil || shell <= 1 || bg <= 1 {
		t.Fatalf("shell pid %d, background pid from %q: %v", shell, out, err)
	}
	for _, pid := range []int{shell, bg} { // both alive before the drop, or "gone" proves nothing
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			t.Fatalf("pid %d is not running before the drop: %v", pid, err)
		}
	}
	tm.conn.Close()
	for _, pid := range []int{shell, bg} {
		testkit.WaitGone(t, pid, "a process of the dropped terminal")
	}
}

func TestTerminalsCountAgainstTheProcessLimit(t *testing.T) {
	m := newManager(t)
	if _, err := m.StartProcess(process.StartRequest{Command: "sleep 100", MaxProcesses: 2}); err != nil {
		t.Fatal(err)
	}
	open(t, m, Request{Cols: 80, Rows: 24, Command: "sleep 100", MaxProcesses: 2})
	_, err := Start(m, Request{Cols: 80, Rows: 24, Command: "sleep 100", MaxProcesses: 2})
	testkit.WantStatus(t, err, http.StatusTooManyRequests)
	for _, req := range []Request{{Cols: 0, Rows: 24}, {Cols: 80, Rows: 24, Cwd: "/nonexistent-dir"}, {Cols: 80, Rows: 24, Cwd: "relative"}} {
		_, err := Start(m, req)
		testkit.WantStatus(t, err, http.StatusBadRequest)
	}
}
