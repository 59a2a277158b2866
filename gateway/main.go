// egress-gateway is sandbox-bridge's egress gateway: the HTTP proxy boxes of a gateway-mode
// pool reach the internet through (docs/egress.md). This file only wires the packages together.
//
//	egress-gateway [serve]           serve (flags below, each with an EGRESS_* environment default)
//	egress-gateway credential NAMESPACE POD NONCE
//	                                 print a box pod's proxy credential under the key file's first key
//	egress-gateway version
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandbox-bridge.io/gateway/certs"
	"sandbox-bridge.io/gateway/events"
	"sandbox-bridge.io/gateway/identity"
	"sandbox-bridge.io/gateway/kube"
	"sandbox-bridge.io/gateway/metrics"
	"sandbox-bridge.io/gateway/proxy"
	"sandbox-bridge.io/gateway/resolver"
	"sandbox-bridge.io/gateway/source"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

type config struct {
	listen, metricsListen     string
	source                    string
	policyFile, keyFile       string
	resolverKeyFile           string
	kube                      kubeFlags
	caCert, caKey, upstreamCA string
	idle, hello, dial         time.Duration
	maxConnsPerBox            int
	allowPrivateUpstreams     bool
	eventsTick                time.Duration // tests: how often denials are flushed into Events (default 5 s)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		return -1
	}
	return def
}

func envIntDefault(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return -1
		}
		return n
	}
	return def
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("egress-gateway", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", env("EGRESS_LISTEN", ":3128"), "proxy address (EGRESS_LISTEN)")
	fs.StringVar(&c.metricsListen, "metrics-listen", env("EGRESS_METRICS_LISTEN", ":9090"), "metrics, /healthz and /readyz address (EGRESS_METRICS_LISTEN)")
	fs.StringVar(&c.source, "source", env("EGRESS_SOURCE", "file"), "where pools and boxes come from: file (-policy-file) or kubernetes (watches on the API server) (EGRESS_SOURCE)")
	fs.StringVar(&c.policyFile, "policy-file", env("EGRESS_POLICY_FILE", ""), "JSON state file: pools, boxes, credentials (EGRESS_POLICY_FILE, required with -source=file)")
	fs.StringVar(&c.kube.kubeconfig, "kubeconfig", env("EGRESS_KUBECONFIG", ""), "-source=kubernetes out of a cluster: a kubeconfig (EGRESS_KUBECONFIG; default: the pod's service account)")
	fs.StringVar(&c.kube.context, "kube-context", env("EGRESS_KUBE_CONTEXT", ""), "the kubeconfig's context (EGRESS_KUBE_CONTEXT; default its current-context)")
	fs.StringVar(&c.kube.server, "kube-server", env("EGRESS_KUBE_SERVER", ""), "API server URL, instead of a kubeconfig or the service account (EGRESS_KUBE_SERVER)")
	fs.StringVar(&c.kube.caFile, "kube-ca-file", env("EGRESS_KUBE_CA_FILE", ""), "with -kube-server: the API server's CA, PEM (EGRESS_KUBE_CA_FILE; default the system roots)")
	fs.StringVar(&c.kube.tlsServerName, "kube-tls-server-name", env("EGRESS_KUBE_TLS_SERVER_NAME", ""),
		"the name the API server's certificate is checked for, when it does not list the address it is reached at, e.g. kubernetes.default.svc (EGRESS_KUBE_TLS_SERVER_NAME; any way of finding the API server; default: a kubeconfig's tls-server-name, else the server's host)")
	fs.StringVar(&c.kube.tokenFile, "kube-token-file", env("EGRESS_KUBE_TOKEN_FILE", ""), "with -kube-server: a bearer token file, re-read when it changes (EGRESS_KUBE_TOKEN_FILE)")
	fs.BoolVar(&c.kube.credentials, "kube-credentials", env("EGRESS_KUBE_CREDENTIALS", "true") != "false",
		"read box credentials from the records' egress-credentials key; false: watch records as metadata only, no credentials (EGRESS_KUBE_CREDENTIALS)")
	fs.BoolVar(&c.kube.events, "kube-events", env("EGRESS_KUBE_EVENTS", "true") != "false",
		"with -source=kubernetes: aggregated EgressDenied Events on box pods, at most one per pod per minute per replica; needs create on events (EGRESS_KUBE_EVENTS)")
	fs.StringVar(&c.kube.namespace, "kube-namespace", env("EGRESS_KUBE_NAMESPACE", ""), "watch box pods, records and pool CA Secrets (and create Events) in this namespace only (EGRESS_KUBE_NAMESPACE; default all: needs a ClusterRole)")
	fs.StringVar(&c.keyFile, "key-file", env("EGRESS_KEY_FILE", ""), "proxy credential keys, one per line, the first signs (EGRESS_KEY_FILE, required)")
	fs.StringVar(&c.resolverKeyFile, "resolver-key-file", env("EGRESS_RESOLVER_KEY_FILE", ""),
		"the key requests to the pools' credential resolvers are signed with: the file's first non-empty line (EGRESS_RESOLVER_KEY_FILE; without it those pools' resolver hosts are refused, 502)")
	fs.StringVar(&c.caCert, "ca-cert", env("EGRESS_CA_CERT", ""), "-source=file: the interception CA certificate, PEM, re-read when it changes (EGRESS_CA_CERT; without it no interception; with -source=kubernetes each pool's CA is its Secret)")
	fs.StringVar(&c.caKey, "ca-key", env("EGRESS_CA_KEY", ""), "-source=file: the interception CA's private key, PEM (EGRESS_CA_KEY)")
	fs.StringVar(&c.upstreamCA, "upstream-ca", env("EGRESS_UPSTREAM_CA", ""), "extra CA bundle, PEM, trusted for intercepted hosts and https credential resolvers besides the system roots (EGRESS_UPSTREAM_CA)")
	fs.DurationVar(&c.idle, "idle-timeout", envDuration("EGRESS_IDLE_TIMEOUT", 5*time.Minute), "close a connection idle this long (EGRESS_IDLE_TIMEOUT)")
	fs.DurationVar(&c.hello, "hello-timeout", envDuration("EGRESS_HELLO_TIMEOUT", 10*time.Second), "wait for a box's ClientHello or TLS handshake (EGRESS_HELLO_TIMEOUT)")
	fs.DurationVar(&c.dial, "dial-timeout", envDuration("EGRESS_DIAL_TIMEOUT", 10*time.Second), "upstream dial timeout (EGRESS_DIAL_TIMEOUT)")
	fs.IntVar(&c.maxConnsPerBox, "max-conns-per-box", envIntDefault("EGRESS_MAX_CONNS_PER_BOX", 256), "open connections one box may hold (EGRESS_MAX_CONNS_PER_BOX)")
	fs.BoolVar(&c.allowPrivateUpstreams, "allow-private-upstreams", env("EGRESS_ALLOW_PRIVATE_UPSTREAMS", "") == "true",
		"dial loopback, private, link-local and other non-public addresses a name resolves to (EGRESS_ALLOW_PRIVATE_UPSTREAMS=true)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.source != "file" && c.source != "kubernetes":
		return c, fmt.Errorf("-source %q: want file or kubernetes", c.source)
	case c.source == "file" && c.policyFile == "":
		return c, errors.New("-policy-file (EGRESS_POLICY_FILE) is required with -source=file")
	case c.source == "kubernetes" && c.kube.server != "" && c.kube.kubeconfig != "":
		return c, errors.New("-kube-server and -kubeconfig: give one")
	case c.source == "kubernetes" && c.kube.server == "" && (c.kube.caFile != "" || c.kube.tokenFile != ""):
		return c, errors.New("-kube-ca-file and -kube-token-file go with -kube-server")
	case c.keyFile == "":
		return c, errors.New("-key-file (EGRESS_KEY_FILE) is required")
	case (c.caCert == "") != (c.caKey == ""):
		return c, errors.New("-ca-cert and -ca-key go together")
	case c.source == "kubernetes" && c.caCert != "":
		// One CA for every pool would be one boxes do not trust (they trust their pool's).
		return c, errors.New("-ca-cert and -ca-key go with -source=file; with -source=kubernetes each pool's CA is its Secret " + source.EgressCAName)
	case c.maxConnsPerBox <= 0:
		return c, errors.New("-max-conns-per-box must be a positive number")
	case c.idle <= 0 || c.hello <= 0 || c.dial <= 0:
		return c, errors.New("timeouts must be positive durations (e.g. 30s, 5m)")
	}
	return c, nil
}

func main() {
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "credential" || args[0] == "version") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		var c config
		if c, err = parseFlags(args); err == nil {
			err = serve(c)
		} else if errors.Is(err, flag.ErrHelp) {
			return
		}
	case "credential":
		err = printCredential(args, os.Stdout)
	case "version":
		fmt.Println(version)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "egress-gateway: %v\n", err)
		os.Exit(1)
	}
}

func printCredential(args []string, out io.Writer) error {
	if len(args) != 3 || args[0] == "" || args[1] == "" || args[2] == "" {
		return errors.New("usage: EGRESS_KEY_FILE=PATH egress-gateway credential NAMESPACE POD NONCE")
	}
	keys, err := identity.LoadKeys(env("EGRESS_KEY_FILE", ""))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, keys.Credential(identity.Pod{Namespace: args[0], Name: args[1], Nonce: args[2]}))
	return nil
}

func serve(c config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, c, slog.New(slog.NewJSONHandler(os.Stdout, nil)))
}

// run serves until ctx ends (SIGTERM, SIGINT; a test's cancel).
func run(ctx context.Context, c config, log *slog.Logger) error {
	keys, err := identity.LoadKeys(c.keyFile)
	if err != nil {
		return err
	}
	var ca certs.Signer // -ca-cert: the file source's CA (with -source=kubernetes each pool's Secret)
	if c.caCert != "" {
		if ca, err = certs.LoadFiles(c.caCert, c.caKey); err != nil {
			return err
		}
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if c.upstreamCA != "" {
		pem, err := os.ReadFile(c.upstreamCA)
		if err != nil {
			return fmt.Errorf("upstream CA bundle: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("upstream CA bundle %s holds no certificate", c.upstreamCA)
		}
	}
	m := metrics.New()
	var agg *events.Aggregator // denial Events, with -source=kubernetes
	res := &resolver.Client{HTTP: resolver.NewHTTPClient(roots), OnResult: func(r resolver.Result) { m.Resolver(string(r)) }}
	if c.resolverKeyFile != "" {
		if res.Key, err = loadResolverKey(c.resolverKeyFile); err != nil {
			return err
		}
	} else {
		log.Warn("no -resolver-key-file: the gateway asks no credential resolver, and the hosts of pools that have one are refused (502 resolver:error)")
	}
	var src runSource
	switch c.source {
	case "kubernetes":
		kc, err := c.kube.config()
		if err != nil {
			return err
		}
		client, err := kube.NewClient(kc)
		if err != nil {
			return err
		}
		// Not ready (503) until pools, box pods and records are listed; then every watch event
		// is a new State.
		src = &source.Kubernetes{Client: client, Namespace: c.kube.namespace, Credentials: c.kube.credentials, Log: log, OnLoad: m.Reload}
		if c.kube.events {
			instance, _ := os.Hostname() // the pod's name
			agg = &events.Aggregator{Client: client, Tick: c.eventsTick, Instance: instance, Log: log, OnResult: m.Event}
		}
		log.Info("policy source: kubernetes", "server", kc.Server, "tls_server_name", kc.TLSServerName, "namespace", c.kube.namespace, "credentials", c.kube.credentials)
	default:
		f := &source.File{Path: c.policyFile, Log: log, OnLoad: m.Reload}
		if err := f.Load(); err != nil {
			// Serve anyway (not ready, every request 503) and keep polling: the file may come later.
			log.Error("policy not loaded", "path", c.policyFile, "error", err.Error())
		}
		src = f
	}
	dialer := &net.Dialer{Timeout: c.dial, KeepAlive: 30 * time.Second}
	if !c.allowPrivateUpstreams {
		dialer.Control = refusePrivate
	}
	var onDeny func(string, *source.Box, string, string)
	if agg != nil {
		onDeny = func(boxID string, b *source.Box, host, rule string) {
			agg.Denied(events.Pod{Namespace: b.Namespace, Name: b.Pod, UID: b.UID, Box: boxID}, host, rule)
		}
	}
	p := proxy.New(proxy.Config{
		Source: src, Keys: keys, CA: ca, Resolver: res, OnDeny: onDeny, UpstreamRoots: roots, Dial: dialer.DialContext, Log: log, Metrics: m,
		IdleTimeout: c.idle, HelloTimeout: c.hello, DialTimeout: c.dial, MaxConnsPerBox: c.maxConnsPerBox,
	})

	go src.Run(ctx)
	go p.Run(ctx) // close open tunnels a policy change no longer allows
	if agg != nil {
		go agg.Run(ctx)
	}

	pl, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	ml, err := net.Listen("tcp", c.metricsListen)
	if err != nil {
		return err
	}
	proxySrv := &http.Server{Handler: p, ReadHeaderTimeout: c.hello, IdleTimeout: c.idle,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	metricsSrv := &http.Server{Handler: m.Handler(func() bool { return src.Current() != nil }), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- proxySrv.Serve(pl) }()
	go func() { errc <- metricsSrv.Serve(ml) }()
	log.Info("egress-gateway serving", "version", version, "proxy", pl.Addr().String(), "metrics", ml.Addr().String(),
		"ca_files", ca != nil, "private_upstreams", c.allowPrivateUpstreams)
	select {
	case err = <-errc:
	case <-ctx.Done():
		// Stop taking connections; hijacked tunnels end on their own (idle timeout) or with the pod.
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		proxySrv.Shutdown(sctx)
		metricsSrv.Shutdown(sctx)
	}
	return err
}

// loadResolverKey reads the resolver signing key: the first non-empty line, trimmed, as bytes (as
// the operator's webhook key and the egress key files are read).
func loadResolverKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("resolver key file: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			return []byte(line), nil
		}
	}
	return nil, fmt.Errorf("resolver key file %s holds no key", path)
}

// runSource is a Source that keeps itself current until its context ends.
type runSource interface {
	source.Source
	Run(ctx context.Context)
}

type kubeFlags struct {
	kubeconfig, context, server, caFile, tokenFile, namespace string
	tlsServerName                                             string
	credentials, events                                       bool
}

// config: -kube-server (with its CA and token files), else a kubeconfig, else the pod's own
// service account; -kube-tls-server-name applies to each.
func (k kubeFlags) config() (*kube.Config, error) {
	c, err := k.where()
	if err == nil && k.tlsServerName != "" {
		c.TLSServerName = k.tlsServerName
	}
	return c, err
}

func (k kubeFlags) where() (*kube.Config, error) {
	switch {
	case k.server != "":
		c := &kube.Config{Server: k.server, TokenFile: k.tokenFile}
		if k.caFile != "" {
			b, err := os.ReadFile(k.caFile)
			if err != nil {
				return nil, fmt.Errorf("-kube-ca-file: %w", err)
			}
			c.CAData = b
		}
		return c, nil
	case k.kubeconfig != "":
		return kube.LoadKubeconfig(k.kubeconfig, k.context)
	default:
		return kube.InCluster()
	}
}

// refusePrivate refuses upstream addresses that are not public unicast: a name an allowed
// pattern covers must not lead a box to the cluster, the node or the cloud metadata service.
func refusePrivate(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return err
	}
	a := ap.Addr().Unmap()
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsMulticast() || a.IsUnspecified() || a.IsInterfaceLocalMulticast() ||
		netip.MustParsePrefix("100.64.0.0/10").Contains(a) {
		return fmt.Errorf("refusing non-public upstream address %s", a)
	}
	return nil
}
