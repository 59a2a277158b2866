package process

import (
	"context"
	"testing"
	"time"
)

// go test -run '^$' -bench Exec ./process: what one `echo hi` costs inside boxd (fork/exec of
// sh, output, exit through the reaper), without HTTP.
func BenchmarkExecEchoHi(b *testing.B) {
	m, err := NewManager(Config{Workdir: b.TempDir()}, NewEnv(nil))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := m.Exec(context.Background(), ExecRequest{Command: "echo hi", Timeout: time.Minute}, discard{}); err != nil {
			b.Fatal(err)
		}
	}
}

type discard struct{}

func (discard) Started(int)         {}
func (discard) Output(byte, []byte) {}
