package files

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"sandbox-bridge.io/boxd/errs"
)

// Archive is a file or directory ready to be sent as a tar.
type Archive struct {
	path string
	fi   fs.FileInfo
}

// PrepareArchive checks p before anything is sent (its errors are plain answers).
func PrepareArchive(p string) (*Archive, error) {
	p, err := Check(p)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, errs.FromOS(p, err)
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return nil, notRegular(p, fi.Mode())
	}
	return &Archive{path: p, fi: fi}, nil
}

// WriteTo streams the tar (gzip-compressed with gz): a directory's entries relative to it, or
// the single file under its name. Regular files, directories and symlinks; other types are
// skipped. An error after the first byte means the stream is unusable: the caller aborts it.
func (a *Archive) WriteTo(w io.Writer, gz bool) error {
	var zw *gzip.Writer
	if gz {
		zw, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		w = zw
	}
	tw := tar.NewWriter(w)
	var err error
	if a.fi.IsDir() {
		err = walk(a.path, "", true, func(full, rel string, fi fs.FileInfo) error {
			return addEntry(tw, full, rel, fi)
		}, func(dir string, err error) error { return err })
	} else {
		err = addEntry(tw, a.path, a.fi.Name(), a.fi)
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil && zw != nil {
		err = zw.Close()
	}
	return err
}

func addEntry(tw *tar.Writer, full, rel string, fi fs.FileInfo) error {
	hdr := &tar.Header{Name: rel, Mode: tarMode(fi.Mode()), ModTime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(full)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	default:
		return nil // FIFOs, sockets, devices
	}
	if hdr.Typeflag != tar.TypeReg {
		return tw.WriteHeader(hdr)
	}
	f, err := os.OpenFile(full, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s changed while it was archived", full)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	// A file that shrank meanwhile fails here (a tar cannot say so otherwise).
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

// ExtractResult answers an upload.
type ExtractResult struct {
	Path    string `json:"path"`
	Entries int64  `json:"entries"`
	Bytes   int64  `json:"bytes"`
}

// Extract unpacks a tar or tar.gz (detected by its magic bytes) into the directory dest,
// created if missing. The whole archive goes to a staging directory on dest's file system
// first (inside dest when it exists, so the final renames never cross a mount; else beside
// where it will be) and is moved into place only once every entry was accepted. Refused,
// with nothing changed in dest: entries whose name is absolute or leaves dest, symlinks with
// an absolute target or one that leaves dest, hard links, devices, FIFOs, and anything
// reached through a symlink; more than maxBytes of content or maxEntries entries.
func Extract(dest string, body io.Reader, maxBytes, maxEntries int64) (ExtractResult, error) {
	dest, err := Check(dest)
	if err != nil {
		return ExtractResult{}, err
	}
	if dest == "/" {
		return ExtractResult{}, errs.Invalid("cannot extract into /")
	}
	x := &extraction{dest: dest, maxBytes: maxBytes, maxEntries: maxEntries, links: map[string]string{}, rootMode: 0o755}
	stageIn, err := x.locate()
	if err != nil {
		return ExtractResult{}, err
	}
	stage, err := os.MkdirTemp(stageIn, ".boxd-extract-*")
	if err != nil {
		return ExtractResult{}, errs.FromOS(stageIn, err)
	}
	defer os.RemoveAll(stage)
	if x.root, err = os.OpenRoot(stage); err != nil {
		return ExtractResult{}, errs.FromOS(stage, err)
	}
	defer x.root.Close()

	if err := x.unpack(body); err != nil {
		return ExtractResult{}, err
	}
	if err := x.checkLinks(); err != nil {
		return ExtractResult{}, err
	}
	if err := x.moveIntoPlace(stage); err != nil {
		return ExtractResult{}, err
	}
	return ExtractResult{Path: dest, Entries: x.entries, Bytes: x.bytes}, nil
}

type extraction struct {
	dest       string // as requested
	real       string // dest with symlinks resolved, when it exists
	exists     bool
	root       *os.Root // the staging directory
	maxBytes   int64
	maxEntries int64
	entries    int64
	bytes      int64
	links      map[string]string // symlinks created: name -> target
	dirs       []dirMode
	rootMode   fs.FileMode
}

type dirMode struct {
	name string
	mode fs.FileMode
}

// locate finds dest (or, when it does not exist yet, its nearest existing ancestor) and returns
// the directory the staging directory goes in.
func (x *extraction) locate() (string, error) {
	fi, err := os.Stat(x.dest)
	if err == nil {
		if !fi.IsDir() {
			return "", errs.Invalid("%s exists and is not a directory", x.dest)
		}
		x.exists = true
		if x.real, err = filepath.EvalSymlinks(x.dest); err != nil {
			return "", errs.FromOS(x.dest, err)
		}
		return x.real, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", errs.FromOS(x.dest, err)
	}
	for dir := filepath.Dir(x.dest); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err == nil {
			if !fi.IsDir() {
				return "", errs.Invalid("%s is not a directory", dir)
			}
			return dir, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", errs.FromOS(dir, err)
		}
	}
}

func (x *extraction) unpack(body io.Reader) error {
	br := bufio.NewReaderSize(body, 64<<10)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return errs.Invalid("not a valid gzip stream: %v", err)
		}
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errs.Invalid("not a valid tar archive: %v", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		x.entries++
		if x.entries > x.maxEntries {
			return errs.TooLarge("the archive has more than %d entries; nothing was changed", x.maxEntries)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// entry checks one header and creates it in the staging directory.
func (x *extraction) entry(hdr *tar.Header, content io.Reader) error {
	name, err := x.checkName(hdr.Name)
	if err != nil {
		return err
	}
	mode := fileMode(hdr.Mode)
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errs.Invalid("entry %q: only a directory may name the archive's root", hdr.Name)
		}
		x.rootMode = mode
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := x.root.MkdirAll(name, 0o700); err != nil {
			return x.entryError(hdr.Name, err)
		}
		x.dirs = append(x.dirs, dirMode{name, mode})
		return nil
	case tar.TypeReg, tar.TypeRegA:
		if x.bytes+hdr.Size > x.maxBytes {
			return errs.TooLarge("the archive holds more than %d bytes; nothing was changed", x.maxBytes)
		}
		if err := x.replaceable(name, hdr.Name); err != nil {
			return err
		}
		f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return x.entryError(hdr.Name, err)
		}
		n, err := io.Copy(f, content)
		x.bytes += n
		if err == nil {
			err = f.Chmod(mode) // exact mode: not subject to the umask
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return errs.Invalid("the archive was cut off inside %q; nothing was changed", hdr.Name)
			}
			return x.entryError(hdr.Name, err)
		}
		_ = x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		return nil
	case tar.TypeSymlink:
		if hdr.Linkname == "" || path.IsAbs(hdr.Linkname) {
			return errs.Invalid("entry %q: symlink to %q refused: targets must be relative and stay inside %s", hdr.Name, hdr.Linkname, x.dest)
		}
		if err := x.replaceable(name, hdr.Name); err != nil {
			return err
		}
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return x.entryError(hdr.Name, err)
		}
		x.links[name] = hdr.Linkname
		return nil
	case tar.TypeLink:
		return errs.Invalid("entry %q: hard links are refused", hdr.Name)
	case tar.TypeChar, tar.TypeBlock:
		return errs.Invalid("entry %q: devices are refused", hdr.Name)
	case tar.TypeFifo:
		return errs.Invalid("entry %q: FIFOs are refused", hdr.Name)
	}
	return errs.Invalid("entry %q: unsupported entry type %q", hdr.Name, hdr.Typeflag)
}

// checkName cleans an entry name and refuses absolute names, names that leave dest and names
// reached through a symlink of the archive.
func (x *extraction) checkName(raw string) (string, error) {
	if strings.IndexByte(raw, 0) >= 0 {
		return "", errs.Invalid("entry %q: name contains a NUL byte", raw)
	}
	if path.IsAbs(raw) {
		return "", errs.Invalid("entry %q: absolute names are refused", raw)
	}
	name := path.Clean(raw)
	if name == ".." || strings.HasPrefix(name, "../") {
		return "", errs.Invalid("entry %q leaves %s", raw, x.dest)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' {
			if _, ok := x.links[name[:i]]; ok {
				return "", errs.Invalid("entry %q is reached through the symlink %q", raw, name[:i])
			}
		}
	}
	return name, nil
}

// replaceable clears the way for a file or symlink: a later entry of the same name wins over
// an earlier file or symlink (as with tar), never over a directory.
func (x *extraction) replaceable(name, raw string) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return x.root.MkdirAll(path.Dir(name), 0o700)
	}
	if err != nil {
		return x.entryError(raw, err)
	}
	if fi.IsDir() {
		return errs.Invalid("entry %q: a directory of that name is already in the archive", raw)
	}
	delete(x.links, name)
	return x.root.Remove(name)
}

func (x *extraction) entryError(raw string, err error) error {
	var e *errs.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EEXIST) {
		return errs.Invalid("entry %q conflicts with an earlier entry of the archive", raw)
	}
	if strings.Contains(err.Error(), "escapes from parent") || errors.Is(err, syscall.ELOOP) {
		return errs.Invalid("entry %q is reached through a symlink", raw)
	}
	return errs.FromOS(raw, err)
}

// checkLinks resolves every symlink target once the whole archive is known, refusing targets
// that pass through a symlink (of the archive, or already in dest): only then is "stays inside
// dest" decidable by looking at names alone.
func (x *extraction) checkLinks() error {
	for name, target := range x.links {
		parts := strings.Split(path.Dir(name), "/")
		if parts[0] == "." {
			parts = parts[:0]
		}
		comps := strings.Split(target, "/")
		for i, c := range comps {
			switch c {
			case "", ".":
				continue
			case "..":
				if len(parts) == 0 {
					return errs.Invalid("entry %q: symlink to %q leaves %s", name, target, x.dest)
				}
				parts = parts[:len(parts)-1]
				continue
			}
			parts = append(parts, c)
			if !more(comps[i+1:]) {
				break // pointing at another symlink is fine: that one is checked too
			}
			at := path.Join(parts...)
			if _, ok := x.links[at]; ok || x.existingLink(at) {
				return errs.Invalid("entry %q: symlink to %q goes through the symlink %q", name, target, at)
			}
		}
	}
	return nil
}

// more reports whether any of the remaining path components names something.
func more(comps []string) bool {
	for _, c := range comps {
		if c != "" && c != "." {
			return true
		}
	}
	return false
}

func (x *extraction) existingLink(rel string) bool {
	if !x.exists {
		return false
	}
	fi, err := os.Lstat(filepath.Join(x.real, rel))
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// moveIntoPlace moves the staged tree to dest: whole when dest did not exist; else each staged
// entry that is new moves whole, a staged directory over an existing one merges into it, and a
// file or symlink replaces a file or symlink. Conflicts are found before anything moves.
func (x *extraction) moveIntoPlace(stage string) error {
	if !x.exists {
		if err := os.Chmod(stage, x.rootMode); err != nil {
			return errs.FromOS(x.dest, err)
		}
		parent := filepath.Dir(x.dest)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return errs.FromOS(parent, err)
		}
		if err := os.Rename(stage, x.dest); err != nil {
			return errs.FromOS(x.dest, err)
		}
		return x.applyDirModes(x.dest)
	}
	var moves []string
	if err := x.plan(stage, "", &moves); err != nil {
		return err
	}
	for _, rel := range moves {
		if err := os.Rename(filepath.Join(stage, rel), filepath.Join(x.real, rel)); err != nil {
			return errs.FromOS(filepath.Join(x.dest, rel), err)
		}
	}
	return x.applyDirModes(x.real)
}

func (x *extraction) plan(stage, rel string, moves *[]string) error {
	entries, err := os.ReadDir(filepath.Join(stage, rel))
	if err != nil {
		return errs.FromOS(x.dest, err)
	}
	for _, e := range entries {
		r := path.Join(rel, e.Name())
		shown := filepath.Join(x.dest, r)
		fi, err := os.Lstat(filepath.Join(x.real, r))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			*moves = append(*moves, r)
		case err != nil:
			return errs.FromOS(shown, err)
		case e.IsDir() && fi.Mode()&fs.ModeSymlink != 0:
			return errs.Invalid("%s is a symlink: the archive's entries below it are refused", shown)
		case e.IsDir() && fi.IsDir():
			if err := x.plan(stage, r, moves); err != nil {
				return err
			}
		case e.IsDir():
			return errs.Conflict("%s exists and is not a directory", shown)
		case fi.IsDir():
			return errs.Conflict("%s is a directory: the archive has a file of that name", shown)
		default:
			*moves = append(*moves, r)
		}
	}
	return nil
}

// applyDirModes sets the archive's directory modes last, deepest first (a read-only directory
// could not have been filled or moved otherwise).
func (x *extraction) applyDirModes(base string) error {
	slices.SortFunc(x.dirs, func(a, b dirMode) int { return strings.Count(b.name, "/") - strings.Count(a.name, "/") })
	for _, d := range x.dirs {
		if err := os.Chmod(filepath.Join(base, d.name), d.mode); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return errs.FromOS(filepath.Join(x.dest, d.name), err)
		}
	}
	return nil
}

// tarMode and fileMode convert permission bits with setgid and sticky (a workspace under an
// fsGroup has setgid directories); setuid is neither archived nor restored.
func tarMode(m fs.FileMode) int64 {
	bits := int64(m.Perm())
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return bits
}

func fileMode(bits int64) fs.FileMode {
	m := fs.FileMode(bits).Perm()
	if bits&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if bits&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}
