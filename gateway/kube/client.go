package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Client makes authenticated requests to one API server (GETs for the watches, a POST for Events). It is safe for concurrent use; with
// HTTP/2 (the API server's default over TLS) every watch shares one connection, and a
// connection that stops answering pings is closed within about 45 s, so a watch on it fails and
// is reopened instead of hanging.
type Client struct {
	base  *url.URL
	hc    *http.Client
	token *tokenSource
}

// NewClient checks c and makes a client.
func NewClient(c *Config) (*Client, error) {
	u, err := url.Parse(c.Server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("API server %q: want https://host:port", c.Server)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if len(c.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.CAData) {
			return nil, errors.New("API server CA: no PEM certificate")
		}
		tc.RootCAs = pool
	}
	if len(c.CertData) > 0 {
		cert, err := tls.X509KeyPair(c.CertData, c.KeyData)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	tr := &http.Transport{
		Proxy:                 nil, // never through HTTP(S)_PROXY: the API server is reached directly
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   4,
		HTTP2:                 &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second},
	}
	cl := &Client{base: u, hc: &http.Client{Transport: tr}}
	if c.TokenFile != "" {
		cl.token = &tokenSource{path: c.TokenFile}
		if _, err := cl.token.get(); err != nil {
			return nil, err
		}
	} else if c.Token != "" {
		cl.token = &tokenSource{fixed: c.Token}
	}
	return cl, nil
}

// StatusError is an answer other than 2xx, with the API server's Status when it sent one.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("API server: %d %s: %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("API server: %d %s", e.Code, e.Reason)
}

// IsGone says err is a 410 (the resourceVersion or continue token is too old: list again).
func IsGone(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusGone
}

// Get requests path with query; a non-2xx answer is a *StatusError (body read, closed). The
// caller closes the body of a 2xx answer.
func (c *Client) Get(ctx context.Context, path string, query url.Values, accept string) (*http.Response, error) {
	return c.Do(ctx, http.MethodGet, path, query, accept, "", nil)
}

// Do sends any request (body with contentType, e.g. application/json or
// application/merge-patch+json); answers as Get.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, accept, contentType string, body []byte) (*http.Response, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	req.Header.Set("User-Agent", "sandbox-bridge-egress-gateway")
	if c.token != nil {
		tok, err := c.token.get()
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, statusError(resp.StatusCode, b)
	}
	return resp, nil
}

// Create POSTs obj (JSON) to a collection path, e.g. /api/v1/namespaces/NS/events; a non-2xx
// answer is a *StatusError.
func (c *Client) Create(ctx context.Context, path string, obj any) error {
	body, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	resp, err := c.Do(ctx, http.MethodPost, path, nil, "", "application/json", body)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.Body.Close()
}

// statusError reads a metav1.Status body (or not) into a StatusError.
func statusError(code int, body []byte) *StatusError {
	var st struct {
		Code    int    `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &st) != nil || st.Code == 0 {
		st.Code, st.Reason = code, http.StatusText(code)
	}
	if st.Code == 0 {
		st.Code = code
	}
	return &StatusError{Code: st.Code, Reason: st.Reason, Message: st.Message}
}

// tokenSource re-reads a token file when its size, modification time or identity changed (the
// kubelet replaces a projected token by swapping a symlink), checked at most once a second.
type tokenSource struct {
	fixed string
	path  string

	mu      sync.Mutex
	tok     string
	fi      os.FileInfo
	checked time.Time
}

func (t *tokenSource) get() (string, error) {
	if t.path == "" {
		return t.fixed, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tok != "" && time.Since(t.checked) < time.Second {
		return t.tok, nil
	}
	t.checked = time.Now()
	fi, err := os.Stat(t.path)
	if err != nil {
		if t.tok != "" {
			return t.tok, nil // keep the last one; the next check may find the new file
		}
		return "", fmt.Errorf("token file: %w", err)
	}
	if t.tok != "" && t.fi != nil && fi.Size() == t.fi.Size() && fi.ModTime().Equal(t.fi.ModTime()) && os.SameFile(fi, t.fi) {
		return t.tok, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		if t.tok != "" {
			return t.tok, nil
		}
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := string(bytes.TrimSpace(b))
	if tok == "" {
		if t.tok != "" {
			return t.tok, nil
		}
		return "", fmt.Errorf("token file %s is empty", t.path)
	}
	t.tok, t.fi = tok, fi
	return tok, nil
}
