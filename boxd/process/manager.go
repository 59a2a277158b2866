// Package process is boxd's process manager: it starts every command (exec, background
// process, terminal) through one reaper, enforces the exec concurrency cap and the process
// limit, keeps background processes with their bounded output, and kills whole process trees.
package process

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"sandbox-bridge.io/boxd/errs"
)

// Config of the manager.
type Config struct {
	Workdir     string // default cwd of commands
	OutputBytes int64  // output kept per background process
	// Grace is how long output is still read after a command exited while something it left
	// behind keeps its stdout/stderr open (e.g. `daemon &`); then boxd stops reading.
	Grace time.Duration
}

// Manager owns every process boxd starts.
type Manager struct {
	cfg     Config
	Env     *Env
	shell   string
	devNull *os.File
	idBase  string
	seq     atomic.Uint64

	mu           sync.Mutex
	execs        int              // execs running
	live         int              // background processes and terminals running
	children     map[*Child]bool  // everything running, for Shutdown
	procs        map[string]*Proc // running and the newest exited
	order        []*Proc          // the same, in start order
	exitedOrder  []*Proc          // the exited ones, in exit order
	nextProc     int
	shuttingDown bool
}

// KeepExited is how many exited background processes stay listed.
const KeepExited = 100

// NewManager finds sh on boxd's PATH (the image's) and opens /dev/null for commands without stdin.
func NewManager(cfg Config, env *Env) (*Manager, error) {
	shell, err := exec.LookPath("sh")
	if err != nil {
		return nil, fmt.Errorf("no sh on PATH (%s): commands cannot run: %w", os.Getenv("PATH"), err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	if cfg.Grace == 0 {
		cfg.Grace = 100 * time.Millisecond
	}
	if cfg.OutputBytes <= 0 {
		cfg.OutputBytes = 4 << 20
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	return &Manager{
		cfg: cfg, Env: env, shell: shell, devNull: devNull,
		// Unique across boxd instances too (tests run several in one machine), so KillTree
		// never matches another instance's processes.
		idBase:   hex.EncodeToString(nonce[:]),
		children: map[*Child]bool{},
		procs:    map[string]*Proc{},
	}, nil
}

// Shell is the sh commands run with.
func (m *Manager) Shell() string { return m.shell }

// Workdir is the default cwd.
func (m *Manager) Workdir() string { return m.cfg.Workdir }

// NewExecID returns a fresh value for ExecIDVar.
func (m *Manager) NewExecID() string {
	return m.idBase + "-" + strconv.FormatUint(m.seq.Add(1), 10)
}

// Start starts a process marked with a fresh exec id and tracks it until Forget.
func (m *Manager) Start(s Spec) (*Child, error) {
	m.mu.Lock()
	if m.shuttingDown {
		m.mu.Unlock()
		return nil, errs.Internal("the box is shutting down")
	}
	m.mu.Unlock()
	if s.Dir == "" {
		s.Dir = m.cfg.Workdir
	}
	c, err := Spawn(s)
	if err != nil {
		return nil, errs.Internal("start %s: %v", s.Path, err)
	}
	m.mu.Lock()
	m.children[c] = true
	m.mu.Unlock()
	return c, nil
}

// Forget stops tracking a child that has exited.
func (m *Manager) Forget(c *Child) {
	m.mu.Lock()
	delete(m.children, c)
	m.mu.Unlock()
}

// checkCommand validates what every `sh -c` command has (a command, an absolute cwd, valid env
// names and values) and returns the cwd to use.
func (m *Manager) checkCommand(command, cwd string, env map[string]string) (string, error) {
	if strings.TrimSpace(command) == "" {
		return "", errs.Invalid("command is required")
	}
	if cwd == "" {
		cwd = m.cfg.Workdir
	}
	if !filepath.IsAbs(cwd) || strings.IndexByte(cwd, 0) >= 0 {
		return "", errs.Invalid("cwd must be an absolute path")
	}
	for k, v := range env {
		if err := CheckVar(k, v); err != nil {
			return "", err
		}
	}
	return cwd, nil
}

// startShell starts `sh -c command` on p's child ends (stdin /dev/null when p has none), marked
// with a fresh exec id, and closes the child ends.
func (m *Manager) startShell(command, cwd string, env map[string]string, p *pipes) (*Child, error) {
	stdin := m.devNull
	if p.stdinR != nil {
		stdin = p.stdinR
	}
	id := m.NewExecID()
	child, err := m.Start(Spec{
		Path:   m.shell,
		Argv:   []string{"sh", "-c", command},
		Env:    m.Env.Build(env, ExecIDVar+"="+id),
		Dir:    cwd,
		Files:  []*os.File{stdin, p.stdoutW, p.stderrW},
		ExecID: id,
	})
	p.closeChildEnds()
	if err != nil {
		return nil, errs.As(err)
	}
	return child, nil
}

// CheckDir returns "" when dir is an existing directory, else why not (for the user).
func CheckDir(dir string) string {
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		if pe, ok := err.(*os.PathError); ok {
			return fmt.Sprintf("cwd %s: %v", dir, pe.Err)
		}
		return fmt.Sprintf("cwd %s: %v", dir, err)
	case !fi.IsDir():
		return fmt.Sprintf("cwd %s: not a directory", dir)
	}
	return ""
}

// AcquireLive takes a slot of the background-process limit (terminals count too).
func (m *Manager) AcquireLive(max int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live >= max {
		return errs.TooMany("%d processes are running in this box (the limit); stop one first", m.live)
	}
	m.live++
	return nil
}

// ReleaseLive gives a slot back.
func (m *Manager) ReleaseLive() {
	m.mu.Lock()
	m.live--
	m.mu.Unlock()
}

// ShuttingDown reports whether Shutdown was called: a stream that ends now ends with an error
// frame, not an exit.
func (m *Manager) ShuttingDown() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shuttingDown
}

// Shutdown refuses new processes and kills every process: as PID 1 everything in the
// container (kill(-1)), otherwise every tree boxd started.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	m.shuttingDown = true
	children := make([]*Child, 0, len(m.children))
	for c := range m.children {
		children = append(children, c)
	}
	m.mu.Unlock()
	if os.Getpid() == 1 {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		return
	}
	for _, c := range children {
		c.KillTree()
	}
}

// Freeze stops (true) or continues (false) every process in the box while idle sleep takes its
// snapshot, so nothing changes the workspace under it: as PID 1 everything in the container
// (kill(-1) spares PID 1 itself), otherwise every process group boxd started.
func (m *Manager) Freeze(stop bool) {
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	if os.Getpid() == 1 {
		_ = syscall.Kill(-1, sig)
		return
	}
	m.mu.Lock()
	children := make([]*Child, 0, len(m.children))
	for c := range m.children {
		children = append(children, c)
	}
	m.mu.Unlock()
	for _, c := range children {
		_ = c.SignalGroup(sig)
	}
}

// ExitFields are the exit code (128+n when killed by signal n) and the signal name.
func ExitFields(ws syscall.WaitStatus) (code int, signal string) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), SignalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}
