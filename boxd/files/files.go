// Package files reads, writes, lists and deletes files in the box, and packs and unpacks tar
// archives (PROTOCOL.md, "Files" and "Archives"). Only regular files are read or written; a
// FIFO, socket or device is refused without ever blocking on it.
package files

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"sandbox-bridge.io/boxd/errs"
)

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
// maxBytes (> 0): payload_too_large, nothing read. What is checked (type, size, boxd's own
// directories) is what gets read: p is opened as O_PATH, checked, then reopened through that
// very descriptor, so a symlink swapped meanwhile changes nothing and a device or FIFO is never
// opened for real.
func (b *Box) Open(p string, maxBytes int64) (*os.File, int64, error) {
	p, err := b.resolve(p, itself)
	if err != nil {
		return nil, 0, err
	}
	pf, fi, err := b.openPath(p, itself)
	if err != nil {
		return nil, 0, err
	}
	defer pf.Close()
	if !fi.Mode().IsRegular() {
		return nil, 0, notRegular(p, fi.Mode())
	}
	if maxBytes > 0 && fi.Size() > maxBytes {
		return nil, 0, errs.TooLarge("%s is %d bytes, more than the limit of %d", p, fi.Size(), maxBytes)
	}
	f, err := os.OpenFile(fdPath(pf), os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, errs.FromOS(p, err)
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
// file; an existing one keeps its mode. Writing to a symlink writes the file it ends at (a
// dangling symlink is itself replaced).
func (b *Box) Write(p string, body io.Reader, maxBytes int64, mode fs.FileMode) (WriteResult, error) {
	p, err := b.resolve(p, itself)
	if err != nil {
		return WriteResult{}, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return WriteResult{}, errs.FromOS(filepath.Dir(p), err)
	}
	dir, name, keep, err := b.writeTarget(p)
	if err != nil {
		return WriteResult{}, err
	}
	defer dir.Close()
	if keep != nil {
		mode = *keep
	}
	base := name
	if len(base) > 64 {
		base = base[:64]
	}
	var tmpName string
	var tmp *os.File
	for range 100 {
		tmpName = "." + base + ".boxd-" + strconv.FormatUint(rand.Uint64(), 36)
		tmp, err = os.OpenFile(at(dir, tmpName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return WriteResult{}, errs.FromOS(filepath.Dir(p), err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(at(dir, tmpName))
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
	// Relative to the directory that was checked: whatever its path names by now.
	if err := os.Rename(at(dir, tmpName), at(dir, name)); err != nil {
		return WriteResult{}, errs.FromOS(p, err)
	}
	done = true
	return WriteResult{Path: p, Size: n}, nil
}

// writeTarget finds where a write of p lands: the open directory, the name in it, and the
// mode to keep when a regular file is there. Symlinks are followed one at a time, each
// directory opened and checked, so no hop can lead into boxd's own directories unseen.
func (b *Box) writeTarget(p string) (dir *os.File, name string, keep *fs.FileMode, err error) {
	var first *os.File // p's own directory, once p turned out to be a symlink
	fail := func(err error) (*os.File, string, *fs.FileMode, error) {
		if first != nil {
			_ = first.Close()
		}
		return nil, "", nil, err
	}
	cur := p
	for range 40 {
		var real string
		dir, name, real, err = b.openParent(p, cur, itself)
		if err != nil {
			if s := errs.As(err).Status; first != nil && (s == http.StatusNotFound || s == http.StatusBadRequest) {
				return first, filepath.Base(p), nil, nil // a symlink to nowhere: replaced itself
			}
			return fail(err)
		}
		fi, err := os.Lstat(at(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			if first == nil {
				return dir, name, nil, nil // a new file
			}
			_ = dir.Close()
			return first, filepath.Base(p), nil, nil
		}
		if err != nil {
			_ = dir.Close()
			return fail(errs.FromOS(p, err))
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(at(dir, name))
			if err != nil {
				_ = dir.Close()
				return fail(errs.FromOS(p, err))
			}
			if !filepath.IsAbs(link) {
				link = filepath.Join(filepath.Dir(real), link)
			}
			cur = filepath.Clean(link)
			if first == nil {
				first = dir
			} else {
				_ = dir.Close()
			}
		case fi.Mode().IsRegular():
			if first != nil {
				_ = first.Close()
			}
			m := fi.Mode().Perm()
			return dir, name, &m, nil
		default:
			_ = dir.Close()
			return fail(notRegular(p, fi.Mode()))
		}
	}
	return fail(errs.Invalid("%s: too many levels of symbolic links", p))
}

// openParent opens cur's directory (following symlinks) and checks the real path of cur's
// entry in it; shown is the path the route named. It returns the directory, the name in it and
// that real path.
func (b *Box) openParent(shown, cur string, r reach) (*os.File, string, string, error) {
	dir, err := b.openDir(filepath.Dir(cur), itself)
	if err != nil {
		return nil, "", "", err
	}
	dirReal, err := realPath(dir)
	if err != nil {
		_ = dir.Close()
		return nil, "", "", errs.Internal("%s: cannot tell what was opened (is /proc mounted?): %v", shown, err)
	}
	name := filepath.Base(cur)
	real := filepath.Join(dirReal, name)
	if err := b.refuse(shown, real, r); err != nil {
		_ = dir.Close()
		return nil, "", "", err
	}
	return dir, name, real, nil
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
// A listing that would show or enter one of boxd's own directories is refused.
func (b *Box) List(p string, recursive bool, limit int) (Listing, error) {
	r := entries
	if recursive {
		r = tree
	}
	p, err := b.resolve(p, r)
	if err != nil {
		return Listing{}, err
	}
	dir, err := b.openDir(p, r)
	if err != nil {
		return Listing{}, err
	}
	defer dir.Close()
	l := Listing{Path: p, Entries: []Entry{}}
	err = b.walk(dir, "", recursive, func(_ *os.File, _, rel string, fi fs.FileInfo) error {
		if len(l.Entries) == limit {
			l.Truncated = true
			return errStop
		}
		l.Entries = append(l.Entries, Entry{
			Path: filepath.Join(p, rel), Name: fi.Name(), Type: entryType(fi.Mode()), Size: fi.Size(),
			Mode: uint32(fi.Mode().Perm()), Modified: fi.ModTime().UTC(),
		})
		return nil
	}, func(string, error) error { return nil })
	if err != nil && err != errStop {
		return Listing{}, errs.FromOS(p, err)
	}
	return l, nil
}

// walk calls fn for each entry below the open directory dir (not dir itself) in name order,
// depth first; rel is the entry's path relative to the walk's root, name its name in dir. It
// never goes through a path: each entry is looked at, and each subdirectory opened (O_NOFOLLOW),
// relative to its parent's descriptor, so a directory swapped for a symlink while the walk runs
// is never entered; boxd's own directories, wherever met, are neither shown nor entered. A
// directory that cannot be read goes to onErr, whose error (if any) ends the walk.
func (b *Box) walk(dir *os.File, rel string, recursive bool, fn func(dir *os.File, name, rel string, fi fs.FileInfo) error, onErr func(rel string, err error) error) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return onErr(rel, err)
	}
	slices.Sort(names)
	for _, name := range names {
		r := path.Join(rel, name)
		fi, err := os.Lstat(at(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the directory was read
		}
		if err != nil {
			return err
		}
		if b.isOwn(fi) {
			continue
		}
		if err := fn(dir, name, r, fi); err != nil {
			return err
		}
		if !recursive || !fi.IsDir() {
			continue
		}
		sub, err := os.OpenFile(at(dir, name), os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
			continue // removed, or swapped for a symlink or a file, since it was looked at
		}
		if err != nil {
			if err := onErr(r, err); err != nil {
				return err
			}
			continue
		}
		if fi, err := sub.Stat(); err != nil || b.isOwn(fi) {
			_ = sub.Close()
			continue // boxd's own directory, moved here since it was looked at
		}
		err = b.walk(sub, r, true, fn, onErr)
		_ = sub.Close()
		if err != nil {
			return err
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
// contain or lie inside one of boxd's own directories. A symlink is removed, not its target.
func (b *Box) Delete(p string, recursive bool) (DeleteResult, error) {
	if c, err := clean(p); err == nil && c == "/" {
		return DeleteResult{}, errs.Invalid("refusing to delete /")
	}
	p, err := b.resolve(p, removal)
	if err != nil {
		return DeleteResult{}, err
	}
	dir, name, _, err := b.openParent(p, p, removal)
	if err != nil {
		return DeleteResult{}, err
	}
	defer dir.Close()
	target := at(dir, name) // in the directory just checked, whatever its path names by now
	fi, err := os.Lstat(target)
	if err != nil {
		return DeleteResult{}, errs.FromOS(p, err)
	}
	switch {
	case fi.IsDir() && recursive:
		err = os.RemoveAll(target) // never follows symlinks below it
	case fi.IsDir():
		err = syscall.Rmdir(target)
	default:
		err = syscall.Unlink(target)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return DeleteResult{}, errs.Conflict("%s is a directory that is not empty; delete it with recursive=true", p)
		}
		return DeleteResult{}, errs.FromOS(p, err)
	}
	return DeleteResult{Path: p, Deleted: true}, nil
}
