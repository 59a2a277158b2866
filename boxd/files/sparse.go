package files

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"syscall"
)

// Sparse files, both ways. An archive stores a sparse file (fewer blocks allocated than its
// size) as a PAX 1.0 sparse entry, the format GNU tar writes with --sparse-version=1.0 and both
// GNU tar and Go's archive/tar read: PAX records GNU.sparse.major=1, GNU.sparse.minor=0,
// GNU.sparse.name (the real name), GNU.sparse.realsize; the entry's data starts with the map of
// data regions (a count, then offset and length per region, in decimal lines, padded to 512
// bytes), followed by those regions only. Extraction leaves every all-zero block a hole.

const (
	seekData = 3 // SEEK_DATA and SEEK_HOLE: os.File.Seek passes whence through to lseek
	seekHole = 4
	// maxExtents keeps a sparse map far below the 1 MiB archive/tar accepts for one; a file
	// with more data regions has its closest ones merged (the holes between them stored).
	maxExtents = 10_000
	blockSize  = 512 // tar's block
	zeroRun    = 4096
)

// extent is a data region of a file.
type extent struct{ off, n int64 }

// dataExtents returns f's data regions (size bytes long) as lseek reports them, at most
// maxExtents of them, and the bytes they hold.
func dataExtents(f *os.File, size int64) ([]extent, int64, error) {
	var ext []extent
	for off := int64(0); off < size; {
		data, err := f.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) {
			break // only a hole from off to the end
		}
		if err != nil {
			return nil, 0, err
		}
		if data >= size {
			break
		}
		hole, err := f.Seek(data, seekHole)
		if err != nil {
			return nil, 0, err
		}
		hole = min(hole, size)
		ext = append(ext, extent{data, hole - data})
		off = hole
	}
	ext = coalesce(ext, maxExtents)
	var n int64
	for _, e := range ext {
		n += e.n
	}
	return ext, n, nil
}

// coalesce merges neighbouring regions, closest first, until at most max remain.
func coalesce(ext []extent, max int) []extent {
	for gap := int64(4096); len(ext) > max; gap *= 2 {
		out := ext[:1]
		for _, e := range ext[1:] {
			last := &out[len(out)-1]
			if e.off-(last.off+last.n) <= gap {
				last.n = e.off + e.n - last.off
				continue
			}
			out = append(out, e)
		}
		ext = out
	}
	return ext
}

// writeSparse writes hdr (a regular file of hdr.Size bytes) as a PAX 1.0 sparse entry holding
// the regions ext of f. archive/tar's Writer cannot: it drops GNU.sparse.* records
// (golang.org/issue/22735), so the two header blocks are made here.
func writeSparse(out *tarOut, hdr *tar.Header, f *os.File, ext []extent) error {
	// The map; a file that ends in a hole ends its map with an empty region at the end, as
	// GNU tar writes it.
	if len(ext) == 0 || ext[len(ext)-1].off+ext[len(ext)-1].n < hdr.Size {
		ext = append(slices.Clip(ext), extent{hdr.Size, 0})
	}
	m := strconv.AppendInt(nil, int64(len(ext)), 10)
	m = append(m, '\n')
	stored := int64(0)
	for _, e := range ext {
		m = append(strconv.AppendInt(m, e.off, 10), '\n')
		m = append(strconv.AppendInt(m, e.n, 10), '\n')
		stored += e.n
	}
	m = append(m, make([]byte, padding(int64(len(m))))...)
	stored += int64(len(m))

	recs := map[string]string{
		"GNU.sparse.major":    "1",
		"GNU.sparse.minor":    "0",
		"GNU.sparse.name":     hdr.Name,
		"GNU.sparse.realsize": strconv.FormatInt(hdr.Size, 10),
	}
	mtime := hdr.ModTime.Unix()
	for k, v := range map[string]int64{"size": stored, "uid": int64(hdr.Uid), "gid": int64(hdr.Gid), "mtime": mtime} {
		if !fitsOctal(k, v) {
			recs[k] = strconv.FormatInt(v, 10)
		}
	}
	var pax []byte
	for _, k := range slices.Sorted(maps.Keys(recs)) {
		pax = append(pax, paxRecord(k, recs[k])...)
	}
	dir, file := path.Split(hdr.Name)
	var blocks bytes.Buffer
	blocks.Write(headerBlock(path.Join(dir, "PaxHeaders.0", file), 0o644, 0, 0, int64(len(pax)), mtime, tar.TypeXHeader))
	blocks.Write(pax)
	blocks.Write(make([]byte, padding(int64(len(pax)))))
	blocks.Write(headerBlock(path.Join(dir, "GNUSparseFile.0", file), hdr.Mode, int64(hdr.Uid), int64(hdr.Gid), stored, mtime, tar.TypeReg))
	blocks.Write(m)
	if _, err := out.w.Write(blocks.Bytes()); err != nil {
		return err
	}
	for _, e := range ext {
		_, err := f.Seek(e.off, io.SeekStart)
		if err == nil {
			err = out.contents(f, e.n)
		}
		if err != nil {
			return fmt.Errorf("%s changed while it was archived: %w", hdr.Name, err)
		}
	}
	return out.pad(stored)
}

func padding(n int64) int64 { return -n & (blockSize - 1) }

// fitsOctal reports whether v fits the header field of k (else a PAX record carries it).
func fitsOctal(k string, v int64) bool {
	width := 11 // size, mtime
	if k == "uid" || k == "gid" {
		width = 7
	}
	return v >= 0 && v < 1<<(3*width)
}

// headerBlock formats a ustar header block; fields that do not fit are left zero (a PAX record
// carries them) and the name is cut to its field (GNU.sparse.name carries the real one).
func headerBlock(name string, mode, uid, gid, size, mtime int64, typ byte) []byte {
	b := make([]byte, blockSize)
	copy(b[0:100], name)
	octal(b[100:108], mode)
	octal(b[108:116], uid)
	octal(b[116:124], gid)
	octal(b[124:136], size)
	octal(b[136:148], mtime)
	b[156] = typ
	copy(b[257:265], "ustar\x0000")
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func octal(field []byte, v int64) {
	s := strconv.FormatInt(v, 8)
	if v < 0 || len(s) > len(field)-1 {
		s = "0"
	}
	for i := range field[:len(field)-1] {
		field[i] = '0'
	}
	copy(field[len(field)-1-len(s):], s)
}

// paxRecord formats "<length> <key>=<value>\n", the length counting itself.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	n += len(strconv.Itoa(n))
	rec := strconv.Itoa(n) + " " + k + "=" + v + "\n"
	if len(rec) != n { // the length gained a digit
		rec = strconv.Itoa(len(rec)) + " " + k + "=" + v + "\n"
	}
	return rec
}

// copySparse copies r into f (new and empty), leaving every all-zero 4 KiB block a hole, then
// sets f's size: holes of a sparse entry (archive/tar reads them back as zeros) and zeros of a
// dense one alike take no space. check runs after each read, before anything is written.
func copySparse(f *os.File, r io.Reader, buf []byte, check func() error) error {
	var off int64
	for {
		n, err := readFull(r, buf)
		if n > 0 {
			if err := check(); err != nil {
				return err
			}
			if err := writeData(f, buf[:n], off); err != nil {
				return err
			}
			off += int64(n)
		}
		if err == io.EOF {
			return f.Truncate(off)
		}
		if err != nil {
			return err
		}
	}
}

var zeros [zeroRun]byte

// writeData writes the blocks of b (at off, a multiple of zeroRun) that are not all zeros.
func writeData(f *os.File, b []byte, off int64) error {
	start := -1
	for i := 0; i < len(b); i += zeroRun {
		end := min(i+zeroRun, len(b))
		if !bytes.Equal(b[i:end], zeros[:end-i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			if _, err := f.WriteAt(b[start:i], off+int64(start)); err != nil {
				return err
			}
			start = -1
		}
	}
	if start >= 0 {
		_, err := f.WriteAt(b[start:], off+int64(start))
		return err
	}
	return nil
}

// readFull fills b unless r ends first (then io.EOF, with what was read).
func readFull(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
