// Package watch streams file-system events of a box from inotify (PROTOCOL.md "File watch").
// boxd has one inotify instance (made on the first watch, closed with the last): the kernel
// allows each user 128 of them on a node, and every box runs as the same user, so a watch
// must not cost one. Each watch holds the inotify watches (one per directory) of its tree,
// shared with other watches of the same directories by reference count, and its own queue:
// bounded, coalesced, with an overflow event where events were dropped.
package watch

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"sandbox-bridge.io/boxd/errs"
)

// Resolver opens a path to watch the way every file route resolves one (files.Box): boxd's own
// directories refused, the check made again on what was opened. It answers the path cleaned,
// an O_PATH descriptor of what it names (the watch is put on exactly that), and its type.
type Resolver interface {
	OpenWatched(p string, recursive bool) (string, *os.File, fs.FileInfo, error)
}

// Config of a Hub. Zero values take the defaults.
type Config struct {
	// MaxDirs bounds the inotify watches (directories) of all watches together (8192): the
	// kernel's budget of them is per user and node, shared by every box there.
	MaxDirs int
	// Window: repeated writes (or attribute changes) to one path within it are one event (100 ms).
	Window time.Duration
	// MaxBytes bounds a watch's queue in bytes (1 MiB) besides its count of events.
	MaxBytes int
	// pairWait is how long a rename's first half waits for its second (10 ms).
	pairWait time.Duration
}

// Options of one watch.
type Options struct {
	Recursive bool
	// Queue: events held for a reader that falls behind (4096); beyond, an overflow event.
	Queue int
	// MaxWatches: watches of the box at once (16), counted across every bridge replica.
	MaxWatches int
}

const mask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO |
	syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_EXCL_UNLINK

// Hub is boxd's inotify instance and the watches on it.
type Hub struct {
	cfg Config
	box Resolver

	mu      sync.Mutex
	ino     *os.File // nil while no watch is open
	fd      int
	refs    map[int32]int // inotify watch -> watches holding it
	watches map[*Watch]bool
	closed  bool
}

// Watch is one watch: a root, the directories it holds and its queue.
type Watch struct {
	hub       *Hub
	root      string
	recursive bool
	rootWd    int32
	isDir     bool
	// paths of the inotify watches this watch holds (guarded by hub.mu).
	paths map[int32]string
	// scanned: entries a scan reported as created (guarded by hub.mu). One made while its
	// directory's watch was already in place is reported by inotify as well: that create is
	// dropped once (scan, dispatch).
	scanned map[string]struct{}
	q       *queue
	done    bool // no more events from the hub (ended or closed)
}

// afterWatch, in tests only, runs between a directory's watch and its scan.
var afterWatch func(dir string)

// maxScanned bounds a watch's scanned set; beyond it a duplicate create may pass.
const maxScanned = 4096

// firstCreate says whether a create of p is news, not what a scan already reported; any other
// event about p ends what the scan said of it. Holds hub.mu.
func (w *Watch) firstCreate(p string, create bool) bool {
	if _, ok := w.scanned[p]; ok {
		delete(w.scanned, p)
		return !create
	}
	return true
}

// New returns a hub resolving paths with box.
func New(box Resolver, cfg Config) *Hub {
	if cfg.MaxDirs <= 0 {
		cfg.MaxDirs = 8192
	}
	if cfg.Window == 0 {
		cfg.Window = 100 * time.Millisecond
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 1 << 20
	}
	if cfg.pairWait <= 0 {
		cfg.pairWait = 10 * time.Millisecond
	}
	return &Hub{cfg: cfg, box: box, refs: map[int32]int{}, watches: map[*Watch]bool{}}
}

// Watch starts a watch of p. Its first event is ready; events of the file system follow.
func (h *Hub) Watch(p string, o Options) (*Watch, error) {
	if o.Queue <= 0 {
		o.Queue = 4096
	}
	if o.MaxWatches <= 0 {
		o.MaxWatches = 16
	}
	shown, f, fi, err := h.box.OpenWatched(p, o.Recursive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return nil, errs.Conflict("boxd is shutting down")
	case len(h.watches) >= o.MaxWatches:
		return nil, errs.TooMany("the box has %d file watches open, the most it allows", len(h.watches))
	}
	if err := h.open(); err != nil {
		return nil, err
	}
	w := &Watch{hub: h, root: shown, recursive: o.Recursive && fi.IsDir(), isDir: fi.IsDir(), paths: map[int32]string{}, scanned: map[string]struct{}{},
		q: newQueue(o.Queue, h.cfg.MaxBytes, h.cfg.Window)}
	wd, err := h.add(w, f, shown)
	if err != nil {
		h.closeIfIdle()
		return nil, err
	}
	w.rootWd = wd
	h.watches[w] = true
	w.q.push(Event{Type: "ready", Path: shown})
	if w.recursive {
		if over := h.scan(w, shown, f, false); over {
			h.release(w)
			delete(h.watches, w)
			h.closeIfIdle()
			return nil, errs.TooLarge("%s holds more directories than the box may watch (%d, all watches together); watch a smaller tree, or without recursive", shown, h.cfg.MaxDirs)
		}
	}
	return w, nil
}

// open makes the inotify instance and starts its reader, if there is none. Holds h.mu.
func (h *Hub) open() error {
	if h.ino != nil {
		return nil
	}
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		if errors.Is(err, syscall.EMFILE) {
			return errs.TooMany("no inotify instance left for the box's user on this node (fs.inotify.max_user_instances)")
		}
		return errs.Internal("inotify: %v", err)
	}
	// Non-blocking: reads wait in Go's poller, and Close wakes them.
	h.ino, h.fd = os.NewFile(uintptr(fd), "inotify"), fd
	go h.read(h.ino)
	return nil
}

// closeIfIdle closes the inotify instance once no watch is open (it frees a per-user slot).
// Holds h.mu.
func (h *Hub) closeIfIdle() {
	if len(h.watches) == 0 && h.ino != nil {
		_ = h.ino.Close()
		h.ino = nil
		h.refs = map[int32]int{}
	}
}

// add puts an inotify watch on what f (O_PATH) names, for w under the path shown. Holds h.mu.
func (h *Hub) add(w *Watch, f *os.File, shown string) (int32, error) {
	wd, err := syscall.InotifyAddWatch(h.fd, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), mask)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return 0, errDirs
		}
		return 0, errs.FromOS(shown, err)
	}
	id := int32(wd)
	if h.refs[id] == 0 && len(h.refs) >= h.cfg.MaxDirs {
		_, _ = syscall.InotifyRmWatch(h.fd, uint32(wd)) // new, and no room for it
		return 0, errDirs
	}
	if _, held := w.paths[id]; !held {
		w.paths[id] = shown
		h.refs[id]++
	}
	return id, nil
}

var errDirs = errs.TooLarge("no more directories may be watched in this box")

// scan adds the directories below dir (f: dir as opened and checked, O_PATH) to a recursive
// watch; with synthetic, it also queues a create for every entry found (a directory made or
// moved in: what was put in it before its watch was in place must not go unseen). Every
// directory is opened through the resolver and listed from what was opened, so a directory
// swapped for a symlink meanwhile never leads into boxd's own. True when a directory could not
// be watched for want of room. Holds h.mu.
func (h *Hub) scan(w *Watch, dir string, f *os.File, synthetic bool) (over bool) {
	d, err := os.Open("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return false
	}
	entries, err := d.ReadDir(-1)
	_ = d.Close()
	if err != nil {
		return false
	}
	for _, e := range entries {
		p := dir + "/" + e.Name()
		if dir == "/" {
			p = "/" + e.Name()
		}
		kind := "file"
		if e.IsDir() { // from the directory entry: a symlink to a directory is not entered
			kind = "dir"
		}
		if synthetic {
			w.q.add(Event{Type: "create", Path: p, Kind: kind})
			if len(w.scanned) < maxScanned {
				w.scanned[p] = struct{}{}
			}
		}
		if kind == "dir" && h.watchDir(w, p, synthetic) {
			return true
		}
	}
	return false
}

// watchDir watches the directory p and what is below it for w (resolved and checked again:
// boxd's own directories are never entered). True when there was no room. Holds h.mu.
func (h *Hub) watchDir(w *Watch, p string, synthetic bool) (over bool) {
	_, f, fi, err := h.box.OpenWatched(p, true)
	if err != nil {
		return false // gone meanwhile, or one of boxd's own: not watched
	}
	defer f.Close()
	if !fi.IsDir() {
		return false
	}
	wd, err := h.add(w, f, p)
	if err == errDirs {
		return true
	}
	if err != nil || w.paths[wd] != p {
		return false // already held under another name (a symlink loop swapped in): not again
	}
	if afterWatch != nil {
		afterWatch(p)
	}
	return h.scan(w, p, f, synthetic)
}

// release drops w's inotify watches (the kernel's go when no other watch holds them). Holds h.mu.
func (h *Hub) release(w *Watch) {
	for wd := range w.paths {
		h.unref(w, wd)
	}
}

func (h *Hub) unref(w *Watch, wd int32) {
	delete(w.paths, wd)
	if h.refs[wd]--; h.refs[wd] <= 0 {
		delete(h.refs, wd)
		if h.ino != nil {
			_, _ = syscall.InotifyRmWatch(h.fd, uint32(wd))
		}
	}
}

// Next returns the next event, waiting for one; after the end event, io.EOF.
func (w *Watch) Next(ctx context.Context) (Event, error) {
	for {
		if e, ok := w.q.take(); ok {
			return e, nil
		}
		w.q.mu.Lock()
		over := w.q.ended && w.q.n == 0
		w.q.mu.Unlock()
		if over {
			return Event{}, io.EOF
		}
		select {
		case <-w.q.wake:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// TryNext returns the next event if one is queued.
func (w *Watch) TryNext() (Event, bool) { return w.q.take() }

// End ends the watch with reason: its last event.
func (w *Watch) End(reason string) {
	w.hub.mu.Lock()
	defer w.hub.mu.Unlock()
	w.hub.end(w, reason)
}

// end: holds h.mu.
func (h *Hub) end(w *Watch, reason string) {
	if w.done {
		return
	}
	w.done = true
	h.release(w)
	w.q.end(reason)
}

// Close stops the watch and frees what it held.
func (w *Watch) Close() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	h.end(w, "closed")
	delete(h.watches, w)
	h.closeIfIdle()
}

// EndAll ends every watch open now with reason (a sleep's fence: the box is about to go).
func (h *Hub) EndAll(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watches {
		h.end(w, reason)
	}
}

// Close ends every watch (reason shutdown) and refuses new ones: boxd is stopping.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for w := range h.watches {
		h.end(w, "shutdown")
	}
}

// Watches is how many watches are open.
func (h *Hub) Watches() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watches)
}

// raw is one inotify event as read.
type raw struct {
	wd     int32
	mask   uint32
	cookie uint32
	name   string
}

// read is the reader of one inotify instance: until it is closed, it reads events and hands
// them to the watches, in the kernel's order. The two halves of a rename come one after the
// other; a first half followed by anything but its second (or by nothing within pairWait) was
// a move out of every watched directory.
func (h *Hub) read(f *os.File) {
	buf := make([]byte, 64<<10)
	var pending *raw // a MOVED_FROM not paired yet
	for {
		if pending != nil {
			_ = f.SetReadDeadline(time.Now().Add(h.cfg.pairWait))
		} else {
			_ = f.SetReadDeadline(time.Time{})
		}
		n, err := f.Read(buf)
		timedOut := errors.Is(err, os.ErrDeadlineExceeded)
		if err != nil && !timedOut {
			return // closed
		}
		h.mu.Lock()
		if h.ino != f {
			h.mu.Unlock()
			return // closed, and maybe another instance made since: its watches are not ours
		}
		if timedOut {
			h.dispatchMove(pending, nil)
			pending = nil
		}
		for _, e := range parse(buf[:n]) {
			switch {
			case pending != nil && e.mask&syscall.IN_MOVED_TO != 0 && e.cookie == pending.cookie:
				h.dispatchMove(pending, &e)
				pending = nil
				continue
			case pending != nil:
				h.dispatchMove(pending, nil)
				pending = nil
			}
			switch {
			case e.mask&syscall.IN_MOVED_FROM != 0:
				pending = &e
			case e.mask&syscall.IN_MOVED_TO != 0:
				h.dispatchMove(nil, &e)
			default:
				h.dispatch(&e)
			}
		}
		h.mu.Unlock()
	}
}

func parse(b []byte) []raw {
	var out []raw
	for len(b) >= syscall.SizeofInotifyEvent {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := syscall.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			break
		}
		name := b[syscall.SizeofInotifyEvent:end]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		out = append(out, raw{wd: ev.Wd, mask: ev.Mask, cookie: ev.Cookie, name: string(name)})
		b = b[end:]
	}
	return out
}

func kindOf(mask uint32) string {
	if mask&syscall.IN_ISDIR != 0 {
		return "dir"
	}
	return "file"
}

// pathIn is the path of name in the watched directory wd of w ("" for the directory itself).
func (w *Watch) pathIn(wd int32, name string) (string, bool) {
	dir, ok := w.paths[wd]
	switch {
	case !ok:
		return "", false
	case name == "":
		return dir, true
	case dir == "/":
		return "/" + name, true
	}
	return dir + "/" + name, true
}

// dispatch hands one event (not a rename half) to the watches holding its directory. Holds h.mu.
func (h *Hub) dispatch(e *raw) {
	if e.mask&syscall.IN_Q_OVERFLOW != 0 {
		for w := range h.watches {
			if !w.done {
				w.q.overflow("kernel")
			}
		}
		return
	}
	for w := range h.watches {
		if w.done {
			continue
		}
		p, ok := w.pathIn(e.wd, e.name)
		if !ok {
			continue
		}
		kind := kindOf(e.mask)
		create := e.mask&syscall.IN_CREATE != 0
		if e.name != "" && !w.firstCreate(p, create) {
			continue // the scan of its new directory reported it, and watches it if a directory
		}
		switch {
		case e.mask&syscall.IN_IGNORED != 0:
			// The kernel dropped the watch (its directory is gone): so does w.
			delete(w.paths, e.wd)
			if e.wd == w.rootWd {
				h.end(w, "removed")
			}
		case e.mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF|syscall.IN_UNMOUNT) != 0:
			// The root itself went (its parent, which is not watched, would have said so).
			if e.wd == w.rootWd {
				if w.isDir {
					kind = "dir"
				}
				w.q.add(Event{Type: "remove", Path: p, Kind: kind})
				h.end(w, "removed")
			}
		case create:
			w.q.add(Event{Type: "create", Path: p, Kind: kind})
			if kind == "dir" && w.recursive {
				h.grow(w, p)
			}
		case e.mask&syscall.IN_DELETE != 0:
			w.q.add(Event{Type: "remove", Path: p, Kind: kind})
		case e.mask&syscall.IN_MODIFY != 0:
			w.q.add(Event{Type: "write", Path: p, Kind: kind})
		case e.mask&syscall.IN_ATTRIB != 0:
			if e.name == "" && e.wd != w.rootWd {
				continue // a watched subdirectory's own change: its parent reports it too
			}
			w.q.add(Event{Type: "chmod", Path: p, Kind: kind})
		}
	}
	if e.mask&syscall.IN_IGNORED != 0 {
		delete(h.refs, e.wd)
	}
}

// grow watches a directory that appeared in a recursive watch, and what is already in it.
func (h *Hub) grow(w *Watch, p string) {
	if h.watchDir(w, p, true) {
		w.q.overflow("directories")
	}
}

// dispatchMove hands a rename to the watches: both halves in a watch are a rename; only the
// first, a remove (moved out of what it watches); only the second, a create (moved in). A
// directory's watches follow it: renamed, dropped, or added. Holds h.mu.
func (h *Hub) dispatchMove(from, to *raw) {
	for w := range h.watches {
		if w.done {
			continue
		}
		var old, now string
		var hasOld, hasNow bool
		kind := "file"
		if from != nil {
			old, hasOld = w.pathIn(from.wd, from.name)
			kind = kindOf(from.mask)
		}
		if to != nil {
			now, hasNow = w.pathIn(to.wd, to.name)
			kind = kindOf(to.mask)
		}
		if hasOld {
			w.firstCreate(old, false)
		}
		if hasNow && !hasOld && !w.firstCreate(now, true) {
			continue // moved in while its directory was scanned: the scan reported it
		}
		if hasNow && hasOld {
			w.firstCreate(now, false)
		}
		switch {
		case hasOld && hasNow:
			w.q.add(Event{Type: "rename", Path: now, From: old, Kind: kind})
			if kind == "dir" {
				for wd, p := range w.paths {
					if p == old || len(p) > len(old) && p[:len(old)+1] == old+"/" {
						w.paths[wd] = now + p[len(old):]
					}
				}
			}
		case hasOld:
			w.q.add(Event{Type: "remove", Path: old, Kind: kind})
			if kind == "dir" {
				for wd, p := range w.paths {
					if p == old || len(p) > len(old) && p[:len(old)+1] == old+"/" {
						h.unref(w, wd)
					}
				}
			}
		case hasNow:
			w.q.add(Event{Type: "create", Path: now, Kind: kind})
			if kind == "dir" && w.recursive {
				h.grow(w, now)
			}
		}
	}
}
