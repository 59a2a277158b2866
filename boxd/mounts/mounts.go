// Package mounts is boxd's "mounts" mode: the box pod's memory-store sidecar (docs/mounts.md).
// It runs beside the box container, not in it, and is the only writer of the memory volume the
// box container mounts read-only at /mnt/memory: so a read-only store is read-only by the
// kernel (EROFS), whatever box code tries. Read-write stores live in a second volume the box
// mounts read-write (/mnt/memory-rw) and appear under /mnt/memory as symlinks only this mode
// can make.
//
// It serves the bridge (and the operator, which syncs read-write stores before a sleep) on its
// own port, with the box's credential, and refuses every connection from the pod's own network
// namespace: box code shares that namespace (and can read the box's credential), but it cannot
// send from any other address without capabilities it does not have.
//
// Every path is taken relative to an os.Root, so a symlink box code plants in a read-write
// store never leads a write or a read out of that store.
package mounts

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"sandbox-bridge.io/boxd/auth"
	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/reqlog"
)

// Config of the mounts server.
type Config struct {
	Version string
	Auth    *auth.Checker
	// Memory is the volume the box sees read-only (/mnt/memory); RW the read-write one (/mnt/memory-rw).
	Memory, RW string
	// Local reports whether a peer address is the pod's own (then the call is refused). Nil:
	// loopback or an address of one of this network namespace's interfaces.
	Local func(ip net.IP) bool
	// MaxFileBytes bounds one file written or read (default 64 MiB); MaxFiles a listing (default 10,000).
	MaxFileBytes int64
	MaxFiles     int
	Log          *slog.Logger
}

// A store name: one path component, never hidden (the server's own entries start with a dot).
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

type server struct{ Config }

// New returns the mounts handler.
func New(cfg Config) http.Handler {
	if cfg.Local == nil {
		cfg.Local = LocalAddress
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = 64 << 20
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = 10_000
	}
	s := &server{cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": s.Version, "mode": "mounts"})
	})
	mux.HandleFunc("POST /v1/memory/{name}/stage", s.stage)
	mux.HandleFunc("PUT /v1/memory/{name}/stage/file", s.writeStaged)
	mux.HandleFunc("POST /v1/memory/{name}/commit", s.commit)
	mux.HandleFunc("GET /v1/memory/{name}/files", s.list)
	mux.HandleFunc("GET /v1/memory/{name}/file", s.read)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errs.NotFound("no route %s %s", r.Method, r.URL.Path))
	})
	return s.logged(s.guarded(mux))
}

// LocalAddress reports whether ip is loopback or one of this network namespace's own addresses.
func LocalAddress(ip net.IP) bool {
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // unknown: refuse
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// guarded refuses calls from the pod itself, then calls without the credential (health included:
// nothing in the box needs to see this server).
func (s *server) guarded(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || s.Local(ip) {
			writeError(w, errs.New(http.StatusForbidden, "the mounts server takes no calls from inside the box"))
			return
		}
		if !s.Auth.Valid(r.Header.Get(auth.Header)) {
			writeError(w, errs.New(http.StatusUnauthorized, "missing or wrong %s", auth.Header))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *server) logged(next http.Handler) http.Handler { return reqlog.Handler(s.Log, next) }

// --- routes ----------------------------------------------------------------------------------

// where a store of this kind is filled before it is committed, and where it then lives.
func (s *server) dirs(name string, readOnly bool) (base, stage, final string) {
	base = s.Memory
	if !readOnly {
		base = s.RW
	}
	return base, ".stage-" + name, name
}

func storeName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return "", errs.Invalid("store name %q: letters, digits, '.', '_', '-', starting with a letter or digit, at most 128", name)
	}
	return name, nil
}

func readOnlyOf(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("read_only")
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errs.Invalid("read_only must be true or false")
	}
	return b, nil
}

// relPath checks a file path inside a store: relative, clean, no parent steps, no dot-names at the top.
func relPath(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) || path.IsAbs(p) || path.Clean(p) != p || p == "." {
		return "", errs.Invalid("file path %q must be relative and clean", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", errs.Invalid("file path %q must not leave the store", p)
		}
	}
	return p, nil
}

// stage makes an empty staging directory for the store (a left-over one is removed first).
func (s *server) stage(w http.ResponseWriter, r *http.Request) {
	name, err := storeName(r)
	ro, err2 := readOnlyOf(r)
	if err = errors.Join(err, err2); err != nil {
		writeError(w, firstErr(err))
		return
	}
	base, stage, _ := s.dirs(name, ro)
	root, err := os.OpenRoot(base)
	if err != nil {
		writeError(w, errs.FromOS(base, err))
		return
	}
	defer root.Close()
	if err := root.RemoveAll(stage); err != nil {
		writeError(w, errs.FromOS(stage, err))
		return
	}
	if err := root.Mkdir(stage, 0o755); err != nil {
		writeError(w, errs.FromOS(stage, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"staged": true})
}

// writeStaged writes one file of the store into its staging directory (parents made).
func (s *server) writeStaged(w http.ResponseWriter, r *http.Request) {
	name, err := storeName(r)
	ro, err2 := readOnlyOf(r)
	rel, err3 := relPath(r.URL.Query().Get("path"))
	if err = errors.Join(err, err2, err3); err != nil {
		writeError(w, firstErr(err))
		return
	}
	if r.ContentLength > s.MaxFileBytes {
		writeError(w, errs.TooLarge("file %s is %d bytes, more than the limit of %d", rel, r.ContentLength, s.MaxFileBytes))
		return
	}
	base, stage, _ := s.dirs(name, ro)
	root, err := openIn(base, stage)
	if err != nil {
		writeError(w, errs.FromOS(stage, err))
		return
	}
	defer root.Close()
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			writeError(w, errs.FromOS(rel, err))
			return
		}
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		writeError(w, errs.FromOS(rel, err))
		return
	}
	n, err := io.Copy(f, io.LimitReader(r.Body, s.MaxFileBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > s.MaxFileBytes {
		err = errs.TooLarge("file %s is more than the limit of %d bytes", rel, s.MaxFileBytes)
	}
	if err != nil {
		_ = root.Remove(rel)
		writeError(w, errs.FromOS(rel, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": rel, "size": n})
}

// commit puts the staged store in place: a read-only store becomes /mnt/memory/<name>; a
// read-write one /mnt/memory-rw/<name>, with /mnt/memory/<name> a symlink to it. Whatever was
// there before under that name goes.
func (s *server) commit(w http.ResponseWriter, r *http.Request) {
	name, err := storeName(r)
	ro, err2 := readOnlyOf(r)
	if err = errors.Join(err, err2); err != nil {
		writeError(w, firstErr(err))
		return
	}
	base, stage, final := s.dirs(name, ro)
	if err := replace(base, stage, final); err != nil {
		writeError(w, errs.FromOS(final, err))
		return
	}
	if !ro {
		link := ".link-" + name
		mem, err := os.OpenRoot(s.Memory)
		if err != nil {
			writeError(w, errs.FromOS(s.Memory, err))
			return
		}
		defer mem.Close()
		_ = mem.RemoveAll(link)
		if err := mem.Symlink(filepath.Join(s.RW, final), link); err != nil {
			writeError(w, errs.FromOS(link, err))
			return
		}
		if err := replace(s.Memory, link, final); err != nil {
			writeError(w, errs.FromOS(final, err))
			return
		}
	} else if rw, err := os.OpenRoot(s.RW); err == nil {
		// A store once mounted read-write under this name leaves nothing behind.
		_ = rw.RemoveAll(final)
		rw.Close()
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "read_only": ro})
}

// openIn opens dir inside base as a root of its own. Box code can swap a directory of the
// read-write volume for a symlink at any moment; resolved inside base, it can never lead out of
// it (to the read-only volume, the credential, the sidecar's own files).
func openIn(base, dir string) (*os.Root, error) {
	b, err := os.OpenRoot(base)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	return b.OpenRoot(dir)
}

// replace renames from to to inside base; an existing to (a directory, a link) is moved aside and removed.
func replace(base, from, to string) error {
	root, err := os.OpenRoot(base)
	if err != nil {
		return err
	}
	defer root.Close()
	old := ".old-" + to
	_ = root.RemoveAll(old)
	if _, err := root.Lstat(to); err == nil {
		if err := root.Rename(to, old); err != nil {
			return err
		}
	}
	if err := root.Rename(from, to); err != nil {
		return err
	}
	return root.RemoveAll(old)
}

type fileEntry struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	// MTime (Unix nanoseconds) with Size tells the bridge which files changed since its last sync.
	MTime int64 `json:"mtime"`
}

// list names the regular files of a read-write store (symlinks and other kinds are not store files).
func (s *server) list(w http.ResponseWriter, r *http.Request) {
	name, err := storeName(r)
	if err != nil {
		writeError(w, err)
		return
	}
	root, err := openIn(s.RW, name)
	if err != nil {
		writeError(w, errs.FromOS(name, err))
		return
	}
	defer root.Close()
	files := []fileEntry{}
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		if len(files) >= s.MaxFiles {
			return errs.TooLarge("store %s has more than %d files", name, s.MaxFiles)
		}
		files = append(files, fileEntry{Path: p, Size: fi.Size(), MTime: fi.ModTime().UnixNano()})
		return nil
	})
	if err != nil {
		writeError(w, errs.FromOS(name, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"files": files})
}

// read streams one regular file of a read-write store.
func (s *server) read(w http.ResponseWriter, r *http.Request) {
	name, err := storeName(r)
	rel, err2 := relPath(r.URL.Query().Get("path"))
	if err = errors.Join(err, err2); err != nil {
		writeError(w, firstErr(err))
		return
	}
	root, err := openIn(s.RW, name)
	if err != nil {
		writeError(w, errs.FromOS(name, err))
		return
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		writeError(w, errs.FromOS(rel, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, errs.FromOS(rel, err))
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, errs.Invalid("%s is not a regular file", rel))
		return
	}
	if fi.Size() > s.MaxFileBytes {
		writeError(w, errs.TooLarge("file %s is %d bytes, more than the limit of %d", rel, fi.Size(), s.MaxFileBytes))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, io.LimitReader(f, fi.Size()))
}

func firstErr(err error) error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		if es := joined.Unwrap(); len(es) > 0 {
			return es[0]
		}
	}
	return err
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	e := errs.As(err)
	writeJSON(w, e.Status, map[string]any{"error": map[string]string{"type": e.Type, "message": e.Message}})
}
