// Package cabundle writes the CA bundle tools in a box of a gateway-mode pool trust (docs/egress.md):
// the image's own system bundle followed by the pool's CA certificates, which the egress gateway
// signs the certificates of intercepted connections with. The pool CA comes from a ConfigMap the
// kubelet updates in place (a new directory behind a `..data` symlink), so the bundle is written
// at start and again whenever that file's content changes, polled: a rotation reaches running boxes.
package cabundle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// SystemBundles are where images keep their system bundle (Debian/Ubuntu/Alpine, Fedora/RHEL,
// openSUSE, others, RHEL's extracted form); the first one there is used.
var SystemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/ssl/cert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
}

// MaxFileBytes bounds every file read: a system bundle is a few hundred KiB, a ConfigMap at most 1 MiB.
const MaxFileBytes = 4 << 20

// Interval is how often the pool CA is looked at (the kubelet itself syncs ConfigMaps every minute or so).
const Interval = 2 * time.Second

// Config says where the pool CA is and where the bundle goes.
type Config struct {
	// Source is the pool CA file (PEM certificates).
	Source string
	// Bundle is the file written: replaced atomically (a temporary file in its directory, renamed).
	Bundle string
	// System lists the system bundle candidates (default SystemBundles).
	System []string
	// Interval between looks at Source (default Interval); MaxBytes bounds reads (default MaxFileBytes).
	Interval time.Duration
	MaxBytes int64
	Log      *slog.Logger
}

// Writer keeps the bundle in step with the pool CA.
type Writer struct {
	c Config
	// What the bundle was last written from.
	written bool
	hadCA   bool
	ca      []byte
	// The last read error logged, so a lasting one is logged once.
	problem string
}

// New fills in Config's defaults.
func New(c Config) *Writer {
	if c.System == nil {
		c.System = SystemBundles
	}
	if c.Interval <= 0 {
		c.Interval = Interval
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = MaxFileBytes
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &Writer{c: c}
}

// Sync writes the bundle if the pool CA changed since the last write (or nothing was written
// yet). A missing CA file gives the system bundle alone; a CA file that cannot be read leaves a
// bundle already written as it is (and writes the system bundle alone when there is none yet).
func (w *Writer) Sync() error {
	ca, err := readBounded(w.c.Source, w.c.MaxBytes)
	present := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		if msg := err.Error(); msg != w.problem {
			w.problem = msg
			w.c.Log.Warn("pool CA unreadable; the CA bundle stays as it is", "file", w.c.Source, "error", msg)
		}
		if w.written {
			return nil
		}
	} else {
		w.problem = ""
	}
	if w.written && present == w.hadCA && bytes.Equal(ca, w.ca) {
		return nil
	}
	system, from := w.system()
	bundle := system
	if present {
		if len(bundle) > 0 {
			bundle = append(bundle, '\n')
		}
		bundle = append(bundle, ca...)
	}
	if err := writeAtomic(w.c.Bundle, bundle); err != nil {
		return fmt.Errorf("CA bundle: %w", err)
	}
	w.written, w.hadCA, w.ca = true, present, ca
	if present {
		w.c.Log.Info("CA bundle written", "bundle", w.c.Bundle, "system", from, "pool_ca", w.c.Source, "pool_ca_bytes", len(ca))
	} else {
		w.c.Log.Info("CA bundle written without the pool CA (not there)", "bundle", w.c.Bundle, "system", from, "pool_ca", w.c.Source)
	}
	return nil
}

// Run syncs every Interval until ctx ends; errors are logged and tried again on the next tick.
func (w *Writer) Run(ctx context.Context) {
	t := time.NewTicker(w.c.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.Sync(); err != nil {
				w.c.Log.Warn("CA bundle not written", "error", err.Error())
			}
		}
	}
}

// system is the first candidate that can be read, and its path ("" and none when no candidate can).
func (w *Writer) system() ([]byte, string) {
	for _, path := range w.c.System {
		b, err := readBounded(path, w.c.MaxBytes)
		if err == nil {
			return b, path
		}
		if !errors.Is(err, fs.ErrNotExist) {
			w.c.Log.Warn("system CA bundle unreadable; trying the next", "file", path, "error", err.Error())
		}
	}
	return nil, ""
}

// readBounded reads a whole file (symlinks followed) of at most max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}

// writeAtomic replaces path with data, mode 0644: readers see the old file or the new one, whole.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // gone already after the rename
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	return err
}
