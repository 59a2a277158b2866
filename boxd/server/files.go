package server

import (
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/files"
)

// box is the file system the file and archive routes see: boxd's own directories cut out.
func (s *server) box() *files.Box { return files.NewBox(s.Protected) }

func (s *server) readFile(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, max := q.str("path"), q.positive("max_bytes", defaultMaxBytes)
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	f, size, err := s.box().Open(path, max)
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
	res, err := s.box().Write(path, r.Body, max, mode)
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
	l, err := s.box().List(path, recursive, int(min(limit, 1<<30)))
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
	res, err := s.box().Delete(path, recursive)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *server) readArchive(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	path, gz := q.str("path"), q.bool("gzip")
	// No limit unless asked for (0); counted as PUT /v1/archive counts.
	lim := files.Limits{Bytes: q.int("max_bytes", 0), Entries: q.int("max_entries", 0)}
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	a, err := s.box().PrepareArchive(path, lim)
	if err != nil {
		writeError(w, err)
		return
	}
	defer a.Close()
	// What the tree held when counted; the stream never goes past the limits asked for.
	entries, bytes := strconv.FormatInt(a.Entries, 10), strconv.FormatInt(a.Bytes, 10)
	if !gz {
		// Uncompressed: written onto the connection itself, file contents with sendfile.
		if conn, rw, err := http.NewResponseController(w).Hijack(); err == nil {
			defer conn.Close()
			_ = conn.SetDeadline(time.Time{}) // the server's header timeout must not cut the stream
			_ = rw.Writer.Flush()
			cw := newChunkedConn(conn)
			_, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nTransfer-Encoding: chunked\r\n"+
				"X-Boxd-Archive-Entries: "+entries+"\r\nX-Boxd-Archive-Bytes: "+bytes+"\r\nConnection: close\r\n\r\n")
			if err == nil {
				err = a.WriteTo(cw, false)
			}
			if err == nil {
				_ = cw.Close()
			}
			// On an error the connection closes without the last chunk: a broken transfer.
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-tar")
	if gz {
		w.Header().Set("Content-Type", "application/gzip")
	}
	w.Header().Set("X-Boxd-Archive-Entries", entries)
	w.Header().Set("X-Boxd-Archive-Bytes", bytes)
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
	lim := files.Limits{Bytes: q.positive("max_bytes", defaultMaxBytes), Entries: q.positive("max_entries", defaultMaxEntries)}
	replace := q.bool("replace")
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	extract := s.box().Extract
	if replace {
		extract = s.box().ExtractReplacing
	}
	res, err := extract(path, r.Body, lim)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
