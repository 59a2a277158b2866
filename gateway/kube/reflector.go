package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Meta is the part of an object's metadata a reflector needs.
type Meta struct {
	Name            string `json:"name"`
	Namespace       string `json:"namespace"`
	ResourceVersion string `json:"resourceVersion"`
}

// Key is namespace/name (name alone for cluster-scoped objects).
func (m Meta) Key() string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// Accept headers asking the API server for metadata only (PartialObjectMetadata): a Secret's
// data never leaves the API server when only its annotations are needed.
const (
	MetadataListAccept  = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	MetadataWatchAccept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// Reflector keeps a local copy of one resource's objects (the ones Decode keeps, in the form it
// returns) with list+watch, the way client-go's reflector does:
//
//   - LIST in pages of PageSize (a consistent snapshot at the first page's resourceVersion); the
//     store is replaced whole, so objects deleted while no watch ran disappear;
//   - WATCH from the list's resourceVersion with bookmarks; every event and BOOKMARK moves the
//     resourceVersion on, so a watch that ends (server timeout, connection lost) resumes where
//     it was without a list;
//   - 410 Gone (as the watch's HTTP status, or an ERROR event with code 410, or an expired
//     continue token) means the resourceVersion is too old: LIST again;
//   - other failures back off exponentially (Backoff to MaxBackoff, with jitter) and retry.
//
// Memory is the decoded values only: every object is decoded one at a time from the stream
// into Decode's small form and the raw JSON dropped.
type Reflector[T any] struct {
	Client *Client
	Path   string     // e.g. /api/v1/namespaces/sandboxes/pods
	Query  url.Values // labelSelector, fieldSelector
	// Accept and WatchAccept: the media types asked for (default JSON; MetadataListAccept and
	// MetadataWatchAccept for metadata only).
	Accept, WatchAccept string
	// Decode turns one object into the value kept; keep false drops it (and deletes its key).
	Decode func(raw json.RawMessage) (v T, keep bool, err error)
	// Equal, when set, says two decoded values are the same: an event that changes nothing the
	// caller keeps (a pod's activity annotation, its status conditions) then only moves the
	// resourceVersion on, and OnChange is not called.
	Equal func(a, b T) bool
	// OnChange is called after the store changed (a list, or an event that changed it), outside
	// the store's lock.
	OnChange func()
	Log      *slog.Logger

	PageSize     int64         // default 500
	WatchTimeout time.Duration // asked of the server per watch; default 5-10 min, random
	Backoff      time.Duration // first retry delay; default 200 ms
	MaxBackoff   time.Duration // default 30 s

	mu     sync.RWMutex
	items  map[string]T
	rv     string
	synced atomic.Bool

	// Counters for metrics and tests.
	Lists, Watches, Relists atomic.Int64
}

// Synced says the first list is in (and stays true: a later failure keeps the last store).
func (r *Reflector[T]) Synced() bool { return r.synced.Load() }

// ResourceVersion is the last one seen.
func (r *Reflector[T]) ResourceVersion() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.rv
}

// Range calls f for every kept object under a read lock (f must not call back into r).
func (r *Reflector[T]) Range(f func(key string, v T)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for k, v := range r.items {
		f(k, v)
	}
}

// Len is the number of objects kept.
func (r *Reflector[T]) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.items)
}

func (r *Reflector[T]) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

func (r *Reflector[T]) changed() {
	if r.OnChange != nil {
		r.OnChange()
	}
}

// errExpired is an ERROR event with code 410.
var errExpired = &StatusError{Code: http.StatusGone, Reason: "Expired"}

// Run lists and watches until ctx ends.
func (r *Reflector[T]) Run(ctx context.Context) {
	base, maxb := r.Backoff, r.MaxBackoff
	if base <= 0 {
		base = 200 * time.Millisecond
	}
	if maxb <= 0 {
		maxb = 30 * time.Second
	}
	delay := base
	needList := true
	for ctx.Err() == nil {
		var err error
		if needList {
			if err = r.list(ctx); err == nil {
				needList, delay = false, base
			}
		}
		if err == nil {
			var progressed bool
			start := time.Now()
			progressed, err = r.watch(ctx)
			if progressed {
				delay = base
			}
			if err == nil && time.Since(start) < time.Second && ctx.Err() == nil {
				err = errors.New("watch ended at once") // back off rather than spin
			}
			if err == nil { // the server ended the watch: resume at once
				continue
			}
			if IsGone(err) {
				r.Relists.Add(1)
				r.log().Info("watch expired; listing again", "resource", r.Path, "resourceVersion", r.ResourceVersion())
				needList = true
				continue // a relist is the remedy: no wait
			}
		}
		if ctx.Err() != nil {
			return
		}
		if IsGone(err) { // a continue token expired mid-list
			needList = true
		}
		r.log().Warn("list/watch failed; retrying", "resource", r.Path, "error", err.Error(), "retry_in", delay.String())
		// Full jitter around delay: replicas that lost the API server together do not return together.
		sleep := delay/2 + time.Duration(rand.Int64N(int64(delay)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(sleep):
		}
		if delay *= 2; delay > maxb {
			delay = maxb
		}
	}
}

func (r *Reflector[T]) list(ctx context.Context) error {
	page := r.PageSize
	if page <= 0 {
		page = 500
	}
	items := map[string]T{}
	var rv, cont string
	for {
		q := url.Values{}
		for k, v := range r.Query {
			q[k] = v
		}
		q.Set("limit", strconv.FormatInt(page, 10))
		if cont != "" {
			q.Set("continue", cont)
		}
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := func() error {
			resp, err := r.Client.Get(lctx, r.Path, q, r.Accept)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var meta struct {
				RV       string `json:"resourceVersion"`
				Continue string `json:"continue"`
			}
			// Decode the list token by token: one item in memory at a time.
			d := json.NewDecoder(resp.Body)
			if err := expectDelim(d, '{'); err != nil {
				return err
			}
			for d.More() {
				tok, err := d.Token()
				if err != nil {
					return err
				}
				switch tok {
				case "metadata":
					if err := d.Decode(&meta); err != nil {
						return err
					}
				case "items":
					if err := r.decodeItems(d, items); err != nil {
						return err
					}
				default:
					var skip json.RawMessage
					if err := d.Decode(&skip); err != nil {
						return err
					}
				}
			}
			if rv == "" {
				rv = meta.RV
			}
			cont = meta.Continue
			return nil
		}()
		cancel()
		if err != nil {
			return fmt.Errorf("list %s: %w", r.Path, err)
		}
		if cont == "" {
			break
		}
	}
	r.mu.Lock()
	r.items, r.rv = items, rv
	r.mu.Unlock()
	r.Lists.Add(1)
	r.synced.Store(true)
	r.changed()
	return nil
}

func (r *Reflector[T]) decodeItems(d *json.Decoder, items map[string]T) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	if tok == nil { // "items": null
		return nil
	}
	if delim, ok := tok.(json.Delim); !ok || delim != '[' {
		return fmt.Errorf("items: want an array")
	}
	for d.More() {
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			return err
		}
		m, err := metaOf(raw)
		if err != nil {
			return err
		}
		v, keep, err := r.Decode(raw)
		if err != nil {
			r.log().Warn("object not understood; skipped", "resource", r.Path, "object", m.Key(), "error", err.Error())
			continue
		}
		if keep {
			items[m.Key()] = v
		}
	}
	_, err = d.Token() // ]
	return err
}

func expectDelim(d *json.Decoder, want json.Delim) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	if delim, ok := tok.(json.Delim); !ok || delim != want {
		return fmt.Errorf("want %q, got %v", want, tok)
	}
	return nil
}

func metaOf(raw json.RawMessage) (Meta, error) {
	var o struct {
		Metadata Meta `json:"metadata"`
	}
	err := json.Unmarshal(raw, &o)
	return o.Metadata, err
}

// watch runs one watch until the server ends it (nil), ctx ends, or it fails. progressed says
// the watch was opened (a failure after it is not the API server refusing us).
func (r *Reflector[T]) watch(ctx context.Context) (progressed bool, err error) {
	timeout := r.WatchTimeout
	if timeout <= 0 {
		timeout = 5*time.Minute + time.Duration(rand.Int64N(int64(5*time.Minute)))
	}
	q := url.Values{}
	for k, v := range r.Query {
		q[k] = v
	}
	q.Set("watch", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("resourceVersion", r.ResourceVersion())
	q.Set("timeoutSeconds", strconv.Itoa(int(timeout.Seconds())))
	// The server ends the watch at timeoutSeconds; past that plus a margin we end it ourselves.
	wctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	accept := r.WatchAccept
	if accept == "" {
		accept = r.Accept
	}
	resp, err := r.Client.Get(wctx, r.Path, q, accept)
	if err != nil {
		return false, fmt.Errorf("watch %s: %w", r.Path, err)
	}
	defer resp.Body.Close()
	r.Watches.Add(1)
	d := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := d.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil || wctx.Err() != nil {
				return true, nil
			}
			return true, fmt.Errorf("watch %s: %w", r.Path, err)
		}
		switch ev.Type {
		case "ERROR":
			var st StatusError
			var s struct {
				Code    int    `json:"code"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(ev.Object, &s)
			st = StatusError{Code: s.Code, Reason: s.Reason, Message: s.Message}
			if st.Code == http.StatusGone {
				return true, errExpired
			}
			return true, fmt.Errorf("watch %s: %w", r.Path, &st)
		case "BOOKMARK":
			m, err := metaOf(ev.Object)
			if err != nil {
				return true, fmt.Errorf("watch %s: bookmark: %w", r.Path, err)
			}
			r.mu.Lock()
			r.rv = m.ResourceVersion
			r.mu.Unlock()
		case "ADDED", "MODIFIED", "DELETED":
			m, err := metaOf(ev.Object)
			if err != nil {
				return true, fmt.Errorf("watch %s: %w", r.Path, err)
			}
			var v T
			keep := false
			if ev.Type != "DELETED" {
				if v, keep, err = r.Decode(ev.Object); err != nil {
					r.log().Warn("object not understood; dropped", "resource", r.Path, "object", m.Key(), "error", err.Error())
					keep = false
				}
			}
			key := m.Key()
			r.mu.Lock()
			old, had := r.items[key]
			same := keep && had && r.Equal != nil && r.Equal(old, v)
			if keep {
				r.items[key] = v
			} else {
				delete(r.items, key)
			}
			r.rv = m.ResourceVersion
			r.mu.Unlock()
			if (keep || had) && !same {
				r.changed()
			}
		default:
			return true, fmt.Errorf("watch %s: unknown event type %q", r.Path, ev.Type)
		}
	}
}
