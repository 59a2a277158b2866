package server

import (
	"encoding/json"
	"net/http"
	"time"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/watch"
)

// watchFiles streams a file watch as NDJSON: ready, file-system events (overflow where some were
// dropped), and end. Not a call at work (fence.go): an open watch does not keep the box awake,
// and a sleep's fence ends it (reason sleep), as does boxd stopping (shutdown).
func (s *server) watchFiles(w http.ResponseWriter, r *http.Request) {
	if s.Watch == nil {
		writeError(w, errs.NotFound("no route %s %s", r.Method, r.URL.Path))
		return
	}
	q := newQuery(r)
	path := q.str("path")
	o := watch.Options{
		Recursive:  q.bool("recursive"),
		Queue:      int(min(q.positive("queue", 4096), 1<<16)),
		MaxWatches: int(min(q.positive("max_watches", 16), 1024)),
	}
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	wt, err := s.Watch.Watch(path, o)
	if err != nil {
		writeError(w, err)
		return
	}
	defer wt.Close()
	// A fence raised before the watch was registered ended none: this one ends at once.
	if _, fence := s.gate.state(); fence != 0 {
		wt.End("sleep")
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for {
		e, err := wt.Next(r.Context())
		if err != nil {
			return // the end was sent, or the caller left
		}
		// Events already queued go out together; the line is flushed once none is waiting.
		for ok := true; ok; e, ok = wt.TryNext() {
			if enc.Encode(e) != nil {
				return
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// boxMetrics answers the box's use now and, with since (RFC 3339), the samples kept after it.
// Not a call at work: reading it does not keep the box awake.
func (s *server) boxMetrics(w http.ResponseWriter, r *http.Request) {
	if s.Metrics == nil {
		writeError(w, errs.NotFound("no route %s %s", r.Method, r.URL.Path))
		return
	}
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeError(w, errs.Invalid("since must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z"))
			return
		}
		since = t
	}
	a, err := s.Metrics.Read(since)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}
