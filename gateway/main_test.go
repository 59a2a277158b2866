package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	t.Setenv("EGRESS_POLICY_FILE", "/etc/egress/policy.json")
	t.Setenv("EGRESS_KEY_FILE", "/etc/egress/keys")
	t.Setenv("EGRESS_IDLE_TIMEOUT", "90s")
	c, err := parseFlags([]string{"-listen", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if c.listen != "127.0.0.1:0" || c.metricsListen != ":9090" || c.idle != 90*time.Second || c.allowPrivateUpstreams {
		t.Fatalf("config %+v", c)
	}
	for args, want := range map[string]string{
		"-ca-cert /x":          "go together",
		"-idle-timeout 0s":     "positive",
		"extra":                "unexpected",
		"-policy-file=":        "required",
		"-max-conns-per-box 0": "positive",
		"-source etcd":         "want file or kubernetes",
		"-source kubernetes -kube-server https://k:6443 -kubeconfig /k": "give one",
		"-source kubernetes -kube-token-file /t":                        "go with -kube-server",
		"-source kubernetes -ca-cert /c -ca-key /k":                     "go with -source=file",
	} {
		if _, err := parseFlags(strings.Fields(args)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
}

func TestParseFlagsKubernetes(t *testing.T) {
	t.Setenv("EGRESS_KEY_FILE", "/etc/egress/keys")
	t.Setenv("EGRESS_POLICY_FILE", "")
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, []byte("PEM"), 0o600)
	// -source=kubernetes needs no policy file; -kube-server with its CA and token files.
	c, err := parseFlags([]string{"-source=kubernetes", "-kube-server=https://10.96.0.1:443", "-kube-ca-file=" + ca,
		"-kube-token-file=/var/run/token", "-kube-namespace=sandboxes", "-kube-tls-server-name=kubernetes.default.svc"})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := c.kube.config()
	if err != nil {
		t.Fatal(err)
	}
	if kc.Server != "https://10.96.0.1:443" || string(kc.CAData) != "PEM" || kc.TokenFile != "/var/run/token" || c.kube.namespace != "sandboxes" || !c.kube.credentials ||
		kc.TLSServerName != "kubernetes.default.svc" {
		t.Fatalf("kube config %+v, flags %+v", kc, c.kube)
	}
	// Without -kube-server or -kubeconfig: the pod's service account, an error outside a pod.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if !c.kube.events {
		t.Fatal("denial Events are on by default")
	}
	t.Setenv("EGRESS_KUBE_CREDENTIALS", "false")
	t.Setenv("EGRESS_KUBE_EVENTS", "false")
	c, err = parseFlags([]string{"-source=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	if c.kube.credentials || c.kube.events {
		t.Fatal("EGRESS_KUBE_CREDENTIALS=false or EGRESS_KUBE_EVENTS=false ignored")
	}
	if _, err := c.kube.config(); err == nil || !strings.Contains(err.Error(), "not in a cluster") {
		t.Fatalf("in-cluster outside a cluster: %v", err)
	}
	if _, err := parseFlags([]string{}); err == nil || !strings.Contains(err.Error(), "-policy-file") {
		t.Fatalf("-source=file (the default) without a file: %v", err)
	}
}

func TestRefusePrivate(t *testing.T) {
	for addr, refused := range map[string]bool{
		"127.0.0.1:443": true, "10.1.2.3:443": true, "172.16.0.1:443": true, "192.168.1.1:443": true,
		"169.254.169.254:80": true, "100.64.0.1:443": true, "[::1]:443": true, "[fd00::1]:443": true,
		"[fe80::1]:443": true, "0.0.0.0:443": true, "[::ffff:10.0.0.1]:443": true,
		"93.184.215.14:443": false, "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443": false,
	} {
		if err := refusePrivate("tcp", addr, nil); (err != nil) != refused {
			t.Errorf("refusePrivate(%s) = %v, want refused=%v", addr, err, refused)
		}
	}
}

// The credential subcommand prints the shared vector's credential (identity v2: namespace, pod, nonce).
func TestCredentialCommand(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\nanother-key-that-only-verifies-0123456789\n"), 0o600)
	t.Setenv("EGRESS_KEY_FILE", keyFile)
	var out strings.Builder
	if err := printCredential([]string{"sbx", "box-abc-0", "00ff"}, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "p6eFeIqBXJEbLtPCt1SCB6xwj4Ra_mIAk24AU5sXV8M\n" {
		t.Fatalf("credential sbx box-abc-0 00ff = %q", out.String())
	}
	if err := printCredential([]string{"box-abc"}, &out); err == nil || !strings.Contains(err.Error(), "NAMESPACE POD NONCE") {
		t.Fatalf("one argument (the v1 form): %v", err)
	}
}

func TestResolverKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "resolver-key")
	os.WriteFile(p, []byte("\n  the-resolver-key-0123456789abcdef  \nsecond line ignored\n"), 0o600)
	k, err := loadResolverKey(p)
	if err != nil || string(k) != "the-resolver-key-0123456789abcdef" {
		t.Fatalf("key %q, %v", k, err)
	}
	os.WriteFile(p, []byte("\n \n"), 0o600)
	if _, err := loadResolverKey(p); err == nil || !strings.Contains(err.Error(), "holds no key") {
		t.Fatalf("an empty file: %v", err)
	}
	if _, err := loadResolverKey(p + ".missing"); err == nil {
		t.Fatal("a missing file: want an error")
	}
	t.Setenv("EGRESS_POLICY_FILE", "/p.json")
	t.Setenv("EGRESS_KEY_FILE", "/k")
	t.Setenv("EGRESS_RESOLVER_KEY_FILE", "/etc/egress/resolver-key")
	if c, err := parseFlags(nil); err != nil || c.resolverKeyFile != "/etc/egress/resolver-key" {
		t.Fatalf("EGRESS_RESOLVER_KEY_FILE: %q %v", c.resolverKeyFile, err)
	}
}
