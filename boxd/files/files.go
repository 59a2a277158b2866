// Package files reads, writes, lists and deletes files in the box, and packs and unpacks tar
// archives (PROTOCOL.md, "Files" and "Archives"). Only regular files are read or written; a
// FIFO, socket or device is refused without ever blocking on it.
package files

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"sandbox-bridge.io/boxd/errs"
)

// Check validates a path from a request (absolute, no NUL) and returns it cleaned.
func Check(p string) (string, error) {
	switch {
	case p == "":
		return "", errs.Invalid("path is required")
	case strings.IndexByte(p, 0) >= 0:
		return "", errs.Invalid("path contains a NUL byte")
	case !filepath.IsAbs(p):
		return "", errs.Invalid("path must be absolute: %q", p)
	}
	return filepath.Clean(p), nil
}

// kind names a file type for messages.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "not a regular file"
}

func notRegular(p string, m fs.FileMode) error {
	return errs.Invalid("%s is %s: only regular files are read or written", p, kind(m))
}

// Open opens the regular file p for reading and returns it with its size. Larger than
// maxBytes (> 0): payload_too_large, nothing read.
func Open(p string, maxBytes int64) (*os.File, int64, error) {
	p, err := Check(p)
	if err != nil {
		return nil, 0, err
	}
	// Refuse by type before opening: opening some devices has effects of its own.
	fi, err := os.Stat(p)
	if err != nil {
		return nil, 0, errs.FromOS(p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, notRegular(p, fi.Mode())
	}
	// O_NONBLOCK: if p was swapped for a FIFO since the check, opening it does not block.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, errs.FromOS(p, err)
	}
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() {
		_ = f.Close()
		if err != nil {
			return nil, 0, errs.FromOS(p, err)
		}
		return nil, 0, notRegular(p, fi.Mode())
	}
	if maxBytes > 0 && fi.Size() > maxBytes {
		_ = f.Close()
		return nil, 0, errs.TooLarge("%s is %d bytes, more than the limit of %d", p, fi.Size(), maxBytes)
	}
	return f, fi.Size(), nil
}

// WriteResult answers a write.
type WriteResult struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// Write replaces the regular file p with body: the bytes go to a temporary file in the same
// directory, renamed over p only when complete, so a reader never sees half a file and a
// refused or cut-off upload changes nothing. Parents are created (0755). mode applies to a new
// file; an existing one keeps its mode. Writing to a symlink writes its target.
func Write(p string, body io.Reader, maxBytes int64, mode fs.FileMode) (WriteResult, error) {
	p, err := Check(p)
	if err != nil {
		return WriteResult{}, err
	}
	target := p
	if fi, err := os.Lstat(p); err == nil {
		if fi.Mode()&fs.ModeSymlink != 0 {
			if resolved, err := filepath.EvalSymlinks(p); err == nil {
				target = resolved
				fi, err = os.Lstat(target)
				if err != nil {
					return WriteResult{}, errs.FromOS(p, err)
				}
			}
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0: // dangling: the link itself is replaced
		case !fi.Mode().IsRegular():
			return WriteResult{}, notRegular(p, fi.Mode())
		default:
			mode = fi.Mode().Perm()
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return WriteResult{}, errs.FromOS(p, err)
	}

	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return WriteResult{}, errs.FromOS(dir, err)
	}
	base := filepath.Base(target)
	if len(base) > 64 {
		base = base[:64]
	}
	tmp, err := os.CreateTemp(dir, "."+base+".boxd-*")
	if err != nil {
		return WriteResult{}, errs.FromOS(dir, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	src := &bodyReader{r: body}
	n, err := io.Copy(tmp, io.LimitReader(src, maxBytes+1))
	if err != nil {
		return WriteResult{}, uploadError(p, src, err)
	}
	if n > maxBytes {
		return WriteResult{}, errs.TooLarge("the content is more than the limit of %d bytes; nothing was written", maxBytes)
	}
	if err := tmp.Chmod(mode.Perm()); err != nil {
		return WriteResult{}, errs.FromOS(p, err)
	}
	if err := tmp.Close(); err != nil {
		return WriteResult{}, errs.FromOS(p, err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return WriteResult{}, errs.FromOS(p, err)
	}
	done = true
	return WriteResult{Path: p, Size: n}, nil
}

// bodyReader remembers a failed read, so a cut-off upload is told apart from a failed write.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func uploadError(p string, src *bodyReader, err error) error {
	if src.err == nil {
		return errs.FromOS(p, err)
	}
	return errs.Invalid("the upload was cut off (%v); nothing was written", src.err)
}

// Entry is one listed file.
type Entry struct {
	Path     string    `json:"path"`
	Name     string    `json:"name"`
	Type     string    `json:"type"` // file | dir | symlink | other
	Size     int64     `json:"size"`
	Mode     uint32    `json:"mode"` // permission bits, e.g. 420 (0644)
	Modified time.Time `json:"modified"`
}

// Listing answers a list.
type Listing struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated"`
}

func entryType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

var errStop = errors.New("stop")

// List lists the directory p (recursive: everything below it, depth first in name order), at
// most limit entries. Symlinks are listed, not followed; unreadable subdirectories are skipped.
func List(p string, recursive bool, limit int) (Listing, error) {
	p, err := Check(p)
	if err != nil {
		return Listing{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Listing{}, errs.FromOS(p, err)
	}
	if !fi.IsDir() {
		return Listing{}, errs.Invalid("%s is not a directory", p)
	}
	l := Listing{Path: p, Entries: []Entry{}}
	err = walk(p, "", recursive, func(full, _ string, fi fs.FileInfo) error {
		if len(l.Entries) == limit {
			l.Truncated = true
			return errStop
		}
		l.Entries = append(l.Entries, Entry{
			Path: full, Name: fi.Name(), Type: entryType(fi.Mode()), Size: fi.Size(),
			Mode: uint32(fi.Mode().Perm()), Modified: fi.ModTime().UTC(),
		})
		return nil
	}, func(string, error) error { return nil })
	if err != nil && err != errStop {
		return Listing{}, errs.FromOS(p, err)
	}
	return l, nil
}

// walk calls fn for each entry below dir (not dir itself) in name order, depth first, never
// following symlinks; rel is the path relative to the walk's root. A directory that cannot be
// read goes to onErr, whose error (if any) ends the walk.
func walk(dir, rel string, recursive bool, fn func(full, rel string, fi fs.FileInfo) error, onErr func(dir string, err error) error) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return onErr(dir, err)
	}
	for _, e := range entries {
		full, r := filepath.Join(dir, e.Name()), path.Join(rel, e.Name())
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the directory was read
		}
		if err != nil {
			return err
		}
		if err := fn(full, r, fi); err != nil {
			return err
		}
		if recursive && fi.IsDir() {
			if err := walk(full, r, true, fn, onErr); err != nil {
				return err
			}
		}
	}
	return nil
}

// DeleteResult answers a delete.
type DeleteResult struct {
	Path    string `json:"path"`
	Deleted bool   `json:"deleted"`
}

// Delete removes p (a directory only when empty, or with recursive). p must not be /, nor be,
// contain or lie inside a protected directory (boxd's own mounts).
func Delete(p string, recursive bool, protected []string) (DeleteResult, error) {
	p, err := Check(p)
	if err != nil {
		return DeleteResult{}, err
	}
	if p == "/" {
		return DeleteResult{}, errs.Invalid("refusing to delete /")
	}
	for _, dir := range protected {
		if within(p, dir) || within(dir, p) {
			return DeleteResult{}, errs.Invalid("%s is protected: it holds boxd or its credentials", p)
		}
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return DeleteResult{}, errs.FromOS(p, err)
	}
	if fi.IsDir() && recursive {
		err = os.RemoveAll(p)
	} else {
		if fi.IsDir() {
			err = syscall.Rmdir(p)
		} else {
			err = syscall.Unlink(p)
		}
	}
	if err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return DeleteResult{}, errs.Conflict("%s is a directory that is not empty; delete it with recursive=true", p)
		}
		return DeleteResult{}, errs.FromOS(p, err)
	}
	return DeleteResult{Path: p, Deleted: true}, nil
}

// within reports whether p is dir or below it (both cleaned).
func within(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}
