package process

import (
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
)

// The reaper is process-wide by nature: one loop owns wait4(-1) for the whole boxd process. As
// PID 1 it reaps every zombie of the container; otherwise (tests, development) boxd makes itself
// a child subreaper so orphans of its commands come back to it too. Commands boxd starts get
// their exit status from this loop (never from a wait of their own, which would race with it):
// Spawn registers the pid under the same lock the loop takes to hand a status out, so a child
// that exits at once still finds its waiter.
var reaper struct {
	once    sync.Once
	mu      sync.Mutex
	waiting map[int]*Child
}

const prSetChildSubreaper = 36

func startReaper() {
	reaper.waiting = make(map[int]*Child)
	if os.Getpid() != 1 {
		// Best effort: without it orphans go to the real init, which reaps them.
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	}
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	go func() {
		for range sigchld {
			reapAll()
		}
	}()
	reapAll() // zombies inherited before the handler was installed
}

// reapAll collects every exited child; signals coalesce, so one SIGCHLD may stand for many.
func reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		reaper.mu.Lock()
		c := reaper.waiting[pid]
		delete(reaper.waiting, pid)
		reaper.mu.Unlock()
		if c != nil {
			c.finish(ws)
		}
	}
}

// Spec describes a process to start.
type Spec struct {
	Path string   // executable (absolute, or found by the caller)
	Argv []string // including argv[0]
	Env  []string
	Dir  string
	// Files become the child's fds 0, 1, 2, ...; they are not closed here.
	Files []*os.File
	// Setctty makes Files[0] the controlling terminal (PTY); the child always gets a new session.
	Setctty bool
	// ExecID marks the process tree (SANDBOX_EXEC_ID, already in Env) for KillTree.
	ExecID string
}

// Child is a started process whose exit status the reaper delivers.
type Child struct {
	Pid    int
	ExecID string
	done   chan struct{}
	mu     sync.Mutex
	status syscall.WaitStatus
	exited bool
}

// Spawn starts a process in a new session (so in its own process group, led by it).
func Spawn(s Spec) (*Child, error) {
	reaper.once.Do(startReaper)
	fds := make([]uintptr, len(s.Files))
	for i, f := range s.Files {
		fds[i] = f.Fd()
	}
	attr := &syscall.ProcAttr{
		Dir:   s.Dir,
		Env:   s.Env,
		Files: fds,
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: s.Setctty, Ctty: 0},
	}
	c := &Child{ExecID: s.ExecID, done: make(chan struct{})}
	reaper.mu.Lock()
	pid, err := syscall.ForkExec(s.Path, s.Argv, attr)
	if err == nil {
		c.Pid = pid
		reaper.waiting[pid] = c
	}
	reaper.mu.Unlock()
	runtime.KeepAlive(s.Files)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Child) finish(ws syscall.WaitStatus) {
	c.mu.Lock()
	c.status, c.exited = ws, true
	c.mu.Unlock()
	close(c.done)
}

// Done is closed when the process has exited and been reaped.
func (c *Child) Done() <-chan struct{} { return c.done }

// Status is the wait status; valid once Done is closed.
func (c *Child) Status() syscall.WaitStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// SignalGroup sends sig to the process group the child leads, while the child is not yet
// reaped (after that its pid, and so the group id, may belong to someone else).
func (c *Child) SignalGroup(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return syscall.ESRCH
	}
	return syscall.Kill(-c.Pid, sig)
}

// KillTree SIGKILLs everything the child started: its process group and session (only while the
// child is unreaped, for the reason above) and every process carrying its SANDBOX_EXEC_ID.
func (c *Child) KillTree() {
	c.mu.Lock()
	sid := 0
	if !c.exited {
		sid = c.Pid
		_ = syscall.Kill(-c.Pid, syscall.SIGKILL)
	}
	c.mu.Unlock()
	killTree(sid, c.ExecID)
}
