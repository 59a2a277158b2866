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
	m.Write([]byte("sandbox-bridge egress v2\nsb/box-abc-0/n0nce"))
	want := base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	if got := k.Credential(Pod{"sb", "box-abc-0", "n0nce"}); got != want {
		t.Fatalf("Credential = %q, want %q", got, want)
	}
}

// The vector common/box-pod.test.ts checks too (docs: the egress contract, section 1): the
// two implementations agree byte for byte.
func TestSharedVector(t *testing.T) {
	k, err := NewKeys([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	const want = "p6eFeIqBXJEbLtPCt1SCB6xwj4Ra_mIAk24AU5sXV8M"
	if got := k.Credential(Pod{Namespace: "sbx", Name: "box-abc-0", Nonce: "00ff"}); got != want {
		t.Fatalf("Credential(sbx, box-abc-0, 00ff) = %q, want %q", got, want)
	}
}

func TestValid(t *testing.T) {
	old, _ := NewKeys(key1)
	k, err := NewKeys(key2, key1) // rotation: new key signs, the old one still verifies
	if err != nil {
		t.Fatal(err)
	}
	podA := Pod{"sb", "box-a-0", "aa01"}
	a := k.Credential(podA)
	cases := []struct {
		pod  Pod
		cred string
		want bool
	}{
		{podA, a, true},
		{podA, old.Credential(podA), true},
		{Pod{"sb", "box-b-0", "aa01"}, a, false},  // another pod
		{Pod{"sb2", "box-a-0", "aa01"}, a, false}, // the same name in another namespace
		{Pod{"sb", "box-a-0", "aa02"}, a, false},  // the box's next pod (a wake): a new nonce
		{Pod{"sb", "box-a-0/aa01", ""}, a, false}, // no nonce: never valid
		{Pod{"sb/box-a-0", "aa01", ""}, a, false}, // nor with the parts shifted
		{Pod{"", "sb/box-a-0", "aa01"}, a, false}, // nor an empty namespace
		{podA, a[:len(a)-1], false},
		{podA, a + "A", false},
		{podA, "", false},
		{Pod{}, k.Credential(Pod{}), false},
		{Pod{"sb", "box-a-0", ""}, k.Credential(Pod{"sb", "box-a-0", ""}), false}, // a pod without a nonce has none
		{podA, "!!!", false},
	}
	for _, c := range cases {
		if got := k.Valid(c.pod, c.cred); got != c.want {
			t.Errorf("Valid(%+v, %q) = %v, want %v", c.pod, c.cred, got, c.want)
		}
	}
	if newOnly, _ := NewKeys(key2); newOnly.Valid(podA, old.Credential(podA)) {
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
	if x := (Pod{"ns", "x", "1"}); k.Credential(x) != want.Credential(x) {
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
