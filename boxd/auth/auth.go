// Package auth checks boxd's one credential: the per-box token the bridge derives and the box's
// Secret carries into the pod (PROTOCOL.md, "Transport and auth"). boxd only compares it.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"path/filepath"
)

// Header carries the token (not Authorization: the API server's pods/proxy strips that).
const Header = "X-Boxd-Token"

// TokenFile is the token's file name inside the secret directory.
const TokenFile = "token"

// Checker compares presented tokens with the one loaded at start.
type Checker struct {
	sum [sha256.Size]byte
}

// Load reads the token from dir/token. A missing or empty file is an error: boxd must not
// serve without a credential.
func Load(dir string) (*Checker, error) {
	path := filepath.Join(dir, TokenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	// A Secret written by hand (kubectl create secret --from-file) often ends in a newline.
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("token file %s is empty", path)
	}
	return &Checker{sum: sha256.Sum256(b)}, nil
}

// Valid reports whether presented is the token, in constant time (both sides are hashed first,
// so not even the length leaks).
func (c *Checker) Valid(presented string) bool {
	if presented == "" {
		return false
	}
	sum := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(sum[:], c.sum[:]) == 1
}
