// Package pty runs interactive terminals: a pseudo-terminal pair from /dev/ptmx, a shell on
// its slave side as session leader with it as controlling terminal, and frames both ways on
// an upgraded HTTP connection (PROTOCOL.md, "PTY").
package pty

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/frames"
	"sandbox-bridge.io/boxd/process"
)

// Open returns a new pseudo-terminal pair. The master is non-blocking (Go's poller reads it);
// the slave is for the child.
func Open() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var n uint32
	err = control(master, func(fd uintptr) error {
		var unlock int32
		if err := ioctl(fd, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
			return fmt.Errorf("unlockpt: %w", err)
		}
		if err := ioctl(fd, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
			return fmt.Errorf("ptsname: %w", err)
		}
		return nil
	})
	if err == nil {
		slave, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	}
	if err != nil {
		_ = master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// Resize sets the terminal's size (the shell gets SIGWINCH).
func Resize(master *os.File, cols, rows int) error {
	ws := struct{ Row, Col, X, Y uint16 }{Row: uint16(rows), Col: uint16(cols)}
	return control(master, func(fd uintptr) error {
		return ioctl(fd, syscall.TIOCSWINSZ, unsafe.Pointer(&ws))
	})
}

// control runs fn on the file's descriptor without taking it out of non-blocking mode (as
// File.Fd would).
func control(f *os.File, fn func(fd uintptr) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(fd) }); err != nil {
		return err
	}
	return ferr
}

func ioctl(fd, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// Request opens a terminal (GET /v1/pty).
type Request struct {
	Cols, Rows   int
	Cwd          string
	Command      string // "": a login shell (bash -l if the image has bash, else sh -l)
	MaxProcesses int
}

// Session is a started terminal, waiting for its connection.
type Session struct {
	m      *process.Manager
	master *os.File
	child  *process.Child
	began  time.Time
}

// Start validates req, takes a process slot and starts the terminal's shell. Its errors come
// before the connection is upgraded, so they are plain JSON answers.
func Start(m *process.Manager, req Request) (*Session, error) {
	if req.Cols <= 0 || req.Rows <= 0 || req.Cols > 10000 || req.Rows > 10000 {
		return nil, errs.Invalid("cols and rows must be between 1 and 10000")
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = m.Workdir()
	}
	if cwd[0] != '/' {
		return nil, errs.Invalid("cwd must be an absolute path")
	}
	if msg := process.CheckDir(cwd); msg != "" {
		return nil, errs.Invalid("%s", msg)
	}
	path, argv := m.Shell(), []string{"sh", "-c", req.Command}
	if req.Command == "" {
		path, argv = m.Shell(), []string{"sh", "-l"}
		if bash, err := exec.LookPath("bash"); err == nil {
			path, argv = bash, []string{"bash", "-l"}
		}
	}
	max := req.MaxProcesses
	if max <= 0 {
		max = process.DefaultMaxProcesses
	}
	if err := m.AcquireLive(max); err != nil {
		return nil, err
	}
	master, slave, err := Open()
	if err != nil {
		m.ReleaseLive()
		return nil, errs.Internal("open a pseudo-terminal: %v", err)
	}
	if err := Resize(master, req.Cols, req.Rows); err != nil {
		_ = master.Close()
		_ = slave.Close()
		m.ReleaseLive()
		return nil, errs.Internal("set the terminal size: %v", err)
	}
	id := m.NewExecID()
	child, err := m.Start(process.Spec{
		Path:    path,
		Argv:    argv,
		Env:     m.Env.Build(nil, "TERM=xterm-256color", process.ExecIDVar+"="+id),
		Dir:     cwd,
		Files:   []*os.File{slave, slave, slave},
		Setctty: true,
		ExecID:  id,
	})
	_ = slave.Close()
	if err != nil {
		_ = master.Close()
		m.ReleaseLive()
		return nil, err
	}
	return &Session{m: m, master: master, child: child, began: time.Now()}, nil
}

// Pid of the terminal's shell.
func (s *Session) Pid() int { return s.child.Pid }

// Serve carries the terminal over conn (already upgraded; rw holds what was buffered) until
// the shell exits, then sends exit and closes conn. When the connection drops first, the
// terminal's processes are killed.
func (s *Session) Serve(conn net.Conn, rw *bufio.ReadWriter) {
	defer s.m.ReleaseLive()
	defer s.m.Forget(s.child)
	defer s.master.Close()
	defer conn.Close()

	fw := frames.NewWriter(rw.Writer, rw.Writer.Flush)
	_ = fw.WriteJSON(frames.Start, map[string]int{"pid": s.child.Pid})
	_ = fw.Flush()

	gone := make(chan struct{}) // the client went away
	var goneOnce sync.Once
	hangup := func() { goneOnce.Do(func() { close(gone) }) }

	var outBytes int64
	rd := make(chan struct{})
	go func() {
		defer close(rd)
		buf := make([]byte, 32<<10)
		for {
			n, err := s.master.Read(buf)
			if n > 0 {
				outBytes += int64(n)
				if fw.WriteFlush(frames.Stdout, buf[:n]) != nil {
					hangup()
				}
			}
			if err != nil { // EIO once every slave fd is closed
				return
			}
		}
	}()

	go func() {
		s.input(frames.NewReader(rw.Reader))
		hangup()
	}()

	select {
	case <-s.child.Done():
	case <-gone:
		s.child.KillTree()
		<-s.child.Done()
	}
	// Output still buffered in the terminal is read until every slave holder is gone, or for
	// a moment when something the shell left behind keeps the terminal open.
	select {
	case <-rd:
	case <-time.After(100 * time.Millisecond):
		_ = s.master.Close()
		<-rd
	}
	code, signal := process.ExitFields(s.child.Status())
	select {
	case <-gone: // nobody to tell
	default:
		if s.m.ShuttingDown() {
			_ = fw.WriteJSON(frames.Error, map[string]string{"type": "internal_error", "message": "the box is shutting down"})
		} else {
			_ = fw.WriteJSON(frames.Exit, process.Exit{
				ExitCode: code, Signal: signal, StdoutBytes: outBytes,
				DurationMs: time.Since(s.began).Milliseconds(),
			})
		}
		_ = fw.Flush()
	}
}

// input applies the client's frames to the terminal until the connection ends.
func (s *Session) input(fr *frames.Reader) {
	for {
		typ, payload, err := fr.Next()
		if err != nil {
			return
		}
		switch typ {
		case frames.Stdin:
			if _, err := s.master.Write(payload); err != nil {
				return
			}
		case frames.Resize:
			var size struct{ Cols, Rows int }
			if json.Unmarshal(payload, &size) == nil && size.Cols > 0 && size.Rows > 0 && size.Cols <= 10000 && size.Rows <= 10000 {
				_ = Resize(s.master, size.Cols, size.Rows)
			}
		case frames.EOF:
			// End of input on a terminal is the EOF character (^D) at the start of a line.
			if _, err := s.master.Write([]byte{4}); err != nil {
				return
			}
		}
	}
}

// Abort ends a session that never got its connection.
func (s *Session) Abort() {
	s.child.KillTree()
	<-s.child.Done()
	_ = s.master.Close()
	s.m.Forget(s.child)
	s.m.ReleaseLive()
}
