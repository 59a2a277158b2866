// Package policy decides whether a box may reach a host. Everything here is a pure function of
// the pool's rules, the box's narrowing and the host name; the proxy calls Decide on every new
// connection (and on every request of an intercepted or plain-HTTP connection).
//
// Patterns (allow, deny, plainHttp lists):
//
//	example.com     exactly that name (case-insensitive, a trailing dot ignored)
//	*.example.com   any name with at least one more label: a.example.com, a.b.example.com;
//	                NOT example.com itself (list both to allow both)
//	*               every DNS name (never an IP literal: those match exact entries only)
//
// Deny wins: a host matching any deny entry (pool's or box's) is refused whatever allows it.
// A box narrows its pool: a host must match the pool's allow list AND, when the box has an allow
// list, the box's (intersection). An empty box allow list (not an absent one) allows nothing.
// Plain HTTP (no TLS) is allowed only to hosts that are allowed and match the pool's plainHttp.
package policy

import (
	"fmt"
	"net/netip"
	"net/textproto"
	"strings"
)

// Pool is a pool's egress rules (SandboxPool spec.egress.domains).
type Pool struct {
	Allow     []string `json:"allow"`
	Deny      []string `json:"deny,omitempty"`
	PlainHTTP []string `json:"plainHttp,omitempty"`
}

// Box is a box's narrowing of its pool's rules. A nil Allow means "the pool's"; a non-nil empty
// one means nothing.
type Box struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Decision is the answer for one (box, host). Rule names what decided, for the proxy's error
// answer and the decision log: "pool.deny:*.evil.test", "box.allow:none", "plainHttp:none", …
type Decision struct {
	Allow bool
	Rule  string
}

// Decide answers whether a box of pool, narrowed by box, may reach host (a name or IP literal,
// no port); plain is true for unencrypted HTTP.
func Decide(pool Pool, box Box, host string, plain bool) Decision {
	h, ok := Normalize(host)
	if !ok {
		return Decision{false, "host:invalid"}
	}
	if p, ok := firstMatch(pool.Deny, h); ok {
		return Decision{false, "pool.deny:" + p}
	}
	if p, ok := firstMatch(box.Deny, h); ok {
		return Decision{false, "box.deny:" + p}
	}
	allowedBy, ok := firstMatch(pool.Allow, h)
	if !ok {
		return Decision{false, "pool.allow:none"}
	}
	rule := "pool.allow:" + allowedBy
	if box.Allow != nil {
		p, ok := firstMatch(box.Allow, h)
		if !ok {
			return Decision{false, "box.allow:none"}
		}
		rule = "box.allow:" + p
	}
	if plain {
		p, ok := firstMatch(pool.PlainHTTP, h)
		if !ok {
			return Decision{false, "plainHttp:none"}
		}
		rule += ",plainHttp:" + p
	}
	return Decision{true, rule}
}

// Normalize lower-cases a host name and drops one trailing dot; ok is false for anything that is
// neither an IP literal nor a syntactically valid DNS name (letters, digits, '-', '_', dots;
// labels of 1-63 bytes; 253 bytes in all).
func Normalize(host string) (string, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", false
		}
		return a.Unmap().String(), true
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if h == "" || len(h) > 253 {
		return "", false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return h, true
}

// Match reports whether pattern matches host; host must already be normalized.
func Match(pattern, host string) bool {
	p := strings.ToLower(strings.TrimSuffix(pattern, "."))
	isIP := false
	if _, err := netip.ParseAddr(host); err == nil {
		isIP = true
	}
	switch {
	case p == "*":
		return !isIP
	case strings.HasPrefix(p, "*."):
		return !isIP && strings.HasSuffix(host, p[1:]) && len(host) > len(p)-1
	default:
		if a, err := netip.ParseAddr(p); err == nil {
			return isIP && a.Unmap().String() == host
		}
		return p == host
	}
}

func firstMatch(patterns []string, host string) (string, bool) {
	for _, p := range patterns {
		if Match(p, host) {
			return p, true
		}
	}
	return "", false
}

// ValidPattern checks one list entry: "*", "*.name", a name or an IP literal.
func ValidPattern(p string) error {
	rest := p
	if p == "*" {
		return nil
	}
	if strings.HasPrefix(p, "*.") {
		rest = p[2:]
		if _, err := netip.ParseAddr(rest); err == nil {
			return fmt.Errorf("pattern %q: a wildcard over an IP address", p)
		}
	}
	if _, ok := Normalize(rest); !ok || strings.Contains(rest, "*") {
		return fmt.Errorf("pattern %q: want a host name, *.name, * or an IP address", p)
	}
	return nil
}

// Covers reports whether every host pattern p matches is also matched by outer.
func Covers(outer, p string) bool {
	o := strings.ToLower(strings.TrimSuffix(outer, "."))
	q := strings.ToLower(strings.TrimSuffix(p, "."))
	switch {
	case o == q:
		return true
	case q == "*":
		return false
	case strings.HasPrefix(q, "*."):
		// *.a.b is within *.b and within * (but not within a.b or *.a.b.c).
		if o == "*" {
			return true
		}
		return strings.HasPrefix(o, "*.") && strings.HasSuffix(q[1:], o[1:])
	default:
		h, ok := Normalize(q)
		return ok && Match(o, h)
	}
}

// Outside returns the entries of a box's allow list not within the pool's allow list: they can
// never allow anything (Decide intersects), and whoever set them should be told.
func Outside(boxAllow, poolAllow []string) []string {
	var out []string
	for _, p := range boxAllow {
		within := false
		for _, o := range poolAllow {
			if Covers(o, p) {
				within = true
				break
			}
		}
		if !within {
			out = append(out, p)
		}
	}
	return out
}

// CredentialHeader reports whether name: value may be injected as a credential (registered on a
// box or given by a pool's resolver): a header name of visible ASCII without ':', not a framing
// or hop-by-hop header, and a value without control characters (tab allowed).
func CredentialHeader(name, value string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Host", "Connection", "Content-Length", "Transfer-Encoding", "Upgrade", "Te", "Trailer",
		"Proxy-Authorization", "Proxy-Connection", "Keep-Alive":
		return false // framing and hop-by-hop headers are not credentials
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
