package logstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Applier applies the log to this node's Store in order: a supervised consumer
// ("log-consumer") feeds Store.Apply, and the Writer hands it the node's own messages
// to apply from memory (Store.ApplyIfNext). It resolves the writers' Futures with the
// verdicts, tells waiters that the state moved (Changed, WaitApplied, CatchUp), checks
// that the log is one the state can continue from (continuity.go), and stops for good
// on an error that leaves the state untrustworthy (Failed, Err). Start it, Stop it.
type Applier struct {
	src          port.Stream // the log
	store        *checkpoint.Store
	stream       string // its name
	stallTimeout time.Duration
	sup          *supervise.Supervisor // nil: one of its own, made at Start
	hooks        *testhooks.Hooks      // Deaf, FailApply, HoldApply, NoLogCheck (production's zero value unless a test's)
	log          *slog.Logger

	mu struct {
		sync.Mutex
		pending map[string][]*Future // by message ID, in message order, until resolved
		applied chan struct{}        // closed and replaced whenever the applied seq moves
		err     error                // the applier's fatal error
	}

	life struct {
		sync.Mutex
		started, stopped bool
		cancel           context.CancelFunc
		done             <-chan struct{} // closed when the supervised consumer has ended
	}
	stopOnce sync.Once
	stopped  chan struct{} // closed when Stop begins
	failed   chan struct{} // closed when the applier stops on an error
	// firstConsumer is Start's consumer until the supervised part takes it (owned by
	// that goroutine, then by Stop once life.done is closed).
	firstConsumer port.Messages
	consumers     atomic.Int64 // consumers opened
}

func newApplier(cfg Config, hooks *testhooks.Hooks, log *slog.Logger) *Applier {
	name := ""
	if cfg.Stream != nil { // nil only in tests that drive the applier without a log
		name = cfg.Stream.Name()
	}
	a := &Applier{src: cfg.Stream, store: cfg.Store, stream: name, stallTimeout: cfg.StallTimeout,
		sup: cfg.Supervisor, hooks: hooks, log: log, stopped: make(chan struct{}), failed: make(chan struct{})}
	a.mu.pending = map[string][]*Future{}
	a.mu.applied = make(chan struct{})
	return a
}

// Start opens the consumer from the first sequence the store has not applied (so that a
// log this node cannot read, or cannot continue from, fails Start) and runs it as the
// supervised part "log-consumer", opened again whenever it ends or falls silent. A
// second Start does nothing; Start after Stop returns ErrStopped.
func (a *Applier) Start(ctx context.Context) error {
	a.life.Lock()
	defer a.life.Unlock()
	switch {
	case a.life.stopped:
		return ErrStopped
	case a.life.started:
		return nil
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	first, err := a.consume(ctx)
	if err != nil {
		cancel()
		return err
	}
	a.life.started, a.life.cancel, a.firstConsumer = true, cancel, first
	sup := a.sup
	if sup == nil {
		sup = supervise.New(supervise.WithLogger(a.log))
	}
	a.life.done = sup.Go(ctx, supervise.Part{Name: "log-consumer", Silence: a.stallTimeout,
		Run: func(ctx context.Context, alive func()) error {
			it := a.firstConsumer
			a.firstConsumer = nil
			return a.runConsumer(ctx, it, alive)
		}})
	return nil
}

// Stop stops the consumer and waits for it. Awaits of unresolved Futures return
// ErrStopped, as do WaitApplied and CatchUp. Safe to call twice and before Start.
func (a *Applier) Stop() {
	a.stopOnce.Do(func() {
		a.life.Lock()
		a.life.stopped = true
		cancel, done := a.life.cancel, a.life.done
		a.life.Unlock()
		close(a.stopped)
		if cancel == nil {
			return // never started
		}
		cancel()
		<-done
		if a.firstConsumer != nil { // stopped before the part ever ran
			a.firstConsumer.Stop()
		}
	})
}

// Err is the applier's fatal error, if it stopped on one.
func (a *Applier) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.err
}

// Failed is closed when the applier stops on an error (Err says which).
func (a *Applier) Failed() <-chan struct{} { return a.failed }

// ConsumerRestarts is how many times the applier's consumer was opened again.
func (a *Applier) ConsumerRestarts() int64 { return max(a.consumers.Load()-1, 0) }

// Store is the state this applier applies to.
func (a *Applier) Store() *checkpoint.Store { return a.store }

// Changed returns a channel closed the next time this node applies a message: take it,
// read the store, then wait on it.
func (a *Applier) Changed() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.applied
}

// WaitApplied waits until this node has applied the log up to seq.
func (a *Applier) WaitApplied(ctx context.Context, seq uint64) error {
	for {
		a.mu.Lock()
		ch, err := a.mu.applied, a.mu.err
		a.mu.Unlock()
		if a.store.Applied() >= seq {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("logstream: wait for sequence %d (applied %d): %w", seq, a.store.Applied(), ctx.Err())
		case <-a.stopped:
			return ErrStopped
		}
	}
}

// CatchUp waits until this node has applied the log as it is now: a read after it sees
// every write acknowledged before it, whichever node made it. Messages deleted from
// the end of the log count as seen (nothing will ever deliver them).
func (a *Applier) CatchUp(ctx context.Context) error {
	last, err := a.LastSeq(ctx)
	if err != nil {
		return err
	}
	if _, err := a.skipDeleted(ctx, last); err != nil {
		return err
	}
	return a.WaitApplied(ctx, last)
}

// LastSeq is the stream's last sequence: the node has caught up when it has applied it.
func (a *Applier) LastSeq(ctx context.Context) (uint64, error) {
	info, err := a.src.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("logstream: stream info: %w", err)
	}
	return info.LastSeq, nil
}

// expect registers the Futures of a message being published under its ID, in message
// order, until it is applied (by applyOwn or the consumer) or abandoned.
func (a *Applier) expect(id string, fs []*Future) {
	a.mu.Lock()
	a.mu.pending[id] = fs
	a.mu.Unlock()
}

// abandon gives up on a message whose publish failed: its Futures get err. If it did
// reach the log after all, the consumer applies it like any other; only its writers are
// not told.
func (a *Applier) abandon(id string, err error) {
	a.mu.Lock()
	fs := a.mu.pending[id]
	delete(a.mu.pending, id)
	a.mu.Unlock()
	for _, f := range fs {
		f.fail(err)
	}
}

// consume opens an ordered consumer of the stream from the first unapplied sequence.
func (a *Applier) consume(ctx context.Context) (port.Messages, error) {
	if err := a.checkLog(ctx); err != nil {
		return nil, err
	}
	it, err := a.src.Consume(ctx, a.store.Applied()+1)
	if err != nil {
		return nil, fmt.Errorf("logstream: consume %s: %w", a.stream, err)
	}
	a.consumers.Add(1)
	return it, nil
}

// runConsumer is one life of the applier's consumer (it, or a new one when nil). It is
// alive while it applies messages or sees that it has applied the stream's last one; a
// consumer that hears nothing while the stream moves on (measured on a 2-core machine
// after one NATS server of three was killed: silent for minutes, no error, no heartbeat
// reset; or a silent partition) is ended by the supervisor after StallTimeout and
// opened again from the first unapplied sequence.
func (a *Applier) runConsumer(ctx context.Context, it port.Messages, alive func()) error {
	if it == nil {
		var err error
		if it, err = a.consume(ctx); err != nil {
			if errors.Is(err, ErrWrongLog) {
				return a.cannotContinue(err)
			}
			return err
		}
	}
	defer it.Stop()
	// The consumer was made (a round trip that worked): alive before its first message,
	// so a catch-up whose first fetch is slow on a loaded machine is not taken for
	// silence. From then on each message applied is progress (runApplier calls alive).
	alive()
	a.hooks.Deaf.Store(false)
	// The applier's Next is given its own context: the ordered consumer's Next was seen
	// (under -race, a stream deleted under it) not to return after Stop alone.
	actx, stopApplier := context.WithCancel(ctx)
	defer stopApplier()
	done := make(chan error, 1)
	go func() { done <- a.runApplier(actx, it, alive) }()
	end := func() {
		// Next returns when its context ends; only then is the iterator stopped. nats.go's
		// ordered iterator stops the inner iterator it holds at that moment, and a Next
		// that is replacing it (a reset) would leave the new one running for good: seen
		// as a leaked pull goroutine at a test's end under load.
		stopApplier()
		wait := time.NewTimer(2 * time.Second)
		defer wait.Stop()
		select {
		case <-done:
			it.Stop()
			return
		case <-wait.C: // a Next that does not return on its context: stop it the other way
		}
		it.Stop()
		<-done
	}
	probe := time.NewTicker(max(a.stallTimeout/4, 10*time.Millisecond))
	defer probe.Stop()
	if err := a.probeCaughtUp(ctx, alive); err != nil {
		end()
		return a.cannotContinue(err)
	}
	lastApplied := a.store.Applied()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			end()
			return ctx.Err()
		case <-probe.C:
			if a := a.store.Applied(); a != lastApplied {
				lastApplied = a // the applier is moving (and calling alive): no need to ask
				continue
			}
			if err := a.probeCaughtUp(ctx, alive); err != nil {
				end()
				return a.cannotContinue(err)
			}
		}
	}
}

// probeCaughtUp calls alive if the stream holds nothing this node has not applied:
// silence is then nothing to hear. It also checks that the stream is still the one the
// state was built from (a stream deleted and created again, which the ordered consumer
// follows silently): if not, it returns ErrWrongLog.
func (a *Applier) probeCaughtUp(ctx context.Context, alive func()) error {
	pctx, cancel := context.WithTimeout(ctx, min(a.stallTimeout/2, 2*time.Second))
	defer cancel()
	before := a.store.Applied()
	info, err := a.src.Info(pctx)
	if errors.Is(err, port.ErrNotFound) && !a.hooks.NoLogCheck {
		return a.wrongLog("the stream %s was deleted", a.stream)
	}
	if err != nil || a.hooks.Deaf.Load() {
		return nil
	}
	if err := a.checkInfo(info, before); err != nil {
		return err
	}
	if end := info.LastSeq; end > a.store.Applied() {
		if skipped, err := a.skipDeleted(pctx, end); err != nil || !skipped {
			return nil
		}
	}
	alive()
	return nil
}

// applyOwn applies the message this node just published, from memory, when it is the
// next one to apply: its writers learn their outcome without waiting for the consumer to
// deliver their own message back (docs/perf.md). The bytes are the ones the log holds at
// seq (an acknowledged duplicate of a retried publish has the same ID and bytes), so the
// outcome is the one every other node computes. Otherwise the consumer applies it.
// entries are data decoded, or nil (the apply then decodes, and a failure names seq).
func (a *Applier) applyOwn(id string, seq uint64, data []byte, entries []checkpoint.Entry) {
	results, applied, err := a.store.ApplyIfNext(seq, data, entries)
	if err != nil {
		a.log.Error("applier stopped", "seq", seq, "err", err)
		a.fail(err)
		return
	}
	if applied {
		a.applied(id, seq, results)
	}
}

// runApplier applies what it consumes until the consumer ends. A fatal error (the
// state may be half-applied) ends it for good: supervise.Fatal.
func (a *Applier) runApplier(ctx context.Context, it port.Messages, alive func()) error {
	for {
		msg, err := it.Next(ctx)
		select {
		case <-a.failed: // applyOwn failed: the state may be half-applied, apply nothing more
			return supervise.Fatal(a.Err())
		default:
		}
		if err != nil {
			if errors.Is(err, port.ErrClosed) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("logstream: log consumer closed: %w", err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Missed heartbeats and the like: the ordered consumer recreates itself
			// after connection trouble, and the supervisor does if it does not.
			a.log.Debug("log consumer error; continuing", "err", err)
			continue
		}
		if a.hooks.Deaf.Load() {
			<-ctx.Done() // the test's silent consumer: hears nothing until replaced
			return ctx.Err()
		}
		if a.hooks.HoldApply.Load() {
			// The test's lagging node: it applies nothing until released, then opens its
			// consumer again from the first unapplied sequence (dropping what this one
			// fetched meanwhile, as a node that had not fetched it would).
			for a.hooks.HoldApply.Load() {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(10 * time.Millisecond):
				}
			}
			return errors.New("logstream: released from Hooks.HoldApply: opening the consumer again")
		}
		seq := msg.Seq
		if seq > a.store.Applied()+1 {
			if err := a.checkGap(ctx, seq); err != nil {
				if !errors.Is(err, ErrWrongLog) {
					return err // the stream could not be asked: open the consumer again
				}
				return a.cannotContinue(err)
			}
		}
		var results []error
		if a.hooks.FailApply.Load() { // as a storage failure does: nothing of it applied
			err = fmt.Errorf("logstream: apply %d: %w: injected (Hooks.FailApply)", seq, checkpoint.ErrStorage)
		} else {
			results, err = a.store.Apply(seq, msg.Data)
		}
		if err != nil {
			a.log.Error("applier stopped", "seq", seq, "err", err)
			a.fail(err)
			return supervise.Fatal(err)
		}
		alive()
		if results == nil {
			continue // its writer here applied it already (applyOwn)
		}
		a.applied(msg.ID, seq, results)
	}
}

func (a *Applier) applied(id string, seq uint64, results []error) {
	a.mu.Lock()
	fs := a.mu.pending[id]
	if fs != nil {
		delete(a.mu.pending, id)
	}
	a.notifyAppliedLocked()
	a.mu.Unlock()
	off := 0
	for _, f := range fs {
		if end := off + f.n; end <= len(results) {
			f.resolve(seq, results[off:end:end])
		} else {
			errs := make([]error, f.n)
			for i := range errs {
				if off+i < len(results) {
					errs[i] = results[off+i]
				} else {
					errs[i] = fmt.Errorf("%w: message %d has %d results for more entries", checkpoint.ErrCorruptLog, seq, len(results))
				}
			}
			f.resolve(seq, errs)
		}
		off += f.n
	}
}

// fail stops the applier for good with err: every pending Future gets it, and Failed
// is closed.
func (a *Applier) fail(err error) {
	a.mu.Lock()
	if a.mu.err != nil { // the writer (applyOwn) and the consumer may both fail
		a.mu.Unlock()
		return
	}
	a.mu.err = err
	pending := a.mu.pending
	a.mu.pending = map[string][]*Future{}
	a.mu.Unlock()
	close(a.failed)
	for _, fs := range pending {
		for _, f := range fs {
			f.fail(err)
		}
	}
}

// notifyApplied wakes whoever waits for the applied sequence to move.
func (a *Applier) notifyApplied() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notifyAppliedLocked()
}

func (a *Applier) notifyAppliedLocked() {
	close(a.mu.applied)
	a.mu.applied = make(chan struct{})
}

// cannotContinue stops the applier for good on a log this node cannot continue from.
func (a *Applier) cannotContinue(err error) error {
	a.log.Error("this node cannot continue from the log", "err", err)
	a.fail(err)
	return supervise.Fatal(err)
}
