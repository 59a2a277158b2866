package files

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"sandbox-bridge.io/boxd/errs"
)

// ExtractResult answers an upload.
type ExtractResult struct {
	Path    string `json:"path"`
	Entries int64  `json:"entries"`
	Bytes   int64  `json:"bytes"` // data stored in the archive (Limits)
}

// Extract unpacks a tar or tar.gz (detected by its magic bytes) into the directory dest,
// created if missing. The whole archive goes to a staging directory on dest's file system
// first (inside dest when it exists, so the final renames never cross a mount; else in its
// nearest existing ancestor) and is moved into place only once every entry was accepted.
// Refused, with nothing changed in dest: entries whose name is absolute or leaves dest,
// symlinks with an absolute target or one that leaves dest, hard links to anything but a
// regular file extracted earlier from the same archive, devices, FIFOs, and anything reached
// through a symlink; more than lim allows. Files are written sparse (all-zero blocks left
// holes). Every step happens relative to directories opened and checked once, never through a
// path box code could have changed since.
func (b *Box) Extract(dest string, body io.Reader, lim Limits) (ExtractResult, error) {
	return b.extract(dest, body, lim, false)
}

// ExtractReplacing is Extract, except that once the whole archive was accepted the entries dest
// had are moved aside (into a hidden directory in dest, then removed), so dest holds exactly
// the archive: a workspace restored into a running box. A refused archive changes nothing.
func (b *Box) ExtractReplacing(dest string, body io.Reader, lim Limits) (ExtractResult, error) {
	return b.extract(dest, body, lim, true)
}

func (b *Box) extract(dest string, body io.Reader, lim Limits, replace bool) (ExtractResult, error) {
	if c, err := clean(dest); err == nil && c == "/" {
		return ExtractResult{}, errs.Invalid("cannot extract into /")
	}
	dest, err := b.resolve(dest, tree)
	if err != nil {
		return ExtractResult{}, err
	}
	x := &extraction{box: b, dest: dest, lim: lim, replace: replace, links: map[string]string{}, files: map[string]bool{}, rootMode: 0o755}
	if err := x.locate(); err != nil {
		return ExtractResult{}, err
	}
	defer x.base.Close()
	if err := x.makeStage(); err != nil {
		return ExtractResult{}, err
	}
	defer x.base.RemoveAll(x.stage)
	defer x.root.Close()

	if err := x.unpack(body); err != nil {
		return ExtractResult{}, err
	}
	if err := x.checkLinks(); err != nil {
		return ExtractResult{}, err
	}
	if err := x.moveIntoPlace(); err != nil {
		return ExtractResult{}, err
	}
	return ExtractResult{Path: dest, Entries: x.c.entries, Bytes: x.c.bytes}, nil
}

type extraction struct {
	box      *Box
	dest     string // as requested
	lim      Limits
	replace  bool     // dest's entries go before the archive's move in
	base     *os.Root // dest when it exists, else its nearest existing ancestor
	rest     string   // dest relative to base ("" when dest exists)
	stage    string   // the staging directory, relative to base
	root     *os.Root // the staging directory
	c        count
	read     *countingReader   // the tar stream: how much data an entry really stores
	links    map[string]string // symlinks created: name -> target
	files    map[string]bool   // regular files created (what a hard link may name)
	dirs     []dirMode
	rootMode fs.FileMode
	buf      []byte
}

type dirMode struct {
	name string
	mode fs.FileMode
}

// locate opens dest, or when it does not exist yet its nearest existing ancestor, and checks
// what was opened.
func (x *extraction) locate() error {
	dir := x.dest
	for {
		fi, err := os.Stat(dir)
		if err == nil && !fi.IsDir() {
			if dir == x.dest {
				return errs.Invalid("%s exists and is not a directory", x.dest)
			}
			return errs.Invalid("%s is not a directory", dir)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return errs.FromOS(dir, err)
		}
		x.rest = path.Join(filepath.Base(dir), x.rest)
		dir = filepath.Dir(dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return errs.FromOS(dir, err)
	}
	f, err := root.Open(".")
	if err == nil {
		var real string
		if real, err = realPath(f); err == nil {
			err = x.box.refuse(x.dest, filepath.Join(real, x.rest), tree)
		}
		_ = f.Close()
	}
	if err != nil {
		_ = root.Close()
		return errs.FromOS(x.dest, err)
	}
	x.base = root
	return nil
}

// makeStage creates the staging directory in base.
func (x *extraction) makeStage() error {
	var err error
	for range 100 {
		x.stage = ".boxd-extract-" + strconv.FormatUint(rand.Uint64(), 36)
		if err = x.base.Mkdir(x.stage, 0o700); !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err == nil {
		x.root, err = x.base.OpenRoot(x.stage)
	}
	if err != nil {
		return errs.FromOS(x.dest, err)
	}
	return nil
}

// countingReader counts what the tar reader takes from the stream: read around an entry's
// content, it tells the data the archive really stores for it (a sparse entry's regions, not
// the zeros archive/tar reads its holes back as).
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
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
	x.read = &countingReader{r: r}
	tr := tar.NewReader(x.read)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return ended(r)
		}
		if err != nil {
			return errs.Invalid("not a valid tar archive: %v", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		x.c.entries++
		if over := x.c.over(x.lim); over != "" {
			return errs.TooLarge("the archive has %s; nothing was changed", over)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// maxTrailing bounds what may follow an archive's end (tar pads archives to a whole record,
// 10 KiB by default).
const maxTrailing = 1 << 20

// ended reads what follows the archive's end, which must end too: a body cut off there (a
// sender that found its data corrupt and broke the transfer off) or a gzip stream whose
// checksum fails is refused, so only an archive that arrived whole is ever moved into place.
func ended(r io.Reader) error {
	n, err := io.Copy(io.Discard, io.LimitReader(r, maxTrailing+1))
	if err != nil {
		return errs.Invalid("the upload did not end cleanly after the archive (%v); nothing was changed", err)
	}
	if n > maxTrailing {
		return errs.Invalid("more than %d bytes follow the archive's end; nothing was changed", maxTrailing)
	}
	return nil
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
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		return x.file(name, hdr, mode, content)
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
		target, err := x.checkName(hdr.Linkname)
		if err != nil || !x.files[target] || target == name {
			return errs.Invalid("entry %q: hard link to %q refused: it must name a regular file extracted earlier from the same archive", hdr.Name, hdr.Linkname)
		}
		if err := x.replaceable(name, hdr.Name); err != nil {
			return err
		}
		if err := x.root.Link(target, name); err != nil {
			return x.entryError(hdr.Name, err)
		}
		x.files[name] = true
		return nil
	case tar.TypeChar, tar.TypeBlock:
		return errs.Invalid("entry %q: devices are refused", hdr.Name)
	case tar.TypeFifo:
		return errs.Invalid("entry %q: FIFOs are refused", hdr.Name)
	}
	return errs.Invalid("entry %q: unsupported entry type %q", hdr.Name, hdr.Typeflag)
}

// file writes a regular entry, sparse, counting the data the archive stores for it.
func (x *extraction) file(name string, hdr *tar.Header, mode fs.FileMode, content io.Reader) error {
	// hdr.Size is the file's size; for a sparse entry the archive stores less, known as it is read.
	sparse := hdr.Typeflag == tar.TypeGNUSparse
	for k := range hdr.PAXRecords {
		sparse = sparse || strings.HasPrefix(k, "GNU.sparse.")
	}
	x.c.logical += hdr.Size
	if over := x.c.over(x.lim); over != "" || (!sparse && x.lim.Bytes > 0 && x.c.bytes+hdr.Size > x.lim.Bytes) {
		if over == "" {
			over = "more than " + strconv.FormatInt(x.lim.Bytes, 10) + " bytes of data"
		}
		return errs.TooLarge("the archive holds %s; nothing was changed", over)
	}
	if err := x.replaceable(name, hdr.Name); err != nil {
		return err
	}
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return x.entryError(hdr.Name, err)
	}
	if x.buf == nil {
		x.buf = make([]byte, 1<<20)
	}
	start, before := x.read.n, x.c.bytes
	err = copySparse(f, content, x.buf, func() error {
		x.c.bytes = before + x.read.n - start
		if over := x.c.over(x.lim); over != "" {
			return errs.TooLarge("the archive holds %s; nothing was changed", over)
		}
		return nil
	})
	x.c.bytes = before + x.read.n - start
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
	x.files[name] = true
	_ = x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	return nil
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

// replaceable clears the way for a file or link: a later entry of the same name wins over an
// earlier file or symlink (as with tar), never over a directory.
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
	delete(x.files, name)
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
	if x.rest != "" {
		return false // dest is new: nothing in it yet
	}
	fi, err := x.base.Lstat(rel)
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// moveIntoPlace moves the staged tree to dest: whole when dest did not exist; else each staged
// entry that is new moves whole, a staged directory over an existing one merges into it, and a
// file or symlink replaces a file or symlink. Conflicts are found before anything moves.
func (x *extraction) moveIntoPlace() error {
	if x.rest != "" {
		if err := x.base.Chmod(x.stage, x.rootMode); err != nil {
			return errs.FromOS(x.dest, err)
		}
		if parent := path.Dir(x.rest); parent != "." {
			if err := x.base.MkdirAll(parent, 0o755); err != nil {
				return errs.FromOS(filepath.Dir(x.dest), err)
			}
		}
		if err := x.base.Rename(x.stage, x.rest); err != nil {
			return errs.FromOS(x.dest, err)
		}
		return x.applyDirModes()
	}
	if x.replace {
		if err := x.clearDest(); err != nil {
			return err
		}
	}
	var moves []string
	if err := x.plan("", &moves); err != nil {
		return err
	}
	for _, rel := range moves {
		if err := x.base.Rename(path.Join(x.stage, rel), rel); err != nil {
			return errs.FromOS(filepath.Join(x.dest, rel), err)
		}
	}
	return x.applyDirModes()
}

// clearDest moves every entry of dest but staging directories (this extraction's and any other
// running) into a hidden directory of its own, then removes that: renames on one file system,
// so dest is empty before the first staged entry moves in, whatever the old tree held.
func (x *extraction) clearDest() error {
	entries, err := readDirIn(x.base, "")
	if err != nil {
		return errs.FromOS(x.dest, err)
	}
	var trash string
	for range 100 {
		trash = ".boxd-replaced-" + strconv.FormatUint(rand.Uint64(), 36)
		if err = x.base.Mkdir(trash, 0o700); !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return errs.FromOS(x.dest, err)
	}
	defer removeTree(x.base, trash)
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".boxd-extract-") || strings.HasPrefix(name, ".boxd-replaced-") {
			continue
		}
		if e.IsDir() {
			// Moving a directory to another parent rewrites its "..": it must be writable.
			_ = x.base.Chmod(name, 0o700)
		}
		if err := x.base.Rename(name, path.Join(trash, name)); err != nil {
			return errs.FromOS(filepath.Join(x.dest, name), err)
		}
	}
	return nil
}

// removeTree removes rel and everything below it, making its directories writable first: box
// code leaves read-only directories (0500, 0555) whose entries could not be removed otherwise.
// Every directory here belongs to the box user, as boxd does.
func removeTree(root *os.Root, rel string) {
	if root.RemoveAll(rel) == nil {
		return
	}
	var open func(string)
	open = func(dir string) {
		if root.Chmod(dir, 0o700) != nil {
			return
		}
		entries, _ := readDirIn(root, dir)
		for _, e := range entries {
			if e.IsDir() {
				open(path.Join(dir, e.Name()))
			}
		}
	}
	open(rel)
	_ = root.RemoveAll(rel)
}

func (x *extraction) plan(rel string, moves *[]string) error {
	entries, err := readDirIn(x.root, rel)
	if err != nil {
		return errs.FromOS(x.dest, err)
	}
	for _, e := range entries {
		r := path.Join(rel, e.Name())
		shown := filepath.Join(x.dest, r)
		fi, err := x.base.Lstat(r)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			*moves = append(*moves, r)
		case err != nil:
			return errs.FromOS(shown, err)
		case e.IsDir() && fi.Mode()&fs.ModeSymlink != 0:
			return errs.Invalid("%s is a symlink: the archive's entries below it are refused", shown)
		case e.IsDir() && fi.IsDir():
			if err := x.plan(r, moves); err != nil {
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

func readDirIn(root *os.Root, rel string) ([]fs.DirEntry, error) {
	if rel == "" {
		rel = "."
	}
	f, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}

// applyDirModes sets the archive's directory modes last, deepest first (a read-only directory
// could not have been filled or moved otherwise).
func (x *extraction) applyDirModes() error {
	slices.SortFunc(x.dirs, func(a, b dirMode) int { return strings.Count(b.name, "/") - strings.Count(a.name, "/") })
	for _, d := range x.dirs {
		if err := x.base.Chmod(path.Join(x.rest, d.name), d.mode); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return errs.FromOS(filepath.Join(x.dest, d.name), err)
		}
	}
	return nil
}
