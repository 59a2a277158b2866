package process

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/frames"
)

// stream collects what Proc.Stream sends.
type stream struct {
	mu      sync.Mutex
	starts  [][2]int64 // offset, dropped
	data    bytes.Buffer
	streams []byte
	exit    *Exit
	flushes int
}

func (s *stream) Start(offset, dropped int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts = append(s.starts, [2]int64{offset, dropped})
	return nil
}

func (s *stream) Output(c Chunk) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data.Write(c.Data)
	s.streams = append(s.streams, c.Stream)
	return nil
}

func (s *stream) Exit(e Exit) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exit = &e
	return nil
}

func (s *stream) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes++
	return nil
}

func (s *stream) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data.String()
}

func start(t *testing.T, m *Manager, command string) *Proc {
	t.Helper()
	info, err := m.StartProcess(StartRequest{Command: command, Tag: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != "running" || info.Pid <= 0 || !strings.HasPrefix(info.ProcessID, "p-") || info.Tag != "t" {
		t.Fatalf("started: %+v", info)
	}
	p, err := m.Process(info.ProcessID)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitExited(t *testing.T, p *Proc) Info {
	t.Helper()
	var info Info
	eventually(t, "process "+p.id+" to exit", func() bool {
		info = p.Info()
		return info.Status == "exited"
	})
	return info
}

func TestProcessReplayFromOffsets(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, "printf abc; sleep 0.05; printf def >&2; sleep 0.05; printf gh; exit 7")
	info := waitExited(t, p)
	if info.ExitCode == nil || *info.ExitCode != 7 || info.OutputBytes != 8 || info.DroppedBytes != 0 || info.EndedAt == nil {
		t.Fatalf("info: %+v", info)
	}
	var s stream
	if err := p.Stream(context.Background(), 0, false, &s); err != nil {
		t.Fatal(err)
	}
	if s.text() != "abcdefgh" || !bytes.Equal(s.streams, []byte{frames.Stdout, frames.Stderr, frames.Stdout}) {
		t.Fatalf("replay: %q %v", s.text(), s.streams)
	}
	if len(s.starts) != 1 || s.starts[0] != [2]int64{0, 0} || s.exit == nil || s.exit.ExitCode != 7 || s.exit.StdoutBytes != 5 || s.exit.StderrBytes != 3 {
		t.Fatalf("replay: starts %v exit %+v", s.starts, s.exit)
	}
	s = stream{}
	if err := p.Stream(context.Background(), 4, false, &s); err != nil {
		t.Fatal(err)
	}
	if s.text() != "efgh" || s.starts[0] != [2]int64{4, 0} || s.exit == nil {
		t.Fatalf("since 4: %q %v", s.text(), s.starts)
	}
}

func TestProcessFollowUntilExit(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, "echo one; sleep 0.3; echo two; sleep 0.3; echo three")
	var s stream
	began := time.Now()
	if err := p.Stream(context.Background(), 0, true, &s); err != nil {
		t.Fatal(err)
	}
	if s.text() != "one\ntwo\nthree\n" || s.exit == nil || s.exit.ExitCode != 0 {
		t.Fatalf("followed: %q %+v", s.text(), s.exit)
	}
	if time.Since(began) < 500*time.Millisecond || s.flushes < 2 {
		t.Fatalf("returned after %v with %d flushes: did not tail", time.Since(began), s.flushes)
	}

	// Without follow, a running process's stream ends after the replay, without exit.
	p = start(t, m, "echo first; sleep 100")
	eventually(t, "output", func() bool { return p.Info().OutputBytes > 0 })
	s = stream{}
	if err := p.Stream(context.Background(), 0, false, &s); err != nil {
		t.Fatal(err)
	}
	if s.text() != "first\n" || s.exit != nil {
		t.Fatalf("replay of a running process: %q %+v", s.text(), s.exit)
	}
	// A follower whose client goes away stops.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Stream(ctx, 0, true, &stream{}) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("follower did not stop")
	}
}

func TestProcessOutputEvictionReportsDropped(t *testing.T) {
	m := newManager(t, Config{OutputBytes: 4096})
	p := start(t, m, "i=0; while [ $i -lt 200 ]; do printf '%099d\\n' $i; i=$((i+1)); done")
	info := waitExited(t, p)
	if info.OutputBytes != 20000 || info.DroppedBytes < 20000-4096 || info.DroppedBytes >= 20000 {
		t.Fatalf("info: %+v", info)
	}
	var s stream
	if err := p.Stream(context.Background(), 100, false, &s); err != nil {
		t.Fatal(err)
	}
	start := s.starts[0]
	if start[0] != info.DroppedBytes || start[1] != info.DroppedBytes-100 {
		t.Fatalf("start frame %v, dropped_bytes %d", start, info.DroppedBytes)
	}
	if int64(s.data.Len()) != 20000-info.DroppedBytes || !strings.HasSuffix(s.text(), "00199\n") {
		t.Fatalf("kept %d bytes ending %q", s.data.Len(), s.text()[max(0, s.data.Len()-10):])
	}
}

func TestProcessStdinAndEOF(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, "cat; echo done")
	n, err := p.WriteStdin(context.Background(), strings.NewReader("hello "), false)
	if err != nil || n != 6 {
		t.Fatalf("write: %d %v", n, err)
	}
	if _, err := p.WriteStdin(context.Background(), strings.NewReader("world\n"), true); err != nil {
		t.Fatal(err)
	}
	waitExited(t, p)
	var s stream
	_ = p.Stream(context.Background(), 0, false, &s)
	if s.text() != "hello world\ndone\n" {
		t.Fatalf("output %q", s.text())
	}
	_, err = p.WriteStdin(context.Background(), strings.NewReader("late"), false)
	wantStatus(t, err, http.StatusConflict)

	// Closed but still running: 409 too.
	p = start(t, m, "exec sleep 100")
	if _, err := p.WriteStdin(context.Background(), strings.NewReader(""), true); err != nil {
		t.Fatal(err)
	}
	_, err = p.WriteStdin(context.Background(), strings.NewReader("x"), false)
	wantStatus(t, err, http.StatusConflict)

	// A write to a process that never reads gives up when the client does.
	p = start(t, m, "exec sleep 100")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = p.WriteStdin(ctx, bytes.NewReader(make([]byte, 4<<20)), false)
	if err == nil {
		t.Fatal("a blocked stdin write returned no error")
	}
}

func TestProcessSignals(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, "sleep 100 & wait")
	if _, err := p.Signal("BOGUS"); err == nil {
		t.Fatal("unknown signal accepted")
	} else {
		wantStatus(t, err, http.StatusBadRequest)
	}
	if _, err := p.Signal("STOP"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Signal("CONT"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	info := waitExited(t, p)
	if *info.ExitCode != 143 || info.Signal != "TERM" {
		t.Fatalf("after TERM: %+v", info)
	}
	_, err := p.Signal("KILL")
	wantStatus(t, err, http.StatusConflict)
}

func TestProcessListStatusAndLimit(t *testing.T) {
	m := newManager(t, Config{})
	quick := start(t, m, "true")
	waitExited(t, quick)
	slow := start(t, m, "sleep 100")
	list := m.Processes()
	if len(list) != 2 || list[0].ProcessID != slow.id || list[0].Status != "running" || list[1].ProcessID != quick.id || list[1].Status != "exited" {
		t.Fatalf("list: %+v", list)
	}
	if _, err := m.Process("p-999"); err == nil {
		t.Fatal("unknown id found")
	} else {
		wantStatus(t, err, http.StatusNotFound)
	}

	// The limit counts running processes only.
	if _, err := m.StartProcess(StartRequest{Command: "sleep 100", MaxProcesses: 2}); err != nil {
		t.Fatal(err)
	}
	_, err := m.StartProcess(StartRequest{Command: "sleep 100", MaxProcesses: 2})
	wantStatus(t, err, http.StatusTooManyRequests)
	if _, err := slow.Signal("KILL"); err != nil {
		t.Fatal(err)
	}
	waitExited(t, slow)
	if _, err := m.StartProcess(StartRequest{Command: "true", MaxProcesses: 2}); err != nil {
		t.Fatalf("after one exited: %v", err)
	}

	_, err = m.StartProcess(StartRequest{Command: "true", Cwd: "/nonexistent-dir"})
	wantStatus(t, err, http.StatusBadRequest)
}

func TestExitedProcessesAreBounded(t *testing.T) {
	m := newManager(t, Config{})
	var last *Proc
	for i := 0; i < KeepExited+5; i++ {
		last = start(t, m, "true")
		waitExited(t, last)
	}
	eventually(t, "retirement", func() bool { return len(m.Processes()) == KeepExited })
	if _, err := m.Process("p-1"); err == nil {
		t.Fatal("the oldest exited process is still kept")
	}
	if _, err := m.Process(last.id); err != nil {
		t.Fatal(err)
	}
}

// blockingStream holds the first output until released, so the process can run ahead of it.
type blockingStream struct {
	stream
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (s *blockingStream) Output(c Chunk) error {
	s.once.Do(func() {
		close(s.held)
		<-s.release
	})
	return s.stream.Output(c)
}

// A follower that falls so far behind that its next output was evicted gets another start
// frame saying where it resumes, so the offsets it counts stay right.
func TestSlowFollowerIsToldWhatItMissed(t *testing.T) {
	child := &Child{done: make(chan struct{})}
	p := &Proc{id: "p-test", child: child, stdinMu: make(chan struct{}, 1), out: ring{limit: 1000}}
	p.append(frames.Stdout, []byte(strings.Repeat("a", 100)))

	s := &blockingStream{held: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- p.Stream(context.Background(), 0, true, s) }()
	<-s.held // it holds bytes 0-99; now 5000 more arrive, far beyond what is kept
	for i := 0; i < 50; i++ {
		p.append(frames.Stdout, []byte(strings.Repeat("b", 100)))
	}
	close(s.release)
	eventually(t, "the follower to catch up", func() bool { return strings.HasSuffix(s.text(), "b") && len(s.text()) >= 100+900 })

	child.finish(0)
	p.finish()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.starts) != 2 || s.starts[0] != [2]int64{0, 0} {
		t.Fatalf("starts %v", s.starts)
	}
	resumed, skipped := s.starts[1][0], s.starts[1][1]
	if resumed != p.out.start || skipped != resumed-100 || int64(s.data.Len()) != 100+(5100-resumed) || s.exit == nil {
		t.Fatalf("resumed at %d after skipping %d; got %d bytes; ring starts at %d; exit %v", resumed, skipped, s.data.Len(), p.out.start, s.exit)
	}
}
