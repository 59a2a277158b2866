package files

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"sandbox-bridge.io/boxd/errs"
)

// Box is the box's file system as the file and archive routes see it: every path a route
// names goes through resolve, and boxd's own directories (its binary, the secret mount with
// the box credential and the env store) are cut out of it. Box code runs as boxd's user and can
// plant symlinks and swap them at any moment, so the check is made again on what was actually
// opened (the kernel's name for an open file descriptor), and walks go from directory
// descriptor to directory descriptor, never through a path that could have changed.
type Box struct {
	dirs []ownDir
}

type ownDir struct {
	path string // as configured, cleaned
	real string // with symlinks resolved; "" when it does not exist
	id   fileID // zero when it does not exist
}

// fileID names an inode: a hard link's other names, or a protected directory met by a walk
// through a mount or a rename, have the same one.
type fileID struct{ dev, ino uint64 }

func idOf(fi fs.FileInfo) fileID {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileID{uint64(st.Dev), st.Ino}
	}
	return fileID{}
}

// NewBox returns the box with the protected directories dirs (absolute) cut out. "/" is
// ignored: a binary at the root would otherwise make every path boxd's own.
func NewBox(dirs []string) *Box {
	b := &Box{}
	for _, d := range dirs {
		d = filepath.Clean(d)
		if d == "/" || !filepath.IsAbs(d) {
			continue
		}
		o := ownDir{path: d}
		if real, err := filepath.EvalSymlinks(d); err == nil {
			o.real = real
		}
		if fi, err := os.Stat(d); err == nil {
			o.id = idOf(fi)
		}
		b.dirs = append(b.dirs, o)
	}
	return b
}

// reach is how much of the file system an operation touches below its path.
type reach int

const (
	itself  reach = iota // read, write: the path only
	entries              // a listing: the path and its direct entries
	tree                 // recursive listings, archives, extraction: everything below
	removal              // delete: the name itself (a symlink is not followed) and all below it
)

// resolve is the one way a route's path becomes a path boxd acts on: absolute, no NUL byte,
// cleaned; refused (403) when it is or lies inside one of boxd's own directories, or when the
// operation's reach below it would take in one — judged on the path as given and on the path
// with its existing symlinks resolved. Each operation then checks again what it opened
// (checkOpened), since box code can swap a symlink between this check and that use.
func (b *Box) resolve(p string, r reach) (string, error) {
	p, err := clean(p)
	if err != nil {
		return "", err
	}
	if err := b.refuse(p, p, r); err != nil {
		return "", err
	}
	real, err := resolveExisting(p, r != removal)
	if err != nil {
		return "", err
	}
	return p, b.refuse(p, real, r)
}

// clean checks a route's path lexically (absolute, no NUL) and returns it cleaned.
func clean(p string) (string, error) {
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

// resolveExisting resolves the symlinks of p as far as they lead: its longest existing prefix,
// then where a dangling symlink would lead, then the rest. With follow false, p's last
// component is not resolved (deleting a symlink deletes the link).
func resolveExisting(p string, follow bool) (string, error) {
	if !follow && p != "/" {
		dir, err := resolveExisting(filepath.Dir(p), true)
		return filepath.Join(dir, filepath.Base(p)), err
	}
	for range 40 {
		real, rest := p, ""
		for {
			r, err := filepath.EvalSymlinks(real)
			if err == nil {
				real = r
				break
			}
			if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
				return "", errs.FromOS(p, err)
			}
			if real == "/" {
				return p, nil
			}
			rest = filepath.Join(filepath.Base(real), rest)
			real = filepath.Dir(real)
		}
		if rest == "" {
			return real, nil
		}
		first, after, _ := strings.Cut(rest, "/")
		link, err := os.Readlink(filepath.Join(real, first))
		if err != nil {
			return filepath.Join(real, rest), nil // first does not exist
		}
		// first is a symlink to nothing (yet): where it would lead counts.
		if !filepath.IsAbs(link) {
			link = filepath.Join(real, link)
		}
		p = filepath.Join(link, after)
	}
	return "", errs.Invalid("%s: too many levels of symbolic links", p)
}

// refuse applies the rule to real, the path shown resolves to.
func (b *Box) refuse(shown, real string, r reach) error {
	what := shown
	if real != shown {
		what = shown + " (resolved: " + real + ")"
	}
	for _, o := range b.dirs {
		for _, dir := range []string{o.path, o.real} {
			if dir == "" {
				continue
			}
			switch {
			case real == dir && shown == o.path:
				return forbidden("%s is boxd's own directory (%s): no file or archive route reaches it", shown, ownWhat)
			case real == dir:
				return forbidden("%s is boxd's own directory %s (%s): no file or archive route reaches it", what, o.path, ownWhat)
			case within(real, dir):
				return forbidden("%s is inside boxd's own directory %s (%s): no file or archive route reaches it", what, o.path, ownWhat)
			case (r == tree || r == removal) && within(dir, real), r == entries && filepath.Dir(dir) == real:
				return forbidden("%s contains boxd's own directory %s (%s): listings, archives, extractions and deletes that would reach it are refused", what, o.path, ownWhat)
			}
		}
	}
	return nil
}

const ownWhat = "its binary, or the box credential and env store"

func forbidden(format string, args ...any) error {
	return errs.New(http.StatusForbidden, format, args...)
}

// within reports whether p is dir or below it (both cleaned).
func within(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// realPath is the kernel's name for what f is open on: what a path resolved to when it was
// opened, whatever was swapped since.
func realPath(f *os.File) (string, error) {
	return os.Readlink(fdPath(f))
}

// fdPath names f through /proc: a path that reaches exactly what f is open on. Names below
// a directory's fdPath are resolved from that directory, not from its (changeable) path.
func fdPath(f *os.File) string {
	return "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
}

// checkOpened applies the rule to what f is open on (shown is the path the route named).
func (b *Box) checkOpened(f *os.File, shown string, r reach) error {
	real, err := realPath(f)
	if err != nil {
		return errs.Internal("%s: cannot tell what was opened (is /proc mounted?): %v", shown, err)
	}
	return b.refuse(shown, strings.TrimSuffix(real, " (deleted)"), r)
}

// isOwn reports whether fi is one of boxd's own directories (a walk skips them wherever it
// meets them: through a mount, or a directory moved into the tree while it was walked).
func (b *Box) isOwn(fi fs.FileInfo) bool {
	if !fi.IsDir() {
		return false
	}
	id := idOf(fi)
	for _, o := range b.dirs {
		if o.id != (fileID{}) && o.id == id {
			return true
		}
	}
	return false
}

// oPath is O_PATH (amd64 and arm64; the syscall package defines it for some architectures
// only): an open that only names the file, with none of the effects opening a device or a
// FIFO has. What it names is checked, then reopened through fdPath.
const oPath = 0x200000

// openPath opens p (following symlinks) as O_PATH and checks what it reached.
func (b *Box) openPath(p string, r reach) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(p, oPath|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errs.FromOS(p, err)
	}
	if err := b.checkOpened(f, p, r); err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, nil, errs.FromOS(p, err)
	}
	return f, fi, nil
}

// OpenWatched opens p for a file watch (package watch): resolved and checked as a listing
// (recursive: as a tree) and opened as O_PATH, checked again on what was opened. The watch is
// put on what the descriptor names, so what was checked is what is watched. It answers p
// cleaned, the descriptor and what it names.
func (b *Box) OpenWatched(p string, recursive bool) (string, *os.File, fs.FileInfo, error) {
	r := entries
	if recursive {
		r = tree
	}
	p, err := b.resolve(p, r)
	if err != nil {
		return "", nil, nil, err
	}
	f, fi, err := b.openPath(p, r)
	if err != nil {
		return "", nil, nil, err
	}
	if b.isOwn(fi) {
		_ = f.Close()
		return "", nil, nil, forbidden("%s is boxd's own directory (%s): no file route reaches it", p, ownWhat)
	}
	return p, f, fi, nil
}

// openDir opens the directory p (following symlinks) and checks what it reached.
func (b *Box) openDir(p string, r reach) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.FromOS(p, err)
	}
	if err := b.checkOpened(f, p, r); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// at names name inside the open directory dir without going through dir's path again.
func at(dir *os.File, name string) string {
	return fdPath(dir) + "/" + name
}
