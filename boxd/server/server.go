// Package server is boxd's HTTP side: routes, the token check, JSON errors and the request log.
// Handlers are thin: they parse, call process/, files/ or pty/, and write the answer.
package server

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"sandbox-bridge.io/boxd/auth"
	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/metrics"
	"sandbox-bridge.io/boxd/ports"
	"sandbox-bridge.io/boxd/process"
	"sandbox-bridge.io/boxd/reqlog"
	"sandbox-bridge.io/boxd/watch"
)

// Config of the server.
type Config struct {
	Version   string
	StartedAt time.Time
	Auth      *auth.Checker
	Procs     *process.Manager
	// Protected are directories delete refuses to touch (boxd's binary and secret mounts).
	Protected []string
	// Ports serves /v1/ports/{port}/... (package ports); nil: no such route.
	Ports http.Handler
	// Watch serves /v1/files/watch, Metrics /v1/metrics; nil: no such route.
	Watch   *watch.Hub
	Metrics *metrics.Sampler
	Log     *slog.Logger
}

// Limits used when a request names none.
const (
	maxJSONBody        = 1 << 20
	defaultMaxBytes    = 50 << 20
	defaultMaxEntries  = 100_000
	defaultListLimit   = 10_000
	defaultTerminalCol = 80
	defaultTerminalRow = 24
)

type server struct {
	Config
	// gate counts the calls at work (idle sleep must not take a box while a command, stream or
	// terminal is still at work in it) and holds a sleep's write fence (fence.go).
	gate gate
}

// New returns boxd's handler.
func New(cfg Config) http.Handler {
	s := &server{Config: cfg}
	if cfg.Procs != nil {
		s.gate.freeze = cfg.Procs.Freeze
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.health)
	mux.HandleFunc("GET /v1/activity", s.activity)
	mux.HandleFunc("POST /v1/fence", s.raiseFence)
	mux.HandleFunc("DELETE /v1/fence", s.liftFence)
	mux.HandleFunc("POST /v1/exec", s.exec)
	mux.HandleFunc("POST /v1/env", s.setEnv)
	mux.HandleFunc("POST /v1/processes", s.startProcess)
	mux.HandleFunc("GET /v1/processes", s.listProcesses)
	mux.HandleFunc("GET /v1/processes/{id}", s.getProcess)
	mux.HandleFunc("GET /v1/processes/{id}/output", s.processOutput)
	mux.HandleFunc("POST /v1/processes/{id}/stdin", s.processStdin)
	mux.HandleFunc("POST /v1/processes/{id}/signal", s.signalProcess)
	mux.HandleFunc("GET /v1/pty", s.pty)
	mux.HandleFunc("GET /v1/files", s.readFile)
	mux.HandleFunc("PUT /v1/files", s.writeFile)
	mux.HandleFunc("DELETE /v1/files", s.deleteFile)
	mux.HandleFunc("GET /v1/files/list", s.listFiles)
	mux.HandleFunc("GET /v1/files/watch", s.watchFiles)
	mux.HandleFunc("GET /v1/metrics", s.boxMetrics)
	mux.HandleFunc("GET /v1/archive", s.readArchive)
	mux.HandleFunc("PUT /v1/archive", s.writeArchive)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errs.NotFound("no route %s %s", r.Method, r.URL.Path))
	})
	return s.logged(s.authenticated(s.admitted(s.portsFirst(mux))))
}

// portsFirst sends /v1/ports/ to the ports proxy before the mux, which would clean the app's
// path (a "//" or ".." redirected) and accepts only the methods it knows; every method passes.
func (s *server) portsFirst(mux http.Handler) http.Handler {
	if s.Ports == nil {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, ports.Prefix) {
			mux.ServeHTTP(w, r)
			return
		}
		r.Pattern = ports.Pattern // what the request log names, never the app's path
		s.Ports.ServeHTTP(w, r)
	})
}

func (s *server) health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{
		"status": "ok", "version": s.Version, "started_at": s.StartedAt.UTC().Format(time.RFC3339Nano),
	})
}

// authenticated requires the token on every route but health.
func (s *server) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health" && !s.Auth.Valid(r.Header.Get(auth.Header)) {
			writeError(w, errs.New(http.StatusUnauthorized, "missing or wrong %s", auth.Header))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// logged writes one JSON line per request (reqlog): route, status, duration.
func (s *server) logged(next http.Handler) http.Handler { return reqlog.Handler(s.Log, next) }

// --- answers ---------------------------------------------------------------------------------

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	e := errs.As(err)
	if e.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, map[string]any{"error": map[string]string{"type": e.Type, "message": e.Message}})
}

// readJSON decodes a JSON body of at most maxJSONBody bytes, reading it to the end (only then
// does the server notice a client that goes away, which cancels exec).
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return errs.TooLarge("the JSON body is larger than %d bytes", maxJSONBody)
		}
		return errs.Invalid("reading the body: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errs.Invalid("the body is not valid JSON for this route: %v", err)
	}
	return nil
}

// query reads typed query parameters, keeping the first error.
type query struct {
	v   url.Values
	err error
}

func newQuery(r *http.Request) *query { return &query{v: r.URL.Query()} }

func (q *query) str(name string) string { return q.v.Get(name) }

func (q *query) int(name string, def int64) int64 {
	s := q.str(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		q.fail("%s must be a non-negative integer", name)
		return def
	}
	return n
}

func (q *query) positive(name string, def int64) int64 {
	n := q.int(name, def)
	if n == 0 {
		q.fail("%s must be > 0", name)
	}
	return n
}

func (q *query) bool(name string) bool {
	s := q.str(name)
	if s == "" {
		return false
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		q.fail("%s must be true or false", name)
	}
	return b
}

func (q *query) fail(format string, args ...any) {
	if q.err == nil {
		q.err = errs.Invalid(format, args...)
	}
}
