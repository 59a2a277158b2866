// Package kube is the little of the Kubernetes API the gateway needs, over the API server's REST
// API with the standard library only: where the API server is and how to authenticate to it
// (in-cluster service account, a kubeconfig, or explicit server/CA/token), and a list+watch
// reflector (reflector.go). No client-go: it would be most of the binary, and the gateway reads
// three kinds of object (four watches) and creates Events.
package kube

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Config says where the API server is and how to authenticate. Files are read when the client is
// made, except TokenFile, which the client re-reads whenever it changes (bound service account
// tokens are rotated by the kubelet, typically hourly).
type Config struct {
	Server    string // https://host:port
	CAData    []byte // PEM; none: the system roots
	CertData  []byte // client certificate, PEM (with KeyData)
	KeyData   []byte
	Token     string // a fixed bearer token
	TokenFile string // a bearer token re-read on change (wins over Token)
	// TLSServerName is the name the API server's certificate is checked for, when not the
	// server's host (kubeconfig tls-server-name): e.g. kubernetes.default.svc where pods reach the
	// API server at a Service IP its certificate does not list.
	TLSServerName string
}

// Service account paths of a pod.
const (
	saDir       = "/var/run/secrets/kubernetes.io/serviceaccount"
	saTokenFile = saDir + "/token"
	saCAFile    = saDir + "/ca.crt"
)

// InCluster is the pod's own service account: KUBERNETES_SERVICE_HOST/PORT, the mounted CA and
// token (re-read on change).
func InCluster() (*Config, error) { return inCluster(saDir) }

func inCluster(dir string) (*Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set")
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("in-cluster CA: %w", err)
	}
	tokenFile := filepath.Join(dir, "token")
	if _, err := os.Stat(tokenFile); err != nil {
		return nil, fmt.Errorf("in-cluster token: %w", err)
	}
	return &Config{Server: "https://" + net.JoinHostPort(host, port), CAData: ca, TokenFile: tokenFile}, nil
}

// LoadKubeconfig reads a kubeconfig (the context named, or its current-context): the cluster's
// server, tls-server-name and CA (data or file), the user's client certificate and key (data or
// file), token or tokenFile. Relative file paths are relative to the kubeconfig, as kubectl has them. Exec and
// auth-provider plugins are not supported (an error says so). The YAML reader handles the block
// style kubectl and kind/kwok write (and JSON); it is not a general YAML parser.
func LoadKubeconfig(path, context string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if t := strings.TrimSpace(string(b)); strings.HasPrefix(t, "{") {
		err = json.Unmarshal(b, &doc)
	} else {
		doc, err = parseYAML(string(b))
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	root, _ := doc.(map[string]any)
	if context == "" {
		context, _ = root["current-context"].(string)
	}
	if context == "" {
		return nil, fmt.Errorf("kubeconfig %s: no current-context and none given", path)
	}
	ctx := named(root, "contexts", context, "context")
	if ctx == nil {
		return nil, fmt.Errorf("kubeconfig %s: no context %q", path, context)
	}
	clusterName, _ := ctx["cluster"].(string)
	userName, _ := ctx["user"].(string)
	cluster := named(root, "clusters", clusterName, "cluster")
	if cluster == nil {
		return nil, fmt.Errorf("kubeconfig %s: no cluster %q", path, clusterName)
	}
	user := named(root, "users", userName, "user") // may be nil: no credentials
	dir := filepath.Dir(path)
	c := &Config{}
	c.Server, _ = cluster["server"].(string)
	if c.Server == "" {
		return nil, fmt.Errorf("kubeconfig %s: cluster %q has no server", path, clusterName)
	}
	if c.CAData, err = dataOrFile(cluster, "certificate-authority-data", "certificate-authority", dir); err != nil {
		return nil, err
	}
	c.TLSServerName, _ = cluster["tls-server-name"].(string)
	if user != nil {
		if user["exec"] != nil || user["auth-provider"] != nil {
			return nil, fmt.Errorf("kubeconfig %s: user %q uses an exec or auth-provider plugin, which the gateway does not run; use a token or client certificate", path, userName)
		}
		if c.CertData, err = dataOrFile(user, "client-certificate-data", "client-certificate", dir); err != nil {
			return nil, err
		}
		if c.KeyData, err = dataOrFile(user, "client-key-data", "client-key", dir); err != nil {
			return nil, err
		}
		c.Token, _ = user["token"].(string)
		if f, _ := user["tokenFile"].(string); f != "" {
			c.TokenFile = abs(dir, f)
		}
	}
	if (c.CertData == nil) != (c.KeyData == nil) {
		return nil, fmt.Errorf("kubeconfig %s: user %q has a client certificate without a key or the reverse", path, userName)
	}
	return c, nil
}

// named finds the entry called name in root[list] and returns its [field] map.
func named(root map[string]any, list, name, field string) map[string]any {
	items, _ := root[list].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		if n, _ := m["name"].(string); n == name && name != "" {
			f, _ := m[field].(map[string]any)
			if f == nil {
				f = map[string]any{}
			}
			return f
		}
	}
	return nil
}

func dataOrFile(m map[string]any, dataKey, fileKey, dir string) ([]byte, error) {
	if d, _ := m[dataKey].(string); d != "" {
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(d))
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", dataKey, err)
		}
		return b, nil
	}
	if f, _ := m[fileKey].(string); f != "" {
		b, err := os.ReadFile(abs(dir, f))
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", fileKey, err)
		}
		return b, nil
	}
	return nil, nil
}

func abs(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

type yamlLine struct {
	indent int
	text   string
	n      int // line number, for errors
}

// parseYAML reads block-style YAML: mappings, sequences ("- " items, at the parent key's indent
// or deeper), plain and quoted scalars, and the empty flow collections {} and [] kubectl writes.
// Anchors, multi-line scalars, flow collections with content and tags are errors or read as text.
func parseYAML(s string) (any, error) {
	var lines []yamlLine
	for i, raw := range strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n") {
		t := strings.TrimRight(raw, " \t")
		trimmed := strings.TrimLeft(t, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") || trimmed == "---" {
			continue
		}
		if strings.HasPrefix(trimmed, "\t") {
			return nil, fmt.Errorf("line %d: tab indentation", i+1)
		}
		lines = append(lines, yamlLine{indent: len(t) - len(trimmed), text: trimmed, n: i + 1})
	}
	if len(lines) == 0 {
		return map[string]any{}, nil
	}
	v, next, err := yamlBlock(lines, 0, lines[0].indent)
	if err != nil {
		return nil, err
	}
	if next < len(lines) {
		return nil, fmt.Errorf("line %d: unexpected indentation", lines[next].n)
	}
	return v, nil
}

func isItem(t string) bool { return t == "-" || strings.HasPrefix(t, "- ") }

func yamlBlock(lines []yamlLine, i, indent int) (any, int, error) {
	if isItem(lines[i].text) {
		var list []any
		for i < len(lines) && lines[i].indent == indent && isItem(lines[i].text) {
			rest := strings.TrimLeft(strings.TrimPrefix(lines[i].text, "-"), " ")
			if rest == "" { // "-" alone: the item is the block below
				if i+1 < len(lines) && lines[i+1].indent > indent {
					v, next, err := yamlBlock(lines, i+1, lines[i+1].indent)
					if err != nil {
						return nil, 0, err
					}
					list, i = append(list, v), next
				} else {
					list, i = append(list, nil), i+1
				}
				continue
			}
			if _, _, isMap := splitKey(rest); !isMap {
				list, i = append(list, scalar(rest)), i+1
				continue
			}
			// "- key: v" starts a mapping whose keys sit at the column of "key".
			col := indent + len(lines[i].text) - len(rest)
			lines[i] = yamlLine{indent: col, text: rest, n: lines[i].n}
			v, next, err := yamlBlock(lines, i, col)
			if err != nil {
				return nil, 0, err
			}
			list, i = append(list, v), next
		}
		return list, i, nil
	}
	m := map[string]any{}
	for i < len(lines) && lines[i].indent == indent && !isItem(lines[i].text) {
		key, rest, ok := splitKey(lines[i].text)
		if !ok {
			return nil, 0, fmt.Errorf("line %d: expected \"key: value\"", lines[i].n)
		}
		i++
		switch {
		case rest != "":
			m[key] = scalar(rest)
		case i < len(lines) && (lines[i].indent > indent || lines[i].indent == indent && isItem(lines[i].text)):
			v, next, err := yamlBlock(lines, i, lines[i].indent)
			if err != nil {
				return nil, 0, err
			}
			m[key], i = v, next
		default:
			m[key] = nil
		}
	}
	if i < len(lines) && lines[i].indent > indent {
		return nil, 0, fmt.Errorf("line %d: unexpected indentation", lines[i].n)
	}
	return m, i, nil
}

// splitKey splits "key: value" or "key:" (a colon followed by a space or the end).
func splitKey(t string) (key, rest string, ok bool) {
	if strings.HasPrefix(t, `"`) || strings.HasPrefix(t, `'`) {
		q := t[:1]
		end := strings.Index(t[1:], q)
		if end < 0 {
			return "", "", false
		}
		key, t = t[1:1+end], t[2+end:]
		if t == ":" {
			return key, "", true
		}
		if strings.HasPrefix(t, ": ") {
			return key, strings.TrimSpace(t[2:]), true
		}
		return "", "", false
	}
	if strings.HasSuffix(t, ":") && !strings.Contains(t[:len(t)-1], ": ") {
		return t[:len(t)-1], "", true
	}
	if k, v, found := strings.Cut(t, ": "); found {
		return k, strings.TrimSpace(v), true
	}
	return "", "", false
}

func scalar(t string) any {
	switch {
	case t == "{}":
		return map[string]any{}
	case t == "[]":
		return []any{}
	case t == "null" || t == "~":
		return nil
	case len(t) >= 2 && t[0] == '"' && t[len(t)-1] == '"':
		var s string
		if json.Unmarshal([]byte(t), &s) == nil {
			return s
		}
		return t[1 : len(t)-1]
	case len(t) >= 2 && t[0] == '\'' && t[len(t)-1] == '\'':
		return strings.ReplaceAll(t[1:len(t)-1], "''", "'")
	}
	if i := strings.Index(t, " #"); i >= 0 { // a trailing comment on a plain scalar
		t = strings.TrimSpace(t[:i])
	}
	return t
}
