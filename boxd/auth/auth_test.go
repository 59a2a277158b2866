package auth

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil {
		t.Fatal("missing token file: want an error")
	}
	if err := os.WriteFile(filepath.Join(dir, TokenFile), []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("empty token file: want an error")
	}
	if err := os.WriteFile(filepath.Join(dir, TokenFile), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for presented, want := range map[string]bool{"s3cret": true, "": false, "s3cre": false, "s3cret\n": false, "S3CRET": false} {
		if got := c.Valid(presented); got != want {
			t.Errorf("Valid(%q) = %v, want %v", presented, got, want)
		}
	}
}
