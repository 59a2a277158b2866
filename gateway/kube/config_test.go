package kube

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandbox-bridge.io/gateway/internal/kubetest"
	"sandbox-bridge.io/gateway/internal/testpki"
)

func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster CA")
	os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "admin.crt"), []byte("CERT"), 0o600)
	os.WriteFile(filepath.Join(dir, "admin.key"), []byte("KEY"), 0o600)
	b64 := base64.StdEncoding.EncodeToString
	// The shapes kubectl, kind and kwok write: lists at the parent's indent, files relative to the
	// kubeconfig, data fields, quoted scalars, {} and comments.
	cfg := `apiVersion: v1
clusters:
- cluster:
    certificate-authority: ca.crt
    server: https://127.0.0.1:28160
  name: local
- cluster:
    certificate-authority-data: ` + b64([]byte("CA-DATA")) + `
    server: "https://other.example:6443"
    tls-server-name: kubernetes.default.svc
  name: other
contexts:
- context:
    cluster: local
    user: admin
  name: local
- context:
    cluster: other
    user: 'bot'
  name: other
current-context: local   # the default
kind: Config
preferences: {}
users:
- name: admin
  user:
    client-certificate: admin.crt
    client-key: ` + filepath.Join(dir, "admin.key") + `
- name: bot
  user:
    token: abc.def
`
	p := filepath.Join(dir, "kubeconfig")
	os.WriteFile(p, []byte(cfg), 0o600)
	c, err := LoadKubeconfig(p, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Server != "https://127.0.0.1:28160" || string(c.CAData) != string(ca.CertPEM) ||
		string(c.CertData) != "CERT" || string(c.KeyData) != "KEY" || c.Token != "" {
		t.Fatalf("current context: %+v", c)
	}
	c, err = LoadKubeconfig(p, "other")
	if err != nil {
		t.Fatal(err)
	}
	if c.Server != "https://other.example:6443" || string(c.CAData) != "CA-DATA" || c.Token != "abc.def" || c.CertData != nil ||
		c.TLSServerName != "kubernetes.default.svc" {
		t.Fatalf("other context: %+v", c)
	}
	if _, err := LoadKubeconfig(p, "nope"); err == nil || !strings.Contains(err.Error(), `no context "nope"`) {
		t.Fatalf("unknown context: %v", err)
	}
	exec := strings.Replace(cfg, "    token: abc.def", "    exec:\n      command: aws", 1)
	os.WriteFile(p, []byte(exec), 0o600)
	if _, err := LoadKubeconfig(p, "other"); err == nil || !strings.Contains(err.Error(), "plugin") {
		t.Fatalf("exec plugin: %v", err)
	}
	// JSON is a kubeconfig too.
	os.WriteFile(p, []byte(`{"current-context":"c","contexts":[{"name":"c","context":{"cluster":"k","user":"u"}}],
		"clusters":[{"name":"k","cluster":{"server":"https://k:6443"}}],"users":[{"name":"u","user":{"token":"t"}}]}`), 0o600)
	if c, err := LoadKubeconfig(p, ""); err != nil || c.Server != "https://k:6443" || c.Token != "t" {
		t.Fatalf("JSON kubeconfig: %+v %v", c, err)
	}
}

// The local cluster's kubeconfig, when there is one, loads (its shape is what tests use).
func TestLoadKubeconfigLocalCluster(t *testing.T) {
	p := os.Getenv("SANDBOX_BRIDGE_TEST_KUBECONFIG")
	if p == "" {
		t.Skip("SANDBOX_BRIDGE_TEST_KUBECONFIG not set")
	}
	c, err := LoadKubeconfig(p, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.Server, "https://") || len(c.CAData) == 0 || (len(c.CertData) == 0 && c.Token == "" && c.TokenFile == "") {
		t.Fatalf("local kubeconfig: server %q, CA %d bytes, cert %d bytes", c.Server, len(c.CAData), len(c.CertData))
	}
}

func TestInClusterAndTokenRotation(t *testing.T) {
	api := kubetest.New(t)
	api.Token = "first-token"
	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster CA")
	os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "token"), []byte("first-token\n"), 0o600)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	c, err := inCluster(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Server != "https://10.96.0.1:443" || c.TokenFile != filepath.Join(dir, "token") || string(c.CAData) != string(ca.CertPEM) {
		t.Fatalf("in-cluster config %+v", c)
	}
	c.Server = api.URL // the double speaks plain HTTP on loopback
	cl, err := NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	get := func() error {
		resp, err := cl.Get(context.Background(), "/api/v1/pods", nil, "")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(); err != nil {
		t.Fatal(err)
	}
	// The kubelet rotates the token (a new file swapped in); the API server stops accepting the old.
	tmp := filepath.Join(dir, "token.new")
	os.WriteFile(tmp, []byte("second-token-rotated"), 0o600)
	os.Rename(tmp, filepath.Join(dir, "token"))
	api.Token = "second-token-rotated"
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := get()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rotated token was never used: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := inCluster(dir); err == nil {
		t.Fatal("in-cluster config without KUBERNETES_SERVICE_HOST")
	}
}

// An API server whose certificate does not name the address it is reached at (pods reach the
// local cluster's at the kubernetes Service IP, which its certificate does not list) is refused,
// and accepted when TLSServerName is a name the certificate has.
func TestTLSServerName(t *testing.T) {
	ca := testpki.NewCA(t, "cluster CA")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kind":"PodList","items":[]}`)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "kubernetes.default.svc")}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	get := func(c *Config) error {
		cl, err := NewClient(c)
		if err != nil {
			return err
		}
		resp, err := cl.Get(context.Background(), "/api/v1/pods", nil, "")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(&Config{Server: srv.URL, CAData: ca.CertPEM}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a certificate for another name: %v, want a verification error", err)
	}
	if err := get(&Config{Server: srv.URL, CAData: ca.CertPEM, TLSServerName: "kubernetes.default.svc"}); err != nil {
		t.Fatalf("with TLSServerName: %v", err)
	}
	if err := get(&Config{Server: srv.URL, CAData: testpki.NewCA(t, "other").CertPEM, TLSServerName: "kubernetes.default.svc"}); err == nil {
		t.Fatal("TLSServerName must not skip the CA check")
	}
}

func TestParseYAMLErrors(t *testing.T) {
	for _, bad := range []string{"a: b\n   c: d\n", "just text\n", "a:\n\t- b\n"} {
		if _, err := parseYAML(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
	v, err := parseYAML("a:\n  - x\n  - 'y'\n  -\n    k: v\nb: \"q\\\"uoted\"\n")
	if err != nil {
		t.Fatal(err)
	}
	m := v.(map[string]any)
	list := m["a"].([]any)
	if len(list) != 3 || list[0] != "x" || list[1] != "y" || list[2].(map[string]any)["k"] != "v" || m["b"] != `q"uoted` {
		t.Fatalf("parsed %#v", v)
	}
}

// Against the local cluster's API server: it is reached at 127.0.0.1 (in its certificate) and
// its certificate names kubernetes.default.svc, which pods give as -kube-tls-server-name since
// the kubernetes Service IP they reach it at is not in it; a name it lacks is refused.
func TestClusterTLSServerName(t *testing.T) {
	p := os.Getenv("SANDBOX_BRIDGE_TEST_KUBECONFIG")
	if p == "" {
		t.Skip("SANDBOX_BRIDGE_TEST_KUBECONFIG not set")
	}
	for name, ok := range map[string]bool{"kubernetes.default.svc": true, "not-in-the-certificate.test": false} {
		c, err := LoadKubeconfig(p, "")
		if err != nil {
			t.Fatal(err)
		}
		c.TLSServerName = name
		cl, err := NewClient(c)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := cl.Get(context.Background(), "/version", nil, "")
		if err == nil {
			resp.Body.Close()
		}
		if (err == nil) != ok {
			t.Errorf("TLSServerName %q: %v, want ok=%v", name, err, ok)
		}
	}
}
