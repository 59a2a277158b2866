package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestServeRefusesToStartWithoutAToken(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("BOXD_SECRET_DIR", dir)
	t.Setenv("BOXD_PORT", "1") // never reached: every case fails before listening
	err := serve()
	if err == nil || !strings.Contains(err.Error(), "credential") {
		t.Fatalf("missing token file: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := serve(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token file: %v", err)
	}
	// A box env copy that is not a JSON object of valid variables fails the start too.
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(`{"1BAD":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := serve(); err == nil || !strings.Contains(err.Error(), "box env") {
		t.Fatalf("bad env file: %v", err)
	}
}

// With BOXD_EGRESS_CA and BOXD_CA_BUNDLE (a gateway-mode pool's box), serve writes the CA bundle
// before it answers, and a SIGTERM still stops it.
func TestServeWritesTheCABundle(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := "-----BEGIN CERTIFICATE-----\nPOOL\n-----END CERTIFICATE-----\n"
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte(ca), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "ca-bundle.pem")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	t.Setenv("BOXD_SECRET_DIR", dir)
	t.Setenv("BOXD_WORKDIR", dir)
	t.Setenv("BOXD_PORT", strconv.Itoa(port))
	t.Setenv("BOXD_EGRESS_CA", filepath.Join(dir, "ca.crt"))
	t.Setenv("BOXD_CA_BUNDLE", bundle)
	served := make(chan error, 1)
	go func() { served <- serve() }()
	deadline := time.Now().Add(5 * time.Second)
	// An answer (not just a connection the kernel accepted) means serve is past its signal.Notify.
	for {
		if res, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/v1/health"); err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("boxd did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Serving means the first bundle is there: the system bundle (if this host has one), then the pool CA.
	got, err := os.ReadFile(bundle)
	if err != nil || !strings.HasSuffix(string(got), ca) {
		t.Fatalf("bundle %q %v", got, err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}

func TestConfig(t *testing.T) {
	t.Setenv("BOXD_PORT", "")
	c, err := loadConfig()
	if err != nil || c.port != 7771 || c.secretDir != "/opt/sandbox-bridge/secret" || c.workdir != "/workspace" || c.outputBytes != 4<<20 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	t.Setenv("BOXD_PORT", "nope")
	if _, err := loadConfig(); err == nil {
		t.Fatal("bad port accepted")
	}
}

func TestInstall(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "bin")
	for _, dest := range []string{filepath.Join(dir, "boxd"), dir} { // a file path, then an existing dir
		if err := install(dest); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(dir, "boxd"))
		if err != nil || fi.Mode().Perm() != 0o555 {
			t.Fatalf("%v %v", fi, err)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "boxd"))
		if !bytes.Equal(got, want) {
			t.Fatal("the copy differs")
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
}

func TestVolumeLimits(t *testing.T) {
	v, err := volumeLimits("")
	if err != nil || len(v) != 2 || v[0].Path != "/workspace" || v[1].Path != "/tmp" || v[0].Limit != 0 {
		t.Fatalf("unset: %+v %v", v, err)
	}
	v, err = volumeLimits("/workspace=1073741824, /tmp/=268435456")
	if err != nil || len(v) != 2 || v[0].Limit != 1<<30 || v[1].Path != "/tmp" || v[1].Limit != 256<<20 {
		t.Fatalf("set: %+v %v", v, err)
	}
	for _, bad := range []string{"workspace=1", "/workspace", "/workspace=1Gi", "/workspace=-1", "/workspace=1,"} {
		if _, err := volumeLimits(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}
