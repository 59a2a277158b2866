package watch

import (
	"strings"
	"sync"
	"time"
)

// Event is one line of a watch stream (PROTOCOL.md "File watch").
type Event struct {
	// Type: create, write, remove, rename, chmod; overflow (events were dropped); ready (the
	// first line: the watch is in place); end (the last line).
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
	// From is a rename's old path.
	From string `json:"from,omitempty"`
	// Kind is "dir" or "file" (anything but a directory) for the file-system events.
	Kind string `json:"kind,omitempty"`
	// Dropped counts events left out (overflow of our queue; absent when the kernel's queue
	// overflowed, which does not say how many).
	Dropped int64 `json:"dropped,omitempty"`
	// Reason of an overflow (queue, kernel, directories) or an end (sleep, shutdown, removed).
	Reason string `json:"reason,omitempty"`
}

// cost is what an event takes in the queue: its strings and a fixed part.
func (e *Event) cost() int { return 64 + len(e.Path) + len(e.From) }

// queue holds one watch's events for its reader: at most max events and maxBytes, coalescing
// repeated writes (and attribute changes) to one path within the window. The last slot is kept
// for an overflow event, so a reader that fell behind learns where events are missing.
type queue struct {
	mu       sync.Mutex
	buf      []Event // ring
	head, n  int
	bytes    int
	maxBytes int
	ended    bool
	// wake is signalled (without blocking) when an event is added.
	wake chan struct{}

	window time.Duration
	recent map[string]*recent // by type and path: writes and chmods emitted within the window
	timer  *time.Timer
}

// recent is a coalesced write or chmod: when one was last emitted, and whether more came since.
type recent struct {
	ev         Event
	at         time.Time
	suppressed bool
}

// maxRecent bounds the coalescing map; beyond it events pass uncoalesced.
const maxRecent = 4096

func newQueue(max, maxBytes int, window time.Duration) *queue {
	return &queue{buf: make([]Event, max+2), maxBytes: maxBytes, wake: make(chan struct{}, 1), window: window, recent: map[string]*recent{}}
}

// add queues a file-system event, coalescing writes and chmods.
func (q *queue) add(e Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return
	}
	if (e.Type == "write" || e.Type == "chmod") && q.window > 0 {
		key := e.Type + "\x00" + e.Path
		now := time.Now()
		if r, ok := q.recent[key]; ok {
			r.suppressed = true
			return
		}
		if len(q.recent) < maxRecent {
			q.recent[key] = &recent{ev: e, at: now}
			if q.timer == nil {
				q.timer = time.AfterFunc(q.window, q.tick)
			}
		}
		q.push(e)
		return
	}
	// Anything else about a path comes after the writes to it that were held back.
	q.flush(e.Path)
	if e.From != "" {
		q.flush(e.From)
	}
	q.push(e)
}

// flush emits the held-back writes and chmods of p and everything below it. Holds q.mu.
func (q *queue) flush(p string) {
	if len(q.recent) == 0 || p == "" {
		return
	}
	for key, r := range q.recent {
		if r.ev.Path == p || strings.HasPrefix(r.ev.Path, p+"/") {
			if r.suppressed {
				q.push(r.ev)
			}
			delete(q.recent, key)
		}
	}
}

// tick ends the windows that are over: a write held back is emitted now (and opens a new
// window, so a file written continuously gives one event per window).
func (q *queue) tick() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.timer = nil
	now := time.Now()
	for key, r := range q.recent {
		if now.Sub(r.at) < q.window {
			continue
		}
		if r.suppressed && !q.ended {
			q.push(r.ev)
			r.at, r.suppressed = now, false
			continue
		}
		delete(q.recent, key)
	}
	if len(q.recent) > 0 && !q.ended {
		q.timer = time.AfterFunc(q.window, q.tick)
	}
}

// overflow queues an overflow event of the given reason (the kernel's queue overflowed, or a
// directory could not be watched).
func (q *queue) overflow(reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.ended {
		q.push(Event{Type: "overflow", Reason: reason})
	}
}

// push adds e, or, when the queue is full, counts it on the overflow event at its tail. The
// ring has two slots beyond max: that overflow event, and the end. Holds q.mu.
func (q *queue) push(e Event) {
	if q.n >= len(q.buf)-2 || q.bytes+e.cost() > q.maxBytes {
		if last := &q.buf[(q.head+q.n-1+len(q.buf))%len(q.buf)]; q.n > 0 && last.Type == "overflow" && last.Reason == "queue" {
			last.Dropped++
			return
		}
		e = Event{Type: "overflow", Reason: "queue", Dropped: 1}
	}
	q.buf[(q.head+q.n)%len(q.buf)] = e
	q.n++
	q.bytes += e.cost()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// end queues the last event (always, full or not); nothing is queued after it.
func (q *queue) end(reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return
	}
	for _, r := range q.recent {
		if r.suppressed {
			q.push(r.ev)
		}
	}
	q.recent = map[string]*recent{}
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	q.ended = true
	q.buf[(q.head+q.n)%len(q.buf)] = Event{Type: "end", Reason: reason}
	q.n++
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns the oldest event, if any.
func (q *queue) take() (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return Event{}, false
	}
	e := q.buf[q.head]
	q.buf[q.head] = Event{}
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	q.bytes -= e.cost()
	return e, true
}
