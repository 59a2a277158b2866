package process

import (
	"os"
	"testing"
	"time"
)

// A reader that gets the CPU only after the grace period (a box at its CPU limit) still gets
// every byte the command wrote before it exited, even while a leftover holds the pipe open.
func TestFinishOutputKeepsUnreadBytesOfASlowReader(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // the "leftover": the write end stays open
	if _, err := w.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	rd := newReaders(1)
	var got []byte
	go func() {
		defer rd.finished()
		time.Sleep(300 * time.Millisecond) // starved
		pump(r, func(b []byte) { got = append(got, b...) })
	}()
	began := time.Now()
	finishOutput(rd, 50*time.Millisecond, r)
	if string(got) != "hi\n" {
		t.Fatalf("output lost: got %q", got)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("finishing took %v", took)
	}
}

// With nothing left unread, a pipe held open by a leftover is let go after the grace period.
func TestFinishOutputLetsGoOfAnIdlePipeAfterGrace(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rd := newReaders(1)
	go func() {
		defer rd.finished()
		pump(r, func([]byte) {})
	}()
	began := time.Now()
	finishOutput(rd, 50*time.Millisecond, r)
	if took := time.Since(began); took < 50*time.Millisecond || took > time.Second {
		t.Fatalf("finishing took %v; want about the grace period", took)
	}
}
