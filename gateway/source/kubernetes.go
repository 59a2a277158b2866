package source

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/kube"
	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/resolver"
)

// The names sandbox-bridge stamps on Kubernetes objects that the gateway reads (common/labels.ts
// is their one definition; these must say the same).
const (
	LabelBox           = "sandbox-bridge.io/box"    // "true" on box pods, warm pods and box Secrets
	LabelBoxID         = "sandbox-bridge.io/box-id" // on a session's box pod (warm pods have none)
	LabelPool          = "sandbox-bridge.io/pool"   // the SandboxPool a box belongs to
	LabelComponent     = "app.kubernetes.io/component"
	ComponentRecord    = "box-record" // a box's record Secret, named after the box id
	AnnotationEgress   = "sandbox-bridge.io/egress"
	AnnotationNonce    = "sandbox-bridge.io/boxd-nonce"       // on a box pod: public, part of its proxy credential
	AnnotationOutbound = "sandbox-bridge.io/outbound-context" // on a record: {tenant_id, session_id} for the resolver
	CredentialsKey     = "egress-credentials"                 // the record's data key (common/box-egress.ts)
	PoolResourcePath   = "/apis/sandbox-bridge.io/v1alpha1/sandboxpools"
	// A pool's interception CA: a kubernetes.io/tls Secret of this name in the pool's namespace,
	// labelled component egress-ca and with the pool's name (common/egress-proxy.ts).
	ComponentEgressCA = "egress-ca"
	EgressCAName      = "sandbox-bridge-egress-ca"
	EgressModeGateway = "gateway"
)

// Kubernetes is a Source fed by watches on the API server (kube.Reflector: list, then watch from
// the list's resourceVersion, relist on 410): SandboxPools (cluster-scoped), box pods
// (sandbox-bridge.io/box=true with a box id) and box record Secrets. Every change builds a new
// State (swapped atomically), so an edit is in force on every replica as soon as its watch event
// arrives, typically milliseconds after the write.
//
// What it reads (docs/egress.md "Where the policy lives"; common/box-egress.ts writes them):
//   - a pool: spec.namespace, spec.egress.mode (only "gateway" pools are served: a direct-mode
//     pool's boxes are unknown to the gateway, 407), spec.egress.domains.{allow,deny,plainHttp}
//     and spec.egress.credentialResolver;
//   - a pod: the box id and pool labels, its name, uid and sandbox-bridge.io/boxd-nonce
//     annotation (the proxy credential is bound to namespace, name and nonce), status.podIP;
//     only pods in their pool's namespace, not finished, not on the host network; two pods
//     claiming one IP are both left out;
//   - a record's sandbox-bridge.io/egress annotation, JSON {"allow": [...], "deny": [...]}: the
//     box's narrowing (absent, or no "allow": the pool's list); its
//     sandbox-bridge.io/outbound-context annotation, JSON {tenant_id, session_id}, for the
//     pool's credential resolver;
//   - with Credentials, the record's data key egress-credentials, JSON {host: {header: value}}.
//     Without it the records are watched as metadata only (PartialObjectMetadata): no record
//     data ever reaches the gateway, and boxes have no credentials (a resolver may supply them);
//   - each gateway pool's CA Secret (sandbox-bridge-egress-ca, labelled component egress-ca and
//     the pool, in the pool's namespace; tls.crt and tls.key): the pool's certs.Authority, built
//     in memory once per Secret content and kept while the content is the same (its leaf cache
//     with it). These Secrets are a watch of their own and always read whole, Credentials or not.
//
// Until pools, pods, records and CA Secrets have each been listed once, Current is nil (not
// ready, 503).
// When the API server goes away the last State stays in force while the watches retry.
type Kubernetes struct {
	Client *kube.Client
	// Namespace limits the pod and Secret watches to one namespace (a Role there suffices);
	// "" watches all namespaces (a ClusterRole).
	Namespace string
	// Credentials: read each record's egress-credentials data key (the whole Secret is then
	// watched; only that key and the annotation are kept).
	Credentials bool
	Log         *slog.Logger
	// OnLoad, when set, is called after every State built (ok true) or refused (never: a bad
	// object is left out, not the whole State).
	OnLoad func(ok bool)

	pools   *kube.Reflector[kubePool]
	pods    *kube.Reflector[kubePod]
	records *kube.Reflector[kubeRecord]
	cas     *kube.Reflector[kubeCA]
	dirty   chan struct{}
	// authorities: the Authority of each CA Secret content (sha256 of certificate and key), so a
	// State build reuses it (and its leaf cache) while the Secret is unchanged.
	authorities map[[sha256.Size]byte]*certs.Authority
	cur         atomic.Pointer[State]
	builds      atomic.Int64
	warned      map[string]bool
	once        sync.Once // warnings of the last build: each is logged once, not per event
}

// Current returns the last State, nil before every resource was listed once.
func (k *Kubernetes) Current() *State { return k.cur.Load() }

// Builds is how many States were built (tests, metrics).
func (k *Kubernetes) Builds() int64 { return k.builds.Load() }

func (k *Kubernetes) log() *slog.Logger {
	if k.Log != nil {
		return k.Log
	}
	return slog.Default()
}

func (k *Kubernetes) init() { k.once.Do(k.setup) }

func (k *Kubernetes) setup() {
	k.dirty = make(chan struct{}, 1)
	mark := func() {
		select {
		case k.dirty <- struct{}{}:
		default: // a build is already due; it will see this change too
		}
	}
	ns := ""
	if k.Namespace != "" {
		ns = "/namespaces/" + url.PathEscape(k.Namespace)
	}
	// Equal: most events change nothing the gateway keeps (the bridge writes a box pod's
	// activity annotation every few seconds, the operator a pool's status); they build no State.
	k.pools = &kube.Reflector[kubePool]{Client: k.Client, Path: PoolResourcePath, Decode: decodePool, OnChange: mark, Log: k.Log,
		Equal: func(a, b kubePool) bool { return reflect.DeepEqual(a, b) }}
	k.pods = &kube.Reflector[kubePod]{
		Client: k.Client, Path: "/api/v1" + ns + "/pods", Decode: decodePod, OnChange: mark, Log: k.Log,
		Equal: func(a, b kubePod) bool { return a == b },
		Query: url.Values{"labelSelector": {LabelBox + "=true," + LabelBoxID}},
	}
	k.records = &kube.Reflector[kubeRecord]{
		Client: k.Client, Path: "/api/v1" + ns + "/secrets", OnChange: mark, Log: k.Log,
		Query:  url.Values{"labelSelector": {LabelBox + "=true," + LabelComponent + "=" + ComponentRecord}},
		Decode: func(raw json.RawMessage) (kubeRecord, bool, error) { return decodeRecord(raw, k.Credentials) },
		Equal:  func(a, b kubeRecord) bool { return reflect.DeepEqual(a, b) },
	}
	if !k.Credentials {
		k.records.Accept, k.records.WatchAccept = kube.MetadataListAccept, kube.MetadataWatchAccept
	}
	k.cas = &kube.Reflector[kubeCA]{
		Client: k.Client, Path: "/api/v1" + ns + "/secrets", OnChange: mark, Log: k.Log, Decode: decodeCA,
		Query: url.Values{"labelSelector": {LabelComponent + "=" + ComponentEgressCA + "," + LabelPool}},
		Equal: func(a, b kubeCA) bool { return reflect.DeepEqual(a, b) },
	}
}

// Run watches until ctx ends.
func (k *Kubernetes) Run(ctx context.Context) {
	k.init()
	go k.pools.Run(ctx)
	go k.pods.Run(ctx)
	go k.records.Run(ctx)
	go k.cas.Run(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.dirty:
		}
		if !k.pools.Synced() || !k.pods.Synced() || !k.records.Synced() || !k.cas.Synced() {
			continue // each first list marks dirty again
		}
		k.rebuild()
	}
}

// Reflectors' counters, for tests.
func (k *Kubernetes) lists() (pools, pods, records int64) {
	k.init()
	return k.pools.Lists.Load(), k.pods.Lists.Load(), k.records.Lists.Load()
}

func (k *Kubernetes) rebuild() {
	var pools map[string]kubePool
	var pods []kubePod
	var records map[string]kubeRecord
	pools = make(map[string]kubePool, k.pools.Len())
	k.pools.Range(func(key string, v kubePool) { pools[key] = v })
	k.pods.Range(func(_ string, v kubePod) { pods = append(pods, v) })
	records = make(map[string]kubeRecord, k.records.Len())
	k.records.Range(func(key string, v kubeRecord) { records[key] = v })
	s, warnings := buildState(pools, pods, records)
	cas := map[string]kubeCA{}
	k.cas.Range(func(key string, v kubeCA) { cas[key] = v })
	var caWarnings []string
	s.CAs, k.authorities, caWarnings = buildCAs(pools, cas, k.authorities)
	warnings = append(warnings, caWarnings...)
	prev := k.cur.Swap(s)
	k.builds.Add(1)
	if k.OnLoad != nil {
		k.OnLoad(true)
	}
	warned := make(map[string]bool, len(warnings))
	for _, w := range warnings {
		if !k.warned[w] {
			k.log().Warn("policy", "source", "kubernetes", "warning", w)
		}
		warned[w] = true
	}
	k.warned = warned
	if prev == nil {
		k.log().Info("policy loaded", "source", "kubernetes", "pools", len(s.Pools), "boxes", len(s.Boxes))
	}
}

// kubePool is what the gateway keeps of a SandboxPool.
type kubePool struct {
	Namespace string
	Gateway   bool
	Pool      policy.Pool
	Resolver  *resolver.Spec
}

// kubePod is what it keeps of a box pod.
type kubePod struct {
	Namespace, Name, BoxID, Pool string
	UID, Nonce                   string
	IP                           netip.Addr
	Deleting                     bool
	Created                      string
}

// kubeRecord is what it keeps of a box's record Secret: the narrowing and credentials, if any.
type kubeRecord struct {
	Set         bool // the annotation is present
	Allow       []string
	Deny        []string
	Err         string // the annotation does not parse: the box gets no allowance (fail closed)
	Credentials map[string]map[string]string
	CredErr     string // what is wrong with the credentials (never a value)
	Outbound    Outbound
	OutErr      string // the outbound context does not parse
}

func decodePool(raw json.RawMessage) (kubePool, bool, error) {
	var o struct {
		Spec struct {
			Namespace string `json:"namespace"`
			Egress    struct {
				Mode               string         `json:"mode"`
				CredentialResolver *resolver.Spec `json:"credentialResolver"`
				Domains            struct {
					Allow     []string `json:"allow"`
					Deny      []string `json:"deny"`
					PlainHTTP []string `json:"plainHttp"`
				} `json:"domains"`
			} `json:"egress"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return kubePool{}, false, err
	}
	d := o.Spec.Egress.Domains
	return kubePool{
		Namespace: o.Spec.Namespace,
		Gateway:   o.Spec.Egress.Mode == EgressModeGateway,
		Pool:      policy.Pool{Allow: d.Allow, Deny: d.Deny, PlainHTTP: d.PlainHTTP},
		Resolver:  o.Spec.Egress.CredentialResolver,
	}, true, nil
}

func decodePod(raw json.RawMessage) (kubePod, bool, error) {
	var o struct {
		Metadata struct {
			Name              string            `json:"name"`
			Namespace         string            `json:"namespace"`
			UID               string            `json:"uid"`
			Labels            map[string]string `json:"labels"`
			Annotations       map[string]string `json:"annotations"`
			DeletionTimestamp *string           `json:"deletionTimestamp"`
			CreationTimestamp string            `json:"creationTimestamp"`
		} `json:"metadata"`
		Spec struct {
			HostNetwork bool `json:"hostNetwork"`
		} `json:"spec"`
		Status struct {
			Phase string `json:"phase"`
			PodIP string `json:"podIP"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return kubePod{}, false, err
	}
	l := o.Metadata.Labels
	if l[LabelBox] != "true" || l[LabelBoxID] == "" || o.Spec.HostNetwork {
		return kubePod{}, false, nil
	}
	// A finished pod's IP is free for another pod; one without an IP yet cannot connect.
	if o.Status.Phase == "Succeeded" || o.Status.Phase == "Failed" || o.Status.PodIP == "" {
		return kubePod{}, false, nil
	}
	ip, err := netip.ParseAddr(o.Status.PodIP)
	if err != nil {
		return kubePod{}, false, fmt.Errorf("status.podIP: %w", err)
	}
	return kubePod{
		Namespace: o.Metadata.Namespace, Name: o.Metadata.Name, BoxID: l[LabelBoxID], Pool: l[LabelPool],
		UID: o.Metadata.UID, Nonce: o.Metadata.Annotations[AnnotationNonce], IP: ip.Unmap(), Deleting: o.Metadata.DeletionTimestamp != nil, Created: o.Metadata.CreationTimestamp,
	}, true, nil
}

func decodeRecord(raw json.RawMessage, withCredentials bool) (kubeRecord, bool, error) {
	var o struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Data map[string]string `json:"data"` // base64
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		// Fail closed (the box allows nothing), and no detail: it could quote data.
		return kubeRecord{Set: true, Allow: []string{}, Err: "the record does not parse"}, true, nil
	}
	var r kubeRecord
	if a, ok := o.Metadata.Annotations[AnnotationEgress]; ok {
		r.Set = true
		var e struct {
			Allow *[]string `json:"allow"`
			Deny  []string  `json:"deny"`
		}
		if err := json.Unmarshal([]byte(a), &e); err != nil {
			r.Allow, r.Err = []string{}, err.Error()
		} else {
			r.Deny = e.Deny
			if e.Allow != nil {
				r.Allow = *e.Allow
				if r.Allow == nil {
					r.Allow = []string{}
				}
			}
		}
	}
	if a, ok := o.Metadata.Annotations[AnnotationOutbound]; ok {
		if err := json.Unmarshal([]byte(a), &r.Outbound); err != nil {
			r.Outbound, r.OutErr = Outbound{}, "annotation "+AnnotationOutbound+" is not JSON {tenant_id, session_id}"
		}
	}
	if withCredentials {
		if v, ok := o.Data[CredentialsKey]; ok {
			if b, err := base64.StdEncoding.DecodeString(v); err != nil {
				r.CredErr = "egress-credentials is not base64"
			} else {
				r.Credentials, r.CredErr = parseCredentials(b)
			}
		}
	}
	if !r.Set && r.Credentials == nil && r.CredErr == "" && r.Outbound == (Outbound{}) && r.OutErr == "" {
		return kubeRecord{}, false, nil // nothing to keep: the pool's policy, no credentials
	}
	return r, true, nil
}

// parseCredentials reads {host: {header: value}} with the File format's rules (exact hosts,
// no framing or hop-by-hop headers, no control characters). A host with a bad entry gets no
// credentials at all; the problem is named without any value.
func parseCredentials(b []byte) (map[string]map[string]string, string) {
	var doc map[string]map[string]string
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, "egress-credentials is not a JSON object of hosts to headers"
	}
	out := make(map[string]map[string]string, len(doc))
	var problems []string
	for host, headers := range doc {
		h, ok := policy.Normalize(host)
		if !ok {
			problems = append(problems, fmt.Sprintf("host %q is not a host name", host))
			continue
		}
		canon := make(map[string]string, len(headers))
		good := true
		for name, v := range headers {
			if !policy.CredentialHeader(name, v) {
				problems = append(problems, fmt.Sprintf("host %q: header %q is not a credential header or its value has control characters", h, name))
				good = false
				break
			}
			canon[http.CanonicalHeaderKey(name)] = v
		}
		if good && len(canon) > 0 {
			out[h] = canon
		}
	}
	sort.Strings(problems)
	return out, strings.Join(problems, "; ")
}

// buildState makes the State the proxy reads. Nothing here refuses the whole State (unlike
// Parse, which refuses a document): one bad object is left out or made to allow nothing, and
// every other box keeps working. Fail closed: a pool whose lists do not validate allows
// nothing; a box whose narrowing does not validate allows nothing.
func buildState(pools map[string]kubePool, pods []kubePod, records map[string]kubeRecord) (*State, []string) {
	s := &State{Pools: map[string]policy.Pool{}, Boxes: map[string]*Box{}, byIP: map[netip.Addr]string{}}
	var warnings []string
	nsOf := map[string]string{}
	for name, p := range pools {
		if !p.Gateway {
			continue
		}
		bad := ""
		for _, list := range [][]string{p.Pool.Allow, p.Pool.Deny, p.Pool.PlainHTTP} {
			for _, pat := range list {
				if err := policy.ValidPattern(pat); err != nil && bad == "" {
					bad = err.Error()
				}
			}
		}
		if bad != "" {
			warnings = append(warnings, fmt.Sprintf("pool %q: %s; the pool allows nothing until it is fixed", name, bad))
			p.Pool = policy.Pool{Allow: []string{}}
		}
		s.Pools[name] = p.Pool
		nsOf[name] = p.Namespace
		if r := p.Resolver; r != nil {
			if err := r.Check(); err != nil {
				warnings = append(warnings, fmt.Sprintf("pool %q: credentialResolver: %s; the pool has no resolver until it is fixed", name, err))
			} else {
				if s.Resolvers == nil {
					s.Resolvers = map[string]*resolver.Spec{}
				}
				s.Resolvers[name] = r
			}
		}
	}
	// One pod per box: a box whose pod is being replaced (a wake) may briefly have two; the one
	// not being deleted wins, then the newer.
	sort.Slice(pods, func(i, j int) bool {
		a, b := pods[i], pods[j]
		if a.BoxID != b.BoxID {
			return a.BoxID < b.BoxID
		}
		if a.Deleting != b.Deleting {
			return !a.Deleting
		}
		if a.Created != b.Created {
			return a.Created > b.Created
		}
		return a.Name < b.Name
	})
	owners := map[netip.Addr][]string{}
	for _, p := range pods {
		if _, done := s.Boxes[p.BoxID]; done {
			continue
		}
		ns, ok := nsOf[p.Pool]
		if !ok || ns != p.Namespace {
			continue // not a gateway pool's box, or a pod outside its pool's namespace
		}
		b := &Box{Pool: p.Pool, IP: p.IP.String(), ip: p.IP, Pod: p.Name, Namespace: p.Namespace, Nonce: p.Nonce, UID: p.UID}
		if p.Nonce == "" {
			warnings = append(warnings, fmt.Sprintf("box %q: pod %s has no %s annotation; its proxy credential cannot be checked (407)", p.BoxID, p.Name, AnnotationNonce))
		}
		if r, ok := records[p.Namespace+"/"+p.BoxID]; ok && r.Set {
			b.Allow, b.Deny = r.Allow, r.Deny
			if r.Err != "" {
				warnings = append(warnings, fmt.Sprintf("box %q: annotation %s does not parse (%s); the box allows nothing", p.BoxID, AnnotationEgress, r.Err))
			}
			for _, list := range [][]string{b.Allow, b.Deny} {
				for _, pat := range list {
					if err := policy.ValidPattern(pat); err != nil {
						warnings = append(warnings, fmt.Sprintf("box %q: %s; the box allows nothing", p.BoxID, err))
						b.Allow, b.Deny = []string{}, nil
					}
				}
			}
			if out := policy.Outside(b.Allow, s.Pools[p.Pool].Allow); len(out) > 0 {
				warnings = append(warnings, fmt.Sprintf("box %q: allow entries %q are outside pool %q's allow list and allow nothing", p.BoxID, out, p.Pool))
			}
		}
		if r, ok := records[p.Namespace+"/"+p.BoxID]; ok {
			b.Credentials, b.Outbound = r.Credentials, r.Outbound
			if r.OutErr != "" {
				warnings = append(warnings, fmt.Sprintf("box %q: %s; the resolver is told no tenant or session", p.BoxID, r.OutErr))
			}
			if r.CredErr != "" {
				warnings = append(warnings, fmt.Sprintf("box %q: credentials left out: %s", p.BoxID, r.CredErr))
			}
		}
		s.Boxes[p.BoxID] = b
		owners[p.IP] = append(owners[p.IP], p.BoxID)
	}
	for ip, ids := range owners {
		if len(ids) > 1 {
			// Identity is the IP and the credential together: an IP two boxes claim identifies
			// neither (both get 407 until the API server's view settles).
			warnings = append(warnings, fmt.Sprintf("boxes %q have the same pod IP %s; both are left out", ids, ip))
			for _, id := range ids {
				delete(s.Boxes, id)
			}
			continue
		}
		s.byIP[ip] = ids[0]
	}
	s.index()
	return s, warnings
}

// kubeCA is what the gateway keeps of a pool's CA Secret: the pool it names and its key pair.
type kubeCA struct {
	Pool      string
	Cert, Key []byte
	Err       string // what is wrong with it (never key material)
}

func decodeCA(raw json.RawMessage) (kubeCA, bool, error) {
	var o struct {
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Type string            `json:"type"`
		Data map[string]string `json:"data"` // base64
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return kubeCA{}, false, errors.New("the Secret does not parse") // no detail: it could quote key material
	}
	if o.Metadata.Name != EgressCAName || o.Metadata.Labels[LabelPool] == "" {
		return kubeCA{}, false, nil
	}
	c := kubeCA{Pool: o.Metadata.Labels[LabelPool]}
	if o.Type != "kubernetes.io/tls" {
		c.Err = fmt.Sprintf("type %q, want kubernetes.io/tls", o.Type)
		return c, true, nil
	}
	var err1, err2 error
	c.Cert, err1 = base64.StdEncoding.DecodeString(o.Data["tls.crt"])
	c.Key, err2 = base64.StdEncoding.DecodeString(o.Data["tls.key"])
	if err1 != nil || err2 != nil || len(c.Cert) == 0 || len(c.Key) == 0 {
		c = kubeCA{Pool: c.Pool, Err: "tls.crt and tls.key are required"}
	}
	return c, true, nil
}

// buildCAs gives each gateway pool the Authority of its CA Secret (one in the pool's namespace
// that names the pool). Authorities are reused from cache by content and the cache returned holds
// only those in use. A Secret that does not load leaves its pool without a CA: interception is
// refused there (502) until it is fixed, with a warning that never quotes key material.
func buildCAs(pools map[string]kubePool, secrets map[string]kubeCA, cache map[[sha256.Size]byte]*certs.Authority) (map[string]*certs.Authority, map[[sha256.Size]byte]*certs.Authority, []string) {
	out := map[string]*certs.Authority{}
	used := map[[sha256.Size]byte]*certs.Authority{}
	var warnings []string
	for key, c := range secrets {
		ns, _, _ := strings.Cut(key, "/")
		p, ok := pools[c.Pool]
		if !ok || !p.Gateway || p.Namespace != ns {
			continue // another pool's namespace, or not a gateway pool (yet)
		}
		if c.Err != "" {
			warnings = append(warnings, fmt.Sprintf("pool %q: CA Secret %s: %s; interception is refused (502) until it is fixed", c.Pool, key, c.Err))
			continue
		}
		h := sha256.New()
		h.Write(c.Cert)
		h.Write([]byte{0})
		h.Write(c.Key)
		var sum [sha256.Size]byte
		copy(sum[:], h.Sum(nil))
		a := cache[sum]
		if a == nil {
			var err error
			if a, err = certs.FromPEM(c.Cert, c.Key); err != nil {
				warnings = append(warnings, fmt.Sprintf("pool %q: CA Secret %s does not load (%v); interception is refused (502) until it is fixed", c.Pool, key, err))
				continue
			}
		}
		used[sum] = a
		out[c.Pool] = a
	}
	return out, used, warnings
}

// WaitReady waits until the first State is built or ctx ends (for callers that want to block).
func (k *Kubernetes) WaitReady(ctx context.Context) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for k.Current() == nil {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}
