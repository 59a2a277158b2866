package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
