// Package identity checks who is asking the gateway: a box presents its pod's name and a per-pod
// proxy credential (Proxy-Authorization: Basic base64(pod-name ":" credential)), and the proxy
// also checks that the connection comes from that pod's IP. The credential is derived, not stored
// (identity "v2"; common/egress-proxy.ts egressProxyCredential computes the same):
//
//	credential = base64url-unpadded( HMAC-SHA256( key,
//	                 "sandbox-bridge egress v2\n" + namespace + "/" + pod-name + "/" + nonce ) )
//
// nonce is the pod's public annotation sandbox-bridge.io/boxd-nonce, new for every pod, so a
// credential is bound to one pod: a box's next pod (a wake) or a warm pod claimed later gets its
// own, and an old one is useless. The gateway verifies it with its key alone, and whoever creates
// box pods (the bridge, the operator) computes it with the same key. A key file holds one or more
// keys, one per line (at least 32 bytes each): the first signs, every one verifies, so keys rotate
// without a window where a box's credential is refused.
package identity

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Realm is sent with 407 answers.
const Realm = "sandbox-bridge egress"

const context = "sandbox-bridge egress v2\n"

// MinKeyBytes is the shortest key accepted.
const MinKeyBytes = 32

// Keys verifies (and signs) box credentials.
type Keys struct {
	keys [][]byte
}

// NewKeys returns Keys for the given keys; the first signs.
func NewKeys(keys ...[]byte) (*Keys, error) {
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	for i, k := range keys {
		if len(k) < MinKeyBytes {
			return nil, fmt.Errorf("key %d is %d bytes, want at least %d", i+1, len(k), MinKeyBytes)
		}
	}
	return &Keys{keys: keys}, nil
}

// LoadKeys reads a key file: one key per non-empty line, used as the line's bytes (a hex or
// base64 line is simply a long key; nothing is decoded, so every writer agrees on the bytes).
func LoadKeys(path string) (*Keys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			keys = append(keys, append([]byte(nil), line...))
		}
	}
	k, err := NewKeys(keys...)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return k, nil
}

// Pod is what a credential is bound to: a box pod's namespace, name and boxd nonce.
type Pod struct {
	Namespace, Name, Nonce string
}

func mac(key []byte, p Pod) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(context))
	m.Write([]byte(p.Namespace + "/" + p.Name + "/" + p.Nonce))
	return m.Sum(nil)
}

// Credential returns pod p's proxy credential under the first key.
func (k *Keys) Credential(p Pod) string {
	return base64.RawURLEncoding.EncodeToString(mac(k.keys[0], p))
}

// Valid reports whether presented is pod p's credential under any key, in constant time per key.
// A pod with an empty part (no nonce annotation, say) has no valid credential.
func (k *Keys) Valid(p Pod, presented string) bool {
	got, err := base64.RawURLEncoding.DecodeString(presented)
	if err != nil || p.Namespace == "" || p.Name == "" || p.Nonce == "" {
		got = nil
	}
	ok := false
	for _, key := range k.keys {
		// hmac.Equal is constant-time (a wrong length is refused at once, which tells nothing:
		// the length is public); every key is tried, so the time does not say which matched.
		if hmac.Equal(mac(key, p), got) {
			ok = true
		}
	}
	return ok && got != nil
}

// ParseBasic splits a Proxy-Authorization header value "Basic base64(user:pass)".
func ParseBasic(header string) (user, pass string, ok bool) {
	scheme, rest, found := strings.Cut(header, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(dec), ":")
	if !ok || user == "" || pass == "" {
		return "", "", false
	}
	return user, pass, true
}
