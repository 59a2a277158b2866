package source

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
)

// File is a Source reading a JSON document (see Parse) from a path. Run polls it: a cheap stat
// every Interval, and the file is re-read when its size, modification time or identity changed
// (a Kubernetes Secret or ConfigMap volume swaps a symlink; os.Stat follows it). Every
// HashEvery it is also re-read and compared by content, for writers that keep mtime and size.
// A document that does not parse is logged and ignored: the last good state stays in force.
type File struct {
	Path      string
	Interval  time.Duration // default 250 ms: a change is in force within this, well under 1 s
	HashEvery time.Duration // default 5 s
	Log       *slog.Logger
	// OnLoad, when set, is called after every load attempt (for metrics): ok false = refused.
	OnLoad func(ok bool)

	cur  atomic.Pointer[State]
	sum  [sha256.Size]byte
	stat os.FileInfo
}

// Current returns the last good state, nil before the first.
func (f *File) Current() *State { return f.cur.Load() }

// Load reads the file once, now; an error leaves the current state in force.
func (f *File) Load() error {
	fi, err := os.Stat(f.Path)
	if err != nil {
		f.loaded(false)
		return err
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		f.loaded(false)
		return err
	}
	f.stat = fi
	sum := sha256.Sum256(b)
	if f.cur.Load() != nil && bytes.Equal(sum[:], f.sum[:]) {
		return nil
	}
	s, warnings, err := Parse(b)
	if err != nil {
		f.loaded(false)
		return err
	}
	for _, w := range warnings {
		f.log().Warn("policy", "path", f.Path, "warning", w)
	}
	f.sum = sum
	f.cur.Store(s)
	f.loaded(true)
	f.log().Info("policy loaded", "path", f.Path, "pools", len(s.Pools), "boxes", len(s.Boxes))
	return nil
}

func (f *File) loaded(ok bool) {
	if f.OnLoad != nil {
		f.OnLoad(ok)
	}
}

func (f *File) log() *slog.Logger {
	if f.Log != nil {
		return f.Log
	}
	return slog.Default()
}

// Run polls until ctx ends.
func (f *File) Run(ctx context.Context) {
	interval, hashEvery := f.Interval, f.HashEvery
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	if hashEvery <= 0 {
		hashEvery = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	lastHash := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(f.Path)
		changed := err == nil && (f.stat == nil || fi.Size() != f.stat.Size() ||
			!fi.ModTime().Equal(f.stat.ModTime()) || !os.SameFile(fi, f.stat))
		if changed || f.cur.Load() == nil || time.Since(lastHash) >= hashEvery {
			lastHash = time.Now()
			if err := f.Load(); err != nil && changed {
				f.log().Error("policy not loaded; the previous one stays in force", "path", f.Path, "error", err.Error())
			}
		}
	}
}
