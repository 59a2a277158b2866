package proxy

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair returns the two ends of one loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// box <-> (a  splice  b) <-> host
func spliced(t *testing.T, idle time.Duration) (box, host *net.TCPConn, done chan [2]int64) {
	box, a := tcpPair(t)
	b, host := tcpPair(t)
	done = make(chan [2]int64, 1)
	go func() { up, down := splice(a, b, idle, nil); done <- [2]int64{up, down} }()
	return box, host, done
}

func TestSpliceHalfClose(t *testing.T) {
	box, host, done := spliced(t, 5*time.Second)
	box.Write([]byte("request"))
	box.CloseWrite() // the box is done sending, still reading
	got, err := io.ReadAll(host)
	if err != nil || string(got) != "request" {
		t.Fatalf("host read %q, %v: want the bytes then EOF", got, err)
	}
	host.Write([]byte("answer after the half-close"))
	host.Close()
	got, err = io.ReadAll(box)
	if err != nil || string(got) != "answer after the half-close" {
		t.Fatalf("box read %q, %v", got, err)
	}
	select {
	case n := <-done:
		if n != [2]int64{7, 27} {
			t.Fatalf("bytes up/down = %v", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("splice did not end when both directions did")
	}
}

func TestSpliceIdle(t *testing.T) {
	// Traffic one way keeps the connection alive both ways (a long download with a silent box).
	box, host, done := spliced(t, 200*time.Millisecond)
	go func() {
		for i := 0; i < 8; i++ {
			host.Write([]byte("x"))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	buf := make([]byte, 1)
	for i := 0; i < 8; i++ {
		if _, err := io.ReadFull(box, buf); err != nil {
			t.Fatalf("byte %d: the connection closed while busy one way: %v", i, err)
		}
	}
	// Then silence: closed after about the idle time.
	start := time.Now()
	select {
	case <-done:
		if d := time.Since(start); d > time.Second {
			t.Fatalf("idle close took %v", d)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("an idle connection was not closed")
	}
	if _, err := box.Read(buf); err == nil {
		t.Fatal("the box's side is still open")
	}
}

func TestSpliceLargeTransferAndLiveCount(t *testing.T) {
	// Several chunks each way, byte for byte, and the bytes counted while the tunnel is open.
	box, a := tcpPair(t)
	b, host := tcpPair(t)
	var up, down atomic.Int64
	done := make(chan [2]int64, 1)
	go func() {
		u, d := splice(a, b, 5*time.Second, func(isUp bool, n int64) {
			if isUp {
				up.Add(n)
			} else {
				down.Add(n)
			}
		})
		done <- [2]int64{u, d}
	}()
	payload := make([]byte, 5*spliceChunk+12345)
	rand.Read(payload)
	go func() { host.Write(payload) }()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(box, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("download: %v, equal %v", err, bytes.Equal(got, payload))
	}
	// Still open, and already counted.
	deadline := time.Now().Add(2 * time.Second)
	for down.Load() != int64(len(payload)) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if down.Load() != int64(len(payload)) {
		t.Fatalf("counted %d of %d bytes down while the tunnel is open", down.Load(), len(payload))
	}
	box.Write([]byte("bye"))
	box.CloseWrite()
	if b, err := io.ReadAll(host); err != nil || string(b) != "bye" {
		t.Fatalf("upload %q %v", b, err)
	}
	host.Close()
	select {
	case n := <-done:
		if n != [2]int64{3, int64(len(payload))} || up.Load() != 3 {
			t.Fatalf("bytes up/down = %v, counted up %d", n, up.Load())
		}
	case <-time.After(2 * time.Second):
		t.Fatal("splice did not end")
	}
}
