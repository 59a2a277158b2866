// Package reqlog writes one log line per HTTP request: route, status, duration. Never bodies,
// queries (paths, commands) or env. Shared by boxd's server and the mounts sidecar.
package reqlog

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Handler logs each request next serves.
func Handler(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &recorder{ResponseWriter: w}
		defer func() {
			route := r.Pattern
			if route == "" || route == "/" {
				route = r.Method + " " + r.URL.Path // unauthenticated or unknown: the path only
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "request",
				slog.String("route", route), slog.Int("status", rec.status()),
				slog.Float64("duration_ms", float64(time.Since(began).Microseconds())/1000))
		}()
		next.ServeHTTP(rec, r)
	})
}

// recorder remembers the status and passes flushing, hijacking and sendfile through.
type recorder struct {
	http.ResponseWriter
	code int
}

func (rec *recorder) status() int {
	if rec.code == 0 {
		return http.StatusOK
	}
	return rec.code
}

func (rec *recorder) WriteHeader(code int) {
	if rec.code == 0 {
		rec.code = code
	}
	rec.ResponseWriter.WriteHeader(code)
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return rec.ResponseWriter.Write(p)
}

func (rec *recorder) ReadFrom(r io.Reader) (int64, error) {
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return io.Copy(rec.ResponseWriter, r) // the server's own ReadFrom (sendfile) when it has one
}

func (rec *recorder) FlushError() error {
	return http.NewResponseController(rec.ResponseWriter).Flush()
}

func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	rec.code = http.StatusSwitchingProtocols
	return http.NewResponseController(rec.ResponseWriter).Hijack()
}

func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }
