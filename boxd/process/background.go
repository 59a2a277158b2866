package process

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/frames"
)

// DefaultMaxProcesses is the live-process limit when a request names none.
const DefaultMaxProcesses = 32

// StartRequest starts a background process (POST /v1/processes).
type StartRequest struct {
	Command      string
	Cwd          string
	Env          map[string]string
	Tag          string
	MaxProcesses int
}

// Info is a background process as the API shows it.
type Info struct {
	ProcessID    string     `json:"process_id"`
	Pid          int        `json:"pid"`
	Command      string     `json:"command"`
	Tag          string     `json:"tag,omitempty"`
	Status       string     `json:"status"` // running | exited
	StartedAt    time.Time  `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at,omitempty"`
	ExitCode     *int       `json:"exit_code,omitempty"`
	Signal       string     `json:"signal,omitempty"`
	OutputBytes  int64      `json:"output_bytes"`
	DroppedBytes int64      `json:"dropped_bytes"`
}

// Proc is one background process: its output buffer, its followers and its lifetime.
type Proc struct {
	id, command, tag string
	child            *Child
	startedAt        time.Time

	stdinMu chan struct{} // one stdin write at a time (a channel: a waiter can give up)

	mu      sync.Mutex // guards the fields below
	out     ring
	bytes   [3]int64      // per stream (frames.Stdout, frames.Stderr)
	wake    chan struct{} // closed when output or the exit arrives, if someone waits
	stdin   *os.File      // nil once closed
	exited  bool
	endedAt time.Time
	exit    Exit
}

// StartProcess starts req.Command as `sh -c` with a stdin pipe, keeping its output.
func (m *Manager) StartProcess(req StartRequest) (Info, error) {
	cwd, err := m.checkCommand(req.Command, req.Cwd, req.Env)
	if err != nil {
		return Info{}, err
	}
	if len(req.Tag) > 256 {
		return Info{}, errs.Invalid("tag is longer than 256 bytes")
	}
	if msg := CheckDir(cwd); msg != "" {
		return Info{}, errs.Invalid("%s", msg)
	}
	max := req.MaxProcesses
	if max <= 0 {
		max = DefaultMaxProcesses
	}
	if err := m.AcquireLive(max); err != nil {
		return Info{}, err
	}
	info, err := m.startProc(req, cwd)
	if err != nil {
		m.ReleaseLive()
	}
	return info, err
}

// startProc starts the process and returns its state as started (running, even when it is
// already gone by the time the caller reads it).
func (m *Manager) startProc(req StartRequest, cwd string) (Info, error) {
	pp, err := newPipes(true)
	if err != nil {
		return Info{}, errs.Internal("pipes: %v", err)
	}
	child, err := m.startShell(req.Command, cwd, req.Env, pp)
	if err != nil {
		pp.closeAll()
		return Info{}, err
	}
	p := &Proc{
		command: req.Command, tag: req.Tag, child: child, startedAt: time.Now().UTC(),
		stdinMu: make(chan struct{}, 1),
		out:     ring{limit: m.cfg.OutputBytes},
		stdin:   pp.stdinW,
	}
	m.mu.Lock()
	m.nextProc++
	p.id = "p-" + strconv.Itoa(m.nextProc)
	m.procs[p.id] = p
	m.order = append(m.order, p)
	m.mu.Unlock()
	info := p.Info()

	rd := newReaders(2)
	for _, s := range []struct {
		stream byte
		r      *os.File
	}{{frames.Stdout, pp.stdoutR}, {frames.Stderr, pp.stderrR}} {
		go func() {
			defer rd.finished()
			pump(s.r, func(b []byte) { p.append(s.stream, b) })
		}()
	}
	go func() {
		<-child.Done()
		finishOutput(rd, m.cfg.Grace, pp.stdoutR, pp.stderrR)
		_ = pp.stdoutR.Close()
		_ = pp.stderrR.Close()
		p.finish()
		m.Forget(child)
		m.ReleaseLive()
		m.retire(p)
	}()
	return info, nil
}

func (p *Proc) append(stream byte, b []byte) {
	p.mu.Lock()
	p.out.append(stream, b)
	p.bytes[stream] += int64(len(b))
	p.wakeLocked()
	p.mu.Unlock()
}

func (p *Proc) wakeLocked() {
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
}

func (p *Proc) finish() {
	ws := p.child.Status()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exited = true
	p.endedAt = time.Now().UTC()
	p.exit.ExitCode, p.exit.Signal = ExitFields(ws)
	p.exit.DurationMs = p.endedAt.Sub(p.startedAt).Milliseconds()
	p.exit.StdoutBytes, p.exit.StderrBytes = p.bytes[frames.Stdout], p.bytes[frames.Stderr]
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
	p.wakeLocked()
}

// retire moves an exited process to the exited list, dropping the oldest beyond KeepExited.
func (m *Manager) retire(p *Proc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.exitedOrder = append(m.exitedOrder, p)
	for len(m.exitedOrder) > KeepExited {
		old := m.exitedOrder[0]
		m.exitedOrder = m.exitedOrder[1:]
		delete(m.procs, old.id)
		for i, q := range m.order {
			if q == old {
				m.order = append(m.order[:i], m.order[i+1:]...)
				break
			}
		}
	}
}

// Process returns a background process by id.
func (m *Manager) Process(id string) (*Proc, error) {
	m.mu.Lock()
	p := m.procs[id]
	m.mu.Unlock()
	if p == nil {
		return nil, errs.NotFound("no process %q in this box", id)
	}
	return p, nil
}

// Processes lists the background processes: running first, then exited, each in start order.
func (m *Manager) Processes() []Info {
	m.mu.Lock()
	procs := append([]*Proc(nil), m.order...)
	m.mu.Unlock()
	running := make([]Info, 0, len(procs))
	var exited []Info
	for _, p := range procs {
		if info := p.Info(); info.Status == "running" {
			running = append(running, info)
		} else {
			exited = append(exited, info)
		}
	}
	return append(running, exited...)
}

// Info is the process's current state.
func (p *Proc) Info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := Info{
		ProcessID: p.id, Pid: p.child.Pid, Command: p.command, Tag: p.tag, Status: "running",
		StartedAt: p.startedAt, OutputBytes: p.out.end, DroppedBytes: p.out.start,
	}
	if p.exited {
		ended, code := p.endedAt, p.exit.ExitCode
		info.Status, info.EndedAt, info.ExitCode, info.Signal = "exited", &ended, &code, p.exit.Signal
	}
	return info
}

// WriteStdin copies r to the process's stdin, then closes it when eof. It gives up when ctx
// ends (a process that does not read would otherwise hold the request forever).
func (p *Proc) WriteStdin(ctx context.Context, r io.Reader, eof bool) (int64, error) {
	select {
	case p.stdinMu <- struct{}{}:
		defer func() { <-p.stdinMu }()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	p.mu.Lock()
	f, exited := p.stdin, p.exited
	p.mu.Unlock()
	switch {
	case exited:
		return 0, errs.Conflict("process %s has exited", p.id)
	case f == nil:
		return 0, errs.Conflict("stdin of process %s is closed", p.id)
	}
	_ = f.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Now()) })
	n, err := io.Copy(f, r)
	stop()
	if err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return n, errs.Conflict("process %s closed its stdin or exited", p.id)
		}
		return n, errs.Invalid("stdin of process %s: %v (%d bytes were written)", p.id, err, n)
	}
	if eof {
		p.mu.Lock()
		if p.stdin != nil {
			_ = p.stdin.Close()
			p.stdin = nil
		}
		p.mu.Unlock()
	}
	return n, nil
}

// Signal sends the named signal to the process's group.
func (p *Proc) Signal(name string) (Info, error) {
	sig, ok := ParseSignal(name)
	if !ok {
		return Info{}, errs.Invalid("unknown signal %q: one of TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT", name)
	}
	if err := p.child.SignalGroup(sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return Info{}, errs.Conflict("process %s has exited", p.id)
		}
		return Info{}, errs.Internal("signal %s: %v", name, err)
	}
	return p.Info(), nil
}

// StreamOutput receives a process's output stream. An error stops the stream (client gone).
type StreamOutput interface {
	// Start: the stream continues at offset; dropped bytes before it were evicted. Sent first,
	// and again whenever the reader fell so far behind that output it had not got was evicted.
	Start(offset, dropped int64) error
	Output(c Chunk) error
	Exit(e Exit) error
	Flush() error
}

// Stream replays the output from offset since, then (follow) tails it until the process exits
// or ctx ends. The exit is sent once the process has ended and its output was all sent.
func (p *Proc) Stream(ctx context.Context, since int64, follow bool, out StreamOutput) error {
	if since < 0 {
		return errs.Invalid("since must be >= 0")
	}
	var chunks []Chunk
	cursor := since
	first := true
	for {
		p.mu.Lock()
		from, cs := p.out.since(cursor, chunks)
		chunks = cs
		exited, exit := p.exited, p.exit
		var wake chan struct{}
		if follow && !exited {
			if p.wake == nil {
				p.wake = make(chan struct{})
			}
			wake = p.wake
		}
		p.mu.Unlock()

		if first || from > cursor {
			if err := out.Start(from, max(0, from-cursor)); err != nil {
				return err
			}
			first = false
		}
		cursor = from
		for _, c := range chunks {
			if err := out.Output(c); err != nil {
				return err
			}
			cursor += int64(len(c.Data))
		}
		clear(chunks) // do not pin evicted output while waiting
		if exited {
			return out.Exit(exit)
		}
		if !follow {
			return nil
		}
		if len(chunks) > 0 {
			continue // more may have come while sending
		}
		if err := out.Flush(); err != nil {
			return err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil
		}
	}
}
