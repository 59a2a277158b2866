package sni

import (
	"bytes"
	"crypto/tls"
	"net"
	"strings"
	"testing"
)

// hello returns the bytes a real crypto/tls client sends first for serverName ("" sends none).
func hello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		conf := &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""}
		_ = tls.Client(c, conf).Handshake()
	}()
	defer c.Close()
	defer s.Close()
	_, raw, err := Peek(s)
	if err != nil {
		t.Fatalf("Peek of a real hello: %v", err)
	}
	return raw
}

func TestPeekRealHello(t *testing.T) {
	for _, name := range []string{"api.example.test", "a.b-c_d.example", ""} {
		raw := hello(t, name)
		got, replay, err := Peek(bytes.NewReader(raw))
		if err != nil || got != name {
			t.Errorf("Peek = %q, %v; want %q", got, err, name)
		}
		if !bytes.Equal(replay, raw) {
			t.Errorf("Peek must return every byte it read for replay")
		}
	}
}

// A ClientHello split over several records (allowed by RFC 8446 5.1) is reassembled.
func TestPeekFragmented(t *testing.T) {
	raw := hello(t, "split.example.test")
	msg := raw[5:]
	var frag []byte
	for i := 0; i < len(msg); i += 100 {
		end := min(i+100, len(msg))
		frag = append(frag, 22, 3, 1, byte((end-i)>>8), byte(end-i))
		frag = append(frag, msg[i:end]...)
	}
	got, replay, err := Peek(bytes.NewReader(frag))
	if err != nil || got != "split.example.test" {
		t.Fatalf("Peek = %q, %v", got, err)
	}
	if !bytes.Equal(replay, frag) {
		t.Fatal("replay differs from the bytes sent")
	}
}

func TestPeekRefuses(t *testing.T) {
	raw := hello(t, "api.example.test")
	// Every truncation is an error, never a panic or a name.
	for i := 0; i < len(raw); i++ {
		if name, _, err := Peek(bytes.NewReader(raw[:i])); err == nil {
			t.Fatalf("truncated at %d of %d: got %q and no error", i, len(raw), name)
		}
	}
	cases := map[string][]byte{
		"http request":      []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"alert record":      {21, 3, 3, 0, 2, 2, 40},
		"empty record":      {22, 3, 1, 0, 0},
		"huge record":       {22, 3, 1, 0xff, 0xff},
		"server hello":      {22, 3, 3, 0, 4, 2, 0, 0, 0},
		"hello over limit":  {22, 3, 3, 0, 4, 1, 0xff, 0xff, 0xff},
		"sslv2-ish version": {22, 2, 0, 0, 4, 1, 0, 0, 0},
	}
	for name, b := range cases {
		if got, _, err := Peek(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: got %q and no error", name, got)
		}
	}
}

// body builds a ClientHello body with the given extensions block (nil: none).
func body(exts []byte) []byte {
	b := make([]byte, 2+32)
	b = append(b, 0)                // session id
	b = append(b, 0, 2, 0x13, 0x01) // one suite
	b = append(b, 1, 0)             // null compression
	if exts != nil {
		b = append(b, byte(len(exts)>>8), byte(len(exts)))
		b = append(b, exts...)
	}
	return b
}

func sniExt(entries ...[]byte) []byte {
	var list []byte
	for _, e := range entries {
		list = append(list, e...)
	}
	data := append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
	return append([]byte{0, 0, byte(len(data) >> 8), byte(len(data))}, data...)
}

func host(typ byte, name string) []byte {
	return append([]byte{typ, byte(len(name) >> 8), byte(len(name))}, name...)
}

func TestServerNameTable(t *testing.T) {
	other := []byte{0, 10, 0, 2, 0, 0} // supported_groups, empty list
	cases := []struct {
		name string
		body []byte
		want string
		ok   bool
	}{
		{"no extensions", body(nil), "", true},
		{"extensions without sni", body(other), "", true},
		{"one host", body(sniExt(host(0, "a.test"))), "a.test", true},
		{"after another ext", body(append(append([]byte{}, other...), sniExt(host(0, "b.test"))...)), "b.test", true},
		{"unknown name type skipped", body(sniExt(host(7, "x"), host(0, "c.test"))), "c.test", true},
		{"two hosts", body(sniExt(host(0, "a.test"), host(0, "b.test"))), "", false},
		{"two sni extensions", body(append(sniExt(host(0, "a.test")), sniExt(host(0, "a.test"))...)), "", false},
		{"empty host", body(sniExt(host(0, ""))), "", false},
		{"nul in host", body(sniExt(host(0, "a\x00.test"))), "", false},
		{"space in host", body(sniExt(host(0, "a .test"))), "", false},
		{"extension length past end", body([]byte{0, 0, 0, 9, 0}), "", false},
		{"list length past end", body([]byte{0, 0, 0, 2, 0, 9}), "", false},
		{"name length past end", body([]byte{0, 0, 0, 5, 0, 3, 0, 0, 9}), "", false},
		{"trailing bytes after list", body([]byte{0, 0, 0, 3, 0, 0, 1}), "", false},
		{"session id past end", append(make([]byte, 34), 40), "", false},
		{"too short", []byte{3, 3}, "", false},
	}
	for _, c := range cases {
		got, err := ServerName(c.body)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: ServerName = %q, %v; want %q ok=%v", c.name, got, err, c.want, c.ok)
		}
	}
}

func FuzzPeek(f *testing.F) {
	f.Add(hello(f, "api.example.test"))
	f.Add(hello(f, ""))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, raw, err := Peek(bytes.NewReader(b))
		if !bytes.HasPrefix(b, raw) {
			t.Fatal("raw is not a prefix of the input")
		}
		if err == nil && strings.ContainsAny(name, " \x00\r\n") {
			t.Fatalf("name %q has forbidden bytes", name)
		}
	})
}
