package identity

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var key1 = []byte(strings.Repeat("k", 32))
var key2 = []byte(strings.Repeat("j", 40))

func TestCredentialFormula(t *testing.T) {
	k, err := NewKeys(key1)
	if err != nil {
		t.Fatal(err)
	}
	// The documented formula, written out independently: the bridge/operator must agree.
	m := hmac.New(sha256.New, key1)
	m.Write([]byte("sandbox-bridge egress v1\nbox-abc"))
	want := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	if got := k.Credential("box-abc"); got != want {
		t.Fatalf("Credential = %q, want %q", got, want)
	}
}

func TestValid(t *testing.T) {
	old, _ := NewKeys(key1)
	k, err := NewKeys(key2, key1) // rotation: new key signs, the old one still verifies
	if err != nil {
		t.Fatal(err)
	}
	a := k.Credential("box-a")
	cases := []struct {
		box, cred string
		want      bool
	}{
		{"box-a", a, true},
		{"box-a", old.Credential("box-a"), true},
		{"box-b", a, false},
		{"box-a", a[:len(a)-1], false},
		{"box-a", a + "A", false},
		{"box-a", "", false},
		{"", k.Credential(""), false},
		{"box-a", "!!!", false},
	}
	for _, c := range cases {
		if got := k.Valid(c.box, c.cred); got != c.want {
			t.Errorf("Valid(%q, %q) = %v, want %v", c.box, c.cred, got, c.want)
		}
	}
	if newOnly, _ := NewKeys(key2); newOnly.Valid("box-a", old.Credential("box-a")) {
		t.Error("a retired key must not verify")
	}
}

func TestLoadKeys(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "keys")
	os.WriteFile(p, []byte("short\n"), 0o600)
	if _, err := LoadKeys(p); err == nil {
		t.Error("a short key must be refused")
	}
	os.WriteFile(p, []byte("\n"+string(key2)+"\n  "+string(key1)+"  \n"), 0o600)
	k, err := LoadKeys(p)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := NewKeys(key2)
	if k.Credential("x") != want.Credential("x") {
		t.Error("the first line's key must sign")
	}
}

func TestParseBasic(t *testing.T) {
	enc := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	cases := map[string][3]string{
		"Basic " + enc("box:cred"):  {"box", "cred", "ok"},
		"basic " + enc("box:cr:ed"): {"box", "cr:ed", "ok"},
		"Bearer " + enc("box:cred"): {},
		"Basic " + enc("box"):       {},
		"Basic " + enc(":cred"):     {},
		"Basic " + enc("box:"):      {},
		"Basic not-base64!":         {},
		"":                          {},
	}
	for h, want := range cases {
		u, p, ok := ParseBasic(h)
		if u != want[0] || p != want[1] || ok != (want[2] == "ok") {
			t.Errorf("ParseBasic(%q) = %q %q %v", h, u, p, ok)
		}
	}
}
