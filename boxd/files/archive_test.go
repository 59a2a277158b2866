package files

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// makeTree writes a tree of n files in nested directories with assorted sizes, modes, empty
// directories and relative symlinks.
func makeTree(t *testing.T, root string, n int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	modes := []fs.FileMode{0o644, 0o755, 0o600, 0o700, 0o444, 0o640}
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%d", i%7), fmt.Sprintf("e%d", i%13))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		content := make([]byte, rng.IntN(3000))
		for j := range content {
			content[j] = byte(rng.IntN(256))
		}
		p := filepath.Join(dir, fmt.Sprintf("f%04d.bin", i))
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, modes[i%len(modes)]); err != nil {
			t.Fatal(err)
		}
	}
	for d, mode := range map[string]fs.FileMode{"empty": 0o700, "d1/private": 0o700, "shared": 0o775 | fs.ModeSetgid, "drop": 0o777 | fs.ModeSticky} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, d), mode); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{"top-link": "d0/e0", "d2/up-link": "../d3/e3/f0003.bin", "dangling": "no-such-file"}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot describes a tree: type, permission bits, content or link target per path.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "link " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %v", fi.Mode()&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky))
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %o %x", fi.Mode().Perm(), b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, a, b map[string]string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d entries vs %d", len(a), len(b))
	}
	for k, v := range a {
		if b[k] != v {
			t.Fatalf("%s differs: %.60q vs %.60q", k, v, b[k])
		}
	}
}

func archiveOf(t *testing.T, p string, gz bool) *bytes.Buffer {
	t.Helper()
	a, err := box.PrepareArchive(p, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := a.WriteTo(&buf, gz); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestArchiveRoundTripOf1000Files(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src, 1000)
	want := snapshot(t, src)
	for _, gz := range []bool{false, true} {
		buf := archiveOf(t, src, gz)
		if gz && !bytes.HasPrefix(buf.Bytes(), []byte{0x1f, 0x8b}) {
			t.Fatal("gzip=true did not compress")
		}
		dst := filepath.Join(t.TempDir(), "new", "dest") // created, parents too
		res, err := box.Extract(dst, buf, Limits{Bytes: 1 << 30, Entries: 10_000})
		if err != nil {
			t.Fatal(err)
		}
		if res.Entries != int64(len(want)) || res.Path != dst {
			t.Fatalf("gzip %v: %+v, want %d entries", gz, res, len(want))
		}
		sameTree(t, want, snapshot(t, dst))
	}
}

func TestArchiveOfOneFileAndMergeIntoExistingDir(t *testing.T) {
	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "one.txt"), "one")
	buf := archiveOf(t, filepath.Join(src, "one.txt"), false)
	tr := tar.NewReader(buf)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "one.txt" || hdr.Size != 3 {
		t.Fatalf("%+v %v", hdr, err)
	}

	dst := t.TempDir()
	mustWrite(t, filepath.Join(dst, "keep.txt"), "kept")
	mustWrite(t, filepath.Join(dst, "sub", "old.txt"), "old")
	mustWrite(t, filepath.Join(dst, "sub", "replace.txt"), "before")
	body := tarOf(t,
		entry{name: "sub/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "sub/replace.txt", body: "after"},
		entry{name: "sub/new.txt", body: "new"},
		entry{name: "fresh/deep/x.txt", body: "x"},
	)
	if _, err := box.Extract(dst, body, Limits{Bytes: 1000, Entries: 100}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, filepath.Join(dst, "keep.txt"), "kept")
	assertContent(t, filepath.Join(dst, "sub", "old.txt"), "old")
	assertContent(t, filepath.Join(dst, "sub", "replace.txt"), "after")
	assertContent(t, filepath.Join(dst, "sub", "new.txt"), "new")
	assertContent(t, filepath.Join(dst, "fresh", "deep", "x.txt"), "x")
	assertOnly(t, dst, "fresh", "keep.txt", "sub") // no staging directory left
}

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func tarOf(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body)), ModTime: time.Unix(1e9, 0)}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if hdr.Typeflag != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// Each escape is refused with 400 and nothing changed: not in dest, not beside it.
func TestArchiveRefusesEscapes(t *testing.T) {
	ok := entry{name: "fine.txt", body: "fine"}
	cases := map[string][]entry{
		"dot-dot":                        {ok, {name: "../x", body: "x"}},
		"dot-dot inside":                 {ok, {name: "a/../../x", body: "x"}},
		"absolute name":                  {ok, {name: "/tmp/x", body: "x"}},
		"symlink to an absolute target":  {ok, {name: "l", typ: tar.TypeSymlink, link: "/etc/passwd"}},
		"symlink leaving the dir":        {ok, {name: "l", typ: tar.TypeSymlink, link: "../outside"}},
		"symlink leaving from below":     {ok, {name: "a/l", typ: tar.TypeSymlink, link: "b/../../../x"}},
		"entry through a symlink dir":    {ok, {name: "sub/", typ: tar.TypeDir}, {name: "d", typ: tar.TypeSymlink, link: "sub"}, {name: "d/f", body: "x"}},
		"symlink through a symlink":      {ok, {name: "d", typ: tar.TypeSymlink, link: "."}, {name: "l", typ: tar.TypeSymlink, link: "d/.."}},
		"symlink later made a traversal": {ok, {name: "l", typ: tar.TypeSymlink, link: "d/../x"}, {name: "d", typ: tar.TypeSymlink, link: "."}},
		"dir replaced by a symlink":      {ok, {name: "d/f", body: "x"}, {name: "d", typ: tar.TypeSymlink, link: "."}},
		"hard link to nothing extracted": {ok, {name: "h", typ: tar.TypeLink, link: "marker"}},
		"hard link leaving the dir":      {ok, {name: "h", typ: tar.TypeLink, link: "../outside"}},
		"hard link to an absolute name":  {ok, {name: "h", typ: tar.TypeLink, link: "/etc/passwd"}},
		"hard link to a later file":      {{name: "h", typ: tar.TypeLink, link: "fine.txt"}, ok},
		"hard link to a symlink":         {ok, {name: "l", typ: tar.TypeSymlink, link: "fine.txt"}, {name: "h", typ: tar.TypeLink, link: "l"}},
		"hard link to a directory":       {ok, {name: "d/", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, link: "d"}},
		"hard link to itself":            {ok, {name: "h", typ: tar.TypeLink, link: "h"}},
		"hard link to a replaced file":   {ok, {name: "fine.txt", typ: tar.TypeSymlink, link: "x"}, {name: "h", typ: tar.TypeLink, link: "fine.txt"}},
		"hard link through a symlink":    {{name: "d/f", body: "x"}, {name: "l", typ: tar.TypeSymlink, link: "d"}, {name: "h", typ: tar.TypeLink, link: "l/f"}},
		"char device":                    {ok, {name: "null", typ: tar.TypeChar}},
		"block device":                   {ok, {name: "sda", typ: tar.TypeBlock}},
		"FIFO":                           {ok, {name: "fifo", typ: tar.TypeFifo}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "dest")
			mustWrite(t, filepath.Join(dst, "marker"), "m")
			before := snapshot(t, parent)
			_, err := box.Extract(dst, tarOf(t, entries...), Limits{Bytes: 1 << 20, Entries: 100})
			wantStatus(t, err, http.StatusBadRequest)
			sameTree(t, before, snapshot(t, parent))

			// Into a directory that does not exist yet: it still does not.
			_, err = box.Extract(filepath.Join(parent, "new", "dest"), tarOf(t, entries...), Limits{Bytes: 1 << 20, Entries: 100})
			wantStatus(t, err, http.StatusBadRequest)
			sameTree(t, before, snapshot(t, parent))
		})
	}
}

func TestArchiveRefusesWritingThroughSymlinksAlreadyInDest(t *testing.T) {
	parent := t.TempDir()
	dst := filepath.Join(parent, "dest")
	outside := filepath.Join(parent, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dst, "marker"), "m")
	if err := os.Symlink(outside, filepath.Join(dst, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..", filepath.Join(dst, "up")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, parent)
	for _, entries := range [][]entry{
		{{name: "link/f", body: "x"}},
		{{name: "l2", typ: tar.TypeSymlink, link: "up/outside"}},
	} {
		_, err := box.Extract(dst, tarOf(t, entries...), Limits{Bytes: 1 << 20, Entries: 100})
		wantStatus(t, err, http.StatusBadRequest)
		sameTree(t, before, snapshot(t, parent))
	}
}

func TestArchiveLimits(t *testing.T) {
	parent := t.TempDir()
	dst := filepath.Join(parent, "dest")
	mustWrite(t, filepath.Join(dst, "marker"), "m")
	before := snapshot(t, parent)
	big := strings.Repeat("x", 600)

	_, err := box.Extract(dst, tarOf(t, entry{name: "a", body: big}, entry{name: "b", body: big}), Limits{Bytes: 1000, Entries: 100})
	wantStatus(t, err, http.StatusRequestEntityTooLarge)
	sameTree(t, before, snapshot(t, parent))

	_, err = box.Extract(dst, tarOf(t, entry{name: "a"}, entry{name: "b"}, entry{name: "c"}), Limits{Bytes: 1000, Entries: 2})
	wantStatus(t, err, http.StatusRequestEntityTooLarge)
	sameTree(t, before, snapshot(t, parent))

	res, err := box.Extract(dst, tarOf(t, entry{name: "a", body: big}, entry{name: "b", body: "y"}), Limits{Bytes: 601, Entries: 2})
	if err != nil || res.Entries != 2 || res.Bytes != 601 {
		t.Fatalf("at the limits: %+v %v", res, err)
	}
}

func TestArchiveBodyFormats(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dest")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(tarOf(t, entry{name: "z.txt", body: "zipped"}).Bytes())
	_ = zw.Close()
	if _, err := box.Extract(dst, &gz, Limits{Bytes: 1000, Entries: 10}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, filepath.Join(dst, "z.txt"), "zipped")

	for name, body := range map[string][]byte{
		"not a tar":      bytes.Repeat([]byte("garbage!"), 200),
		"broken gzip":    {0x1f, 0x8b, 0, 1, 2, 3},
		"cut-off tar":    tarOf(t, entry{name: "big", body: strings.Repeat("b", 5000)}).Bytes()[:2000],
		"duplicate kind": tarOf(t, entry{name: "x/", typ: tar.TypeDir}, entry{name: "x", body: "file over dir"}).Bytes(),
	} {
		_, err := box.Extract(dst, bytes.NewReader(body), Limits{Bytes: 1 << 20, Entries: 10})
		if err == nil {
			t.Fatalf("%s: accepted", name)
		}
		wantStatus(t, err, http.StatusBadRequest)
	}
	assertOnly(t, dst, "z.txt")

	// A file into the place of an existing file of dest is fine; over a directory it is not.
	mustWrite(t, filepath.Join(dst, "dir", "f"), "f")
	_, err := box.Extract(dst, tarOf(t, entry{name: "dir", body: "x"}), Limits{Bytes: 1000, Entries: 10})
	wantStatus(t, err, http.StatusConflict)
	_, err = box.Extract(filepath.Join(dst, "z.txt"), tarOf(t, entry{name: "a", body: "x"}), Limits{Bytes: 1000, Entries: 10})
	wantStatus(t, err, http.StatusBadRequest)
}

// Replacing: dest ends up holding exactly the archive (old files, directories and symlinks
// gone, no staging or trash directory left); a refused archive changes nothing.
func TestArchiveExtractReplacing(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dest")
	mustWrite(t, filepath.Join(dst, "old.txt"), "old")
	mustWrite(t, filepath.Join(dst, "sub", "old.txt"), "old")
	mustWrite(t, filepath.Join(dst, "sub", "same.txt"), "before")
	if err := os.Symlink("old.txt", filepath.Join(dst, "link")); err != nil {
		t.Fatal(err)
	}
	// Read-only directories box code left, at the top and deeper: moved aside and removed all the same
	// (as root here permissions are not checked; test/integration/platform.test.ts checks them as the box user).
	mustWrite(t, filepath.Join(dst, "ro", "f"), "f")
	mustWrite(t, filepath.Join(dst, "deep", "locked", "f"), "f")
	for _, d := range []string{filepath.Join(dst, "ro"), filepath.Join(dst, "deep", "locked")} {
		if err := os.Chmod(d, 0o500); err != nil {
			t.Fatal(err)
		}
	}
	body := tarOf(t, entry{name: "sub/same.txt", body: "after"}, entry{name: "new/x.txt", body: "x"})
	if _, err := box.ExtractReplacing(dst, body, Limits{Bytes: 1000, Entries: 100}); err != nil {
		t.Fatal(err)
	}
	assertContent(t, filepath.Join(dst, "sub", "same.txt"), "after")
	assertContent(t, filepath.Join(dst, "new", "x.txt"), "x")
	assertOnly(t, dst, "new", "sub")
	assertOnly(t, filepath.Join(dst, "sub"), "same.txt")

	before := snapshot(t, dst)
	_, err := box.ExtractReplacing(dst, tarOf(t, entry{name: "fine.txt", body: "x"}, entry{name: "../escape", body: "x"}), Limits{Bytes: 1000, Entries: 100})
	wantStatus(t, err, http.StatusBadRequest)
	sameTree(t, before, snapshot(t, dst))
}
