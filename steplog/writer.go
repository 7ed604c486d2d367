package steplog

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/port"
)

// Defaults of Config.
const (
	// DefaultLimit is the most bytes of lines kept of one step attempt (flowd
	// --step-log-limit).
	DefaultLimit = 1 << 20
	// DefaultFlushEvery is how long a line waits before it is appended: what a reader
	// following a running step lags by.
	DefaultFlushEvery = 250 * time.Millisecond
	// maxBatch is the most bytes of lines in one message (the server takes 1 MiB).
	maxBatch = 64 << 10
	// maxLine is the longest line kept whole; a longer one is cut into lines of it.
	maxLine = 16 << 10
	// appendTimeout bounds one append: a step never waits longer on its log.
	appendTimeout = 5 * time.Second
)

// Config configures a Sink.
type Config struct {
	Logs       port.StepLogs // where the lines go (nil: nowhere)
	Node       string        // this node (in message IDs)
	Limit      int64         // DefaultLimit when 0
	FlushEvery time.Duration // DefaultFlushEvery when 0
	Now        func() time.Time
	Logger     *slog.Logger
}

// Sink opens a Writer per step attempt.
type Sink struct {
	cfg Config
}

// NewSink is a Sink; with no Logs its writers keep nothing.
func NewSink(cfg Config) *Sink {
	if cfg.Limit <= 0 {
		cfg.Limit = DefaultLimit
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = DefaultFlushEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sink{cfg: cfg}
}

// Limit is the most bytes kept of one step attempt.
func (s *Sink) Limit() int64 { return s.cfg.Limit }

// Key is the step attempt a Writer writes for. Item is -1 for a whole step.
type Key struct {
	Run     string
	Step    string
	Item    int
	Attempt int
	Epoch   int64
}

// message is what one append holds: lines of one key, in order.
type message struct {
	Lines []client.LogLine `json:"lines"`
}

// Writer takes what one step attempt writes. Its streams (Stream) may be written from
// several goroutines; Close appends what is left and must be called once the step has
// returned.
type Writer struct {
	s    *Sink
	k    Key
	item *int
	mask *Masker

	mu       sync.Mutex
	partial  map[string][]byte // a stream's line not ended yet
	batch    []client.LogLine
	size     int
	kept     int64 // bytes of lines kept
	dropped  int64 // bytes not kept (past the limit)
	closed   bool
	timer    *time.Timer
	pending  sync.WaitGroup // the timer's flush, once scheduled
	appendMu sync.Mutex     // appends in order, one at a time
	sent     int            // messages appended (their IDs)
	nonce    string         // this writer's, in its message IDs: another writer of the same key (an attempt run again) is not taken for a retry
	failed   bool           // an append failed (logged once)
}

// Open is a Writer for k, masking with mask (nil: nothing). A nil Sink's Writer (or one
// without Logs) keeps nothing.
func (s *Sink) Open(k Key, mask *Masker) *Writer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	w := &Writer{s: s, k: k, mask: mask, partial: map[string][]byte{}, nonce: hex.EncodeToString(b[:])}
	if k.Item >= 0 {
		item := k.Item
		w.item = &item
	}
	return w
}

func (w *Writer) keeps() bool { return w != nil && w.s != nil && w.s.cfg.Logs != nil }

// Stream is an io.Writer for one of the step's streams (stdout, stderr...). It never
// fails: a step does not fail because its log could not be kept.
func (w *Writer) Stream(name string) io.Writer {
	if !w.keeps() {
		return io.Discard
	}
	return streamWriter{w, name}
}

type streamWriter struct {
	w    *Writer
	name string
}

func (s streamWriter) Write(p []byte) (int, error) {
	s.w.write(s.name, p)
	return len(p), nil
}

// Line writes one whole line on stream.
func (w *Writer) Line(stream, line string) {
	if !w.keeps() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.addLocked(stream, []byte(line))
}

func (w *Writer) write(stream string, p []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	buf := append(w.partial[stream], p...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		w.addLocked(stream, bytes.TrimSuffix(buf[:i], []byte("\r")))
		buf = buf[i+1:]
	}
	for len(buf) >= maxLine {
		w.addLocked(stream, buf[:maxLine])
		buf = buf[maxLine:]
	}
	w.partial[stream] = append(w.partial[stream][:0:0], buf...)
}

// addLocked adds a line to the batch, or counts it as dropped past the limit.
func (w *Writer) addLocked(stream string, line []byte) {
	n := int64(len(line)) + 1
	if w.dropped > 0 || w.kept+n > w.s.cfg.Limit {
		if w.dropped == 0 {
			w.appendLineLocked("flow", fmt.Sprintf("[flow: log truncated: this attempt printed more than %d bytes (flowd --step-log-limit); what follows is not kept]", w.s.cfg.Limit))
		}
		w.dropped += n
		return
	}
	w.kept += n
	w.appendLineLocked(stream, w.mask.String(string(line)))
}

func (w *Writer) appendLineLocked(stream, line string) {
	w.batch = append(w.batch, client.LogLine{Step: w.k.Step, Item: w.item, Attempt: w.k.Attempt, Epoch: w.k.Epoch,
		Stream: stream, Line: line, At: w.s.cfg.Now().UTC().Format(time.RFC3339Nano)})
	w.size += len(line) + 64
	if w.size >= maxBatch {
		w.sendLocked(w.takeLocked())
		w.mu.Lock()
		return
	}
	if w.timer == nil {
		w.pending.Add(1)
		w.timer = time.AfterFunc(w.s.cfg.FlushEvery, func() {
			defer w.pending.Done()
			w.mu.Lock()
			w.sendLocked(w.takeLocked())
		})
	}
}

// takeLocked takes the batch (and the timer's turn: the next line schedules another).
func (w *Writer) takeLocked() []client.LogLine {
	lines := w.batch
	w.batch, w.size = nil, 0
	if w.timer != nil && w.timer.Stop() {
		w.pending.Done() // it will not run
	}
	w.timer = nil
	return lines
}

// sendLocked appends lines as one message. It is called with mu held and returns with
// it given back: appendMu is taken before mu is given back, so that messages are
// appended in the order their lines were written.
func (w *Writer) sendLocked(lines []client.LogLine) {
	if len(lines) == 0 {
		w.mu.Unlock()
		return
	}
	w.appendMu.Lock()
	w.mu.Unlock()
	defer w.appendMu.Unlock()
	data, err := json.Marshal(message{Lines: lines})
	if err != nil {
		return
	}
	id := w.k.Run + "\x00" + w.k.Step + "\x00" + strconv.Itoa(w.k.Item) + "\x00" + strconv.Itoa(w.k.Attempt) + "\x00" +
		strconv.FormatInt(w.k.Epoch, 10) + "\x00" + w.s.cfg.Node + "\x00" + w.nonce + "\x00" + strconv.Itoa(w.sent)
	w.sent++
	ctx, cancel := context.WithTimeout(context.Background(), appendTimeout)
	defer cancel()
	if err := w.s.cfg.Logs.Append(ctx, w.k.Run, id, data); err != nil && !w.failed {
		w.failed = true
		w.s.cfg.Logger.Warn("could not keep a step's log lines (the step goes on; later lines are tried again)",
			"run", w.k.Run, "step", w.k.Step, "item", w.k.Item, "attempt", w.k.Attempt, "lines", len(lines), "err", err)
	}
}

// Close appends what is left: the lines not ended yet, a mark of how much was not kept,
// and the batch. Whatever the step writes after is dropped.
func (w *Writer) Close() {
	if !w.keeps() {
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	for _, stream := range []string{"stdout", "stderr", "log", "http"} {
		if p := w.partial[stream]; len(p) > 0 {
			w.addLocked(stream, p)
		}
	}
	for stream, p := range w.partial {
		if len(p) > 0 && stream != "stdout" && stream != "stderr" && stream != "log" && stream != "http" {
			w.addLocked(stream, p)
		}
	}
	w.partial = nil
	if w.dropped > 0 {
		w.appendLineLocked("flow", fmt.Sprintf("[flow: %d bytes of this attempt's output were not kept]", w.dropped))
	}
	w.closed = true
	w.sendLocked(w.takeLocked())
	w.pending.Wait()
}
