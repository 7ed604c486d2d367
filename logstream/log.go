package logstream

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/checkpoint"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/ident"
	"github.com/flowrun/flow/internal/streams"
	"github.com/flowrun/flow/internal/supervise"
	"github.com/flowrun/flow/internal/testhooks"
)

// Defaults of Config.
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

// Config configures a Log.
type Config struct {
	JS    jetstream.JetStream // required
	Store *checkpoint.Store   // required: this node's state, fed by the applier
	Node  string              // required: this node's ID (message IDs, envelope)

	Stream   string // default FLOW_LOG
	Subject  string // default flow.log
	Replicas int    // stream replicas; default 1 (streams.Replicas gives the cluster's)

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
	// Hooks are tests' switches (internal/testhooks: PassQueue, Deaf); nil in production.
	Hooks  *testhooks.Hooks
	Logger *slog.Logger
}

// Log appends entries to the stream with group commit and applies the stream to the
// Store. One Log per node. Start it, Stop it.
type Log struct {
	cfg      Config
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

	// hooks are tests' switches (cfg.Hooks, or production's zero value).
	hooks *testhooks.Hooks

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
}

// Open creates the stream if needed and returns a Log ready to Start.
func Open(ctx context.Context, cfg Config) (*Log, error) {
	if cfg.JS == nil || cfg.Store == nil || !ident.ValidID(cfg.Node) {
		return nil, fmt.Errorf("%w: Config needs JS, Store and a valid Node ID (got %q)", checkpoint.ErrInvalidEntry, cfg.Node)
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
				checkpoint.ErrInvalidEntry, maxPayload, minOutputBytes+2*envelopeHeadroom)
		}
		cfg.Logger.Warn("step outputs are limited by the NATS server's max_payload; raise max_payload on the server (e.g. 8MB) to allow larger ones",
			"max_output_bytes", fit, "asked", cfg.MaxOutputBytes, "max_payload", maxPayload)
		cfg.MaxOutputBytes = fit
	}
	_, err := streams.EnsureStream(ctx, cfg.JS, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "flow checkpoint log: every change to run state, in order",
		Subjects:    []string{cfg.Subject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    cfg.Replicas,
		Duplicates:  duplicateWindow,
	})
	if err != nil {
		return nil, fmt.Errorf("logstream: create stream %s: %w", cfg.Stream, err)
	}
	l := &Log{
		cfg:      cfg,
		hooks:    testhooks.OrProduction(cfg.Hooks),
		log:      cfg.Logger.With("component", "log"),
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
func (l *Log) Store() *checkpoint.Store { return l.cfg.Store }

// MaxOutputBytes is the largest step output the log accepts: the configured limit, or
// less when the NATS server's max_payload does not leave room for it (Open warns).
func (l *Log) MaxOutputBytes() int { return l.cfg.MaxOutputBytes }

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
			return fmt.Errorf("logstream: wait for sequence %d (applied %d): %w", seq, l.cfg.Store.Applied(), ctx.Err())
		case <-l.stopped:
			return ErrStopped
		}
	}
}

// CatchUp waits until this node has applied the log as it is now: a read after it sees
// every write acknowledged before it, whichever node made it. Messages deleted from
// the end of the log count as seen (nothing will ever deliver them).
func (l *Log) CatchUp(ctx context.Context) error {
	last, err := l.LastSeq(ctx)
	if err != nil {
		return err
	}
	if _, err := l.skipDeleted(ctx, last); err != nil {
		return err
	}
	return l.WaitApplied(ctx, last)
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
		return 0, fmt.Errorf("logstream: stream info: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("logstream: stream info: %w", err)
	}
	return info.State.LastSeq, nil
}
