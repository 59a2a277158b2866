// Package kubetest is a protocol test double of the Kubernetes API server's list and watch, for
// unit tests of pure watch logic (kube.Reflector, source.Kubernetes): paged LIST with continue
// tokens, WATCH as a chunked stream of JSON events flushed one by one, BOOKMARK events, 410 Gone
// for a resourceVersion older than the compaction point (as an HTTP status or as an ERROR event,
// like the API server does for a watch cache miss and an expiry mid-watch), label selectors
// (k=v and k), PartialObjectMetadata answers, bearer tokens and injected failures; and POST to a
// collection (the gateway creates Events), which stores the object (metadata.generateName
// honoured) as a Put does. It is not a fake cluster: the gateway's cluster behaviour is tested against the real API server
// (source/kubernetes_cluster_test.go).
package kubetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is the double. Objects are map[string]any with metadata.name (and namespace).
type Server struct {
	*httptest.Server
	Token string // when set, requests must carry "Bearer Token"

	mu             sync.Mutex
	rv             int64
	compacted      int64                                // a watch from a resourceVersion below this is 410
	objs           map[string]map[string]map[string]any // resource -> ns/name -> object
	history        map[string][]event
	notify         chan struct{} // closed and replaced on every change
	fail           map[string][]int
	gone410AsEvent bool
	requests       []Request
	closeWatches   chan struct{}
	expireCont     bool // the next continue token is 410
}

type event struct {
	rv  int64
	typ string
	obj map[string]any
}

// Request is one request the double answered.
type Request struct {
	Method              string
	Resource, Namespace string
	Watch               bool
	ResourceVersion     string
	Continue            string
	Limit               string
	Accept              string
	LabelSelector       string
	Status              int
}

// New starts a double on loopback.
func New(t testing.TB) *Server {
	s := &Server{objs: map[string]map[string]map[string]any{}, history: map[string][]event{},
		notify: make(chan struct{}), fail: map[string][]int{}, closeWatches: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.CloseWatches()
		s.Server.Close()
	})
	return s
}

func key(obj map[string]any) (ns, name string) {
	m, _ := obj["metadata"].(map[string]any)
	ns, _ = m["namespace"].(string)
	name, _ = m["name"].(string)
	return
}

func (s *Server) changed() {
	close(s.notify)
	s.notify = make(chan struct{})
}

// Put creates or replaces an object of resource ("pods", "secrets", "sandboxpools"), stamping
// a new resourceVersion, and records an ADDED or MODIFIED event.
func (s *Server) Put(resource string, obj map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj = clone(obj)
	s.rv++
	obj["metadata"].(map[string]any)["resourceVersion"] = strconv.FormatInt(s.rv, 10)
	ns, name := key(obj)
	if s.objs[resource] == nil {
		s.objs[resource] = map[string]map[string]any{}
	}
	typ := "ADDED"
	if _, ok := s.objs[resource][ns+"/"+name]; ok {
		typ = "MODIFIED"
	}
	s.objs[resource][ns+"/"+name] = obj
	s.history[resource] = append(s.history[resource], event{rv: s.rv, typ: typ, obj: obj})
	s.changed()
}

// Delete removes an object and records a DELETED event.
func (s *Server) Delete(resource, ns, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, ok := s.objs[resource][ns+"/"+name]
	if !ok {
		return
	}
	delete(s.objs[resource], ns+"/"+name)
	s.rv++
	obj = clone(obj)
	obj["metadata"].(map[string]any)["resourceVersion"] = strconv.FormatInt(s.rv, 10)
	s.history[resource] = append(s.history[resource], event{rv: s.rv, typ: "DELETED", obj: obj})
	s.changed()
}

// Bookmark sends every open watch of resource a BOOKMARK at the current resourceVersion, after
// moving it on (as other resources' writes do on a real server).
func (s *Server) Bookmark(resource string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	s.history[resource] = append(s.history[resource], event{rv: s.rv, typ: "BOOKMARK",
		obj: map[string]any{"metadata": map[string]any{"resourceVersion": strconv.FormatInt(s.rv, 10)}}})
	s.changed()
}

// Compact forgets history: a watch from any resourceVersion before now gets 410 Gone, as an
// ERROR event when asEvent (open watches included: they get it at once), else as the HTTP status
// of the next watch.
func (s *Server) Compact(asEvent bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	s.compacted = s.rv
	s.gone410AsEvent = asEvent
	for r := range s.history {
		s.history[r] = nil
	}
	s.changed()
}

// FailNext makes the next requests of resource answer these HTTP statuses, in order.
func (s *Server) FailNext(resource string, codes ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[resource] = append(s.fail[resource], codes...)
}

// ExpireNextContinue makes the next list page asked for with a continue token 410 Expired, as
// when the snapshot it continues was compacted.
func (s *Server) ExpireNextContinue() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireCont = true
}

// CloseWatches ends every open watch (as a server timeout or a lost connection would).
func (s *Server) CloseWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.closeWatches)
	s.closeWatches = make(chan struct{})
}

// Requests returns the requests answered so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// parsePath: /api/v1/[namespaces/NS/]RES or /apis/G/V/[namespaces/NS/]RES.
func parsePath(p string) (ns, res string, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "", "", false
	}
	switch len(parts) {
	case 1:
		return "", parts[0], true
	case 3:
		if parts[0] == "namespaces" {
			return parts[1], parts[2], true
		}
	}
	return "", "", false
}

func matches(obj map[string]any, selector string) bool {
	if selector == "" {
		return true
	}
	m, _ := obj["metadata"].(map[string]any)
	labels, _ := m["labels"].(map[string]any)
	for _, term := range strings.Split(selector, ",") {
		k, v, hasValue := strings.Cut(term, "=")
		got, ok := labels[k].(string)
		if !ok || hasValue && got != v {
			return false
		}
	}
	return true
}

func inNamespace(obj map[string]any, ns string) bool {
	on, _ := key(obj)
	return ns == "" || on == ns
}

func metadataOnly(obj map[string]any, kind string) map[string]any {
	return map[string]any{"kind": kind, "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
}

func writeStatus(w http.ResponseWriter, code int, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
		"code": code, "reason": reason, "message": fmt.Sprintf("test double: %d", code)})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	ns, res, ok := parsePath(r.URL.Path)
	q := r.URL.Query()
	req := Request{Method: r.Method, Resource: res, Namespace: ns, Watch: q.Get("watch") == "true" || q.Get("watch") == "1",
		ResourceVersion: q.Get("resourceVersion"), Continue: q.Get("continue"), Limit: q.Get("limit"), Accept: r.Header.Get("Accept"),
		LabelSelector: q.Get("labelSelector")}
	s.mu.Lock()
	status := 200
	switch {
	case !ok:
		status = 404
	case s.Token != "" && r.Header.Get("Authorization") != "Bearer "+s.Token:
		status = 401
	case len(s.fail[res]) > 0:
		status, s.fail[res] = s.fail[res][0], s.fail[res][1:]
	}
	req.Status = status
	if status == 200 && req.Watch {
		if rv, _ := strconv.ParseInt(req.ResourceVersion, 10, 64); rv < s.compacted && !s.gone410AsEvent {
			status, req.Status = 410, 410
		}
	}
	s.requests = append(s.requests, req)
	closed := s.closeWatches // a CloseWatches from now on ends this watch
	s.mu.Unlock()
	if status != 200 {
		writeStatus(w, status, http.StatusText(status))
		return
	}
	if r.Method == http.MethodPost {
		s.create(w, r, res, ns)
		return
	}
	partial := strings.Contains(req.Accept, "as=PartialObjectMetadata")
	if req.Watch {
		s.watch(w, r, res, ns, req, partial, closed)
		return
	}
	s.list(w, res, ns, req, partial)
}

// create stores a POSTed object: its namespace is the path's, a generateName gets a suffix.
func (s *Server) create(w http.ResponseWriter, r *http.Request, res, ns string) {
	var obj map[string]any
	if err := json.NewDecoder(r.Body).Decode(&obj); err != nil {
		writeStatus(w, 400, "BadRequest")
		return
	}
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		obj["metadata"] = md
	}
	if name, _ := md["name"].(string); name == "" {
		gen, _ := md["generateName"].(string)
		if gen == "" {
			writeStatus(w, 422, "Invalid")
			return
		}
		s.mu.Lock()
		md["name"] = fmt.Sprintf("%s%05d", gen, s.rv+1)
		s.mu.Unlock()
	}
	if ns != "" {
		md["namespace"] = ns
	}
	s.Put(res, obj)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(obj)
}

// Objects returns the objects of resource now (copies), sorted by namespace/name.
func (s *Server) Objects(resource string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.objs[resource]))
	for k := range s.objs[resource] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]map[string]any, 0, len(keys))
	for _, k := range keys {
		out = append(out, clone(s.objs[resource][k]))
	}
	return out
}

func (s *Server) list(w http.ResponseWriter, res, ns string, req Request, partial bool) {
	s.mu.Lock()
	var keys []string
	for k, o := range s.objs[res] {
		if inNamespace(o, ns) && matches(o, req.LabelSelector) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	start := 0
	listRV := strconv.FormatInt(s.rv, 10)
	if req.Continue != "" && s.expireCont {
		s.expireCont = false
		s.mu.Unlock()
		writeStatus(w, 410, "Expired")
		return
	}
	if req.Continue != "" {
		// The token is "offset:rv": the page continues the snapshot at rv (as an approximation,
		// the current objects after offset; an expired token is 410).
		off, rv, _ := strings.Cut(req.Continue, ":")
		start, _ = strconv.Atoi(off)
		listRV = rv
		if n, _ := strconv.ParseInt(rv, 10, 64); n < s.compacted {
			s.mu.Unlock()
			writeStatus(w, 410, "Expired")
			return
		}
	}
	pageSize := len(keys)
	if l, err := strconv.Atoi(req.Limit); err == nil && l > 0 {
		pageSize = l
	}
	end := min(start+pageSize, len(keys))
	if start > len(keys) {
		start = len(keys)
	}
	items := make([]any, 0, end-start)
	for _, k := range keys[start:end] {
		o := s.objs[res][k]
		if partial {
			o = metadataOnly(o, "PartialObjectMetadata")
		}
		items = append(items, o)
	}
	cont := ""
	if end < len(keys) {
		cont = fmt.Sprintf("%d:%s", end, listRV)
	}
	s.mu.Unlock()
	kind := "List"
	if partial {
		kind = "PartialObjectMetadataList"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"kind": kind, "apiVersion": "v1",
		"metadata": map[string]any{"resourceVersion": listRV, "continue": cont}, "items": items})
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, res, ns string, req Request, partial bool, closed chan struct{}) {
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(200)
	fl.Flush()
	from, _ := strconv.ParseInt(req.ResourceVersion, 10, 64)
	timeout := time.Hour
	if t, err := strconv.Atoi(r.URL.Query().Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	deadline := time.After(timeout)
	enc := json.NewEncoder(w)
	sent := from
	for {
		s.mu.Lock()
		if s.gone410AsEvent && sent < s.compacted {
			s.mu.Unlock()
			enc.Encode(map[string]any{"type": "ERROR", "object": map[string]any{"kind": "Status", "apiVersion": "v1",
				"status": "Failure", "code": 410, "reason": "Expired", "message": "too old resource version"}})
			fl.Flush()
			return
		}
		var out []event
		for _, e := range s.history[res] {
			if e.rv > sent && (e.typ == "BOOKMARK" || inNamespace(e.obj, ns) && matches(e.obj, req.LabelSelector)) {
				out = append(out, e)
			}
		}
		if n := len(s.history[res]); n > 0 && s.history[res][n-1].rv > sent {
			sent = s.history[res][n-1].rv
		}
		notify := s.notify
		s.mu.Unlock()
		for _, e := range out {
			obj := e.obj
			if partial && e.typ != "BOOKMARK" {
				obj = metadataOnly(obj, "PartialObjectMetadata")
			}
			if err := enc.Encode(map[string]any{"type": e.typ, "object": obj}); err != nil {
				return
			}
			fl.Flush() // one chunk per event, as the API server sends them
		}
		select {
		case <-notify:
		case <-closed:
			return
		case <-deadline:
			return
		case <-r.Context().Done():
			return
		}
	}
}

func clone(o map[string]any) map[string]any {
	b, _ := json.Marshal(o)
	var c map[string]any
	json.Unmarshal(b, &c)
	return c
}
