// Package certs mints the leaf certificates the gateway presents when it intercepts a
// connection (only for a box and host with registered credentials). The CA is read from a
// certificate file and a key file; new files (rotation) are picked up for new connections,
// without a restart: the files are stat'ed at most once a second and re-read when they changed.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"time"
)

// LeafValidity is how long a minted leaf is valid (and cached, less an hour).
const LeafValidity = 24 * time.Hour

const maxCached = 10_000

// Authority mints leaves from the CA in CertFile/KeyFile.
type Authority struct {
	CertFile, KeyFile string

	mu        sync.Mutex
	ca        *tls.Certificate
	stamp     string // sizes and mtimes of both files at the last read
	checked   time.Time
	leafKey   crypto.Signer
	leaves    map[string]*tls.Certificate
	now       func() time.Time
	checkStep time.Duration
}

// New loads the CA at once (an unusable CA is an error at start, not at the first connection).
func New(certFile, keyFile string) (*Authority, error) {
	a := &Authority{CertFile: certFile, KeyFile: keyFile, now: time.Now, checkStep: time.Second}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	a.leafKey = key
	if err := a.reload(); err != nil {
		return nil, err
	}
	return a, nil
}

func fileStamp(paths ...string) (string, error) {
	s := ""
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d/%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

// reload reads the CA files if they changed; a.mu held (or not yet shared).
func (a *Authority) reload() error {
	stamp, err := fileStamp(a.CertFile, a.KeyFile)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	if a.ca != nil && stamp == a.stamp {
		return nil
	}
	certPEM, err := os.ReadFile(a.CertFile)
	if err != nil {
		return fmt.Errorf("CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(a.KeyFile)
	if err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("CA certificate: %w", err)
		}
		pair.Leaf = leaf
	}
	if !leaf.IsCA || leaf.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("CA certificate is not a CA (basicConstraints CA and keyCertSign required)")
	}
	a.ca, a.stamp = &pair, stamp
	a.leaves = map[string]*tls.Certificate{}
	return nil
}

// CA returns the CA certificate in force (parsed).
func (a *Authority) CA() *x509.Certificate {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ca.Leaf
}

// Leaf returns a certificate for host (a DNS name or an IP literal), minted by the current CA
// or taken from the cache. Files that changed but do not load leave the previous CA in force
// (the error is returned once per check so the caller can log it).
func (a *Authority) Leaf(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	var reloadErr error
	if now.Sub(a.checked) >= a.checkStep {
		a.checked = now
		reloadErr = a.reload()
	}
	if c, ok := a.leaves[host]; ok && now.Before(c.Leaf.NotAfter.Add(-time.Hour)) {
		return c, nil
	}
	c, err := a.mint(host, now)
	if err != nil {
		return nil, err
	}
	if len(a.leaves) >= maxCached {
		a.leaves = map[string]*tls.Certificate{}
	}
	a.leaves[host] = c
	if reloadErr != nil {
		return c, fmt.Errorf("kept the previous CA: %w", reloadErr)
	}
	return c, nil
}

func (a *Authority) mint(host string, now time.Time) (*tls.Certificate, error) {
	ca := a.ca.Leaf
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(LeafValidity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, a.leafKey.Public(), a.ca.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("minting a leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{
		Certificate: [][]byte{der, a.ca.Certificate[0]},
		PrivateKey:  a.leafKey,
		Leaf:        leaf,
	}, nil
}
