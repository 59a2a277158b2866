package frames

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	flushes := 0
	w := NewWriter(&buf, func() error { flushes++; return nil })
	big := bytes.Repeat([]byte("x"), MaxPayload+10)
	if err := w.Write(Stdout, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteJSON(Exit, map[string]int{"exit_code": 3}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFlush(Stderr, big); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(EOF, nil); err != nil {
		t.Fatal(err)
	}
	if flushes != 1 {
		t.Fatalf("flushes = %d, want 1", flushes)
	}

	r := NewReader(&buf)
	want := []struct {
		typ     byte
		payload string
	}{
		{Stdout, "hi"}, {Exit, `{"exit_code":3}`}, {Stderr, string(big[:MaxPayload])}, {Stderr, "xxxxxxxxxx"}, {EOF, ""},
	}
	for i, f := range want {
		typ, p, err := r.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if typ != f.typ || string(p) != f.payload {
			t.Fatalf("frame %d: got type %d (%d bytes), want type %d (%d bytes)", i, typ, len(p), f.typ, len(f.payload))
		}
	}
	if _, _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReaderRefusesOversizedAndCutFrames(t *testing.T) {
	r := NewReader(bytes.NewReader([]byte{1, 0, 0x10, 0, 1}))
	if _, _, err := r.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	r = NewReader(bytes.NewReader([]byte{1, 0, 0, 0, 5, 'a', 'b'}))
	if _, _, err := r.Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut payload: %v", err)
	}
	r = NewReader(bytes.NewReader([]byte{1, 0}))
	if _, _, err := r.Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut header: %v", err)
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("peer gone")
}

func TestWriterStopsAfterFirstError(t *testing.T) {
	fw := &failWriter{}
	w := NewWriter(fw, nil)
	if err := w.Write(Stdout, []byte("a")); err == nil {
		t.Fatal("want an error")
	}
	if err := w.Write(Stdout, []byte("b")); err == nil || fw.n != 1 {
		t.Fatalf("second write: err %v, writes %d", err, fw.n)
	}
}
