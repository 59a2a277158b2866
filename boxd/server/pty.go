package server

import (
	"net/http"
	"strings"
	"time"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/pty"
)

// UpgradeProtocol is the Upgrade token of a terminal connection.
const UpgradeProtocol = "boxd-frames"

func (s *server) pty(w http.ResponseWriter, r *http.Request) {
	if !headerHasToken(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), UpgradeProtocol) {
		writeError(w, errs.Invalid("a terminal needs Connection: Upgrade and Upgrade: %s", UpgradeProtocol))
		return
	}
	q := newQuery(r)
	req := pty.Request{
		Cols:         int(q.positive("cols", defaultTerminalCol)),
		Rows:         int(q.positive("rows", defaultTerminalRow)),
		Cwd:          q.str("cwd"),
		Command:      q.str("command"),
		MaxProcesses: int(q.int("max_processes", 0)),
	}
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	sess, err := pty.Start(s.Procs, req)
	if err != nil {
		writeError(w, err)
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		sess.Abort()
		writeError(w, errs.Internal("cannot take over the connection: %v", err))
		return
	}
	_ = conn.SetDeadline(time.Time{}) // the server's header timeout must not end the terminal
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeProtocol + "\r\n\r\n")
	sess.Serve(conn, rw)
}

// headerHasToken reports whether a comma-separated header holds token (case-insensitive).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
