// boxd is the in-box agent of sandbox-bridge: PID 1 of every box container, serving the
// protocol in PROTOCOL.md on one port. This file only wires the packages together.
//
//	boxd [serve]         serve (configuration from the environment, see config)
//	boxd mounts          the memory-store sidecar (package mounts, docs/mounts.md)
//	boxd install DEST    copy this executable to DEST (a file path, or an existing directory)
//	boxd version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sandbox-bridge.io/boxd/auth"
	"sandbox-bridge.io/boxd/cabundle"
	"sandbox-bridge.io/boxd/files"
	"sandbox-bridge.io/boxd/metrics"
	"sandbox-bridge.io/boxd/mounts"
	"sandbox-bridge.io/boxd/ports"
	"sandbox-bridge.io/boxd/process"
	"sandbox-bridge.io/boxd/server"
	"sandbox-bridge.io/boxd/watch"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

type config struct {
	port        int
	secretDir   string
	workdir     string
	outputBytes int64
}

func loadConfig() (config, error) {
	c := config{
		port:        envInt("BOXD_PORT", 7771),
		secretDir:   envStr("BOXD_SECRET_DIR", "/opt/sandbox-bridge/secret"),
		workdir:     envStr("BOXD_WORKDIR", "/workspace"),
		outputBytes: int64(envInt("BOXD_PROCESS_OUTPUT_BYTES", 4<<20)),
	}
	if c.port <= 0 || c.port > 65535 {
		return c, fmt.Errorf("BOXD_PORT must be a port number")
	}
	if c.outputBytes <= 0 {
		return c, fmt.Errorf("BOXD_PROCESS_OUTPUT_BYTES must be a positive number of bytes")
	}
	return c, nil
}

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return -1
	}
	return n
}

func main() {
	cmd, args := "serve", os.Args[1:]
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch {
	case cmd == "serve" && len(args) == 0:
		err = serve()
	case cmd == "mounts" && len(args) == 0:
		err = serveMounts()
	case cmd == "install" && len(args) == 1:
		err = install(args[0])
	case cmd == "version" && len(args) == 0:
		fmt.Println(version)
	default:
		fmt.Fprintln(os.Stderr, "usage: boxd [serve] | boxd mounts | boxd install DEST | boxd version")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "boxd: %v\n", err)
		os.Exit(1)
	}
}

// install copies this executable to dest (mode 0555; into dest/boxd when dest is a directory),
// creating the directory. The init container runs it to fill the box's emptyDir.
func install(dest string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
		dest = filepath.Join(dest, "boxd")
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".boxd-install-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err == nil {
		fmt.Fprintf(os.Stderr, "boxd %s installed to %s\n", version, dest)
	}
	return err
}

func serve() error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	checker, err := auth.Load(cfg.secretDir)
	if err != nil {
		return fmt.Errorf("refusing to serve without a credential: %w", err)
	}
	env := process.NewEnv(os.Environ())
	if err := env.LoadFile(filepath.Join(cfg.secretDir, "env")); err != nil {
		return fmt.Errorf("box env: %w", err)
	}
	procs, err := process.NewManager(process.Config{Workdir: cfg.workdir, OutputBytes: cfg.outputBytes}, env)
	if err != nil {
		return err
	}
	// boxd's own directories, which no file or archive route reaches (files.Box): the secret
	// mount (credential, env store) and the directory of its binary.
	secretDir, err := filepath.Abs(cfg.secretDir)
	if err != nil {
		return err
	}
	protected := []string{secretDir}
	if self, err := os.Executable(); err == nil {
		protected = append(protected, filepath.Dir(self))
	}

	// Gateway-mode pools (docs/egress.md): the CA bundle the box's tools trust, written before the
	// first command can run and kept in step with the pool CA until boxd stops.
	bundleCtx, stopBundle := context.WithCancel(context.Background())
	defer stopBundle()
	if src, dst := os.Getenv("BOXD_EGRESS_CA"), os.Getenv("BOXD_CA_BUNDLE"); src != "" && dst != "" {
		bundle := cabundle.New(cabundle.Config{Source: src, Bundle: dst, Log: log})
		if err := bundle.Sync(); err != nil {
			// The box still serves: a tool pointed at a missing bundle fails closed.
			log.Warn("CA bundle not written", "error", err.Error())
		}
		go bundle.Run(bundleCtx)
	}

	// File watches (one inotify instance for all) and the box's use, sampled every 5 s.
	watches := watch.New(files.NewBox(protected), watch.Config{})
	volumes, err := volumeLimits(os.Getenv("BOXD_VOLUME_LIMITS"))
	if err != nil {
		return err
	}
	sampler := metrics.New(metrics.Config{Volumes: volumes})
	if sampler.Version() == "" {
		log.Warn("the box's cgroup cannot be read: /v1/metrics answers 500")
	}
	go sampler.Run(bundleCtx)

	ln, err := net.Listen("tcp", ":"+strconv.Itoa(cfg.port))
	if err != nil {
		return err
	}
	// Ports of the box's apps, on its loopback; boxd's own port and the mounts sidecar's are not among them.
	portProxy := ports.New(log, cfg.port, envInt("BOXD_MOUNTS_PORT", 7772))
	defer portProxy.Close()
	srv := &http.Server{
		Handler: server.New(server.Config{
			Version: version, StartedAt: time.Now(), Auth: checker, Procs: procs, Protected: protected, Ports: portProxy,
			Watch: watches, Metrics: sampler, Log: log,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("boxd serving", "version", version, "port", cfg.port, "pid1", os.Getpid() == 1,
		"workdir", cfg.workdir, "box_env_vars", env.Count())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case sig := <-stop:
		// The box is going away: every process dies now (as PID 1: everything in the
		// container), running streams end with an error frame, then boxd exits 0.
		log.Info("boxd stopping", "signal", sig.String())
		stopBundle()
		watches.Close()
		procs.Shutdown()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			log.Warn("shutdown", "error", err.Error())
		}
		return nil
	}
}

// volumeLimits parses BOXD_VOLUME_LIMITS, "/workspace=1073741824,/tmp=268435456": the volumes
// whose use /v1/metrics reports and their limits in bytes (0: unknown), which a disk-backed
// emptyDir's statfs does not show (common/box-pod.ts sets it from the pod's sizeLimits).
// Unset: /workspace and /tmp, limits unknown.
func volumeLimits(v string) ([]metrics.Volume, error) {
	if v == "" {
		return []metrics.Volume{{Path: "/workspace"}, {Path: "/tmp"}}, nil
	}
	var out []metrics.Volume
	for _, item := range strings.Split(v, ",") {
		p, n, ok := strings.Cut(strings.TrimSpace(item), "=")
		limit, err := strconv.ParseUint(n, 10, 64)
		if !ok || err != nil || !filepath.IsAbs(p) {
			return nil, fmt.Errorf("BOXD_VOLUME_LIMITS: %q is not /path=bytes", item)
		}
		out = append(out, metrics.Volume{Path: filepath.Clean(p), Limit: limit})
	}
	return out, nil
}

// serveMounts runs the memory-store sidecar: no processes, no env, only the memory volumes.
func serveMounts() error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	port := envInt("BOXD_MOUNTS_PORT", 7772)
	if port <= 0 || port > 65535 {
		return fmt.Errorf("BOXD_MOUNTS_PORT must be a port number")
	}
	checker, err := auth.Load(envStr("BOXD_SECRET_DIR", "/opt/sandbox-bridge/secret"))
	if err != nil {
		return fmt.Errorf("refusing to serve without a credential: %w", err)
	}
	cfg := mounts.Config{
		Version: version, Auth: checker, Log: log,
		Memory: envStr("BOXD_MEMORY_DIR", "/mnt/memory"),
		RW:     envStr("BOXD_MEMORY_RW_DIR", "/mnt/memory-rw"),
	}
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           mounts.New(cfg),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("boxd mounts serving", "version", version, "port", port)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-stop:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		return nil
	}
}
