// Package certs mints the leaf certificates the gateway presents when it intercepts a
// connection (only for a box and host with credentials to inject). An Authority is one CA held
// in memory, with its own cache of leaves: a pool's CA comes from its Secret (source.Kubernetes
// builds an Authority from tls.crt/tls.key), so a new CA is a new Authority and new connections
// get leaves from it at once, while the old one's cache goes with it. Files is the CA of
// -ca-cert/-ca-key (the file source), re-read when the files change.
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

// LeafValidity is how long a minted leaf is valid after it is minted (and cached, less an hour).
// The operator's CA rotation relies on it: the old CA leaves the boxes' bundle 25 h after the
// Secret switched signer, when every leaf it signed has expired.
const LeafValidity = 24 * time.Hour

// maxCached bounds the leaves one Authority keeps (one per intercepted host name).
const maxCached = 10_000

// Signer gives the certificate to present for host.
type Signer interface {
	Leaf(host string) (*tls.Certificate, error)
}

// Authority mints leaves from one CA held in memory. It is safe for concurrent use.
type Authority struct {
	ca      tls.Certificate
	leafKey crypto.Signer
	now     func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// FromPEM makes an Authority from a CA certificate and its private key (PEM; the key PKCS#8,
// PKCS#1 or SEC 1, ECDSA or RSA). The certificate must be a CA allowed to sign certificates.
func FromPEM(certPEM, keyPEM []byte) (*Authority, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
	}
	if !pair.Leaf.IsCA || pair.Leaf.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate is not a CA (basicConstraints CA and keyCertSign required)")
	}
	// One key for every leaf of this CA: leaves are minted per host on the data path, and a
	// P-256 key per host would cost more than the signature.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &Authority{ca: pair, leafKey: key, now: time.Now, leaves: map[string]*tls.Certificate{}}, nil
}

// CA returns the CA certificate (parsed).
func (a *Authority) CA() *x509.Certificate { return a.ca.Leaf }

// Leaf returns a certificate for host (a DNS name or an IP literal), from the cache or minted.
func (a *Authority) Leaf(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
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
		NotBefore:             now.Add(-time.Hour), // boxes whose clock is a little behind
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

// Files is a CA read from a certificate file and a key file; new files (rotation) are picked up
// for new connections without a restart: the files are stat'ed at most once a second and
// re-read when they changed.
type Files struct {
	CertFile, KeyFile string

	mu        sync.Mutex
	cur       *Authority
	stamp     string // sizes and mtimes of both files at the last read
	checked   time.Time
	now       func() time.Time
	checkStep time.Duration
}

// LoadFiles loads the CA at once (an unusable CA is an error at start, not at the first
// connection).
func LoadFiles(certFile, keyFile string) (*Files, error) {
	f := &Files{CertFile: certFile, KeyFile: keyFile, now: time.Now, checkStep: time.Second}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
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

// reload reads the CA files if they changed; f.mu held (or not yet shared).
func (f *Files) reload() error {
	stamp, err := fileStamp(f.CertFile, f.KeyFile)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	if f.cur != nil && stamp == f.stamp {
		return nil
	}
	certPEM, err := os.ReadFile(f.CertFile)
	if err != nil {
		return fmt.Errorf("CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(f.KeyFile)
	if err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	a, err := FromPEM(certPEM, keyPEM)
	if err != nil {
		return err
	}
	a.now = f.now
	f.cur, f.stamp = a, stamp
	return nil
}

// current returns the Authority in force, after a check of the files when one is due. Files
// that changed but do not load leave the previous CA in force (the error is returned once per
// check so the caller can log it).
func (f *Files) current() (*Authority, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if now := f.now(); now.Sub(f.checked) >= f.checkStep {
		f.checked = now
		if err = f.reload(); err != nil {
			err = fmt.Errorf("kept the previous CA: %w", err)
		}
	}
	return f.cur, err
}

// CA returns the CA certificate in force.
func (f *Files) CA() *x509.Certificate {
	a, _ := f.current()
	return a.CA()
}

// Leaf returns a certificate for host from the CA in force. With a reload error it returns the
// previous CA's leaf and the error.
func (f *Files) Leaf(host string) (*tls.Certificate, error) {
	a, reloadErr := f.current()
	c, err := a.Leaf(host)
	if err != nil {
		return nil, err
	}
	return c, reloadErr
}
