package process

// Chunk is a piece of a background process's output: which stream, where it starts in the
// combined output, and its bytes (never modified once handed out).
type Chunk struct {
	Stream byte // frames.Stdout or frames.Stderr
	Offset int64
	Data   []byte
}

// chunkOverhead is what one chunk costs beyond its bytes; counted against the limit so that a
// process alternating one-byte writes between stdout and stderr cannot grow memory unbounded.
const chunkOverhead = 64

// mergeMax is the size up to which consecutive output of one stream is kept as one chunk.
const mergeMax = 64 << 10

// ring keeps the most recent output of one process, up to limit bytes, addressed by offsets
// into the combined output (bytes ever read). Not safe for concurrent use: Proc locks it.
type ring struct {
	limit  int64
	chunks []Chunk // oldest first
	start  int64   // offset of the oldest byte kept (= bytes evicted)
	end    int64   // offset after the newest byte (= bytes ever appended)
	cost   int64   // bytes kept + chunkOverhead per chunk
}

func (r *ring) append(stream byte, p []byte) {
	if len(p) == 0 {
		return
	}
	if n := len(r.chunks); n > 0 && r.chunks[n-1].Stream == stream && len(r.chunks[n-1].Data)+len(p) <= mergeMax {
		// Appending past a slice's length never touches bytes a reader holds.
		last := &r.chunks[n-1]
		last.Data = append(last.Data, p...)
	} else {
		r.chunks = append(r.chunks, Chunk{Stream: stream, Offset: r.end, Data: append([]byte(nil), p...)})
		r.cost += chunkOverhead
	}
	r.end += int64(len(p))
	r.cost += int64(len(p))
	r.evict()
}

func (r *ring) evict() {
	drop := 0
	for r.cost > r.limit && drop < len(r.chunks) {
		c := &r.chunks[drop]
		excess := r.cost - r.limit
		if excess >= int64(len(c.Data)) {
			r.start = c.Offset + int64(len(c.Data))
			r.cost -= int64(len(c.Data)) + chunkOverhead
			drop++
			continue
		}
		// Trim the front of the oldest chunk (re-slicing: readers keep their own view).
		c.Data = c.Data[excess:]
		c.Offset += excess
		r.start = c.Offset
		r.cost -= excess
	}
	if drop > 0 {
		// Copy down instead of re-slicing so the backing array does not grow forever.
		n := copy(r.chunks, r.chunks[drop:])
		clear(r.chunks[n:])
		r.chunks = r.chunks[:n]
	}
}

// since returns the chunks holding output from offset off on (the first one trimmed to start
// there) and the offset they actually start at, which is later than off when that output was
// already evicted. An offset beyond the end is treated as the end.
func (r *ring) since(off int64, out []Chunk) (from int64, chunks []Chunk) {
	from = max(off, r.start)
	from = min(from, r.end)
	chunks = out[:0]
	for _, c := range r.chunks {
		cend := c.Offset + int64(len(c.Data))
		if cend <= from {
			continue
		}
		if c.Offset < from {
			c.Data = c.Data[from-c.Offset:]
			c.Offset = from
		}
		chunks = append(chunks, c)
	}
	return from, chunks
}
