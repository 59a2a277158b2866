package certs

import (
	"crypto/x509"
	"os"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/internal/testpki"
)

func TestLeafAndRotation(t *testing.T) {
	dir := t.TempDir()
	ca1 := testpki.NewCA(t, "ca one")
	certFile, keyFile := ca1.Write(t, dir, "ca")
	a, err := New(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	a.now = func() time.Time { return clock }

	verify := func(host string, ca *testpki.CA) error {
		c, err := a.Leaf(host)
		if err != nil {
			return err
		}
		_, err = c.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: ca.Pool()})
		return err
	}
	if err := verify("api.example.test", ca1); err != nil {
		t.Fatalf("leaf does not verify against the CA: %v", err)
	}
	c1, _ := a.Leaf("api.example.test")
	if c2, _ := a.Leaf("api.example.test"); c2 != c1 {
		t.Error("a second connection to the same host must reuse the cached leaf")
	}
	if err := verify("10.1.2.3", ca1); err == nil {
		// IP leaves carry an IP SAN; DNSName verification of an IP uses it.
	} else {
		t.Errorf("IP leaf: %v", err)
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
	if a.CA().Subject.CommonName != "ca two" {
		t.Fatal("CA not rotated")
	}

	// A broken rotation keeps the CA in force and says so.
	os.WriteFile(keyFile, []byte("garbage"), 0o600)
	clock = clock.Add(2 * time.Second)
	if _, err := a.Leaf("other.example.test"); err == nil {
		t.Error("a CA that no longer loads must be reported")
	}
	if err := verify("other.example.test", ca2); err != nil {
		t.Errorf("the previous CA must stay in force: %v", err)
	}
}

func TestNotACA(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	leaf := ca.Leaf(t, "x.test")
	_ = leaf
	certFile, keyFile := ca.Write(t, dir, "ca")
	if _, err := New(certFile, keyFile+".missing"); err == nil {
		t.Error("missing key: want an error")
	}
	os.WriteFile(keyFile, []byte("nope"), 0o600)
	if _, err := New(certFile, keyFile); err == nil {
		t.Error("bad key: want an error")
	}
}
