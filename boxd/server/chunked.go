package server

import (
	"io"
	"net"
	"os"
	"strconv"
)

// chunkedConn writes an HTTP/1.1 chunked body straight onto a connection taken over from the
// server, so an archive's file contents can go with sendfile (net.TCPConn.ReadFrom): boxd's CPU
// per byte is then the kernel's page references, not a read and a write. Everything else
// (headers, padding, small files) is gathered into chunks of up to chunkMax: few and large
// chunks cost the reader (the bridge's HTTP parser) least.
type chunkedConn struct {
	conn net.Conn
	rf   io.ReaderFrom // conn's sendfile
	buf  []byte        // the next chunk's data
	head []byte
}

const chunkMax = 256 << 10

func newChunkedConn(conn net.Conn) *chunkedConn {
	c := &chunkedConn{conn: conn, buf: make([]byte, 0, chunkMax)}
	c.rf, _ = conn.(io.ReaderFrom)
	return c
}

func (c *chunkedConn) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(c.buf) == cap(c.buf) {
			if err := c.flush(nil); err != nil {
				return n - len(p), err
			}
		}
		k := copy(c.buf[len(c.buf):cap(c.buf)], p)
		c.buf = c.buf[:len(c.buf)+k]
		p = p[k:]
	}
	return n, nil
}

// WriteFile sends the next n bytes of f as one chunk of their own (files.FileWriter).
func (c *chunkedConn) WriteFile(f *os.File, n int64) error {
	if c.rf == nil {
		_, err := io.CopyN(c, f, n)
		return err
	}
	// The pending data's chunk and this one's size line go in one write.
	if err := c.flush(strconv.AppendInt(nil, n, 16)); err != nil {
		return err
	}
	sent, err := c.rf.ReadFrom(&io.LimitedReader{R: f, N: n})
	if err == nil && sent < n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return err
	}
	c.head = append(c.head[:0], "\r\n"...) // the end of this chunk, sent with the next
	return nil
}

// flush sends what is pending as a chunk, then the size line of a chunk that follows (size
// in hex, or nil for none).
func (c *chunkedConn) flush(next []byte) error {
	if len(c.head) == 0 && len(c.buf) == 0 && next == nil {
		return nil
	}
	out := c.head
	if len(c.buf) > 0 {
		out = strconv.AppendInt(out, int64(len(c.buf)), 16)
		out = append(out, "\r\n"...)
	}
	bufs := net.Buffers{out}
	if len(c.buf) > 0 {
		bufs = append(bufs, c.buf, []byte("\r\n"))
	}
	if next != nil {
		bufs = append(bufs, append(next, "\r\n"...))
	}
	_, err := bufs.WriteTo(c.conn)
	c.buf, c.head = c.buf[:0], c.head[:0]
	return err
}

// Close ends the body (the last chunk). Not calling it leaves the body cut off, as an error
// must: the reader then sees a broken transfer, never a short archive that looks whole.
func (c *chunkedConn) Close() error {
	if err := c.flush(nil); err != nil {
		return err
	}
	_, err := c.conn.Write([]byte("0\r\n\r\n"))
	return err
}
