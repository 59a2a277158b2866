// Package sni reads the server name a TLS client asks for, from the ClientHello it sends first,
// without terminating TLS (crypto/tls has no API to peek at a ClientHello). Every length read
// from the wire is checked against what is left, so a hostile hello can only produce an error.
package sni

import (
	"errors"
	"fmt"
	"io"
)

// MaxHello bounds the handshake message Peek assembles (a ClientHello with post-quantum key
// shares is ~1.8 KiB; 64 KiB leaves room for many extensions and refuses a flood).
const MaxHello = 64 << 10

const (
	recordHandshake   = 22
	handshakeHello    = 1
	extServerName     = 0
	nameTypeHost      = 0
	maxRecordFragment = 16384 + 2048 // RFC 8446 5.2: a TLSCiphertext limit; plaintext ones are smaller
)

// ErrNotTLS means the first bytes were not a TLS handshake record.
var ErrNotTLS = errors.New("not a TLS handshake")

// Peek reads TLS records from r until it has the whole ClientHello and returns the host name of
// its server_name extension ("" when there is none) and every byte it read, to be replayed
// unchanged to whoever handles the connection next.
func Peek(r io.Reader) (name string, raw []byte, err error) {
	var msg []byte
	for {
		var hdr [5]byte
		if n, err := io.ReadFull(r, hdr[:]); err != nil {
			return "", append(raw, hdr[:n]...), fmt.Errorf("reading a TLS record header: %w", err)
		}
		raw = append(raw, hdr[:]...)
		if hdr[0] != recordHandshake || hdr[1] != 3 {
			return "", raw, ErrNotTLS
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > maxRecordFragment {
			return "", raw, fmt.Errorf("TLS record of %d bytes", n)
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if got, err := io.ReadFull(r, raw[start:]); err != nil {
			return "", raw[:start+got], fmt.Errorf("reading a TLS record: %w", err)
		}
		msg = append(msg, raw[start:]...)
		if len(msg) < 4 {
			continue
		}
		if msg[0] != handshakeHello {
			return "", raw, fmt.Errorf("first handshake message is type %d, not a ClientHello", msg[0])
		}
		want := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
		if want > MaxHello {
			return "", raw, fmt.Errorf("ClientHello of %d bytes", want)
		}
		if len(msg) >= want {
			name, err := ServerName(msg[4:want])
			return name, raw, err
		}
	}
}

// ServerName parses a ClientHello body (after the 4-byte handshake header) and returns its
// server_name host name, "" when the extension is absent.
func ServerName(body []byte) (string, error) {
	s := cursor{b: body}
	s.skip(2 + 32)       // legacy_version, random
	s.skip(int(s.u8()))  // legacy_session_id
	s.skip(int(s.u16())) // cipher_suites
	s.skip(int(s.u8()))  // legacy_compression_methods
	if s.err == nil && s.left() == 0 {
		return "", nil // no extensions at all (TLS 1.0-style hello)
	}
	exts := cursor{b: s.bytes(int(s.u16()))}
	if s.err != nil {
		return "", s.err
	}
	if s.left() != 0 {
		return "", errors.New("ClientHello: bytes after the extensions")
	}
	name, seen := "", false
	for exts.err == nil && exts.left() > 0 {
		typ := exts.u16()
		data := exts.bytes(int(exts.u16()))
		if exts.err != nil || typ != extServerName {
			continue
		}
		if seen {
			return "", errors.New("ClientHello: two server_name extensions")
		}
		seen = true
		var err error
		if name, err = hostName(data); err != nil {
			return "", err
		}
	}
	if exts.err != nil {
		return "", exts.err
	}
	return name, nil
}

// hostName parses a server_name extension's ServerNameList (RFC 6066 3): the host_name entry.
func hostName(data []byte) (string, error) {
	c := cursor{b: data}
	list := cursor{b: c.bytes(int(c.u16()))}
	if c.err != nil || c.left() != 0 {
		return "", errors.New("ClientHello: malformed server_name extension")
	}
	name := ""
	for list.err == nil && list.left() > 0 {
		typ := list.u8()
		v := list.bytes(int(list.u16()))
		if list.err != nil {
			break
		}
		if typ != nameTypeHost {
			continue
		}
		if name != "" {
			return "", errors.New("ClientHello: two host names")
		}
		if len(v) == 0 || len(v) > 255 {
			return "", errors.New("ClientHello: empty or oversized host name")
		}
		for _, ch := range v {
			if ch <= ' ' || ch >= 0x7f {
				return "", errors.New("ClientHello: host name with a control, space or non-ASCII byte")
			}
		}
		name = string(v)
	}
	if list.err != nil {
		return "", list.err
	}
	return name, nil
}

// cursor reads big-endian fields; after the first short read every call returns zero values and
// err says what ran out.
type cursor struct {
	b   []byte
	err error
}

var errShort = errors.New("ClientHello: truncated")

func (c *cursor) left() int { return len(c.b) }

func (c *cursor) bytes(n int) []byte {
	if c.err != nil {
		return nil
	}
	if n < 0 || n > len(c.b) {
		c.err = errShort
		c.b = nil
		return nil
	}
	v := c.b[:n:n]
	c.b = c.b[n:]
	return v
}

func (c *cursor) skip(n int) { c.bytes(n) }

func (c *cursor) u8() uint8 {
	v := c.bytes(1)
	if v == nil {
		return 0
	}
	return v[0]
}

func (c *cursor) u16() uint16 {
	v := c.bytes(2)
	if v == nil {
		return 0
	}
	return uint16(v[0])<<8 | uint16(v[1])
}
