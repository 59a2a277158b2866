package ports

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandbox-bridge.io/boxd/internal/testkit"
)

// appOn serves h on 127.0.0.1 (an app in the box) and answers its port.
func appOn(t *testing.T, h http.Handler) int {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return portOf(t, srv.Listener.Addr())
}

func portOf(t *testing.T, a net.Addr) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(a.String())
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// proxyServer serves the proxy as boxd would (the path under /v1/ports/), reserving port 7771.
func proxyServer(t *testing.T) (*Proxy, *httptest.Server) {
	t.Helper()
	p := New(slog.New(slog.NewTextHandler(io.Discard, nil)), 7771)
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		p.Close()
	})
	return p, srv
}

func do(t *testing.T, method, url string, body io.Reader, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// client bounds every test request: a proxy that holds an answer back fails a test, not hangs it.
var client = &http.Client{Timeout: 20 * time.Second}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantBoxdError checks one of boxd's own answers: JSON, the type, and no marker of the app.
func wantBoxdError(t *testing.T, resp *http.Response, status int, typ string) string {
	t.Helper()
	body := readBody(t, resp)
	var e struct {
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != status || e.Error.Type != typ || e.Error.Message == "" {
		t.Fatalf("got %d %q, want %d %s", resp.StatusCode, body, status, typ)
	}
	if resp.Header.Get(ProxiedHeader) != "" {
		t.Fatalf("boxd's own answer carries %s", ProxiedHeader)
	}
	return e.Error.Message
}

func TestRequestReachesTheAppAsAReverseProxyWould(t *testing.T) {
	var seen *http.Request
	var body []byte
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Clone(context.Background())
		body, _ = io.ReadAll(r.Body)
		w.Header().Set("X-Boxd-Fence", "7") // an app must not speak for boxd
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "gone")
		w.Header().Set("X-App", "kept")
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, "from the app")
	}))
	_, srv := proxyServer(t)
	resp := do(t, "PATCH", fmt.Sprintf("%s/v1/ports/%d/a%%2Fb//c/../d?x=1&y=%%20&x=2", srv.URL, port), strings.NewReader("payload"),
		"X-Boxd-Token", "secret", MaxConnsHeader, "10", "Connection", "X-Drop", "X-Drop", "1", "Keep-Alive", "timeout=5",
		"X-Forwarded-For", "203.0.113.7", "X-Forwarded-Host", "8000-box.preview.example.com", "X-Forwarded-Proto", "https",
		"Authorization", "Basic app-credential", "Cookie", "a=1")
	if got := readBody(t, resp); resp.StatusCode != http.StatusTeapot || got != "from the app" {
		t.Fatalf("answer %d %q", resp.StatusCode, got)
	}
	if resp.Header.Get(ProxiedHeader) != "1" || resp.Header.Get("X-App") != "kept" {
		t.Fatalf("answer headers %v", resp.Header)
	}
	if resp.Header.Get("X-Boxd-Fence") != "" || resp.Header.Get("X-Hop") != "" {
		t.Fatalf("the app's X-Boxd-* or hop-by-hop header reached the caller: %v", resp.Header)
	}
	if seen.Method != "PATCH" || seen.URL.EscapedPath() != "/a%2Fb//c/../d" || seen.URL.RawQuery != "x=1&y=%20&x=2" || string(body) != "payload" {
		t.Fatalf("the app saw %s %s ? %s with %q", seen.Method, seen.URL.EscapedPath(), seen.URL.RawQuery, body)
	}
	if seen.Host != "localhost:"+strconv.Itoa(port) {
		t.Fatalf("Host %q", seen.Host)
	}
	for _, h := range []string{"X-Boxd-Token", MaxConnsHeader, "X-Drop", "Keep-Alive", "Expect"} {
		if v := seen.Header.Get(h); v != "" {
			t.Fatalf("%s reached the app: %q", h, v)
		}
	}
	if seen.Header.Get("X-Forwarded-For") != "203.0.113.7" || seen.Header.Get("X-Forwarded-Host") != "8000-box.preview.example.com" ||
		seen.Header.Get("X-Forwarded-Proto") != "https" {
		t.Fatalf("forwarded headers %v", seen.Header)
	}
	if seen.Header.Get("Authorization") != "Basic app-credential" || seen.Header.Get("Cookie") != "a=1" {
		t.Fatalf("end-to-end headers lost: %v", seen.Header)
	}
}

func TestPortsOfTheWrongShapeAreRefused(t *testing.T) {
	_, srv := proxyServer(t)
	for _, port := range []string{"0", "65536", "08000", "abc", "-1", ""} {
		wantBoxdError(t, do(t, "GET", srv.URL+"/v1/ports/"+port+"/", nil), http.StatusBadRequest, "invalid_request")
	}
	msg := wantBoxdError(t, do(t, "GET", srv.URL+"/v1/ports/7771/v1/health", nil), http.StatusForbidden, "forbidden")
	if !strings.Contains(msg, "boxd's own") {
		t.Fatal(msg)
	}
	wantBoxdError(t, do(t, "GET", srv.URL+"/v1/ports/8000/", nil, MaxConnsHeader, "x"), http.StatusBadRequest, "invalid_request")
	wantBoxdError(t, do(t, "GET", srv.URL+"/v1/ports/8000/", nil, MaxConnsHeader, "0"), http.StatusBadRequest, "invalid_request")
	wantBoxdError(t, do(t, "GET", srv.URL+"/v1/ports/8000/", nil, RateHeader, "-5"), http.StatusBadRequest, "invalid_request")
}

func TestNothingListeningIsABadGateway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, ln.Addr())
	ln.Close()
	_, srv := proxyServer(t)
	msg := wantBoxdError(t, do(t, "GET", fmt.Sprintf("%s/v1/ports/%d/", srv.URL, port), nil), http.StatusBadGateway, "bad_gateway")
	if !strings.Contains(msg, "nothing listens on port "+strconv.Itoa(port)) {
		t.Fatal(msg)
	}
}

func TestAnAppOnlyOnIPv6LoopbackIsReached(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	// The same port on 127.0.0.1 must be free, so the first dial is refused.
	port := portOf(t, ln.Addr())
	if l4, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port)); err != nil {
		ln.Close()
		t.Skip("that port is taken on 127.0.0.1")
	} else {
		l4.Close()
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "v6") }))
	}()
	t.Cleanup(func() { ln.Close() })
	_, srv := proxyServer(t)
	resp := do(t, "GET", fmt.Sprintf("%s/v1/ports/%d/", srv.URL, port), nil)
	if got := readBody(t, resp); resp.StatusCode != 200 || got != "v6" {
		t.Fatalf("%d %q", resp.StatusCode, got)
	}
}

func TestBodiesStreamBothWays(t *testing.T) {
	release := make(chan struct{})
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/upload" {
			n, err := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d %v", n, err)
			return
		}
		// A download without a length: its first part must reach the caller before the rest exists.
		fmt.Fprint(w, "first part;")
		http.NewResponseController(w).Flush()
		select { // bounded: a failing test must not hang the server's Close
		case <-release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "second part")
	}))
	_, srv := proxyServer(t)

	const size = 8 << 20
	resp := do(t, "POST", fmt.Sprintf("%s/v1/ports/%d/upload", srv.URL, port), io.LimitReader(zeros{}, size))
	if got := readBody(t, resp); got != fmt.Sprintf("%d <nil>", size) {
		t.Fatalf("upload: %q", got)
	}

	resp = do(t, "GET", fmt.Sprintf("%s/v1/ports/%d/download", srv.URL, port), nil)
	defer resp.Body.Close()
	first := make([]byte, len("first part;"))
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(resp.Body, first); done <- err }()
	select {
	case err := <-done:
		if err != nil || string(first) != "first part;" {
			t.Fatalf("%q %v", first, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first part was held back until the answer ended")
	}
	close(release)
	if rest, _ := io.ReadAll(resp.Body); string(rest) != "second part" {
		t.Fatalf("rest %q", rest)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestServerSentEventsAreNotBuffered(t *testing.T) {
	next := make(chan struct{})
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", "1000") // a length must not make the proxy hold events back either
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			http.NewResponseController(w).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	_, srv := proxyServer(t)
	resp := do(t, "GET", fmt.Sprintf("%s/v1/ports/%d/events", srv.URL, port), nil, "Accept", "text/event-stream")
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for i := 1; i <= 3; i++ {
		line := make(chan string, 1)
		go func() {
			l, _ := r.ReadString('\n')
			_, _ = r.ReadString('\n')
			line <- l
		}()
		select {
		case l := <-line:
			if l != fmt.Sprintf("data: %d\n", i) {
				t.Fatalf("event %d: %q", i, l)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d did not arrive while the stream was open", i)
		}
		next <- struct{}{}
	}
}

func TestWebSocketUpgradeRoundTrips(t *testing.T) {
	port := appOn(t, http.HandlerFunc(testkit.WSEcho))
	_, srv := proxyServer(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	ws, resp, err := testkit.DialWS(addr, addr, fmt.Sprintf("/v1/ports/%d/socket?x=1", port), "X-Boxd-Token", "secret")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if resp.Header.Get(ProxiedHeader) != "1" {
		t.Fatalf("101 headers %v", resp.Header)
	}
	if op, p, err := ws.Receive(); err != nil || op != testkit.WSText || string(p) != "hello /socket" {
		t.Fatalf("hello: %d %q %v", op, p, err)
	}
	big := bytes.Repeat([]byte("0123456789"), 20_000)
	for _, m := range []struct {
		op byte
		p  []byte
	}{{testkit.WSText, []byte("ping?")}, {testkit.WSBinary, big}, {testkit.WSPing, []byte("p")}} {
		if err := ws.Send(m.op, m.p); err != nil {
			t.Fatal(err)
		}
		op, p, err := ws.Receive()
		want := m.op
		if m.op == testkit.WSPing {
			want = testkit.WSPong
		}
		if err != nil || op != want || !bytes.Equal(p, m.p) {
			t.Fatalf("echo of op %d: op %d, %d bytes, %v", m.op, op, len(p), err)
		}
	}
	if err := ws.Send(testkit.WSClose, []byte{3, 232}); err != nil {
		t.Fatal(err)
	}
	if op, _, err := ws.Receive(); err != nil || op != testkit.WSClose {
		t.Fatalf("close: %d %v", op, err)
	}
}

func TestAnAppThatRefusesTheUpgradeAnswersAsItself(t *testing.T) {
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no websockets here", http.StatusNotFound) }))
	_, srv := proxyServer(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	_, resp, err := testkit.DialWS(addr, addr, fmt.Sprintf("/v1/ports/%d/", port))
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound || resp.Header.Get(ProxiedHeader) != "1" {
		t.Fatalf("%v %+v", err, resp)
	}
}

func TestConnectionsPerBoxAreBounded(t *testing.T) {
	entered, release := make(chan struct{}, 4), make(chan struct{})
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "ok")
	}))
	p, srv := proxyServer(t)
	url := fmt.Sprintf("%s/v1/ports/%d/", srv.URL, port)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := do(t, "GET", url, nil, MaxConnsHeader, "2")
			if got := readBody(t, resp); got != "ok" {
				t.Errorf("held request: %q", got)
			}
		}()
	}
	<-entered
	<-entered
	if p.Open() != 2 {
		t.Fatalf("open %d", p.Open())
	}
	resp := do(t, "GET", url, nil, MaxConnsHeader, "2")
	if resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("no Retry-After on %d", resp.StatusCode)
	}
	wantBoxdError(t, resp, http.StatusTooManyRequests, "rate_limited")
	close(release)
	wg.Wait()
	if p.Open() != 0 {
		t.Fatalf("open %d after all ended", p.Open())
	}
	if got := readBody(t, do(t, "GET", url, nil, MaxConnsHeader, "2")); got != "ok" {
		t.Fatalf("after release: %q", got)
	}
}

func TestBytesPerSecondSlowTransfers(t *testing.T) {
	const size = 192 << 10
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("x"), size))
	}))
	_, srv := proxyServer(t)
	url := fmt.Sprintf("%s/v1/ports/%d/", srv.URL, port)
	began := time.Now()
	// 64 KiB/s with a bucket of one second: 192 KiB take about 2 s.
	if got := readBody(t, do(t, "GET", url, nil, RateHeader, strconv.Itoa(64<<10))); len(got) != size {
		t.Fatalf("%d bytes", len(got))
	}
	if took := time.Since(began); took < 1500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("192 KiB at 64 KiB/s took %v", took)
	}
	began = time.Now()
	if got := readBody(t, do(t, "GET", url, nil, RateHeader, "0")); len(got) != size {
		t.Fatalf("%d bytes", len(got))
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("without a rate it took %v", took)
	}
}

func TestACallerThatGoesAwayEndsTheAppRequest(t *testing.T) {
	ended := make(chan struct{})
	port := appOn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(ended)
	}))
	p, srv := proxyServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/ports/%d/", srv.URL, port), nil)
	go func() {
		for p.Open() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("the request was answered")
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the app's request went on after its caller left")
	}
}
