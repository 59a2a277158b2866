package files

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"sandbox-bridge.io/boxd/errs"
)

// makeLinksAndSparse writes, under root: a 1 GiB sparse file with a few data blocks (one at its
// very end), a 100 MiB one that ends in a hole, a 10 MiB one that is all hole, and a 256 KiB
// file of random bytes with 50 more hard links to it.
func makeLinksAndSparse(t *testing.T, root string) {
	t.Helper()
	sparse := func(name string, size int64, at ...int64) {
		f, err := os.Create(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		for i, off := range at {
			if _, err := f.WriteAt([]byte(fmt.Sprintf("data block %d at %d\n", i, off)), off); err != nil {
				t.Fatal(err)
			}
		}
	}
	sparse("big.sparse", 1<<30, 0, 300<<20, 777<<20+12345, 1<<30-20)
	sparse("tail-hole.sparse", 100<<20, 4096)
	sparse("all-hole.sparse", 10<<20)
	rnd := make([]byte, 256<<10)
	for i := range rnd {
		rnd[i] = byte(rand.IntN(256))
	}
	mustWrite(t, filepath.Join(root, "data.bin"), string(rnd))
	for i := 0; i < 50; i++ {
		dir := filepath.Join(root, "links", fmt.Sprint(i%3))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(root, "data.bin"), filepath.Join(dir, fmt.Sprintf("l%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"big.sparse", "tail-hole.sparse", "all-hole.sparse"} {
		if allocatedOf(t, filepath.Join(root, name)) > 1<<20 {
			t.Skipf("the file system here does not keep %s sparse", name)
		}
	}
}

func allocatedOf(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// sameContent reports whether files a and b hold the same bytes.
func sameContent(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if ea != nil || eb != nil {
			return ea == eb || (ea == io.ErrUnexpectedEOF) == (eb == io.ErrUnexpectedEOF)
		}
	}
}

// sameLinksAndSparse checks dst against src as makeLinksAndSparse made it.
func sameLinksAndSparse(t *testing.T, src, dst string) {
	t.Helper()
	for _, name := range []string{"big.sparse", "tail-hole.sparse", "all-hole.sparse", "data.bin"} {
		a, b := filepath.Join(src, name), filepath.Join(dst, name)
		sa, _ := os.Stat(a)
		sb, err := os.Stat(b)
		if err != nil || sa.Size() != sb.Size() || !sameContent(t, a, b) {
			t.Fatalf("%s differs (%v)", name, err)
		}
		if strings.HasSuffix(name, ".sparse") && allocatedOf(t, b) > 1<<20 {
			t.Fatalf("%s was restored with %d bytes allocated for %d", name, allocatedOf(t, b), sb.Size())
		}
	}
	data, _ := os.Stat(filepath.Join(dst, "data.bin"))
	for i := 0; i < 50; i++ {
		l, err := os.Stat(filepath.Join(dst, "links", fmt.Sprint(i%3), fmt.Sprintf("l%02d", i)))
		if err != nil || !os.SameFile(data, l) {
			t.Fatalf("link %d is not the same file (%v)", i, err)
		}
	}
	if n := data.Sys().(*syscall.Stat_t).Nlink; n != 51 {
		t.Fatalf("data.bin has %d links, want 51", n)
	}
}

func TestArchiveKeepsHardLinksAndSparseFiles(t *testing.T) {
	src := t.TempDir()
	makeLinksAndSparse(t, src)
	a, err := box.PrepareArchive(src, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var buf bytes.Buffer
	if err := a.WriteTo(&buf, true); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 1<<20 {
		t.Fatalf("the archive is %d bytes gzipped", buf.Len())
	}
	// 4 files, 4 directories, 50 links; data: the random file once, the sparse files' data blocks.
	if a.Entries != 58 || a.Bytes < 256<<10 || a.Bytes > 256<<10+64<<10 {
		t.Fatalf("counted %d entries, %d bytes", a.Entries, a.Bytes)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	res, err := box.Extract(dst, &buf, Limits{Bytes: a.Bytes, Entries: a.Entries})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != a.Entries || res.Bytes != a.Bytes {
		t.Fatalf("extraction counted %+v, the archive %d entries and %d bytes", res, a.Entries, a.Bytes)
	}
	sameLinksAndSparse(t, src, dst)
}

// Our archives are what GNU tar reads, and what GNU tar writes (PAX, sparse 1.0) we read.
func TestArchiveSparseAndLinksWithGNUTar(t *testing.T) {
	gnutar, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("no tar here")
	}
	if out, _ := exec.Command(gnutar, "--version").Output(); !bytes.Contains(out, []byte("GNU tar")) {
		t.Skip("tar here is not GNU tar")
	}
	src := t.TempDir()
	makeLinksAndSparse(t, src)

	dst := t.TempDir()
	cmd := exec.Command(gnutar, "-xzf", "-", "-C", dst)
	cmd.Stdin = archiveOf(t, src, true)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GNU tar: %v: %s", err, out)
	}
	sameLinksAndSparse(t, src, dst)

	out, err := exec.Command(gnutar, "--format=posix", "--sparse", "--sparse-version=1.0", "-czf", "-", "-C", src, ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	dst = filepath.Join(t.TempDir(), "dst")
	if _, err := box.Extract(dst, bytes.NewReader(out), Limits{Bytes: 1 << 20, Entries: 100}); err != nil {
		t.Fatal(err)
	}
	sameLinksAndSparse(t, src, dst)
}

// Both routes count alike: whatever an archive made under limits holds, its extraction under
// the same limits accepts; one less of either is refused on both sides, before anything is
// sent or changed.
func TestArchiveLimitsCountAlike(t *testing.T) {
	src := t.TempDir()
	makeLinksAndSparse(t, src)
	makeTree(t, filepath.Join(src, "tree"), 300)
	// Zeros in a dense file are stored (and counted) whole, and restored as holes.
	mustWrite(t, filepath.Join(src, "zeros.bin"), strings.Repeat("\x00", 100<<10)+"end")

	all, err := box.PrepareArchive(src, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	all.Close()
	exact := Limits{Bytes: all.Bytes, Entries: all.Entries}
	a, err := box.PrepareArchive(src, exact)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := a.WriteTo(&buf, false); err != nil {
		t.Fatal(err)
	}
	a.Close()

	for _, lim := range []Limits{{Bytes: exact.Bytes - 1}, {Entries: exact.Entries - 1}} {
		_, err := box.PrepareArchive(src, lim)
		wantStatus(t, err, http.StatusRequestEntityTooLarge)
		msg := errs.As(err).Message
		if !strings.Contains(msg, fmt.Sprintf("%d entries and %d bytes", exact.Entries, exact.Bytes)) || !strings.Contains(msg, "nothing was sent") {
			t.Fatalf("the refusal does not give the counts and the limit: %s", msg)
		}
		_, err = box.Extract(filepath.Join(t.TempDir(), "dst"), bytes.NewReader(buf.Bytes()), Limits{Bytes: max(lim.Bytes, 1), Entries: max(lim.Entries, 1)})
		wantStatus(t, err, http.StatusRequestEntityTooLarge)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	res, err := box.Extract(dst, bytes.NewReader(buf.Bytes()), exact)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != exact.Entries || res.Bytes != exact.Bytes {
		t.Fatalf("extraction counted %+v, the archive %+v", res, exact)
	}
	sameTree(t, snapshot(t, filepath.Join(src, "tree")), snapshot(t, filepath.Join(dst, "tree")))
	assertContent(t, filepath.Join(dst, "zeros.bin"), strings.Repeat("\x00", 100<<10)+"end")
	if n := allocatedOf(t, filepath.Join(dst, "zeros.bin")); n > 16<<10 {
		t.Fatalf("100 KiB of zeros restored with %d bytes allocated", n)
	}
}

// A tree that grows past the limits between the count and the stream is cut off: the reader
// sees a broken stream, never a well-formed short archive.
func TestArchiveStreamCutWhenTheTreeGrows(t *testing.T) {
	for _, grow := range []string{"entries", "bytes"} {
		for _, gz := range []bool{false, true} {
			src := t.TempDir()
			makeTree(t, src, 50)
			all, err := box.PrepareArchive(src, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			all.Close()
			a, err := box.PrepareArchive(src, Limits{Bytes: all.Bytes, Entries: all.Entries})
			if err != nil {
				t.Fatal(err)
			}
			if grow == "entries" {
				mustWrite(t, filepath.Join(src, "zz-late"), "")
			} else {
				mustWrite(t, filepath.Join(src, "zz-late"), "one byte too many")
				_ = os.Remove(filepath.Join(src, "top-link"))
			}
			var buf bytes.Buffer
			err = a.WriteTo(&buf, gz)
			a.Close()
			if err == nil || !strings.Contains(err.Error(), "cut off") {
				t.Fatalf("%s, gzip %v: %v", grow, gz, err)
			}
			var r io.Reader = &buf
			if gz {
				zr, err := gzip.NewReader(r)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadAll(zr); err == nil {
					t.Fatalf("%s: the gzip stream reads as whole", grow)
				}
				continue
			}
			if b := buf.Bytes(); len(b) >= 1024 && bytes.Equal(b[len(b)-1024:], make([]byte, 1024)) {
				t.Fatalf("%s: the tar ends with its end-of-archive blocks", grow)
			}
		}
	}
}

// Holes are free by the count but not to read back (archive/tar reads them as zeros), so the
// files' sizes have a bound on both routes.
func TestArchiveBoundsSparseSizes(t *testing.T) {
	src := t.TempDir()
	f, err := os.Create(filepath.Join(src, "huge.sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(maxLogical + 1); err != nil {
		t.Skipf("cannot make a file of %d bytes here: %v", int64(maxLogical+1), err)
	}
	_, err = box.PrepareArchive(src, Limits{})
	wantStatus(t, err, http.StatusRequestEntityTooLarge)

	var buf bytes.Buffer
	hdr := &tar.Header{Name: "huge.sparse", Mode: 0o644, Size: maxLogical + 1}
	if err := writeSparse(&tarOut{w: &buf}, hdr, f, nil); err != nil {
		t.Fatal(err)
	}
	buf.Write(make([]byte, 1024))
	_, err = box.Extract(filepath.Join(t.TempDir(), "dst"), &buf, Limits{Bytes: 1 << 20, Entries: 10})
	wantStatus(t, err, http.StatusRequestEntityTooLarge)
}
