package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/natsnode"
	"github.com/flowrun/flow/internal/supervise"

	"github.com/flowrun/flow/internal/backoff"
)

// Defaults of LogConfig.
const (
	DefaultStream          = "FLOW_LOG"
	DefaultSubject         = "flow.log"
	DefaultMaxOutputBytes  = 1 << 20 // 1 MiB per step output
	DefaultMaxBatchEntries = 256
	DefaultPublishTimeout  = 10 * time.Second
	DefaultStallTimeout    = 10 * time.Second
	DefaultNoteDelay       = 5 * time.Millisecond
	duplicateWindow        = 2 * time.Minute
	envelopeHeadroom       = 4 << 10
	// minOutputBytes is the smallest output limit worth running with: below it a
	// server's max_payload is refused at start rather than fitted.
	minOutputBytes = 4 << 10
)

// LogConfig configures a Log.
type LogConfig struct {
	JS    jetstream.JetStream // required
	Store *Store              // required: this node's state, fed by the applier
	Node  string              // required: this node's ID (message IDs, envelope)

	Stream   string // default FLOW_LOG
	Subject  string // default flow.log
	Replicas int    // stream replicas; default 1 (natsnode.Replicas gives the cluster's)

	// MaxOutputBytes bounds one step output (default 1 MiB). Above it, Append refuses
	// the entry with ErrOutputTooLarge. It must fit in the server's max payload.
	MaxOutputBytes int
	// MaxBatchEntries bounds the entries packed into one message (default 256).
	MaxBatchEntries int
	// StallTimeout is how long the applier may go without applying a message or seeing
	// that it has applied the stream's last one before its consumer is presumed silent
	// and recreated (default 10s).
	StallTimeout time.Duration
	// Supervisor keeps the applier's consumer alive (internal/supervise); default: a
	// supervisor of the Log's own.
	Supervisor *supervise.Supervisor
	// NoOwnApply leaves every message to the applier, including this node's own (for
	// benchmarks comparing the two).
	NoOwnApply bool
	// NoteDelay is how long a note (AppendNote) waits for a write to ride with before it
	// is published on its own (default 5ms).
	NoteDelay time.Duration
	// PublishTimeout bounds the retries of one publish (default 10s).
	PublishTimeout time.Duration
	Logger         *slog.Logger
}

// Log appends entries to the stream with group commit and applies the stream to the
// Store. One Log per node. Start it, Stop it.
type Log struct {
	cfg      LogConfig
	log      *slog.Logger
	maxBytes int
	nonce    string
	counter  atomic.Uint64

	// The queue of the group commit. Exactly one publish is in flight at a time (busy),
	// made by the writer goroutine, or inline by a Write that found the log idle.
	wq struct {
		sync.Mutex
		reqs    []*request    // heads of chains, in order
		busy    bool          // a publish is in flight
		closed  bool          // Stop began: no new requests, no new inline publishes
		space   chan struct{} // closed (and replaced) when reqs drop below the bound
		company int           // writes in the last message plus those queued at its ack
		notes   int           // notes among reqs
		noteDue bool          // the oldest queued note has waited NoteDelay
		timer   *time.Timer   // makes notes due; nil when none is armed
		ctx     context.Context
	}
	wake chan struct{} // cap 1: the writer goroutine should look at the queue

	// decodes hands a message being published to the decoder goroutine, which decodes
	// it while the publish is in flight (unbuffered: a send succeeds only when the
	// decoder is idle, and then it finishes the job).
	decodes chan *decodeJob

	// unsafePassQueue lets an inline write go out ahead of queued entries: the
	// negative control of TestWritersKeepTheirOrder, never set otherwise.
	unsafePassQueue bool

	mu struct {
		sync.Mutex
		pending map[string][]*Ticket // by message ID, until the applier resolves them
		applied chan struct{}        // closed and replaced whenever the applied seq moves
		err     error                // the applier's fatal error
	}

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
	stopped             chan struct{} // closed when Stop begins
	failed              chan struct{} // closed when the applier stops on an error
	wg                  sync.WaitGroup
	applierDone         <-chan struct{} // closed when the supervised applier has ended
	// firstConsumer is Start's consumer until the applier takes it (owned by the
	// applier's goroutine, then by Stop once applierDone is closed).
	firstConsumer jetstream.MessagesContext
	consumers     atomic.Int64 // consumers the applier has opened
	// deaf makes the current consumer hear nothing until the supervisor replaces it:
	// TestStalledApplierIsRestarted's silence, never set otherwise.
	deaf atomic.Bool
}

type request struct {
	data   []byte
	note   bool // AppendNote: rides with the next message, or goes out within NoteDelay
	kind   Kind
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

// Ticket is an appended entry's pending outcome.
type Ticket struct {
	log  *Log
	once sync.Once
	done chan struct{}
	seq  uint64
	err  error
}

func (t *Ticket) resolve(seq uint64, err error) {
	t.once.Do(func() {
		t.seq, t.err = seq, err
		close(t.done)
	})
}

// Await waits until this node has applied the entry and returns its outcome: nil if
// accepted, or the rejection (errors.Is it with ErrFenced, ErrStaleTerm, ...).
func (t *Ticket) Await(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return fmt.Errorf("checkpoint: await: %w", ctx.Err())
	case <-t.log.failed:
		return t.log.Err()
	case <-t.log.stopped:
		select { // it may have been resolved just before Stop
		case <-t.done:
			return t.err
		default:
			return ErrStopped
		}
	}
}

// Seq is the entry's log sequence, once Await returned.
func (t *Ticket) Seq() uint64 {
	select {
	case <-t.done:
		return t.seq
	default:
		return 0
	}
}

// OpenLog creates the stream if needed and returns a Log ready to Start.
func OpenLog(ctx context.Context, cfg LogConfig) (*Log, error) {
	if cfg.JS == nil || cfg.Store == nil || !ValidID(cfg.Node) {
		return nil, fmt.Errorf("%w: LogConfig needs JS, Store and a valid Node ID (got %q)", ErrInvalidEntry, cfg.Node)
	}
	if cfg.Stream == "" {
		cfg.Stream = DefaultStream
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultSubject
	}
	cfg.Replicas = max(cfg.Replicas, 1)
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.MaxBatchEntries <= 0 {
		cfg.MaxBatchEntries = DefaultMaxBatchEntries
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = DefaultPublishTimeout
	}
	if cfg.NoteDelay <= 0 {
		cfg.NoteDelay = DefaultNoteDelay
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	maxPayload := int(cfg.JS.Conn().MaxPayload())
	// An output of the limit must fit one message with its entry's other fields and
	// the envelope: a headroom for each.
	if fit := maxPayload - 2*envelopeHeadroom; cfg.MaxOutputBytes > fit {
		// A stock nats-server allows 1 MiB messages, exactly the default output limit:
		// fit the limit to the server rather than refuse to start, and say so.
		if fit < minOutputBytes {
			return nil, fmt.Errorf("%w: the NATS server's max_payload %d leaves no room for step outputs (flow needs at least %d bytes): raise max_payload on the server (e.g. max_payload: 8MB)",
				ErrInvalidEntry, maxPayload, minOutputBytes+2*envelopeHeadroom)
		}
		cfg.Logger.Warn("step outputs are limited by the NATS server's max_payload; raise max_payload on the server (e.g. 8MB) to allow larger ones",
			"max_output_bytes", fit, "asked", cfg.MaxOutputBytes, "max_payload", maxPayload)
		cfg.MaxOutputBytes = fit
	}
	_, err := natsnode.EnsureStream(ctx, cfg.JS, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "flow checkpoint log: every change to run state, in order",
		Subjects:    []string{cfg.Subject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    cfg.Replicas,
		Duplicates:  duplicateWindow,
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: create stream %s: %w", cfg.Stream, err)
	}
	l := &Log{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "checkpoint"),
		maxBytes: maxPayload - envelopeHeadroom,
		nonce:    strconv.FormatUint(rand.Uint64(), 36),
		wake:     make(chan struct{}, 1),
		decodes:  make(chan *decodeJob),
		stopped:  make(chan struct{}),
		failed:   make(chan struct{}),
	}
	l.mu.pending = map[string][]*Ticket{}
	l.mu.applied = make(chan struct{})
	l.wq.space = make(chan struct{})
	return l, nil
}

// Start starts the writer and the applier. The applier replays from the store's
// applied sequence; its consumer is a supervised part ("log-consumer"), opened again
// whenever it ends or falls silent.
func (l *Log) Start(ctx context.Context) error {
	err := ErrStopped
	l.startOnce.Do(func() {
		ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
		// The first consumer is opened here so that a log that cannot be read fails Start.
		if l.firstConsumer, err = l.consume(ctx); err != nil {
			return
		}
		l.wq.Lock()
		l.wq.ctx = ctx
		l.wq.Unlock()
		l.wg.Add(2)
		go l.runDecoder(ctx)
		go l.runWriter(ctx)
		sup := l.cfg.Supervisor
		if sup == nil {
			sup = supervise.New(supervise.WithLogger(l.log))
		}
		l.applierDone = sup.Go(ctx, supervise.Part{Name: "log-consumer", Silence: l.cfg.StallTimeout,
			Run: func(ctx context.Context, alive func()) error {
				it := l.firstConsumer
				l.firstConsumer = nil
				return l.runConsumer(ctx, it, alive)
			}})
	})
	return err
}

// consume opens an ordered consumer of the stream from the first unapplied sequence.
func (l *Log) consume(ctx context.Context) (jetstream.MessagesContext, error) {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if a := l.cfg.Store.Applied(); a > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a+1
	}
	cons, err := l.cfg.JS.OrderedConsumer(ctx, l.cfg.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: consume %s: %w", l.cfg.Stream, err)
	}
	// Idle heartbeats every second: a consumer whose server went away is noticed (two
	// missed) and recreated by the client in seconds, not the default's ten.
	it, err := cons.Messages(jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: consume %s: %w", l.cfg.Stream, err)
	}
	l.consumers.Add(1)
	return it, nil
}

// runConsumer is one life of the applier's consumer (it, or a new one when nil). It is
// alive while it applies messages or sees that it has applied the stream's last one; a
// consumer that hears nothing while the stream moves on (measured on a 2-core machine
// after one NATS server of three was killed: silent for minutes, no error, no heartbeat
// reset; or a silent partition) is ended by the supervisor after StallTimeout and
// opened again from the first unapplied sequence.
func (l *Log) runConsumer(ctx context.Context, it jetstream.MessagesContext, alive func()) error {
	if it == nil {
		var err error
		if it, err = l.consume(ctx); err != nil {
			return err
		}
	}
	defer it.Stop()
	l.deaf.Store(false)
	done := make(chan error, 1)
	go func() { done <- l.runApplier(ctx, it, alive) }()
	probe := time.NewTicker(max(l.cfg.StallTimeout/4, 10*time.Millisecond))
	defer probe.Stop()
	l.probeCaughtUp(ctx, alive)
	lastApplied := l.cfg.Store.Applied()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			it.Stop()
			<-done
			return ctx.Err()
		case <-probe.C:
			if a := l.cfg.Store.Applied(); a != lastApplied {
				lastApplied = a // the applier is moving (and calling alive): no need to ask
				continue
			}
			l.probeCaughtUp(ctx, alive)
		}
	}
}

// probeCaughtUp calls alive if the stream holds nothing this node has not applied:
// silence is then nothing to hear.
func (l *Log) probeCaughtUp(ctx context.Context, alive func()) {
	pctx, cancel := context.WithTimeout(ctx, min(l.cfg.StallTimeout/2, 2*time.Second))
	end, err := l.LastSeq(pctx)
	cancel()
	if err == nil && end <= l.cfg.Store.Applied() && !l.deaf.Load() {
		alive()
	}
}

// Stop stops the writer and the applier and waits for them. Unresolved tickets get
// ErrStopped. Safe to call twice and before Start.
func (l *Log) Stop() {
	l.stopOnce.Do(func() {
		l.wq.Lock()
		l.wq.closed = true // after this no inline publish starts (they wg.Add under this lock)
		l.wq.Unlock()
		close(l.stopped)
		if l.cancel != nil {
			l.cancel()
		}
		if l.applierDone != nil {
			<-l.applierDone
			if l.firstConsumer != nil { // stopped before the applier ever ran
				l.firstConsumer.Stop()
			}
		}
		l.wg.Wait()
	})
}

// Err is the applier's fatal error, if it stopped on one.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.err
}

// Failed is closed when the applier stops on an error.
func (l *Log) Failed() <-chan struct{} { return l.failed }

// ConsumerRestarts is how many times the applier's consumer was opened again.
func (l *Log) ConsumerRestarts() int64 { return max(l.consumers.Load()-1, 0) }

// Store is the state this log applies to.
func (l *Log) Store() *Store { return l.cfg.Store }

// MaxOutputBytes is the largest step output the log accepts: the configured limit, or
// less when the NATS server's max_payload does not leave room for it (OpenLog warns).
func (l *Log) MaxOutputBytes() int { return l.cfg.MaxOutputBytes }

// Append validates and queues an entry for the next log message. The returned ticket's
// Await gives the outcome.
func (l *Log) Append(ctx context.Context, e Entry) (*Ticket, error) {
	r, err := l.encode(e)
	if err != nil {
		return nil, err
	}
	return r.ticket, l.enqueue(ctx, r)
}

// AppendNote queues an entry whose writer does not wait for it (a step's start, a
// retry's failure): it rides in the next message another write makes, and goes out on
// its own only if none comes within NoteDelay. A lone writer's note and its next write
// then cost one publish, not two (docs/perf.md).
func (l *Log) AppendNote(ctx context.Context, e Entry) (*Ticket, error) {
	r, err := l.encode(e)
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
func (l *Log) AppendAll(ctx context.Context, entries ...Entry) ([]*Ticket, error) {
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
func (l *Log) encodeAll(entries []Entry) (*request, []*Ticket, error) {
	if len(entries) == 0 {
		return nil, nil, fmt.Errorf("%w: no entries to write", ErrInvalidEntry)
	}
	if len(entries) > l.cfg.MaxBatchEntries {
		return nil, nil, fmt.Errorf("%w: %d entries for one message, at most %d", ErrInvalidEntry, len(entries), l.cfg.MaxBatchEntries)
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

func (l *Log) encode(e Entry) (*request, error) {
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	if len(e.Output) > l.cfg.MaxOutputBytes {
		return nil, fmt.Errorf("%w: step %q item %d output is %d bytes, the limit is %d: write large results elsewhere and return a reference",
			ErrOutputTooLarge, e.Step, e.Item, len(e.Output), l.cfg.MaxOutputBytes)
	}
	data, err := json.Marshal(&e)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %v", ErrInvalidEntry, err)
	}
	if len(data) > l.maxBytes {
		return nil, fmt.Errorf("%w: the encoded entry is %d bytes, a log message holds at most %d", ErrOutputTooLarge, len(data), l.maxBytes)
	}
	return &request{data: data, kind: e.Kind, run: e.Run, ticket: &Ticket{log: l, done: make(chan struct{})}}, nil
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
			return fmt.Errorf("checkpoint: append: %w", ctx.Err())
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
func (l *Log) WriteAll(ctx context.Context, entries ...Entry) ([]*Ticket, error) {
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
	if l.unsafePassQueue {
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
func (l *Log) Write(ctx context.Context, e Entry) (uint64, error) {
	tickets, err := l.WriteAll(ctx, e)
	if len(tickets) == 0 {
		return 0, err
	}
	return tickets[0].Seq(), err
}

// WaitApplied waits until this node has applied the log up to seq.
func (l *Log) WaitApplied(ctx context.Context, seq uint64) error {
	for {
		l.mu.Lock()
		ch, err := l.mu.applied, l.mu.err
		l.mu.Unlock()
		if l.cfg.Store.Applied() >= seq {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("checkpoint: wait for sequence %d (applied %d): %w", seq, l.cfg.Store.Applied(), ctx.Err())
		case <-l.stopped:
			return ErrStopped
		}
	}
}

// Changed returns a channel closed the next time this node applies a message: wait on
// it, then read the store.
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.applied
}

// LastSeq is the stream's last sequence: the node has caught up when it has applied it.
func (l *Log) LastSeq(ctx context.Context) (uint64, error) {
	s, err := l.cfg.JS.Stream(ctx, l.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: stream info: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: stream info: %w", err)
	}
	return info.State.LastSeq, nil
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
		if x.kind == KindAssign {
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
	for _, r := range batch {
		r.chain(func(x *request) {
			tickets, datas = append(tickets, x.ticket), append(datas, x.data)
		})
	}
	l.mu.Lock()
	l.mu.pending[id] = tickets
	l.mu.Unlock()

	msg := &nats.Msg{Subject: l.cfg.Subject, Data: encodeEnvelope(l.cfg.Node, datas), Header: nats.Header{}}
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

// applyOwn applies the message this node just published, from memory, when it is the
// next one to apply: its writers learn their outcome without waiting for the consumer to
// deliver their own message back (docs/perf.md). The bytes are the ones the log holds at
// seq (an acknowledged duplicate of a retried publish has the same ID and bytes), so the
// outcome is the one every other node computes. Otherwise the applier applies it.
func (l *Log) applyOwn(id string, seq uint64, data []byte, job *decodeJob) {
	if l.cfg.NoOwnApply {
		return
	}
	var entries []Entry // nil: the apply decodes (the decoder was busy, or failed: the apply's error names seq)
	if job != nil && job.wait() == nil {
		entries = job.entries
	}
	results, applied, err := l.cfg.Store.applyNextDecoded(seq, data, entries)
	if err != nil {
		l.log.Error("applier stopped", "seq", seq, "err", err)
		l.fail(err)
		return
	}
	if applied {
		l.applied(id, seq, results)
	}
}

// decodeJob is a message decoded on the decoder goroutine.
type decodeJob struct {
	data    []byte
	entries []Entry
	err     error
	done    chan struct{}
}

func (j *decodeJob) wait() error {
	<-j.done
	return j.err
}

// predecode hands data to the decoder goroutine if it is idle, and returns the job; nil
// if it is busy (the apply then decodes). Decoding a W2 step's message took ~18 µs of
// the ~80 µs a step costs besides the fsync; overlapped with the publish's round trip,
// it is off the step's path (docs/perf.md).
func (l *Log) predecode(data []byte) *decodeJob {
	job := &decodeJob{data: data, done: make(chan struct{})}
	select {
	case l.decodes <- job:
		return job
	default:
		return nil
	}
}

// runDecoder decodes the messages this node publishes while their publish is in flight.
func (l *Log) runDecoder(ctx context.Context) {
	defer l.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case job := <-l.decodes:
			job.entries, job.err = decodeEnvelope(0, job.data)
			close(job.done)
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

// runApplier applies what it consumes until the consumer ends. A fatal error (the
// state may be half-applied) ends it for good: supervise.Fatal.
func (l *Log) runApplier(ctx context.Context, it jetstream.MessagesContext, alive func()) error {
	for {
		msg, err := it.Next()
		select {
		case <-l.failed: // applyOwn failed: the state may be half-applied, apply nothing more
			return supervise.Fatal(l.Err())
		default:
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("checkpoint: log consumer closed: %w", err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Missed heartbeats and the like: the ordered consumer recreates itself
			// after connection trouble, and the supervisor does if it does not.
			l.log.Debug("log consumer error; continuing", "err", err)
			continue
		}
		if l.deaf.Load() {
			<-ctx.Done() // the test's silent consumer: hears nothing until replaced
			return ctx.Err()
		}
		meta, err := msg.Metadata()
		if err != nil {
			err = fmt.Errorf("checkpoint: log message without metadata: %w", err)
			l.fail(err)
			return supervise.Fatal(err)
		}
		seq := meta.Sequence.Stream
		results, err := l.cfg.Store.ApplyMessage(seq, msg.Data())
		if err != nil {
			l.log.Error("applier stopped", "seq", seq, "err", err)
			l.fail(err)
			return supervise.Fatal(err)
		}
		alive()
		if results == nil {
			continue // its writer here applied it already (applyOwn)
		}
		l.applied(msg.Headers().Get(jetstream.MsgIDHeader), seq, results)
	}
}

func (l *Log) applied(id string, seq uint64, results []error) {
	l.mu.Lock()
	tickets := l.mu.pending[id]
	if tickets != nil {
		delete(l.mu.pending, id)
	}
	close(l.mu.applied)
	l.mu.applied = make(chan struct{})
	l.mu.Unlock()
	for i, t := range tickets {
		if i < len(results) {
			t.resolve(seq, results[i])
		} else {
			t.resolve(seq, fmt.Errorf("%w: message %d has %d results for %d entries", ErrCorruptLog, seq, len(results), len(tickets)))
		}
	}
}

func (l *Log) fail(err error) {
	l.mu.Lock()
	if l.mu.err != nil { // the writer (applyOwn) and the applier may both fail
		l.mu.Unlock()
		return
	}
	l.mu.err = err
	pending := l.mu.pending
	l.mu.pending = map[string][]*Ticket{}
	l.mu.Unlock()
	close(l.failed)
	for _, ts := range pending {
		for _, t := range ts {
			t.resolve(0, err)
		}
	}
}
