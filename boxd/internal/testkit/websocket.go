package testkit

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// A minimal WebSocket (RFC 6455), standard library only: a server that echoes every message and a
// client to talk to it. Enough for tests of what carries WebSocket connections (boxd's ports
// route, the bridge), and for the port app run inside boxes (portapp/).

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// WebSocket opcodes.
const (
	WSText   = 1
	WSBinary = 2
	WSClose  = 8
	WSPing   = 9
	WSPong   = 10
)

// WSAccept is the Sec-WebSocket-Accept answer to a Sec-WebSocket-Key.
func WSAccept(key string) string {
	sum := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// WSEcho accepts a WebSocket upgrade and sends every text or binary message back as it came,
// answers pings, and ends on a close (echoed) or when the connection drops. The first echoed
// frame is preceded by a text message "hello <path>" so a test sees which server answered.
func WSEcho(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || r.Header.Get("Sec-WebSocket-Key") == "" {
		http.Error(w, "a WebSocket upgrade is expected here", http.StatusBadRequest)
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", WSAccept(r.Header.Get("Sec-WebSocket-Key")))
	if err := WriteWSFrame(rw, WSText, []byte("hello "+r.URL.Path), false); err != nil {
		return
	}
	for {
		if rw.Flush() != nil {
			return
		}
		op, payload, err := ReadWSFrame(rw.Reader)
		if err != nil {
			return
		}
		switch op {
		case WSClose:
			_ = WriteWSFrame(rw, WSClose, payload, false)
			_ = rw.Flush()
			return
		case WSPing:
			err = WriteWSFrame(rw, WSPong, payload, false)
		case WSPong:
		default:
			err = WriteWSFrame(rw, op, payload, false)
		}
		if err != nil {
			return
		}
	}
}

// WriteWSFrame writes one final frame; clients mask (RFC 6455 5.3), servers do not.
func WriteWSFrame(w io.Writer, op byte, payload []byte, mask bool) error {
	head := []byte{0x80 | op}
	maskBit := byte(0)
	if mask {
		maskBit = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		head = append(head, maskBit|byte(n))
	case n <= 0xffff:
		head = append(head, maskBit|126, byte(n>>8), byte(n))
	default:
		head = append(head, maskBit|127)
		head = binary.BigEndian.AppendUint64(head, uint64(n))
	}
	body := payload
	if mask {
		key := make([]byte, 4)
		_, _ = rand.Read(key)
		head = append(head, key...)
		body = make([]byte, len(payload))
		for i, b := range payload {
			body[i] = b ^ key[i%4]
		}
	}
	if _, err := w.Write(head); err != nil {
		return err
	}
	_, err := w.Write(body)
	return err
}

// ReadWSFrame reads one frame (unmasking it if masked); fragments are returned one by one.
func ReadWSFrame(r *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	op := h[0] & 0x0f
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 16<<20 {
		return 0, nil, errors.New("websocket frame over 16 MiB")
	}
	var key [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(r, key[:]); err != nil {
			return 0, nil, err
		}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	if masked {
		for i := range payload {
			payload[i] ^= key[i%4]
		}
	}
	return op, payload, nil
}

// WSConn is a client's WebSocket connection.
type WSConn struct {
	net.Conn
	R *bufio.Reader
}

// Send writes one masked message.
func (c *WSConn) Send(op byte, payload []byte) error { return WriteWSFrame(c.Conn, op, payload, true) }

// Receive reads the next frame.
func (c *WSConn) Receive() (byte, []byte, error) { return ReadWSFrame(c.R) }

// DialWS opens a WebSocket over a TCP connection to addr (host:port) at path (with its query),
// with extra request headers (name, value, ...). It fails unless the answer is 101 with the right
// Sec-WebSocket-Accept; the answer's head is returned either way.
func DialWS(addr, host, path string, headers ...string) (*WSConn, *http.Response, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	keyBytes := make([]byte, 16)
	_, _ = rand.Read(keyBytes)
	key := base64.StdEncoding.EncodeToString(keyBytes)
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n", path, host, key)
	for i := 0; i+1 < len(headers); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", headers[i], headers[i+1])
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		conn.Close()
		return nil, nil, err
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return nil, resp, fmt.Errorf("status %d, want 101", resp.StatusCode)
	}
	if got := resp.Header.Get("Sec-WebSocket-Accept"); got != WSAccept(key) {
		conn.Close()
		return nil, resp, fmt.Errorf("Sec-WebSocket-Accept %q, want %q", got, WSAccept(key))
	}
	return &WSConn{Conn: conn, R: r}, resp, nil
}
