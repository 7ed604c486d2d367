package logstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Writer appends entries to the log: Write encodes them on the caller's goroutine, and
// they go out either inline (a lone writer on an idle log publishes its own message) or
// with whatever else queued while the previous publish was in flight (group commit: one
// publish in flight, so concurrent writers share an fsync). It hands each message's
// Futures to the Applier, and applies its own message from memory when it is the next
// (Applier.applyOwn). Start it, Stop it.
type Writer struct {
	a              *Applier
	dst            port.Stream // the log
	node           string
	maxOutput      int // the step output limit in force (Config.MaxOutputBytes, fitted to the server)
	maxBytes       int // the most one message's entries may take (the server's max_payload less the envelope)
	maxEntries     int
	noteDelay      time.Duration
	publishTimeout time.Duration
	noOwnApply     bool
	hooks          *testhooks.Hooks // PassQueue (production's zero value unless a test's)
	order          func([]checkpoint.Entry)
	log            *slog.Logger
	nonce          string
	counter        atomic.Uint64

	// The queue of the group commit. Exactly one publish is in flight at a time (busy),
	// made by the writer goroutine, or inline by a Write that found the log idle.
	wq struct {
		sync.Mutex
		reqs    []*request    // one per Write, in order
		busy    bool          // a publish is in flight
		closed  bool          // Stop began: no new requests, no new inline publishes
		space   chan struct{} // closed (and replaced) when reqs drop below the bound
		company int           // writes in the last message plus those queued at its ack
		notes   int           // notes among reqs
		noteDue bool          // the oldest queued note has waited NoteDelay
		timer   *time.Timer   // makes notes due; nil when none is armed
		ctx     context.Context
		cancel  context.CancelFunc
	}
	wake chan struct{} // cap 1: the writer goroutine should look at the queue

	// decodes hands a message being published to the decoder goroutine, which decodes
	// it while the publish is in flight (unbuffered: a send succeeds only when the
	// decoder is idle, and then it finishes the job).
	decodes chan *decodeJob

	stopOnce sync.Once
	stopped  chan struct{}  // closed when Stop begins
	wg       sync.WaitGroup // the writer and decoder goroutines, and inline publishes
}

func newWriter(cfg Config, a *Applier, maxOutput, maxBytes int, hooks *testhooks.Hooks, log *slog.Logger) *Writer {
	w := &Writer{a: a, dst: cfg.Stream, node: cfg.Node,
		maxOutput: maxOutput, maxBytes: maxBytes, maxEntries: cfg.MaxBatchEntries, noteDelay: cfg.NoteDelay,
		publishTimeout: cfg.PublishTimeout, noOwnApply: cfg.NoOwnApply, hooks: hooks, order: cfg.Order, log: log,
		nonce: nonceOr(cfg.Nonce), wake: make(chan struct{}, 1), decodes: make(chan *decodeJob),
		stopped: make(chan struct{})}
	w.wq.space = make(chan struct{})
	return w
}

// Start starts the group commit's writer goroutine and the decoder. Writes made before
// Start wait in the queue. A second Start does nothing; Start after Stop returns
// ErrStopped.
func (w *Writer) Start(ctx context.Context) error {
	w.wq.Lock()
	defer w.wq.Unlock()
	switch {
	case w.wq.closed:
		return ErrStopped
	case w.wq.ctx != nil:
		return nil
	}
	w.wq.ctx, w.wq.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.wg.Add(2)
	go w.runDecoder(w.wq.ctx)
	go w.runWriter(w.wq.ctx)
	return nil
}

// Stop stops taking writes, ends the publish in flight (its writers get
// ErrAppendUncertain unless it was acknowledged) and waits for the writer's goroutines.
// Queued writes get ErrStopped. Safe to call twice and before Start.
func (w *Writer) Stop() {
	w.stopOnce.Do(func() {
		w.wq.Lock()
		w.wq.closed = true // after this no inline publish starts (they wg.Add under this lock)
		cancel := w.wq.cancel
		w.wq.Unlock()
		close(w.stopped)
		if cancel != nil {
			cancel()
		}
		w.wg.Wait()
		w.drainQueue() // the writer goroutine did, unless it never ran
	})
}

// MaxOutputBytes is the largest step output the writer accepts: the configured limit,
// or less when the NATS server's max_payload does not leave room for it (Open warns).
func (w *Writer) MaxOutputBytes() int { return w.maxOutput }

type request struct {
	data     [][]byte // the entries, encoded, in the order written
	size     int      // bytes they take in a message
	format   int      // the log format they are encoded in (the cluster version's when encoded)
	revision int      // the revision they need (format 1: RevisionOf; format 2: Revision)
	assigns  []string // runs they assign: two assigns of a run in one message would share an epoch
	note     bool     // rides with the next message, or goes out within NoteDelay
	future   *Future
}

// Write appends entries to the log in one message, in this order, and returns their
// Future; the caller awaits it or not. Each entry is judged on its own, on the state
// the ones before it left (a run's last commit and its completion cost one synced write,
// not two). A write that cannot be made is refused before publishing, through the
// Future: an invalid entry (checkpoint.ErrInvalidEntry), more than MaxBatchEntries
// entries, an output above MaxOutputBytes or entries that together do not fit one
// message (ErrOutputTooLarge), a stopped writer (ErrStopped), a failed applier (its
// error). ctx bounds only the wait for room in a full queue; Await takes its own.
//
// How it goes out:
//   - A lone writer publishes the message and applies it on its own goroutine, so that
//     Write returns with the Future resolved: when nothing is in flight, nothing but
//     notes is queued (they go first, in the same message), and the last message had no
//     company. That costs one publish and no hand-off to the writer goroutine and back
//     (docs/perf.md, W2). A caller whose ctx deadline comes before PublishTimeout is
//     queued instead, so that its Await can keep that deadline.
//   - Otherwise the entries join the group commit.
//   - A note, a write whose entries are all step starts or non-final failures (entries
//     whose writer does not wait: a property of the entries, not an option), does not
//     wake the writer: it rides in the next message another write makes, and goes out on
//     its own only if none comes within NoteDelay. A lone writer's step start and its
//     commit then cost one publish, not two. Awaiting a note may take NoteDelay.
//
// A writer's entries never pass each other, whichever way each went out.
func (w *Writer) Write(ctx context.Context, entries ...checkpoint.Entry) *Future {
	if w.order != nil {
		w.order(entries)
	}
	r, err := w.encode(entries)
	if err != nil {
		return failedFuture(w.a, len(entries), err)
	}
	if !r.note {
		if pctx, batch, ok := w.takeIdle(ctx, r); ok {
			w.publish(pctx, batch)
			w.releaseIdle()
			return r.future
		}
	}
	if err := w.enqueue(ctx, r); err != nil {
		r.future.fail(err)
	}
	return r.future
}

// isNote reports whether an entry's writer goes on without its outcome: a step's start,
// a failed attempt that will be retried.
func isNote(e *checkpoint.Entry) bool {
	return e.Kind == checkpoint.KindStart || (e.Kind == checkpoint.KindFail && !e.Final)
}

func (w *Writer) enqueue(ctx context.Context, r *request) error {
	for {
		select {
		case <-w.a.failed:
			return w.a.Err()
		default:
		}
		w.wq.Lock()
		if w.wq.closed {
			w.wq.Unlock()
			return ErrStopped
		}
		if len(w.wq.reqs) < w.queueBound() {
			w.wq.reqs = append(w.wq.reqs, r)
			if r.note {
				w.wq.notes++
				if w.wq.timer == nil {
					w.wq.timer = time.AfterFunc(w.noteDelay, w.notesDue)
				}
				w.wq.Unlock()
				return nil // no kick: it waits for company or its delay
			}
			busy := w.wq.busy
			w.wq.Unlock()
			if !busy { // else the publisher in flight takes it next
				w.kick()
			}
			return nil
		}
		space := w.wq.space
		w.wq.Unlock()
		select {
		case <-space:
		case <-w.stopped:
			return ErrStopped
		case <-w.a.failed:
			return w.a.Err()
		case <-ctx.Done():
			return fmt.Errorf("logstream: write: %w", ctx.Err())
		}
	}
}

// notesDue makes the queued notes publishable on their own (timer goroutine).
func (w *Writer) notesDue() {
	w.wq.Lock()
	w.wq.timer = nil
	w.wq.noteDue = w.wq.notes > 0
	w.wq.Unlock()
	w.kick()
}

// readyLocked reports whether the queue holds something to publish now.
func (w *Writer) readyLocked() bool {
	return len(w.wq.reqs) > w.wq.notes || (w.wq.notes > 0 && w.wq.noteDue)
}

// queueBound is how many writes may wait for the writer before Write blocks.
func (w *Writer) queueBound() int { return 4 * w.maxEntries }

func (w *Writer) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// takeIdle makes the caller the publisher if the writer is started and idle and nothing
// but notes is queued: the batch is those notes (queued first) and r. A caller whose
// deadline comes before PublishTimeout is not made the publisher: a publish runs to its
// end (the writer must learn whether the message landed), and the caller would wait it
// out past its own deadline; queued, it awaits its Future with its deadline.
func (w *Writer) takeIdle(ctx context.Context, r *request) (context.Context, []*request, bool) {
	select {
	case <-w.a.failed:
		return nil, nil, false
	default:
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < w.publishTimeout {
		return nil, nil, false
	}
	w.wq.Lock()
	defer w.wq.Unlock()
	// Only a lone writer publishes inline: when the last message had company, the next
	// writers are about to queue, and a message of one entry would make them all wait a
	// whole publish (measured: 64 writers then alternate messages of 1 and 63 entries).
	if w.wq.busy || w.wq.closed || w.wq.ctx == nil || w.wq.company > 1 {
		return nil, nil, false
	}
	if w.hooks.PassQueue {
		w.wq.busy = true
		w.wg.Add(1)
		return w.wq.ctx, []*request{r}, true
	}
	if len(w.wq.reqs) > w.wq.notes {
		return nil, nil, false // a write is queued: going first would pass it
	}
	fits := batcher{w: w}
	for _, q := range w.wq.reqs {
		fits.add(q)
	}
	if len(fits.batch) < len(w.wq.reqs) || !fits.add(r) {
		return nil, nil, false // more than one message: the writer's job
	}
	b := batcher{w: w, batch: make([]*request, 0, len(w.wq.reqs)+1)}
	w.takeLocked(&b)
	b.add(r)
	w.wq.busy = true
	w.wg.Add(1) // Stop waits for this publish like for the writer's
	return w.wq.ctx, b.batch, true
}

// releaseIdle ends an inline publish; what queued meanwhile goes to the writer.
func (w *Writer) releaseIdle() {
	w.wq.Lock()
	w.wq.busy = false
	w.wq.company = 1 + len(w.wq.reqs) - w.wq.notes
	queued := w.readyLocked()
	w.wq.Unlock()
	w.wg.Done()
	if queued {
		w.kick()
	}
}

// runWriter is the group commit: it packs whatever queued while the previous publish
// was in flight into one message, with exactly one publish in flight and no timer, so
// a lone writer pays one publish and many writers share one fsync. (A linger timer was
// measured and gained nothing here: docs/perf.md.)
func (w *Writer) runWriter(ctx context.Context) {
	defer w.wg.Done()
	for {
		select {
		case <-w.wake:
		case <-w.stopped:
			w.drainQueue()
			return
		}
		w.wq.Lock()
		if w.wq.busy || !w.readyLocked() {
			w.wq.Unlock()
			continue // an inline publish is in flight (it kicks when it ends), or only notes wait
		}
		w.wq.busy = true
		w.wq.Unlock()
		for w.publishNext(ctx) {
		}
	}
}

// publishNext publishes one batch from the queue, or ends the caller's turn as the
// publisher (busy) when the queue is empty.
func (w *Writer) publishNext(ctx context.Context) bool {
	b := batcher{w: w, batch: make([]*request, 0, 16)}
	w.wq.Lock()
	if !w.readyLocked() {
		w.wq.busy = false
		w.wq.Unlock()
		return false
	}
	w.takeLocked(&b)
	w.wq.Unlock()
	w.publish(ctx, b.batch)
	writes := 0
	for _, r := range b.batch {
		if !r.note {
			writes++
		}
	}
	w.wq.Lock()
	w.wq.company = min(writes+len(w.wq.reqs)-w.wq.notes, w.maxEntries)
	w.wq.Unlock()
	return true
}

// takeLocked moves queued requests into b while they fit.
func (w *Writer) takeLocked(b *batcher) {
	n := 0
	for n < len(w.wq.reqs) && b.add(w.wq.reqs[n]) {
		if w.wq.reqs[n].note {
			w.wq.notes--
		}
		n++
	}
	if w.wq.notes == 0 {
		w.wq.noteDue = false
	}
	if n == 0 {
		return
	}
	bound := w.queueBound()
	wasFull := len(w.wq.reqs) >= bound
	rest := copy(w.wq.reqs, w.wq.reqs[n:])
	clear(w.wq.reqs[rest:])
	w.wq.reqs = w.wq.reqs[:rest]
	if wasFull && rest < bound {
		close(w.wq.space)
		w.wq.space = make(chan struct{})
	}
}

type batcher struct {
	w        *Writer
	batch    []*request
	size     int
	entries  int
	assigned map[string]bool
}

// add takes r into the batch, or reports that it must open the next one. A write is
// never split: its entries share one message.
func (b *batcher) add(r *request) bool {
	// One message has one format: a write encoded before the cluster version moved
	// goes in a message of its own.
	if len(b.batch) > 0 && (b.size+r.size > b.w.maxBytes || b.entries+len(r.data) > b.w.maxEntries || r.format != b.batch[0].format) {
		return false
	}
	// Two assigns of one run in one message would share an epoch.
	for _, run := range r.assigns {
		if b.assigned[run] {
			return false
		}
	}
	for _, run := range r.assigns {
		if b.assigned == nil {
			b.assigned = map[string]bool{}
		}
		b.assigned[run] = true
	}
	b.size += r.size
	b.entries += len(r.data)
	b.batch = append(b.batch, r)
	return true
}

func (w *Writer) drainQueue() {
	w.wq.Lock()
	reqs := w.wq.reqs
	w.wq.reqs, w.wq.closed, w.wq.notes = nil, true, 0
	if w.wq.timer != nil {
		w.wq.timer.Stop()
		w.wq.timer = nil
	}
	w.wq.Unlock()
	for _, r := range reqs {
		r.future.fail(ErrStopped)
	}
}

func (w *Writer) publish(ctx context.Context, batch []*request) {
	id := w.node + "." + w.nonce + "." + strconv.FormatUint(w.counter.Add(1), 36)
	futures := make([]*Future, len(batch))
	n := 0
	for _, r := range batch {
		n += len(r.data)
	}
	datas := make([][]byte, 0, n)
	revision := 1
	for i, r := range batch {
		futures[i] = r.future
		datas = append(datas, r.data...)
		revision = max(revision, r.revision)
	}
	w.a.expect(id, futures)

	data := checkpoint.EncodeEnvelopeIn(batch[0].format, w.node, revision, datas)
	job := w.predecode(data)
	pctx, cancel := context.WithTimeout(ctx, w.publishTimeout)
	defer cancel()
	retry := backoff.Policy{Base: 20 * time.Millisecond, Cap: time.Second}
	for attempt := 0; ; attempt++ {
		// The message ID makes a retried publish a duplicate, not a second entry.
		seq, err := w.dst.Publish(pctx, id, data)
		if err == nil {
			w.applyOwn(id, seq, data, job)
			return // else the applier resolves the futures
		}
		if errors.Is(err, port.ErrNotFound) || errors.Is(err, port.ErrTooLarge) {
			w.a.abandon(id, fmt.Errorf("%w: %v", ErrAppendUncertain, err))
			return
		}
		w.log.Warn("log publish failed; retrying", "err", err, "attempt", attempt, "entries", n)
		if retry.Sleep(pctx, attempt) != nil {
			w.a.abandon(id, fmt.Errorf("%w: publish of %d entries failed for %s: %v", ErrAppendUncertain, n, w.publishTimeout, err))
			return
		}
	}
}

// applyOwn hands the message just acknowledged at seq to the applier to apply from
// memory (Applier.applyOwn), with its entries if the decoder decoded them meanwhile.
func (w *Writer) applyOwn(id string, seq uint64, data []byte, job *decodeJob) {
	if w.noOwnApply {
		return
	}
	var entries []checkpoint.Entry // nil: the apply decodes (the decoder was busy, or failed: the apply's error names seq)
	if job != nil && job.wait() == nil {
		entries = job.entries
	}
	w.a.applyOwn(id, seq, data, entries)
}

// nonceOr is nonce, or a random one: it tells this writer's message IDs from those of
// the node's earlier lives (a restarted node's counter starts again).
func nonceOr(nonce string) string {
	if nonce != "" {
		return nonce
	}
	return strconv.FormatUint(rand.Uint64(), 36)
}
