package files

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"sandbox-bridge.io/boxd/errs"
)

const credential = "the-box-credential"

// ownLayout is a box in a temporary directory: boxd's directories as in a pod (the secret
// mount in the kubelet's layout: token -> ..data/token, ..data -> ..<timestamp>) and a
// workspace in which box code planted symlinks into them.
type ownLayout struct {
	root, secret, bin, ws string
	box                   *Box
}

func newOwnLayout(t *testing.T) *ownLayout {
	t.Helper()
	root := t.TempDir()
	l := &ownLayout{
		root:   root,
		secret: filepath.Join(root, "opt", "sandbox-bridge", "secret"),
		bin:    filepath.Join(root, "opt", "sandbox-bridge", "bin"),
		ws:     filepath.Join(root, "workspace"),
	}
	mustWrite(t, filepath.Join(l.secret, "..2025_01_01", "token"), credential)
	mustWrite(t, filepath.Join(l.secret, "..2025_01_01", "env"), `{"API_KEY":"`+credential+`"}`)
	mustWrite(t, filepath.Join(l.bin, "boxd"), "boxd binary")
	mustWrite(t, filepath.Join(l.ws, "ok.txt"), "ok")
	links := map[string]string{
		filepath.Join(l.secret, "..data"):   "..2025_01_01",
		filepath.Join(l.secret, "token"):    "..data/token",
		filepath.Join(l.secret, "env"):      "..data/env",
		filepath.Join(l.ws, "l-token"):      filepath.Join(l.secret, "token"), // absolute
		filepath.Join(l.ws, "l-token-rel"):  "../opt/sandbox-bridge/secret/token",
		filepath.Join(l.ws, "l-secret"):     l.secret,                // a directory
		filepath.Join(l.ws, "l-sb"):         "../opt/sandbox-bridge", // above both
		filepath.Join(l.ws, "l-boxd"):       filepath.Join(l.bin, "boxd"),
		filepath.Join(l.ws, "l-new-in-bin"): filepath.Join(l.bin, "planted"), // dangling
	}
	for name, target := range links {
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	l.box = NewBox([]string{l.secret, l.bin})
	return l
}

// paths reaching boxd's directories: absolute, climbing with "..", through planted symlinks.
func (l *ownLayout) paths() []string {
	return []string{
		l.secret, filepath.Join(l.secret, "token"), filepath.Join(l.secret, "..data", "env"), l.bin, filepath.Join(l.bin, "boxd"),
		l.ws + "/../opt/sandbox-bridge/secret/token", l.ws + "/sub/../../opt/sandbox-bridge/bin",
		filepath.Join(l.ws, "l-token"), filepath.Join(l.ws, "l-token-rel"), filepath.Join(l.ws, "l-secret"),
		filepath.Join(l.ws, "l-secret", "token"), filepath.Join(l.ws, "l-sb", "secret"), filepath.Join(l.ws, "l-sb", "bin", "boxd"),
		filepath.Join(l.ws, "l-boxd"), filepath.Join(l.ws, "l-secret", "new-file"), filepath.Join(l.ws, "l-new-in-bin"),
	}
}

// unchanged fails unless boxd's directories hold what they held.
func (l *ownLayout) unchanged(t *testing.T) {
	t.Helper()
	assertContent(t, filepath.Join(l.secret, "token"), credential)
	assertContent(t, filepath.Join(l.bin, "boxd"), "boxd binary")
	assertOnly(t, l.bin, "boxd")
	assertOnly(t, l.secret, "..2025_01_01", "..data", "env", "token")
}

func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: not refused", what)
	}
	if e := errs.As(err); e.Status != http.StatusForbidden || e.Type != "forbidden" || !strings.Contains(e.Message, "boxd's own directory") {
		t.Fatalf("%s: %d %s %q, want 403 forbidden naming boxd's own directory", what, e.Status, e.Type, e.Message)
	}
}

func TestEveryRouteRefusesBoxdDirectories(t *testing.T) {
	l := newOwnLayout(t)
	for _, p := range l.paths() {
		f, _, err := l.box.Open(p, 0)
		if f != nil {
			f.Close()
		}
		wantForbidden(t, "read "+p, err)
		_, err = l.box.Write(p, strings.NewReader("overwritten"), 100, 0o644)
		wantForbidden(t, "write "+p, err)
		_, err = l.box.List(p, false, 100)
		wantForbidden(t, "list "+p, err)
		_, err = l.box.List(p, true, 100)
		wantForbidden(t, "recursive list "+p, err)
		if !isLink(p) { // deleting a symlink deletes the link: below
			_, err = l.box.Delete(p, false)
			wantForbidden(t, "delete "+p, err)
			_, err = l.box.Delete(p, true)
			wantForbidden(t, "recursive delete "+p, err)
		}
		a, err := l.box.PrepareArchive(p, Limits{})
		if a != nil {
			a.Close()
		}
		wantForbidden(t, "archive "+p, err)
		_, err = l.box.Extract(p, tarOf(t, entry{name: "token", body: "overwritten"}), Limits{Bytes: 100, Entries: 10})
		wantForbidden(t, "extract into "+p, err)
	}
	l.unchanged(t)

	// Symlinks box code planted are its own: deleting one removes the link, never its target.
	for _, p := range append(l.paths(), filepath.Join(l.ws, "l-sb")) {
		if isLink(p) && filepath.Dir(p) == l.ws {
			if _, err := l.box.Delete(p, true); err != nil {
				t.Fatalf("delete the symlink %s: %v", p, err)
			}
		}
	}
	assertOnly(t, l.ws, "ok.txt")
	l.unchanged(t)
}

func isLink(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode()&os.ModeSymlink != 0
}

// What contains boxd's directories is refused where the operation would reach them; what
// merely holds them further down is fine for a plain listing.
func TestListingsArchivesAndDeletesAboveBoxdDirectories(t *testing.T) {
	l := newOwnLayout(t)
	sb := filepath.Join(l.root, "opt", "sandbox-bridge")
	opt := filepath.Join(l.root, "opt")
	_, err := l.box.List(sb, false, 100)
	wantForbidden(t, "list /opt/sandbox-bridge", err)
	_, err = l.box.List(filepath.Join(l.ws, "l-sb"), false, 100)
	wantForbidden(t, "list a symlink to /opt/sandbox-bridge", err)
	for _, p := range []string{sb, opt, l.root, filepath.Join(l.ws, "l-sb")} {
		_, err = l.box.List(p, true, 100)
		wantForbidden(t, "recursive list "+p, err)
		_, err = l.box.PrepareArchive(p, Limits{})
		wantForbidden(t, "archive "+p, err)
		if !isLink(p) {
			_, err = l.box.Delete(p, true)
			wantForbidden(t, "delete "+p, err)
		}
		_, err = l.box.Extract(p, tarOf(t, entry{name: "secret/token", body: "overwritten"}), Limits{Bytes: 100, Entries: 10})
		wantForbidden(t, "extract into "+p, err)
	}
	if ls, err := l.box.List(opt, false, 100); err != nil || len(ls.Entries) != 1 || ls.Entries[0].Name != "sandbox-bridge" {
		t.Fatalf("list /opt: %+v %v", ls, err)
	}
	l.unchanged(t)
}

// A workspace holding symlinks into boxd's directories lists and archives them as symlinks:
// never followed, never their content.
func TestWalksShowPlantedSymlinksNotWhatTheyReach(t *testing.T) {
	l := newOwnLayout(t)
	ls, err := l.box.List(l.ws, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ls.Entries {
		names = append(names, e.Name+":"+e.Type)
	}
	if got := strings.Join(names, " "); got != "l-boxd:symlink l-new-in-bin:symlink l-sb:symlink l-secret:symlink l-token:symlink l-token-rel:symlink ok.txt:file" {
		t.Fatalf("listing: %s", got)
	}
	buf := archiveOf(t, l.ws, false)
	if bytes.Contains(buf.Bytes(), []byte(credential)) || bytes.Contains(buf.Bytes(), []byte("boxd binary")) {
		t.Fatal("the archive holds what a symlink points at")
	}
	tr := tar.NewReader(buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name != "ok.txt" && hdr.Typeflag != tar.TypeSymlink {
			t.Fatalf("%s archived as %q", hdr.Name, hdr.Typeflag)
		}
	}
}

// The second line: what was opened is checked again, so a path that passed resolve and was
// swapped for a symlink into boxd's directories before use is still refused. The swap is made
// deterministic here by calling what runs after resolve directly.
func TestWhatWasOpenedIsCheckedAgain(t *testing.T) {
	l := newOwnLayout(t)
	_, _, err := l.box.openPath(filepath.Join(l.ws, "l-token"), itself)
	wantForbidden(t, "open after the check", err)
	_, err = l.box.openDir(filepath.Join(l.ws, "l-secret"), entries)
	wantForbidden(t, "open a directory after the check", err)
	_, err = l.box.openDir(filepath.Join(l.ws, "l-sb"), entries)
	wantForbidden(t, "open a directory holding boxd's after the check", err)
	_, _, _, err = l.box.writeTarget(filepath.Join(l.ws, "l-boxd"))
	wantForbidden(t, "write through a symlink after the check", err)
	_, _, _, err = l.box.writeTarget(filepath.Join(l.ws, "l-new-in-bin"))
	wantForbidden(t, "write through a dangling symlink after the check", err)
	_, _, _, err = l.box.openParent(filepath.Join(l.ws, "l-sb", "secret"), filepath.Join(l.ws, "l-sb", "secret"), tree)
	wantForbidden(t, "delete after the check", err)
	x := &extraction{box: l.box, dest: filepath.Join(l.ws, "l-secret", "sub")}
	wantForbidden(t, "extract after the check", x.locate())

	// A walk meets boxd's directory (moved or mounted into the tree after the check): it is
	// neither shown nor entered.
	dir, err := os.Open(filepath.Join(l.root, "opt"))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	var seen []string
	err = l.box.walk(dir, "", true, func(_ *os.File, _, rel string, _ os.FileInfo) error {
		seen = append(seen, rel)
		return nil
	}, func(string, error) error { return nil })
	if err != nil || strings.Join(seen, " ") != "sandbox-bridge" {
		t.Fatalf("walk saw %v (%v)", seen, err)
	}

	// A directory swapped for a symlink into the secret directory after the walk looked at it
	// and before it enters it: not entered.
	mustWrite(t, filepath.Join(l.ws, "dir", "mine"), "mine")
	ws, err := os.Open(l.ws)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	seen = nil
	err = l.box.walk(ws, "", true, func(_ *os.File, _, rel string, _ os.FileInfo) error {
		seen = append(seen, rel)
		if rel == "dir" { // box code moves just then
			if err := os.RemoveAll(filepath.Join(l.ws, "dir")); err != nil {
				return err
			}
			return os.Symlink(filepath.Join(l.secret, "..2025_01_01"), filepath.Join(l.ws, "dir"))
		}
		return nil
	}, func(string, error) error { return nil })
	if err != nil || slices.Contains(seen, "dir/token") || slices.Contains(seen, "dir/mine") {
		t.Fatalf("walk saw %v (%v)", seen, err)
	}
	l.unchanged(t)
}

// Best effort against the real race: box code swaps a name between a file of its own and a
// symlink to the credential as fast as it can while files are read, listed and archived.
// Nothing of boxd's may come out, whichever way each race goes.
func TestSymlinkSwappedWhileServed(t *testing.T) {
	l := newOwnLayout(t)
	flip := filepath.Join(l.ws, "flip")
	mustWrite(t, filepath.Join(l.ws, "mine", "token"), "mine")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // flip is in turn a file, a symlink to the credential, a symlink to the secret directory
		defer wg.Done()
		tmp := filepath.Join(l.ws, ".flip")
		for i := 0; !stop.Load(); i++ {
			_ = os.RemoveAll(tmp)
			switch i % 3 {
			case 0:
				_ = os.WriteFile(tmp, []byte("mine"), 0o644)
			case 1:
				_ = os.Symlink(filepath.Join(l.secret, "token"), tmp)
			case 2:
				_ = os.Symlink(l.secret, tmp)
			}
			_ = os.Rename(tmp, flip)
			if i%3 == 2 { // and a directory of its own, swapped whole
				_ = os.RemoveAll(filepath.Join(l.ws, "dir"))
				_ = os.Rename(filepath.Join(l.ws, "mine"), filepath.Join(l.ws, "dir"))
				_ = os.MkdirAll(filepath.Join(l.ws, "mine"), 0o755)
				_ = os.WriteFile(filepath.Join(l.ws, "mine", "token"), []byte("mine"), 0o644)
			} else { // or a symlink into the secret directory
				_ = os.RemoveAll(filepath.Join(l.ws, "dir"))
				_ = os.Symlink(filepath.Join(l.secret, "..2025_01_01"), filepath.Join(l.ws, "dir"))
			}
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	leaked := func(b []byte) bool { return bytes.Contains(b, []byte(credential)) }
	served := 0
	for i := 0; i < 3000; i++ {
		if f, _, err := l.box.Open(flip, 0); err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if leaked(b) {
				t.Fatal("a read served the credential")
			}
			served++
		} else if e := errs.As(err); e.Status == http.StatusInternalServerError {
			t.Fatal(err)
		}
		for _, p := range []string{flip, filepath.Join(l.ws, "dir"), l.ws} {
			if ls, err := l.box.List(p, true, 100); err == nil {
				for _, e := range ls.Entries {
					if e.Name == "..data" || e.Name == "env" {
						t.Fatalf("a listing of %s showed the secret directory: %+v", p, ls.Entries)
					}
				}
			}
		}
		if i%2 == 0 {
			if a, err := l.box.PrepareArchive(l.ws, Limits{}); err == nil {
				var buf bytes.Buffer
				_ = a.WriteTo(&buf, false)
				a.Close()
				if leaked(buf.Bytes()) {
					t.Fatal("an archive held the credential")
				}
			}
		}
	}
	if served == 0 {
		t.Log("no read won the race to a file of its own")
	}
	stop.Store(true)
	wg.Wait()
	l.unchanged(t)
}

func TestBoxIgnoresRootAndRelativeDirectories(t *testing.T) {
	b := NewBox([]string{"/", "relative"})
	if len(b.dirs) != 0 {
		t.Fatalf("%+v", b.dirs)
	}
	if _, err := b.resolve("/tmp", tree); err != nil {
		t.Fatal(err)
	}
	_, err := NewBox([]string{"/opt/sandbox-bridge/secret"}).resolve("/opt/sandbox-bridge/secret/token", itself)
	if err == nil || errs.As(err).Status != http.StatusForbidden {
		t.Fatalf("a missing protected directory is still protected: %v", err)
	}
}
