package server

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/ports"
)

// FenceHeader carries the epoch of the fence that refused a call (PROTOCOL.md "Fence").
const FenceHeader = "X-Boxd-Fence"

// gate admits calls and holds idle sleep's write fence. Every call but health, activity and the
// fence routes passes through admit, which counts it while it runs; once a sleep raised the
// fence, calls that may change the box (anything but a GET, and the terminal) are refused
// before they start. Counting and refusing share one lock, so the count a fence answers covers
// every call that got in before it: none can slip in after and be acknowledged unseen.
type gate struct {
	mu    sync.Mutex
	epoch uint64 // the fence up, 0 when none
	// newest is the newest epoch ever raised or lifted: an older one is from a holder whose
	// lease was taken over, and may neither fence again nor lift.
	newest uint64
	calls  int64
	// freeze stops (true) or continues (false) the box's background processes: nothing
	// changes the workspace under a snapshot.
	freeze func(bool)
}

// admit counts a call in, or refuses it with the epoch of the fence when it may write while
// one is up. The returned function counts it out.
func (g *gate) admit(mutating bool) (done func(), fenced uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if mutating && g.epoch != 0 {
		return nil, g.epoch
	}
	g.calls++
	return func() {
		g.mu.Lock()
		g.calls--
		g.mu.Unlock()
	}, 0
}

// state answers the calls at work and the fence up (0: none).
func (g *gate) state() (int64, uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls, g.epoch
}

// raise puts up the fence of epoch (again: idempotent) and answers the calls at work. An
// epoch older than the newest seen is refused: a sleeper that lost its lease must not fence anew.
func (g *gate) raise(epoch uint64) (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if epoch < g.newest {
		return 0, errs.Conflict("fence %d is older than fence %d", epoch, g.newest)
	}
	g.newest = epoch
	if g.epoch == 0 && g.freeze != nil {
		g.freeze(true)
	}
	g.epoch = epoch
	return g.calls, nil
}

// lift takes the fence down when epoch is at least the one up; false when none was up.
func (g *gate) lift(epoch uint64) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case epoch < g.newest:
		return false, errs.Conflict("fence %d is newer; %d cannot lift it", g.newest, epoch)
	case g.epoch == 0:
		g.newest = epoch
		return false, nil
	}
	g.epoch, g.newest = 0, epoch
	if g.freeze != nil {
		g.freeze(false)
	}
	return true, nil
}

// exempt routes are neither counted nor fenced: probes, the sleeper's own calls, and reads
// that only observe the box (a file watch, its metrics), which must not keep it awake.
func exempt(path string) bool {
	switch path {
	case "/v1/health", "/v1/activity", "/v1/fence", "/v1/files/watch", "/v1/metrics":
		return true
	}
	return false
}

// admitted passes a call through the gate.
func (s *server) admitted(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exempt(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		// A terminal types into the box; a port reaches an app that may do anything on any method.
		mutating := r.Method != http.MethodGet || r.URL.Path == "/v1/pty" || strings.HasPrefix(r.URL.Path, ports.Prefix)
		done, fenced := s.gate.admit(mutating)
		if done == nil {
			w.Header().Set(FenceHeader, strconv.FormatUint(fenced, 10))
			writeError(w, errs.Conflict("the box is being put to sleep (fence %d); nothing was done", fenced))
			return
		}
		defer done()
		next.ServeHTTP(w, r)
	})
}

func (s *server) activity(w http.ResponseWriter, _ *http.Request) {
	calls, fence := s.gate.state()
	writeJSON(w, http.StatusOK, map[string]any{"calls": calls, "fence": fence})
}

func (s *server) raiseFence(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Epoch uint64 `json:"epoch"`
	}
	if err := readJSON(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Epoch == 0 {
		writeError(w, errs.Invalid("epoch must be > 0"))
		return
	}
	calls, err := s.gate.raise(req.Epoch)
	if err != nil {
		writeError(w, err)
		return
	}
	if s.Watch != nil {
		s.Watch.EndAll("sleep") // the box is going: its watches end now, not with the pod
	}
	s.Log.Info("fence raised", "epoch", req.Epoch, "calls", calls)
	writeJSON(w, http.StatusOK, map[string]any{"epoch": req.Epoch, "calls": calls})
}

func (s *server) liftFence(w http.ResponseWriter, r *http.Request) {
	q := newQuery(r)
	epoch := q.positive("epoch", 0)
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	lifted, err := s.gate.lift(uint64(epoch))
	if err != nil {
		writeError(w, err)
		return
	}
	if lifted {
		s.Log.Info("fence lifted", "epoch", epoch)
	}
	writeJSON(w, http.StatusOK, map[string]bool{"lifted": lifted})
}
