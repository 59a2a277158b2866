package ports

import (
	"io"
	"sync"
	"time"
)

// bucket is the box's byte rate through its ports: a token bucket of one second's worth, shared
// by every request and connection both ways. A transfer past it waits for its bytes (it is slowed,
// never failed). Rate 0: no limit, and no wrapping at all.
type bucket struct {
	mu     sync.Mutex
	rate   int64 // bytes per second; 0: unlimited
	tokens float64
	last   time.Time
}

func (b *bucket) setRate(rate int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rate == b.rate {
		return
	}
	b.rate, b.tokens, b.last = rate, float64(rate), time.Now()
}

func (b *bucket) limited() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rate > 0
}

// chunk is how much one read or write may move at once, so no single wait grows past ~1/4 s.
func (b *bucket) chunk(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n <= 0 || b.rate <= 0 {
		return n
	}
	return min(n, int(max(b.rate/4, 512)))
}

// take spends n bytes and sleeps for as long as the bucket is in debt.
func (b *bucket) take(n int) {
	b.mu.Lock()
	if b.rate <= 0 {
		b.mu.Unlock()
		return
	}
	now := time.Now()
	b.tokens = min(float64(b.rate), b.tokens+now.Sub(b.last).Seconds()*float64(b.rate))
	b.last = now
	b.tokens -= float64(n)
	var wait time.Duration
	if b.tokens < 0 {
		wait = time.Duration(-b.tokens / float64(b.rate) * float64(time.Second))
	}
	b.mu.Unlock()
	if wait > 0 {
		time.Sleep(wait)
	}
}

// rateReader is a body read at the box's rate.
type rateReader struct {
	io.ReadCloser
	b *bucket
}

func (r *rateReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p[:r.b.chunk(len(p))])
	r.b.take(n)
	return n, err
}

// rateConn is an upgraded connection to the app, both ways at the box's rate.
type rateConn struct {
	io.ReadWriteCloser
	b *bucket
}

func (c *rateConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p[:c.b.chunk(len(p))])
	c.b.take(n)
	return n, err
}

func (c *rateConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		part := p[written : written+c.b.chunk(len(p)-written)]
		c.b.take(len(part))
		n, err := c.ReadWriteCloser.Write(part)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}
