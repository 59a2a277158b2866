// portapp is the app the ports tests and bench run inside a box (built static, uploaded, started
// as a background process): an HTTP/1.1 server with keep-alive on a loopback address, standing in
// for what an agent starts (a dev server, a notebook). Not part of boxd.
//
//	portapp -listen 127.0.0.1:8000
//
// Routes: "/" a line of text; /echo[/...] the request as JSON (method, path, query, host, headers,
// body size); /stream the body back as it arrives; /sse?n=&every_ms= n server-sent events;
// /bytes?n= n bytes; /cookie sets cookies (with Domain and Path); any WebSocket upgrade is an
// echo (testkit.WSEcho).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"strings"
	"time"

	"sandbox-bridge.io/boxd/internal/testkit"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "address to listen on")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			testkit.WSEcho(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "hello from portapp on %s\n", *listen)
	})
	echo := func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"method": r.Method, "path": r.URL.EscapedPath(), "query": r.URL.RawQuery, "host": r.Host,
			"headers": r.Header, "body_bytes": n,
		})
	}
	mux.HandleFunc("/echo", echo)
	mux.HandleFunc("/echo/", echo)
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					return
				}
				_ = rc.Flush()
			}
			if err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		every, _ := strconv.Atoi(r.URL.Query().Get("every_ms"))
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		rc := http.NewResponseController(w)
		for i := 1; i <= max(n, 1); i++ {
			fmt.Fprintf(w, "id: %d\ndata: event %d at %d\n\n", i, i, time.Now().UnixMilli())
			if rc.Flush() != nil {
				return
			}
			if i < n {
				select {
				case <-time.After(time.Duration(every) * time.Millisecond):
				case <-r.Context().Done():
					return
				}
			}
		}
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := []byte(strings.Repeat("x", 32<<10))
		for n > 0 {
			m := min(n, len(chunk))
			if _, err := w.Write(chunk[:m]); err != nil {
				return
			}
			n -= m
		}
	})
	mux.HandleFunc("/cookie", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "plain=1; Path=/")
		w.Header().Add("Set-Cookie", "wide=2; Domain=example.com; Path=/app; HttpOnly")
		w.Header().Add("Set-Cookie", "bare=3")
		fmt.Fprintln(w, "cookies set")
	})
	log.Printf("portapp listening on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
