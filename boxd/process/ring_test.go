package process

import (
	"bytes"
	"testing"

	"sandbox-bridge.io/boxd/frames"
)

func collectRing(r *ring, since int64) (int64, string, []byte) {
	from, chunks := r.since(since, nil)
	var b bytes.Buffer
	var streams []byte
	for _, c := range chunks {
		b.Write(c.Data)
		streams = append(streams, c.Stream)
	}
	return from, b.String(), streams
}

func TestRingKeepsOrderAndOffsets(t *testing.T) {
	r := &ring{limit: 1 << 20}
	r.append(frames.Stdout, []byte("abc"))
	r.append(frames.Stdout, []byte("def")) // merged with the previous chunk
	r.append(frames.Stderr, []byte("XY"))
	r.append(frames.Stdout, []byte("g"))
	if len(r.chunks) != 3 {
		t.Fatalf("chunks = %d, want 3", len(r.chunks))
	}
	from, s, streams := collectRing(r, 0)
	if from != 0 || s != "abcdefXYg" || !bytes.Equal(streams, []byte{1, 2, 1}) {
		t.Fatalf("since 0: %d %q %v", from, s, streams)
	}
	from, s, streams = collectRing(r, 4)
	if from != 4 || s != "efXYg" || !bytes.Equal(streams, []byte{1, 2, 1}) {
		t.Fatalf("since 4: %d %q %v", from, s, streams)
	}
	if from, s, _ = collectRing(r, 100); from != 9 || s != "" {
		t.Fatalf("since beyond the end: %d %q", from, s)
	}
}

func TestRingEvictsOldestAndSaysFromWhere(t *testing.T) {
	r := &ring{limit: 100 + chunkOverhead}
	data := bytes.Repeat([]byte("0123456789"), 30) // 300 bytes
	for i := 0; i < len(data); i += 10 {
		r.append(frames.Stdout, data[i:i+10])
	}
	if r.end != 300 || r.start != 200 {
		t.Fatalf("start %d end %d, want 200 300", r.start, r.end)
	}
	from, s, _ := collectRing(r, 0)
	if from != 200 || s != string(data[200:]) {
		t.Fatalf("since 0 after eviction: from %d, %q", from, s)
	}
	// A process alternating streams pays the per-chunk overhead: memory stays bounded.
	r = &ring{limit: 1000}
	for i := 0; i < 10000; i++ {
		r.append(byte(1+i%2), []byte("x"))
	}
	if r.cost > r.limit || len(r.chunks) > 1000/chunkOverhead {
		t.Fatalf("cost %d chunks %d over the limit %d", r.cost, len(r.chunks), r.limit)
	}
	if r.end != 10000 || r.start != r.end-int64(len(r.chunks)) {
		t.Fatalf("start %d end %d chunks %d", r.start, r.end, len(r.chunks))
	}
}
