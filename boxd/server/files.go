package server

import (
	"io"
	"io/fs"
	"net/http"
	"strconv"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/files"
)

func (s *server) readFile(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, max := q.str("path"), q.positive("max_bytes", defaultMaxBytes)
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	f, size, err := files.Open(path, max)
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	// Exactly size bytes even if the file grows meanwhile (sendfile when the server can).
	_, _ = io.Copy(w, io.LimitReader(f, size))
}

func (s *server) writeFile(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, max := q.str("path"), q.positive("max_bytes", defaultMaxBytes)
	mode := fs.FileMode(0o644)
	if m := q.str("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o777 {
			q.fail("mode must be octal permission bits, e.g. 644")
		}
		mode = fs.FileMode(n)
	}
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	if r.ContentLength > max {
		writeError(w, errs.TooLarge("the content is %d bytes, more than the limit of %d; nothing was written", r.ContentLength, max))
		return
	}
	res, err := files.Write(path, r.Body, max, mode)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *server) listFiles(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, recursive, limit := q.str("path"), q.bool("recursive"), q.positive("limit", defaultListLimit)
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	l, err := files.List(path, recursive, int(min(limit, 1<<30)))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *server) deleteFile(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, recursive := q.str("path"), q.bool("recursive")
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	res, err := files.Delete(path, recursive, s.Protected)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *server) readArchive(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, gz := q.str("path"), q.bool("gzip")
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	a, err := files.PrepareArchive(path)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	if gz {
		w.Header().Set("Content-Type", "application/gzip")
	}
	w.WriteHeader(http.StatusOK)
	if err := a.WriteTo(w, gz); err != nil {
		// Mid-stream: end the response without its terminating chunk, so the client sees a
		// broken transfer rather than a short archive that looks whole.
		panic(http.ErrAbortHandler)
	}
}

func (s *server) writeArchive(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path := q.str("path")
	maxBytes, maxEntries := q.positive("max_bytes", defaultMaxBytes), q.positive("max_entries", defaultMaxEntries)
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	res, err := files.Extract(path, r.Body, maxBytes, maxEntries)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
