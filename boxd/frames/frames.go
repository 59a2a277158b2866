// Package frames is the codec of boxd's streams (PROTOCOL.md, "Frames"):
//
//	1 byte type | 4 bytes big-endian payload length | payload
//
// Exec output, process output and the PTY all use it; the PTY in both directions.
package frames

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Frame types.
const (
	Stdout byte = 1
	Stderr byte = 2
	Exit   byte = 3
	Error  byte = 4
	Start  byte = 5
	Stdin  byte = 6
	Resize byte = 7
	EOF    byte = 8
)

// ContentType of a response that carries frames.
const ContentType = "application/vnd.sandbox-bridge.frames"

// MaxPayload is the largest payload of one frame; larger writes are split.
const MaxPayload = 1 << 20

const headerLen = 5

// Writer writes frames. It is safe for concurrent use (exec's stdout and stderr readers write
// from two goroutines); each frame is written whole.
type Writer struct {
	mu    sync.Mutex
	w     io.Writer
	flush func() error
	hdr   [headerLen]byte
	err   error
}

// NewWriter writes frames to w; flush (may be nil) pushes buffered bytes to the peer.
func NewWriter(w io.Writer, flush func() error) *Writer {
	return &Writer{w: w, flush: flush}
}

// Write writes p as frames of type typ (split at MaxPayload; an empty p is one empty frame).
// After the first error every call returns it: the peer is gone.
func (fw *Writer) Write(typ byte, p []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	for {
		n := min(len(p), MaxPayload)
		if err := fw.writeLocked(typ, p[:n]); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// WriteJSON writes v, JSON-encoded, as one frame of type typ.
func (fw *Writer) WriteJSON(typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fw.Write(typ, b)
}

// Flush pushes what was written so far to the peer.
func (fw *Writer) Flush() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.err == nil && fw.flush != nil {
		fw.err = fw.flush()
	}
	return fw.err
}

// WriteFlush writes p as frames of type typ and flushes: for output a client waits for.
func (fw *Writer) WriteFlush(typ byte, p []byte) error {
	if err := fw.Write(typ, p); err != nil {
		return err
	}
	return fw.Flush()
}

func (fw *Writer) writeLocked(typ byte, p []byte) error {
	if fw.err != nil {
		return fw.err
	}
	fw.hdr[0] = typ
	binary.BigEndian.PutUint32(fw.hdr[1:], uint32(len(p)))
	if _, err := fw.w.Write(fw.hdr[:]); err != nil {
		fw.err = err
		return err
	}
	if len(p) > 0 {
		if _, err := fw.w.Write(p); err != nil {
			fw.err = err
			return err
		}
	}
	return nil
}

// ErrTooLarge is returned by Reader.Next for a frame whose length exceeds MaxPayload.
var ErrTooLarge = errors.New("frame payload larger than 1 MiB")

// Reader reads frames. Not safe for concurrent use.
type Reader struct {
	r   *bufio.Reader
	hdr [headerLen]byte
	buf []byte
}

// NewReader reads frames from r (wrapped in a bufio.Reader unless it is one).
func NewReader(r io.Reader) *Reader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReader(r)
	}
	return &Reader{r: br}
}

// Next returns the next frame. The payload is valid until the next call. io.EOF means the
// stream ended cleanly between frames; io.ErrUnexpectedEOF that it was cut inside one.
func (fr *Reader) Next() (typ byte, payload []byte, err error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[1:])
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	payload = fr.buf[:n]
	if _, err := io.ReadFull(fr.r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return fr.hdr[0], payload, nil
}
