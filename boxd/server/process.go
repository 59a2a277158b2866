package server

import (
	"encoding/base64"
	"net/http"
	"sync"
	"time"

	"sandbox-bridge.io/boxd/errs"
	"sandbox-bridge.io/boxd/frames"
	"sandbox-bridge.io/boxd/process"
)

var shuttingDown = map[string]string{"type": "internal_error", "message": "the box is shutting down"}

// frameStream is a 200 answer of frames; the status line goes out with the first frame, so
// a refusal before it is still a JSON error.
type frameStream struct {
	w     http.ResponseWriter
	fw    *frames.Writer
	begin sync.Once
}

func newFrameStream(w http.ResponseWriter) *frameStream {
	return &frameStream{w: w, fw: frames.NewWriter(w, http.NewResponseController(w).Flush)}
}

func (fs *frameStream) start() {
	fs.begin.Do(func() {
		fs.w.Header().Set("Content-Type", frames.ContentType)
		fs.w.Header().Set("Cache-Control", "no-store")
		fs.w.WriteHeader(http.StatusOK)
	})
}

// --- exec ------------------------------------------------------------------------------------

type execBody struct {
	Command        string            `json:"command"`
	Cwd            string            `json:"cwd"`
	Env            map[string]string `json:"env"`
	Stdin          *string           `json:"stdin"`
	TimeoutMs      int64             `json:"timeout_ms"`
	MaxOutputBytes int64             `json:"max_output_bytes"`
	MaxConcurrent  int               `json:"max_concurrent"`
	Coalesce       bool              `json:"coalesce"`
}

// execOutput sends an exec's events as frames: each flushed at once (a caller showing output
// as it comes), or, with coalesce, left in the response's buffer to go out when it fills or the
// command ends (a caller that reads the answer whole: one write for a short command instead of
// one per frame and one for the end, and a Content-Length instead of chunks).
type execOutput struct {
	*frameStream
	flush bool
}

func (o execOutput) Started(pid int) {
	o.start()
	_ = o.fw.WriteJSON(frames.Start, map[string]int{"pid": pid})
	if o.flush {
		_ = o.fw.Flush()
	}
}

func (o execOutput) Output(stream byte, p []byte) {
	o.start()
	if o.flush {
		_ = o.fw.WriteFlush(stream, p)
	} else {
		_ = o.fw.Write(stream, p)
	}
}

func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	var body execBody
	if err := readJSON(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	req := process.ExecRequest{
		Command: body.Command, Cwd: body.Cwd, Env: body.Env,
		Timeout:        time.Duration(body.TimeoutMs) * time.Millisecond,
		MaxOutputBytes: body.MaxOutputBytes, MaxConcurrent: body.MaxConcurrent,
	}
	if body.Stdin != nil {
		b, err := base64.StdEncoding.DecodeString(*body.Stdin)
		if err != nil {
			writeError(w, errs.Invalid("stdin is not valid base64: %v", err))
			return
		}
		req.Stdin = append([]byte{}, b...) // non-nil even when empty: a pipe closed at once
	}
	out := execOutput{newFrameStream(w), !body.Coalesce}
	exit, err := s.Procs.Exec(r.Context(), req, out)
	if err != nil {
		writeError(w, err)
		return
	}
	out.start()
	if s.Procs.ShuttingDown() {
		_ = out.fw.WriteJSON(frames.Error, shuttingDown)
	} else {
		_ = out.fw.WriteJSON(frames.Exit, exit)
	}
	if out.flush {
		_ = out.fw.Flush()
	} // else the server sends what is buffered, and the end of the answer, as the handler returns
}

// --- env -------------------------------------------------------------------------------------

func (s *server) setEnv(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Set map[string]string `json:"set"`
	}
	if err := readJSON(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	count, err := s.Procs.Env.Set(body.Set)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"count": count})
}

// --- background processes --------------------------------------------------------------------

func (s *server) startProcess(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Command      string            `json:"command"`
		Cwd          string            `json:"cwd"`
		Env          map[string]string `json:"env"`
		Tag          string            `json:"tag"`
		MaxProcesses int               `json:"max_processes"`
	}
	if err := readJSON(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	info, err := s.Procs.StartProcess(process.StartRequest{
		Command: body.Command, Cwd: body.Cwd, Env: body.Env, Tag: body.Tag, MaxProcesses: body.MaxProcesses,
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *server) listProcesses(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"processes": s.Procs.Processes()})
}

func (s *server) getProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.Procs.Process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p.Info())
}

// processStream sends a process's output as frames; flushed before waiting for more.
type processStream struct {
	*frameStream
	procs *process.Manager
}

func (o processStream) Start(offset, dropped int64) error {
	o.start()
	return o.fw.WriteJSON(frames.Start, map[string]int64{"offset": offset, "dropped": dropped})
}

func (o processStream) Output(c process.Chunk) error { return o.fw.Write(c.Stream, c.Data) }
func (o processStream) Flush() error                 { return o.fw.Flush() }

func (o processStream) Exit(e process.Exit) error {
	if o.procs.ShuttingDown() {
		return o.fw.WriteJSON(frames.Error, shuttingDown)
	}
	return o.fw.WriteJSON(frames.Exit, e)
}

func (s *server) processOutput(w http.ResponseWriter, r *http.Request) {
	p, err := s.Procs.Process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := newQuery(r)
	since, follow := q.int("since", 0), q.bool("follow")
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	out := processStream{newFrameStream(w), s.Procs}
	if err := p.Stream(r.Context(), since, follow, out); err == nil {
		_ = out.fw.Flush()
	}
}

func (s *server) processStdin(w http.ResponseWriter, r *http.Request) {
	p, err := s.Procs.Process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := newQuery(r)
	eof := q.bool("eof")
	if q.err != nil {
		writeError(w, q.err)
		return
	}
	n, err := p.WriteStdin(r.Context(), r.Body, eof)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"written": n})
}

func (s *server) signalProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.Procs.Process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var body struct {
		Signal string `json:"signal"`
	}
	if err := readJSON(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	info, err := p.Signal(body.Signal)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}
