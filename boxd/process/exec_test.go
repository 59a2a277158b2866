package process

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestExecOutputAndExitCodes(t *testing.T) {
	m := newManager(t, Config{})
	res, stdout, stderr := run(t, m, ExecRequest{Command: "echo hi; echo oops >&2; exit 3"})
	if stdout != "hi\n" || stderr != "oops\n" || res.ExitCode != 3 || res.TimedOut || res.Signal != "" {
		t.Fatalf("got %+v %q %q", res, stdout, stderr)
	}
	if res.StdoutBytes != 3 || res.StderrBytes != 5 || res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("counts: %+v", res)
	}
	res, _, _ = run(t, m, ExecRequest{Command: "kill -USR1 $$"})
	if res.ExitCode != 128+10 || res.Signal != "USR1" {
		t.Fatalf("killed by a signal: %+v", res)
	}
	res, _, _ = run(t, m, ExecRequest{Command: "true"})
	if res.ExitCode != 0 {
		t.Fatalf("true: %+v", res)
	}
}

func TestExecStdinCwdAndEnvLayers(t *testing.T) {
	m, err := NewManager(Config{Workdir: t.TempDir()}, NewEnv([]string{"PATH=" + os.Getenv("PATH"), "A=boxd", "B=boxd", "C=boxd", "D=boxd"}))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := m.Env.Set(map[string]string{"B": "box", "C": "box"}); err != nil || n != 2 {
		t.Fatalf("set env: %d %v", n, err)
	}
	res, stdout, _ := run(t, m, ExecRequest{
		Command: `echo "$A $B $C $D"; printf %s "$SANDBOX_EXEC_ID" | wc -c; pwd; cat`,
		Env:     map[string]string{"C": "call", "D": "call", "SANDBOX_EXEC_ID": "forged"},
		Stdin:   []byte("from stdin"),
	})
	lines := strings.Split(stdout, "\n")
	if res.ExitCode != 0 || len(lines) != 4 || lines[0] != "boxd box call call" || lines[2] != m.Workdir() || lines[3] != "from stdin" {
		t.Fatalf("got %+v %q", res, stdout)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(lines[1])); n < 10 { // boxd's id, not the forged one
		t.Fatalf("SANDBOX_EXEC_ID has %q characters", lines[1])
	}

	// Without stdin the command reads /dev/null; an empty stdin is a closed pipe.
	if _, stdout, _ = run(t, m, ExecRequest{Command: "cat; echo done"}); stdout != "done\n" {
		t.Fatalf("no stdin: %q", stdout)
	}
	if _, stdout, _ = run(t, m, ExecRequest{Command: "cat; echo done", Stdin: []byte{}}); stdout != "done\n" {
		t.Fatalf("empty stdin: %q", stdout)
	}

	sub := filepath.Join(m.Workdir(), "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, stdout, _ = run(t, m, ExecRequest{Command: "pwd", Cwd: sub}); stdout != sub+"\n" {
		t.Fatalf("cwd: %q", stdout)
	}

	// A large stdin that the command never reads does not hang the exec.
	res, _, _ = run(t, m, ExecRequest{Command: "exit 0", Stdin: make([]byte, 1<<20)})
	if res.ExitCode != 0 {
		t.Fatalf("unread stdin: %+v", res)
	}
}

func TestExecMissingCwdIsAFailingCommand(t *testing.T) {
	m := newManager(t, Config{})
	missing := filepath.Join(m.Workdir(), "nope")
	res, stdout, stderr := run(t, m, ExecRequest{Command: "echo never", Cwd: missing})
	if res.ExitCode != 1 || stdout != "" || !strings.Contains(stderr, missing) || !strings.Contains(stderr, "no such file") {
		t.Fatalf("got %+v %q %q", res, stdout, stderr)
	}
	file := filepath.Join(m.Workdir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, _, stderr = run(t, m, ExecRequest{Command: "echo never", Cwd: file})
	if res.ExitCode != 1 || !strings.Contains(stderr, "not a directory") {
		t.Fatalf("cwd is a file: %+v %q", res, stderr)
	}
}

func TestExecRefusesBadRequests(t *testing.T) {
	m := newManager(t, Config{})
	for name, req := range map[string]ExecRequest{
		"no command":   {Timeout: time.Second},
		"no timeout":   {Command: "true"},
		"relative cwd": {Command: "true", Timeout: time.Second, Cwd: "tmp"},
		"bad env name": {Command: "true", Timeout: time.Second, Env: map[string]string{"1X": "v"}},
		"NUL in value": {Command: "true", Timeout: time.Second, Env: map[string]string{"X": "a\x00b"}},
	} {
		out := newOutput()
		_, err := m.Exec(context.Background(), req, out)
		wantStatus(t, err, http.StatusBadRequest)
		select {
		case <-out.started:
			t.Fatalf("%s: started anyway", name)
		default:
		}
	}
}

// A tree that ignores SIGTERM, with a grandchild that left for its own session (setsid), is
// entirely gone after the timeout; the exit code is 124.
func TestExecTimeoutKillsTheWholeTree(t *testing.T) {
	m := newManager(t, Config{})
	dir := m.Workdir()
	began := time.Now()
	res, _, _ := run(t, m, ExecRequest{
		Command: `trap '' TERM
			sh -c 'trap "" TERM; echo $$ > child.pid; sleep 100' &
			setsid sh -c 'trap "" TERM; echo $$ > escaped.pid; sleep 100' > /dev/null 2>&1 < /dev/null &
			echo $$ > leader.pid
			sleep 100`,
		Timeout: 700 * time.Millisecond,
	})
	if !res.TimedOut || res.ExitCode != TimeoutExitCode || res.Signal != "KILL" {
		t.Fatalf("got %+v", res)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("took %v", took)
	}
	for _, f := range []string{"leader.pid", "child.pid", "escaped.pid"} {
		waitGone(t, readPid(t, filepath.Join(dir, f)), f)
	}
}

func TestExecClientCancelKills(t *testing.T) {
	m := newManager(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	out := newOutput()
	done := make(chan Exit, 1)
	go func() {
		res, err := m.Exec(ctx, ExecRequest{Command: "echo $$ > pid; sleep 100 & sleep 100", Timeout: time.Minute}, out)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	pid := readPid(t, filepath.Join(m.Workdir(), "pid"))
	cancel()
	select {
	case res := <-done:
		if res.TimedOut || res.ExitCode != 137 {
			t.Fatalf("got %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("exec did not end after the cancel")
	}
	waitGone(t, pid, "the command")
}

func TestExecOutputCapsPerStream(t *testing.T) {
	m := newManager(t, Config{})
	res, stdout, stderr := run(t, m, ExecRequest{
		Command:        "head -c 100000 /dev/zero | tr '\\0' a; printf 12345 >&2",
		MaxOutputBytes: 1000,
	})
	if len(stdout) != 1000 || !res.StdoutTruncated || res.StdoutBytes != 100000 {
		t.Fatalf("stdout: %d bytes, %+v", len(stdout), res)
	}
	if stderr != "12345" || res.StderrTruncated || res.StderrBytes != 5 {
		t.Fatalf("stderr: %q, %+v", stderr, res)
	}
	res, stdout, _ = run(t, m, ExecRequest{Command: "printf 12345", MaxOutputBytes: 5})
	if stdout != "12345" || res.StdoutTruncated {
		t.Fatalf("exactly the cap: %q %+v", stdout, res)
	}
}

func TestExecConcurrencyCap(t *testing.T) {
	m := newManager(t, Config{})
	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := m.Exec(context.Background(), ExecRequest{Command: "sleep 2", Timeout: time.Minute, MaxConcurrent: 5}, newOutput())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	refused := 0
	for err := range errs {
		if err != nil {
			wantStatus(t, err, http.StatusTooManyRequests)
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d of %d refused, want exactly 1", refused, n)
	}
	// The slots come back.
	if res, _, _ := run(t, m, ExecRequest{Command: "true", MaxConcurrent: 1}); res.ExitCode != 0 {
		t.Fatalf("after: %+v", res)
	}
}

// An orphaned grandchild comes back to boxd (PID 1, or the subreaper in tests) and is reaped.
func TestOrphansAreReaped(t *testing.T) {
	m := newManager(t, Config{})
	_, stdout, _ := run(t, m, ExecRequest{Command: "sleep 0.3 > /dev/null 2>&1 & echo $!"})
	pid, err := strconv.Atoi(strings.TrimSpace(stdout))
	if err != nil {
		t.Fatalf("%q: %v", stdout, err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err == nil {
		fields := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
		if ppid, _ := strconv.Atoi(fields[1]); ppid != os.Getpid() {
			t.Fatalf("the orphan's parent is %d, not boxd (%d)", ppid, os.Getpid())
		}
	}
	waitGone(t, pid, "the orphan")
}

func TestShutdownKillsEverything(t *testing.T) {
	m := newManager(t, Config{})
	ctx := context.Background()
	done := make(chan Exit, 1)
	go func() {
		res, _ := m.Exec(ctx, ExecRequest{Command: "echo $$ > pid; exec sleep 100", Timeout: time.Minute}, newOutput())
		done <- res
	}()
	pid := readPid(t, filepath.Join(m.Workdir(), "pid"))
	info, err := m.StartProcess(StartRequest{Command: "sleep 100"})
	if err != nil {
		t.Fatal(err)
	}
	m.Shutdown()
	<-done
	waitGone(t, pid, "the exec")
	waitGone(t, info.Pid, "the background process")
	if !m.ShuttingDown() {
		t.Fatal("not shutting down")
	}
	_, err = m.StartProcess(StartRequest{Command: "true"})
	wantStatus(t, err, http.StatusInternalServerError)
}
