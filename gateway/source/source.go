// Package source is where the gateway learns pools, boxes and the credentials registered for
// them. The proxy reads only the Source interface; File is the implementation for now (a JSON
// file, re-read when it changes), and the chart/operator wiring can replace it with a Kubernetes
// watch. Whatever the implementation, Current must return the new state within 1 s of a change.
package source

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"sort"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/identity"
	"sandbox-bridge.io/gateway/policy"
	"sandbox-bridge.io/gateway/resolver"
)

// Source hands out the current state; nil until the first good load.
type Source interface {
	Current() *State
}

// State is one consistent view: every proxy decision reads one State and never a mix of two.
// It is immutable once returned by a Source.
type State struct {
	Pools map[string]policy.Pool `json:"pools"`
	Boxes map[string]*Box        `json:"boxes"`
	// CAs are the pools' interception CAs (source.Kubernetes: from each pool's Secret); a pool
	// without one uses the gateway's -ca-cert, if any.
	CAs map[string]*certs.Authority `json:"-"`
	// Resolvers are the pools' credential resolvers (checked; a pool without one has none).
	Resolvers map[string]*resolver.Spec `json:"-"`

	byIP  map[netip.Addr]string
	byPod map[string]string // pod name -> box id ("" when boxes of two namespaces share the name)
}

// Box is one box: its pool, its pod (IP, namespace, name, boxd nonce: what its proxy credential
// is bound to), its narrowing of the pool's policy and the headers to inject per host (host name,
// exact, -> header name -> value). Header values are secrets: they are never logged, and nothing
// prints a State.
type Box struct {
	Pool      string `json:"pool"`
	IP        string `json:"ip"`
	Pod       string `json:"pod"`
	Namespace string `json:"namespace"`
	Nonce     string `json:"nonce"`
	UID       string `json:"uid,omitempty"` // the pod's uid (Events name it)
	// Outbound is the box's outbound context (record annotation sandbox-bridge.io/outbound-context)
	// the pool's credential resolver is told.
	Outbound    Outbound                     `json:"outboundContext,omitempty"`
	Allow       []string                     `json:"allow,omitempty"`
	Deny        []string                     `json:"deny,omitempty"`
	Credentials map[string]map[string]string `json:"credentials,omitempty"`

	ip netip.Addr
}

// Outbound is what the platform set with setOutboundContext for the box's session.
type Outbound struct {
	TenantID  string `json:"tenant_id"`
	SessionID string `json:"session_id"`
}

// Policy returns the box's narrowing in policy's terms.
func (b *Box) Policy() policy.Box { return policy.Box{Allow: b.Allow, Deny: b.Deny} }

// Addr is the box's pod IP.
func (b *Box) Addr() netip.Addr { return b.ip }

// Identity is what the box's proxy credential is bound to.
func (b *Box) Identity() identity.Pod {
	return identity.Pod{Namespace: b.Namespace, Name: b.Pod, Nonce: b.Nonce}
}

// Headers returns the headers registered for host (already normalized), nil when none.
func (b *Box) Headers(host string) map[string]string {
	if b == nil {
		return nil
	}
	return b.Credentials[host]
}

// BoxAt returns the id of the box whose pod IP is ip, "" when none.
func (s *State) BoxAt(ip netip.Addr) string { return s.byIP[ip.Unmap()] }

// PodBox returns the id of the box whose pod is called name, "" when none or more than one (for
// the decision log: which known box a refused request claimed to be).
func (s *State) PodBox(name string) string { return s.byPod[name] }

// index fills byPod from Boxes.
func (s *State) index() {
	s.byPod = make(map[string]string, len(s.Boxes))
	for id, b := range s.Boxes {
		if _, dup := s.byPod[b.Pod]; dup {
			s.byPod[b.Pod] = ""
			continue
		}
		s.byPod[b.Pod] = id
	}
}

// Parse decodes and checks a state document (the File format, see README). Problems that make
// the document unusable are errors; box allow entries outside their pool's allow list are only
// reported in warnings (they can never allow anything: policy intersects).
func Parse(b []byte) (*State, []string, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, nil, fmt.Errorf("policy document: %w", err)
	}
	var resolvers struct {
		Pools map[string]struct {
			CredentialResolver *resolver.Spec `json:"credentialResolver"`
		} `json:"pools"`
	}
	if err := json.Unmarshal(b, &resolvers); err != nil {
		return nil, nil, fmt.Errorf("policy document: %w", err)
	}
	for name, p := range resolvers.Pools {
		if r := p.CredentialResolver; r != nil {
			if err := r.Check(); err != nil {
				return nil, nil, fmt.Errorf("pool %q: credentialResolver: %w", name, err)
			}
			if s.Resolvers == nil {
				s.Resolvers = map[string]*resolver.Spec{}
			}
			s.Resolvers[name] = r
		}
	}
	var warnings []string
	for name, p := range s.Pools {
		for _, list := range [][]string{p.Allow, p.Deny, p.PlainHTTP} {
			for _, pat := range list {
				if err := policy.ValidPattern(pat); err != nil {
					return nil, nil, fmt.Errorf("pool %q: %w", name, err)
				}
			}
		}
	}
	s.byIP = make(map[netip.Addr]string, len(s.Boxes))
	ids := make([]string, 0, len(s.Boxes))
	for id := range s.Boxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		box := s.Boxes[id]
		if box == nil {
			return nil, nil, fmt.Errorf("box %q: null", id)
		}
		pool, ok := s.Pools[box.Pool]
		if !ok {
			return nil, nil, fmt.Errorf("box %q: no pool %q", id, box.Pool)
		}
		ip, err := netip.ParseAddr(box.IP)
		if err != nil {
			return nil, nil, fmt.Errorf("box %q: ip: %w", id, err)
		}
		if box.Pod == "" || box.Namespace == "" || box.Nonce == "" {
			return nil, nil, fmt.Errorf("box %q: pod, namespace and nonce are required (its proxy credential is bound to them)", id)
		}
		box.ip = ip.Unmap()
		if other, dup := s.byIP[box.ip]; dup {
			return nil, nil, fmt.Errorf("boxes %q and %q have the same IP %s", other, id, box.ip)
		}
		s.byIP[box.ip] = id
		for _, list := range [][]string{box.Allow, box.Deny} {
			for _, pat := range list {
				if err := policy.ValidPattern(pat); err != nil {
					return nil, nil, fmt.Errorf("box %q: %w", id, err)
				}
			}
		}
		if out := policy.Outside(box.Allow, pool.Allow); len(out) > 0 {
			warnings = append(warnings, fmt.Sprintf("box %q: allow entries %q are outside pool %q's allow list and allow nothing", id, out, box.Pool))
		}
		creds := make(map[string]map[string]string, len(box.Credentials))
		for host, headers := range box.Credentials {
			h, ok := policy.Normalize(host)
			if !ok {
				return nil, nil, fmt.Errorf("box %q: credentials for an invalid host %q", id, host)
			}
			canon := make(map[string]string, len(headers))
			for name, v := range headers {
				if !policy.CredentialHeader(name, v) {
					// The value is not quoted: it is a secret.
					return nil, nil, fmt.Errorf("box %q: credentials for %q: invalid header %q (name or value)", id, h, name)
				}
				canon[http.CanonicalHeaderKey(name)] = v
			}
			creds[h] = canon
		}
		box.Credentials = creds
	}
	s.index()
	return &s, warnings, nil
}
