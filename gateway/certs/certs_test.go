package certs

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/internal/testpki"
)

func TestFilesLeafAndRotation(t *testing.T) {
	dir := t.TempDir()
	ca1 := testpki.NewCA(t, "ca one")
	certFile, keyFile := ca1.Write(t, dir, "ca")
	clock := time.Now()
	f, err := LoadFiles(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	f.now = func() time.Time { return clock }
	f.cur.now = f.now

	verify := func(host string, ca *testpki.CA) error {
		c, err := f.Leaf(host)
		if err != nil {
			return err
		}
		_, err = c.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: ca.Pool()})
		return err
	}
	if err := verify("api.example.test", ca1); err != nil {
		t.Fatalf("leaf does not verify against the CA: %v", err)
	}
	c1, _ := f.Leaf("api.example.test")
	if c2, _ := f.Leaf("api.example.test"); c2 != c1 {
		t.Error("a second connection to the same host must reuse the cached leaf")
	}
	if err := verify("10.1.2.3", ca1); err != nil {
		t.Errorf("IP leaf (an IP SAN): %v", err)
	}

	// Rotation: new files are read for new connections once the check interval passed.
	ca2 := testpki.NewCA(t, "ca two")
	os.WriteFile(certFile, ca2.CertPEM, 0o600)
	os.WriteFile(keyFile, ca2.KeyPEM, 0o600)
	future := clock.Add(2 * time.Second)
	os.Chtimes(certFile, future, future)
	clock = clock.Add(2 * time.Second)
	if err := verify("api.example.test", ca2); err != nil {
		t.Fatalf("after rotation the leaf must come from the new CA: %v", err)
	}
	if f.CA().Subject.CommonName != "ca two" {
		t.Fatal("CA not rotated")
	}

	// A broken rotation keeps the CA in force and says so.
	os.WriteFile(keyFile, []byte("garbage"), 0o600)
	clock = clock.Add(2 * time.Second)
	if _, err := f.Leaf("other.example.test"); err == nil {
		t.Error("a CA that no longer loads must be reported")
	}
	if err := verify("other.example.test", ca2); err != nil {
		t.Errorf("the previous CA must stay in force: %v", err)
	}
}

func TestNotACA(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	certFile, keyFile := ca.Write(t, dir, "ca")
	if _, err := LoadFiles(certFile, keyFile+".missing"); err == nil {
		t.Error("missing key: want an error")
	}
	os.WriteFile(keyFile, []byte("nope"), 0o600)
	if _, err := LoadFiles(certFile, keyFile); err == nil {
		t.Error("bad key: want an error")
	}
	// A leaf (not a CA) with its own key.
	leaf := ca.Leaf(t, "x.test")
	keyDER, _ := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})
	if _, err := FromPEM(leafPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err == nil {
		t.Error("a leaf certificate accepted as a CA")
	}
	if _, err := FromPEM(ca.CertPEM, testpki.NewCA(t, "other").KeyPEM); err == nil {
		t.Error("a key that is not the certificate's accepted")
	}
}

// A CA from memory (a pool's Secret: PKCS#8 ECDSA P-256 as the operator makes, or RSA): leaves
// verify against it, name the host, live at most 24 h from minting, and are cached per CA.
func TestFromPEM(t *testing.T) {
	ec := testpki.NewCA(t, "pool ca")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "rsa pool ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &rsaKey.PublicKey, rsaKey)
	rsaCert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(rsaKey)
	rsaCertPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	rsaKeyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})

	for name, c := range map[string]struct {
		cert, key []byte
		root      *x509.Certificate
	}{"ecdsa": {ec.CertPEM, ec.KeyPEM, ec.Cert}, "rsa": {rsaCertPEM, rsaKeyPEM, rsaCert}} {
		a, err := FromPEM(c.cert, c.key)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(c.root)
		before := time.Now()
		leaf, err := a.Leaf("api.example.test")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.test", Roots: roots}); err != nil {
			t.Fatalf("%s: the leaf does not verify against its CA: %v", name, err)
		}
		if life := leaf.Leaf.NotAfter.Sub(before); life > 24*time.Hour+time.Second {
			t.Fatalf("%s: a leaf valid for %v after minting, want at most 24 h", name, life)
		}
		if again, _ := a.Leaf("api.example.test"); again != leaf {
			t.Fatalf("%s: the leaf was not cached", name)
		}
	}
	// Two Authorities never share leaves: a new CA (a rotated Secret) mints its own at once.
	a1, _ := FromPEM(ec.CertPEM, ec.KeyPEM)
	ec2 := testpki.NewCA(t, "pool ca 2")
	a2, _ := FromPEM(ec2.CertPEM, ec2.KeyPEM)
	l1, _ := a1.Leaf("h.test")
	l2, _ := a2.Leaf("h.test")
	if l2.Leaf.Issuer.CommonName != "pool ca 2" || l1.Leaf.Issuer.CommonName != "pool ca" {
		t.Fatalf("issuers %q and %q", l1.Leaf.Issuer.CommonName, l2.Leaf.Issuer.CommonName)
	}
}
