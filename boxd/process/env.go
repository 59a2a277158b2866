package process

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"

	"sandbox-bridge.io/boxd/errs"
)

// Env is the box env: variables set through /v1/env (and loaded from the Secret's copy at
// start) that every later exec, process and terminal gets.
type Env struct {
	base []string // boxd's own environment (the container's)
	mu   sync.RWMutex
	vars map[string]string
}

// NewEnv starts from base (boxd's own environment, os.Environ()).
func NewEnv(base []string) *Env {
	return &Env{base: base, vars: map[string]string{}}
}

// LoadFile merges the JSON object in path (the Secret's durable copy). A missing file is fine:
// the box has no env yet.
func (e *Env) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var vars map[string]string
	if err := json.Unmarshal(b, &vars); err != nil {
		return fmt.Errorf("%s: not a JSON object of strings: %w", path, err)
	}
	if _, err := e.Set(vars); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Set merges vars into the box env and returns how many variables are now set. Names must
// match ^[A-Za-z_][A-Za-z0-9_]*$ and values hold no NUL; otherwise nothing changes.
func (e *Env) Set(vars map[string]string) (int, error) {
	for k, v := range vars {
		if err := CheckVar(k, v); err != nil {
			return 0, err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, v := range vars {
		e.vars[k] = v
	}
	return len(e.vars), nil
}

// CheckVar validates one variable (values are never echoed back in the message).
func CheckVar(name, value string) error {
	if !validName(name) {
		return errs.Invalid("invalid environment variable name %q: must match ^[A-Za-z_][A-Za-z0-9_]*$", name)
	}
	if strings.IndexByte(value, 0) >= 0 {
		return errs.Invalid("environment variable %s: value contains a NUL byte", name)
	}
	return nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Build returns the environment of one command, later entries winning: boxd's own, the box
// env, the call's env, then extra (e.g. SANDBOX_EXEC_ID, TERM).
func (e *Env) Build(call map[string]string, extra ...string) []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make([]string, 0, len(e.base)+len(e.vars)+len(call)+len(extra))
	index := make(map[string]int, cap(out))
	put := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			out[i] = kv
			return
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range e.base {
		put(kv)
	}
	for k, v := range e.vars {
		put(k + "=" + v)
	}
	for k, v := range call {
		put(k + "=" + v)
	}
	for _, kv := range extra {
		put(kv)
	}
	return out
}

// Count is the number of box env variables set.
func (e *Env) Count() int {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return len(e.vars)
}
