package logstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/flowrun/flow/checkpoint"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/backoff"
)

type request struct {
	data   []byte
	note   bool // AppendNote: rides with the next message, or goes out within NoteDelay
	kind   checkpoint.Kind
	run    string
	ticket *Ticket
	then   *request // the next entry that must share this one's message (AppendAll)
}

// chain calls fn for r and the entries that must share its message.
func (r *request) chain(fn func(*request)) {
	for ; r != nil; r = r.then {
		fn(r)
	}
}

// Append validates and queues an entry for the next log message. The returned ticket's
// Await gives the outcome.
func (l *Log) Append(ctx context.Context, entry checkpoint.Entry) (*Ticket, error) {
	r, err := l.encode(entry)
	if err != nil {
		return nil, err
	}
	return r.ticket, l.enqueue(ctx, r)
}

// AppendNote queues an entry whose writer does not wait for it (a step's start, a
// retry's failure): it rides in the next message another write makes, and goes out on
// its own only if none comes within NoteDelay. A lone writer's note and its next write
// then cost one publish, not two (docs/perf.md).
func (l *Log) AppendNote(ctx context.Context, entry checkpoint.Entry) (*Ticket, error) {
	r, err := l.encode(entry)
	if err != nil {
		return nil, err
	}
	r.note = true
	return r.ticket, l.enqueue(ctx, r)
}

// AppendAll queues entries that go into one log message together, in this order (so a
// run's last commit and its completion cost one synced write, not two). Each has its own
// ticket and outcome: a message's entries are applied one after the other, each judged on
// the state the ones before it left.
func (l *Log) AppendAll(ctx context.Context, entries ...checkpoint.Entry) ([]*Ticket, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	head, tickets, err := l.encodeAll(entries)
	if err != nil {
		return nil, err
	}
	return tickets, l.enqueue(ctx, head)
}

// encodeAll encodes entries into a chain of requests that must share one message.
func (l *Log) encodeAll(entries []checkpoint.Entry) (*request, []*Ticket, error) {
	if len(entries) == 0 {
		return nil, nil, fmt.Errorf("%w: no entries to write", checkpoint.ErrInvalidEntry)
	}
	if len(entries) > l.cfg.MaxBatchEntries {
		return nil, nil, fmt.Errorf("%w: %d entries for one message, at most %d", checkpoint.ErrInvalidEntry, len(entries), l.cfg.MaxBatchEntries)
	}
	var head, tail *request
	tickets := make([]*Ticket, len(entries))
	size := 0
	for i, e := range entries {
		r, err := l.encode(e)
		if err != nil {
			return nil, nil, err
		}
		if size += len(r.data) + 1; size > l.maxBytes {
			return nil, nil, fmt.Errorf("%w: %d entries of %d bytes together do not fit one log message (at most %d)", ErrOutputTooLarge, len(entries), size, l.maxBytes)
		}
		if head == nil {
			head = r
		} else {
			tail.then = r
		}
		tail, tickets[i] = r, r.ticket
	}
	return head, tickets, nil
}

func (l *Log) encode(entry checkpoint.Entry) (*request, error) {
	if entry.At.IsZero() {
		entry.At = time.Now().UTC()
	}
	if err := entry.Validate(); err != nil {
		return nil, err
	}
	if len(entry.Output) > l.cfg.MaxOutputBytes {
		return nil, fmt.Errorf("%w: step %q item %d output is %d bytes, the limit is %d: write large results elsewhere and return a reference",
			ErrOutputTooLarge, entry.Step, entry.Item, len(entry.Output), l.cfg.MaxOutputBytes)
	}
	data, err := json.Marshal(&entry)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %v", checkpoint.ErrInvalidEntry, err)
	}
	if len(data) > l.maxBytes {
		return nil, fmt.Errorf("%w: the encoded entry is %d bytes, a log message holds at most %d", ErrOutputTooLarge, len(data), l.maxBytes)
	}
	return &request{data: data, kind: entry.Kind, run: entry.Run, ticket: &Ticket{log: l, done: make(chan struct{})}}, nil
}

func (l *Log) enqueue(ctx context.Context, r *request) error {
	for {
		select {
		case <-l.failed:
			return l.Err()
		default:
		}
		l.wq.Lock()
		if l.wq.closed {
			l.wq.Unlock()
			return ErrStopped
		}
		if len(l.wq.reqs) < l.queueBound() {
			l.wq.reqs = append(l.wq.reqs, r)
			if r.note {
				l.wq.notes++
				if l.wq.timer == nil {
					l.wq.timer = time.AfterFunc(l.cfg.NoteDelay, l.notesDue)
				}
				l.wq.Unlock()
				return nil // no kick: it waits for company or its delay
			}
			busy := l.wq.busy
			l.wq.Unlock()
			if !busy { // else the publisher in flight takes it next
				l.kick()
			}
			return nil
		}
		space := l.wq.space
		l.wq.Unlock()
		select {
		case <-space:
		case <-l.stopped:
			return ErrStopped
		case <-l.failed:
			return l.Err()
		case <-ctx.Done():
			return fmt.Errorf("logstream: append: %w", ctx.Err())
		}
	}
}

// notesDue makes the queued notes publishable on their own (timer goroutine).
func (l *Log) notesDue() {
	l.wq.Lock()
	l.wq.timer = nil
	l.wq.noteDue = l.wq.notes > 0
	l.wq.Unlock()
	l.kick()
}

// readyLocked reports whether the queue holds something to publish now.
func (l *Log) readyLocked() bool {
	return len(l.wq.reqs) > l.wq.notes || (l.wq.notes > 0 && l.wq.noteDue)
}

// queueBound is how many requests may wait for the writer before Append blocks.
func (l *Log) queueBound() int { return 4 * l.cfg.MaxBatchEntries }

func (l *Log) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// WriteAll appends entries that go into one message together, like AppendAll, and
// waits for their outcomes: each ticket is resolved when it returns without error.
//
// A lone writer publishes the message and applies it on its own goroutine: when nothing
// is in flight, nothing but notes is queued (they go first, in the same message), and
// the last message had no company. That costs one publish and no hand-off to the writer
// goroutine and back (docs/perf.md, W2). Otherwise the entries join the group commit.
func (l *Log) WriteAll(ctx context.Context, entries ...checkpoint.Entry) ([]*Ticket, error) {
	head, tickets, err := l.encodeAll(entries)
	if err != nil {
		return nil, err
	}
	if pctx, batch, ok := l.takeIdle(ctx, head); ok {
		l.publish(pctx, batch)
		l.releaseIdle()
	} else if err := l.enqueue(ctx, head); err != nil {
		return nil, err
	}
	for _, t := range tickets {
		if err := t.Await(ctx); err != nil {
			return tickets, err
		}
	}
	return tickets, nil
}

// takeIdle makes the caller the publisher if the log is started and idle and nothing
// but notes is queued: the batch is those notes (queued first) and head. A caller whose
// deadline comes before PublishTimeout is not made the publisher: a publish runs to its
// end (the log must learn whether the message landed), and the caller would wait it out
// past its own deadline; queued, it awaits its ticket with its deadline.
func (l *Log) takeIdle(ctx context.Context, head *request) (context.Context, []*request, bool) {
	select {
	case <-l.failed:
		return nil, nil, false
	default:
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < l.cfg.PublishTimeout {
		return nil, nil, false
	}
	l.wq.Lock()
	defer l.wq.Unlock()
	// Only a lone writer publishes inline: when the last message had company, the next
	// writers are about to queue, and a message of one entry would make them all wait a
	// whole publish (measured: 64 writers then alternate messages of 1 and 63 entries).
	if l.wq.busy || l.wq.closed || l.wq.ctx == nil || l.wq.company > 1 {
		return nil, nil, false
	}
	if l.hooks.PassQueue {
		l.wq.busy = true
		l.wg.Add(1)
		return l.wq.ctx, []*request{head}, true
	}
	if len(l.wq.reqs) > l.wq.notes {
		return nil, nil, false // a write is queued: going first would pass it
	}
	fits := batcher{l: l}
	for _, r := range l.wq.reqs {
		fits.add(r)
	}
	if len(fits.batch) < len(l.wq.reqs) || !fits.add(head) {
		return nil, nil, false // more than one message: the writer's job
	}
	b := batcher{l: l, batch: make([]*request, 0, len(l.wq.reqs)+1)}
	l.takeLocked(&b)
	b.add(head)
	l.wq.busy = true
	l.wg.Add(1) // Stop waits for this publish like for the writer's
	return l.wq.ctx, b.batch, true
}

// releaseIdle ends an inline publish; what queued meanwhile goes to the writer.
func (l *Log) releaseIdle() {
	l.wq.Lock()
	l.wq.busy = false
	l.wq.company = 1 + len(l.wq.reqs) - l.wq.notes
	queued := l.readyLocked()
	l.wq.Unlock()
	l.wg.Done()
	if queued {
		l.kick()
	}
}

// Write appends an entry and waits for its outcome (see WriteAll).
func (l *Log) Write(ctx context.Context, entry checkpoint.Entry) (uint64, error) {
	tickets, err := l.WriteAll(ctx, entry)
	if len(tickets) == 0 {
		return 0, err
	}
	return tickets[0].Seq(), err
}

// runWriter is the group commit: it packs whatever queued while the previous publish
// was in flight into one message, with exactly one publish in flight and no timer, so
// a lone writer pays one publish and many writers share one fsync. (A linger timer was
// measured and gained nothing here: docs/perf.md.)
func (l *Log) runWriter(ctx context.Context) {
	defer l.wg.Done()
	for {
		select {
		case <-l.wake:
		case <-l.stopped:
			l.drainQueue()
			return
		}
		l.wq.Lock()
		if l.wq.busy || !l.readyLocked() {
			l.wq.Unlock()
			continue // an inline publish is in flight (it kicks when it ends), or only notes wait
		}
		l.wq.busy = true
		l.wq.Unlock()
		for l.publishNext(ctx) {
		}
	}
}

// publishNext publishes one batch from the queue, or ends the caller's turn as the
// publisher (busy) when the queue is empty.
func (l *Log) publishNext(ctx context.Context) bool {
	b := batcher{l: l, batch: make([]*request, 0, 16)}
	l.wq.Lock()
	if !l.readyLocked() {
		l.wq.busy = false
		l.wq.Unlock()
		return false
	}
	l.takeLocked(&b)
	l.wq.Unlock()
	l.publish(ctx, b.batch)
	writes := 0
	for _, r := range b.batch {
		if !r.note {
			writes++
		}
	}
	l.wq.Lock()
	l.wq.company = min(writes+len(l.wq.reqs)-l.wq.notes, l.cfg.MaxBatchEntries)
	l.wq.Unlock()
	return true
}

// takeLocked moves queued requests into b while they fit.
func (l *Log) takeLocked(b *batcher) {
	n := 0
	for n < len(l.wq.reqs) && b.add(l.wq.reqs[n]) {
		if l.wq.reqs[n].note {
			l.wq.notes--
		}
		n++
	}
	if l.wq.notes == 0 {
		l.wq.noteDue = false
	}
	if n == 0 {
		return
	}
	bound := l.queueBound()
	wasFull := len(l.wq.reqs) >= bound
	rest := copy(l.wq.reqs, l.wq.reqs[n:])
	clear(l.wq.reqs[rest:])
	l.wq.reqs = l.wq.reqs[:rest]
	if wasFull && rest < bound {
		close(l.wq.space)
		l.wq.space = make(chan struct{})
	}
}

type batcher struct {
	l        *Log
	batch    []*request // heads of chains
	size     int
	entries  int
	assigned map[string]bool
}

// add takes r (and the entries chained to it) into the batch, or reports that it must
// open the next one.
func (b *batcher) add(r *request) bool {
	size, n := 0, 0
	var runs []string
	r.chain(func(x *request) {
		size += len(x.data) + 1
		n++
		if x.kind == checkpoint.KindAssign {
			runs = append(runs, x.run)
		}
	})
	if len(b.batch) > 0 && (b.size+size > b.l.maxBytes || b.entries+n > b.l.cfg.MaxBatchEntries) {
		return false
	}
	// Two assigns of one run in one message would share an epoch.
	for _, run := range runs {
		if b.assigned[run] {
			return false
		}
	}
	for _, run := range runs {
		if b.assigned == nil {
			b.assigned = map[string]bool{}
		}
		b.assigned[run] = true
	}
	b.size += size
	b.entries += n
	b.batch = append(b.batch, r)
	return true
}

func (l *Log) drainQueue() {
	l.wq.Lock()
	reqs := l.wq.reqs
	l.wq.reqs, l.wq.closed, l.wq.notes = nil, true, 0
	if l.wq.timer != nil {
		l.wq.timer.Stop()
		l.wq.timer = nil
	}
	l.wq.Unlock()
	for _, r := range reqs {
		r.chain(func(x *request) { x.ticket.resolve(0, ErrStopped) })
	}
}

func (l *Log) publish(ctx context.Context, batch []*request) {
	id := l.cfg.Node + "." + l.nonce + "." + strconv.FormatUint(l.counter.Add(1), 36)
	tickets := make([]*Ticket, 0, len(batch))
	datas := make([][]byte, 0, len(batch))
	version := 1
	for _, r := range batch {
		r.chain(func(x *request) {
			tickets, datas = append(tickets, x.ticket), append(datas, x.data)
			version = max(version, checkpoint.FormatFor(x.kind))
		})
	}
	l.mu.Lock()
	l.mu.pending[id] = tickets
	l.mu.Unlock()

	msg := &nats.Msg{Subject: l.cfg.Subject, Data: checkpoint.EncodeEnvelopeVersion(l.cfg.Node, version, datas), Header: nats.Header{}}
	job := l.predecode(msg.Data)
	pctx, cancel := context.WithTimeout(ctx, l.cfg.PublishTimeout)
	defer cancel()
	retry := backoff.Policy{Base: 20 * time.Millisecond, Cap: time.Second}
	for attempt := 0; ; attempt++ {
		// The message ID makes a retried publish a duplicate, not a second entry.
		ack, err := l.cfg.JS.PublishMsg(pctx, msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(l.cfg.Stream))
		if err == nil {
			l.applyOwn(id, ack.Sequence, msg.Data, job)
			return // else the applier resolves the tickets
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrMaxPayload) {
			l.abandon(id, fmt.Errorf("%w: %v", ErrAppendUncertain, err))
			return
		}
		l.log.Warn("log publish failed; retrying", "err", err, "attempt", attempt, "entries", len(tickets))
		if retry.Sleep(pctx, attempt) != nil {
			l.abandon(id, fmt.Errorf("%w: publish of %d entries failed for %s: %v", ErrAppendUncertain, len(tickets), l.cfg.PublishTimeout, err))
			return
		}
	}
}

// abandon gives up on a message whose publish failed. If it did reach the log after
// all, the applier applies it like any other; only its writers are not told.
func (l *Log) abandon(id string, err error) {
	l.mu.Lock()
	tickets := l.mu.pending[id]
	delete(l.mu.pending, id)
	l.mu.Unlock()
	for _, t := range tickets {
		t.resolve(0, err)
	}
}
