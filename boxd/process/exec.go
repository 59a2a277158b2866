package process

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/frames"
)

// ExecRequest is one command run to completion (POST /v1/exec).
type ExecRequest struct {
	Command        string
	Cwd            string            // absolute; "" for the workdir
	Env            map[string]string // over the box env, this call only
	Stdin          []byte            // nil: /dev/null
	Timeout        time.Duration
	MaxOutputBytes int64 // per stream; <= 0 for DefaultMaxOutputBytes
	MaxConcurrent  int   // <= 0 for DefaultMaxConcurrent
}

const (
	DefaultMaxOutputBytes = 1 << 20
	DefaultMaxConcurrent  = 5
	// TimeoutExitCode is the exit code of a command boxd killed for its timeout (GNU timeout's).
	TimeoutExitCode = 124
)

// Exit is the payload of an exit frame (exec, process output and terminal alike).
type Exit struct {
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out"`
	DurationMs      int64  `json:"duration_ms"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
}

// ExecOutput receives an exec's events. Output is called from two goroutines (stdout and
// stderr are read independently) and must not keep p.
type ExecOutput interface {
	Started(pid int)
	Output(stream byte, p []byte)
}

// Exec runs req.Command as `sh -c` in a new session and waits for it. At the timeout, or when
// ctx ends (the client went away), the whole tree is SIGKILLed. A cwd that is not a directory
// is reported like a failing command: a line on stderr and exit code 1. Errors (refusals) are
// returned before anything is sent to out.
func (m *Manager) Exec(ctx context.Context, req ExecRequest, out ExecOutput) (Exit, error) {
	cwd, err := m.checkCommand(req.Command, req.Cwd, req.Env)
	if err != nil {
		return Exit{}, err
	}
	if req.Timeout <= 0 {
		return Exit{}, errs.Invalid("timeout_ms must be > 0")
	}
	limit := req.MaxOutputBytes
	if limit <= 0 {
		limit = DefaultMaxOutputBytes
	}
	if err := m.acquireExec(req.MaxConcurrent); err != nil {
		return Exit{}, err
	}
	defer m.releaseExec()

	began := time.Now()
	if msg := CheckDir(cwd); msg != "" {
		line := []byte("boxd: " + msg + "\n")
		out.Output(frames.Stderr, line)
		return Exit{ExitCode: 1, StderrBytes: int64(len(line)), DurationMs: time.Since(began).Milliseconds()}, nil
	}

	p, err := newPipes(req.Stdin != nil)
	if err != nil {
		return Exit{}, errs.Internal("pipes: %v", err)
	}
	defer p.closeAll()
	child, err := m.startShell(req.Command, cwd, req.Env, p)
	if err != nil {
		return Exit{}, err
	}
	defer m.Forget(child)
	out.Started(child.Pid)

	var res Exit
	rd := newReaders(2)
	capture := func(stream byte, r *os.File, n *int64, truncated *bool) {
		defer rd.finished()
		pump(r, func(b []byte) {
			room := limit - *n
			*n += int64(len(b))
			if room <= 0 {
				*truncated = true
				return
			}
			if int64(len(b)) > room {
				b, *truncated = b[:room], true
			}
			out.Output(stream, b)
		})
	}
	go capture(frames.Stdout, p.stdoutR, &res.StdoutBytes, &res.StdoutTruncated)
	go capture(frames.Stderr, p.stderrR, &res.StderrBytes, &res.StderrTruncated)
	if p.stdinW != nil {
		w := p.stdinW
		p.stdinW = nil
		go func() {
			// Fails with EPIPE when the command exits without reading it all: fine.
			_, _ = w.Write(req.Stdin)
			_ = w.Close()
		}()
	}

	var timedOut atomic.Bool
	timer := time.AfterFunc(req.Timeout, func() {
		select {
		case <-child.Done():
		default:
			timedOut.Store(true)
			child.KillTree()
		}
	})
	stop := context.AfterFunc(ctx, child.KillTree)
	<-child.Done()
	timer.Stop()
	stop()
	finishOutput(rd, m.cfg.Grace, p.stdoutR, p.stderrR)

	res.ExitCode, res.Signal = ExitFields(child.Status())
	if timedOut.Load() {
		res.ExitCode, res.TimedOut = TimeoutExitCode, true
	}
	res.DurationMs = time.Since(began).Milliseconds()
	return res, nil
}

func (m *Manager) acquireExec(max int) error {
	if max <= 0 {
		max = DefaultMaxConcurrent
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.execs >= max {
		return errs.TooMany("%d commands are already running in this box (the limit); retry when one finishes", m.execs)
	}
	m.execs++
	return nil
}

func (m *Manager) releaseExec() {
	m.mu.Lock()
	m.execs--
	m.mu.Unlock()
}

// pipes of one command; the child's ends are closed right after it started.
type pipes struct {
	stdinR, stdinW   *os.File
	stdoutR, stdoutW *os.File
	stderrR, stderrW *os.File
}

func newPipes(stdin bool) (*pipes, error) {
	p := &pipes{}
	var err error
	if p.stdoutR, p.stdoutW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if p.stderrR, p.stderrW, err = os.Pipe(); err != nil {
		p.closeAll()
		return nil, err
	}
	if stdin {
		if p.stdinR, p.stdinW, err = os.Pipe(); err != nil {
			p.closeAll()
			return nil, err
		}
	}
	return p, nil
}

func (p *pipes) closeChildEnds() {
	for _, f := range []**os.File{&p.stdinR, &p.stdoutW, &p.stderrW} {
		if *f != nil {
			_ = (*f).Close()
			*f = nil
		}
	}
}

func (p *pipes) closeAll() {
	p.closeChildEnds()
	for _, f := range []**os.File{&p.stdinW, &p.stdoutR, &p.stderrR} {
		if *f != nil {
			_ = (*f).Close()
			*f = nil
		}
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// pump hands everything read from r to emit until EOF or until r is closed.
func pump(r *os.File, emit func([]byte)) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	for {
		n, err := r.Read(*bp)
		if n > 0 {
			emit((*bp)[:n])
		}
		if err != nil {
			return
		}
	}
}

// readers counts the goroutines reading one command's output.
type readers struct {
	left atomic.Int32
	done chan struct{} // closed when all have finished
}

func newReaders(n int32) *readers {
	r := &readers{done: make(chan struct{})}
	r.left.Store(n)
	return r
}

func (r *readers) finished() {
	if r.left.Add(-1) == 0 {
		close(r.done)
	}
}

// finishOutput waits, after the command exited, until its output is read to the end. If
// something it left behind still holds the pipes open, boxd stops reading once grace has passed
// and nothing is left unread in them: output already written is never dropped, however slowly
// the readers get the CPU (a box at its CPU limit runs boxd slowly too).
func finishOutput(r *readers, grace time.Duration, readEnds ...*os.File) {
	select {
	case <-r.done:
		return
	default:
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-r.done:
		return
	case <-t.C:
	}
	// Bounded, so a leftover that keeps writing cannot hold the exec open forever.
	for deadline := time.Now().Add(50 * grace); unread(readEnds) && time.Now().Before(deadline); {
		select {
		case <-r.done:
			return
		case <-time.After(grace / 10):
		}
	}
	for _, f := range readEnds {
		_ = f.Close()
	}
	<-r.done
}

// unread reports whether any of the pipes still holds bytes nobody has read.
func unread(files []*os.File) bool {
	for _, f := range files {
		conn, err := f.SyscallConn()
		if err != nil {
			continue
		}
		var n int32
		_ = conn.Control(func(fd uintptr) {
			_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		})
		if n > 0 {
			return true
		}
	}
	return false
}
