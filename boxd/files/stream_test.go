package files

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fileWriter takes file contents as files (like boxd's connection with sendfile), recording
// how much came that way.
type fileWriter struct {
	bytes.Buffer
	asFiles int64
}

func (w *fileWriter) WriteFile(f *os.File, n int64) error {
	got, err := io.CopyN(&w.Buffer, f, n)
	w.asFiles += got
	return err
}

// A stream that takes contents as files gets the same tar, byte for byte, as one that takes
// bytes, with every large content (a file of 1 MiB, one of exactly minFileWrite, a sparse file's
// data region of 256 KiB) handed over as a file, and hard links as links.
func TestArchiveToAFileWriterIsTheSameTar(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src, 200)
	mustWrite(t, filepath.Join(src, "big.txt"), strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB
	mustWrite(t, filepath.Join(src, "edge.txt"), strings.Repeat("e", minFileWrite))
	for i := range 3 {
		if err := os.Link(filepath.Join(src, "big.txt"), filepath.Join(src, fmt.Sprintf("link%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Sparse: a 256 KiB data region, a hole, a small one at the end.
	f, err := os.Create(filepath.Join(src, "holes.sparse"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(bytes.Repeat([]byte("s"), 256<<10), 1<<20)
	if err == nil {
		_, err = f.WriteAt([]byte("tail"), 64<<20)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if allocatedOf(t, filepath.Join(src, "holes.sparse")) > 1<<20 {
		t.Skip("the file system here does not keep files sparse")
	}
	want := archiveOf(t, src, false).Bytes()

	a, err := box.PrepareArchive(src, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var fw fileWriter
	if err := a.WriteTo(&fw, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fw.Bytes(), want) {
		t.Fatalf("the tars differ: %d and %d bytes", fw.Len(), len(want))
	}
	if wantFiles := int64(1<<20 + minFileWrite + 256<<10); fw.asFiles != wantFiles {
		t.Fatalf("%d bytes went as files, want %d", fw.asFiles, wantFiles)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if _, err := box.Extract(dst, &fw.Buffer, Limits{Bytes: 1 << 31, Entries: 10_000}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, snapshot(t, src), snapshot(t, dst))
	if !sameContent(t, filepath.Join(src, "holes.sparse"), filepath.Join(dst, "holes.sparse")) || allocatedOf(t, filepath.Join(dst, "holes.sparse")) > 1<<20 {
		t.Fatal("the sparse file came back different, or not sparse")
	}
}

// cutAfter reads r, then fails: a body broken off by its sender.
type cutAfter struct{ r io.Reader }

func (c cutAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// An extraction is moved into place only once its body has ended cleanly: a body broken off
// after the archive's end (a sender that found the data corrupt), a gzip stream whose checksum
// fails, or more than maxTrailing bytes after the end are refused with nothing changed. Padding
// after the end (GNU tar's records) is fine.
func TestExtractWaitsForTheBodyToEnd(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dest")
	mustWrite(t, filepath.Join(dst, "old.txt"), "old")
	archive := tarOf(t, entry{name: "new.txt", body: "new"}).Bytes()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(archive)
	_ = zw.Close()
	badSum := bytes.Clone(gz.Bytes())
	badSum[len(badSum)-6] ^= 0xff // the CRC-32 in the trailer

	for name, body := range map[string]func() io.Reader{
		"cut off after the end":        func() io.Reader { return cutAfter{bytes.NewReader(archive)} },
		"cut off after the end (gzip)": func() io.Reader { return cutAfter{bytes.NewReader(gz.Bytes())} },
		"gzip checksum wrong":          func() io.Reader { return bytes.NewReader(badSum) },
		"more than maxTrailing after it": func() io.Reader {
			return io.MultiReader(bytes.NewReader(archive), bytes.NewReader(make([]byte, maxTrailing+1)))
		},
	} {
		for _, extract := range []func(string, io.Reader, Limits) (ExtractResult, error){box.Extract, box.ExtractReplacing} {
			_, err := extract(dst, body(), Limits{Bytes: 1000, Entries: 10})
			wantStatus(t, err, http.StatusBadRequest)
			if err != nil && !strings.Contains(err.Error(), "nothing was changed") {
				t.Fatalf("%s: %v", name, err)
			}
			assertOnly(t, dst, "old.txt")
		}
	}
	padded := io.MultiReader(bytes.NewReader(archive), bytes.NewReader(make([]byte, 10<<10)))
	if _, err := box.Extract(dst, padded, Limits{Bytes: 1000, Entries: 10}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, filepath.Join(dst, "new.txt"), "new")
	if _, err := box.Extract(dst, bytes.NewReader(gz.Bytes()), Limits{Bytes: 1000, Entries: 10}); err != nil {
		t.Fatal(err)
	}
}
