package files

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"sandbox-bridge.io/boxd/errs"
)

// Limits bound an archive, the same way on both routes (0: no limit). Entries are tar
// entries: files, directories, symlinks, hard links. Bytes are the data the archive stores: a
// sparse file's data regions, not its holes; a hard-linked file's data once. Counted alike when
// an archive is made and when it is unpacked, an archive made under a limit is always unpacked
// under the same limit.
type Limits struct {
	Bytes   int64
	Entries int64
}

// maxLogical bounds the size of an archive's files counting their holes, on both routes:
// archive/tar reads holes back as zeros, so a sparse entry of a few bytes could otherwise keep
// an extraction busy for hours.
const maxLogical = 1 << 40

// count tallies an archive as it is made or unpacked.
type count struct {
	entries, bytes, logical int64
}

// over names the limit c is past, or "".
func (c count) over(lim Limits) string {
	switch {
	case lim.Entries > 0 && c.entries > lim.Entries:
		return fmt.Sprintf("more than %d entries", lim.Entries)
	case lim.Bytes > 0 && c.bytes > lim.Bytes:
		return fmt.Sprintf("more than %d bytes of data", lim.Bytes)
	case c.logical > maxLogical:
		return fmt.Sprintf("files of more than %d bytes (holes of sparse files included)", int64(maxLogical))
	}
	return ""
}

// Archive is a file or directory ready to be sent as a tar, counted and checked against its
// limits before anything is sent.
type Archive struct {
	box     *Box
	path    string
	f       *os.File // O_PATH: what path named when it was checked
	fi      fs.FileInfo
	lim     Limits
	Entries int64 // as counted before sending
	Bytes   int64
}

// PrepareArchive checks p and counts what its archive would hold: its errors, a tree past the
// limits among them, are plain answers given before anything is sent.
func (b *Box) PrepareArchive(p string, lim Limits) (*Archive, error) {
	p, err := b.resolve(p, tree)
	if err != nil {
		return nil, err
	}
	f, fi, err := b.openPath(p, tree)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, notRegular(p, fi.Mode())
	}
	a := &Archive{box: b, path: p, f: f, fi: fi, lim: lim}
	var c count
	if err := a.walk(&c, nil); err != nil {
		_ = f.Close()
		return nil, errs.FromOS(p, err)
	}
	a.Entries, a.Bytes = c.entries, c.bytes
	if over := c.over(lim); over != "" {
		_ = f.Close()
		return nil, errs.TooLarge("the archive of %s would hold %d entries and %d bytes of data: %s; nothing was sent",
			p, c.entries, c.bytes, over)
	}
	return a, nil
}

// Close releases what PrepareArchive opened.
func (a *Archive) Close() error { return a.f.Close() }

// WriteTo streams the tar (gzip-compressed with gz): a directory's entries relative to it, or
// the single file under its name. Regular files (hard links as links, sparse files sparse),
// directories and symlinks; other types are skipped. An error after the first byte means the
// stream is unusable: the caller aborts it. A tree that grew past the limits since it was
// counted is such an error, found before the entry that passes them is written: the stream is
// cut off, never ended as if whole. When w is a FileWriter (and gz is off), file contents go
// to it as files, for it to send without copying them (sendfile).
func (a *Archive) WriteTo(w io.Writer, gz bool) error {
	var zw *gzip.Writer
	if gz {
		zw, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		w = zw
	}
	out := &tarOut{w: w}
	if fw, ok := w.(FileWriter); ok {
		out.fw = fw
	}
	var c count
	err := a.walk(&c, out)
	if err == nil {
		_, err = w.Write(make([]byte, 2*blockSize)) // the end of the archive
	}
	if err == nil && zw != nil {
		err = zw.Close()
	}
	return err
}

// FileWriter is a stream that takes file contents as files: WriteFile writes the next n bytes
// of f (from its offset), and fails if f has fewer. An archive hands it the contents of files
// of at least minFileWrite bytes this way, everything else as bytes.
type FileWriter interface {
	io.Writer
	WriteFile(f *os.File, n int64) error
}

// minFileWrite: smaller contents are copied into the stream, which costs less than a call of
// their own.
const minFileWrite = 64 << 10

// copyBuffer is the size of the reads that copy file contents into the stream.
const copyBuffer = 256 << 10

// tarOut writes the tar format: header blocks made by archive/tar (each entry's with a
// Writer of its own, so the contents can be written around it), contents, padding, the end.
type tarOut struct {
	w       io.Writer
	fw      FileWriter // w as a FileWriter, or nil
	buf     []byte
	scratch bytes.Buffer
}

func (o *tarOut) header(hdr *tar.Header) error {
	o.scratch.Reset()
	if err := tar.NewWriter(&o.scratch).WriteHeader(hdr); err != nil {
		return err
	}
	_, err := o.w.Write(o.scratch.Bytes())
	return err
}

// contents writes n bytes of f from its offset: exactly n, or an error when f has fewer (a
// file that shrank while it was archived: a tar cannot say so otherwise).
func (o *tarOut) contents(f *os.File, n int64) error {
	if o.fw != nil && n >= minFileWrite {
		return o.fw.WriteFile(f, n)
	}
	if o.buf == nil {
		o.buf = make([]byte, copyBuffer)
	}
	// writerOnly: w's own ReadFrom (a response's) would copy through a buffer of its own.
	m, err := io.CopyBuffer(writerOnly{o.w}, io.LimitReader(f, n), o.buf)
	if err == nil && m < n {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// pad ends an entry's contents of n bytes at a block boundary.
func (o *tarOut) pad(n int64) error {
	if p := padding(n); p > 0 {
		_, err := o.w.Write(zeroBlock[:p])
		return err
	}
	return nil
}

var zeroBlock [blockSize]byte

type writerOnly struct{ io.Writer }

// walk goes over the archive's entries, counting each against the limits, and writes them to
// out (nil: only counts).
func (a *Archive) walk(c *count, out *tarOut) error {
	links := map[fileID]string{} // hard-linked files archived so far: inode -> entry name
	if !a.fi.IsDir() {
		open := func() (*os.File, error) {
			return os.OpenFile(fdPath(a.f), os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		}
		return a.entry(c, out, links, a.fi.Name(), a.fi, "", open)
	}
	dir, err := os.OpenFile(fdPath(a.f), os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	return a.box.walk(dir, "", true, func(dir *os.File, name, rel string, fi fs.FileInfo) error {
		open := func() (*os.File, error) {
			return os.OpenFile(at(dir, name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			var err error
			if target, err = os.Readlink(at(dir, name)); err != nil {
				return err
			}
		}
		return a.entry(c, out, links, rel, fi, target, open)
	}, func(_ string, err error) error { return err })
}

// entry counts and writes one entry; open opens a regular file (never following a symlink).
func (a *Archive) entry(c *count, out *tarOut, links map[fileID]string, rel string, fi fs.FileInfo, target string, open func() (*os.File, error)) error {
	hdr := &tar.Header{Name: rel, Mode: tarMode(fi.Mode()), ModTime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		return a.file(c, out, links, hdr, fi, open)
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
	case fi.Mode()&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	default:
		return nil // FIFOs, sockets, devices
	}
	if err := a.add(c, out, 0, 0); err != nil || out == nil {
		return err
	}
	return out.header(hdr)
}

// file counts and writes a regular file: as a hard link to the entry that already holds its
// data, as a sparse entry, or whole.
func (a *Archive) file(c *count, out *tarOut, links map[fileID]string, hdr *tar.Header, fi fs.FileInfo, open func() (*os.File, error)) error {
	if first, ok := links[idOf(fi)]; ok && nlink(fi) > 1 {
		hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
		if err := a.add(c, out, 0, 0); err != nil || out == nil {
			return err
		}
		return out.header(hdr)
	}
	sparse := allocated(fi) < fi.Size()
	var f *os.File
	if out != nil || sparse { // counting opens only what may be sparse
		var err error
		if f, err = open(); err != nil {
			return err
		}
		defer f.Close()
		// What was opened is what gets archived, even if the name was replaced meanwhile.
		if fi, err = f.Stat(); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		sparse = allocated(fi) < fi.Size()
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	stored := fi.Size()
	var ext []extent
	if sparse {
		var err error
		if ext, stored, err = dataExtents(f, fi.Size()); err != nil {
			return err
		}
		if len(ext) == 1 && ext[0] == (extent{0, fi.Size()}) {
			ext, sparse = nil, false // all data after all
		}
	}
	if err := a.add(c, out, stored, fi.Size()); err != nil {
		return err
	}
	if nlink(fi) > 1 {
		links[idOf(fi)] = hdr.Name
	}
	if out == nil {
		return nil
	}
	if sparse {
		return writeSparse(out, hdr, f, ext)
	}
	if err := out.header(hdr); err != nil {
		return err
	}
	if err := out.contents(f, hdr.Size); err != nil {
		return fmt.Errorf("%s changed while it was archived: %w", hdr.Name, err)
	}
	return out.pad(hdr.Size)
}

// add counts an entry. Counting goes on past the limits (the answer gives the whole count);
// streaming stops there: the tree grew since it was counted.
func (a *Archive) add(c *count, out *tarOut, stored, logical int64) error {
	c.entries++
	c.bytes += stored
	c.logical += logical
	if over := c.over(a.lim); over != "" && out != nil {
		return fmt.Errorf("%s grew past its limits while it was archived (%s); the stream was cut off", a.path, over)
	}
	return nil
}

func nlink(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// allocated is the space fi's blocks take (fi.Size() when unknown).
func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
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
