package logstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/supervise"
)

// consume opens an ordered consumer of the stream from the first unapplied sequence.
func (l *Log) consume(ctx context.Context) (jetstream.MessagesContext, error) {
	if err := l.checkLog(ctx); err != nil {
		return nil, err
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if a := l.cfg.Store.Applied(); a > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, a+1
	}
	cons, err := l.cfg.JS.OrderedConsumer(ctx, l.cfg.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("logstream: consume %s: %w", l.cfg.Stream, err)
	}
	// Idle heartbeats every second: a consumer whose server went away is noticed (two
	// missed) and recreated by the client in seconds, not the default's ten.
	it, err := cons.Messages(jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return nil, fmt.Errorf("logstream: consume %s: %w", l.cfg.Stream, err)
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
			if errors.Is(err, ErrWrongLog) {
				return l.cannotContinue(err)
			}
			return err
		}
	}
	defer it.Stop()
	l.hooks.Deaf.Store(false)
	// The applier's Next is given its own context: the ordered consumer's Next was seen
	// (under -race, a stream deleted under it) not to return after Stop alone.
	actx, stopApplier := context.WithCancel(ctx)
	defer stopApplier()
	done := make(chan error, 1)
	go func() { done <- l.runApplier(actx, it, alive) }()
	end := func() {
		stopApplier()
		it.Stop()
		<-done
	}
	probe := time.NewTicker(max(l.cfg.StallTimeout/4, 10*time.Millisecond))
	defer probe.Stop()
	if err := l.probeCaughtUp(ctx, alive); err != nil {
		end()
		return l.cannotContinue(err)
	}
	lastApplied := l.cfg.Store.Applied()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			end()
			return ctx.Err()
		case <-probe.C:
			if a := l.cfg.Store.Applied(); a != lastApplied {
				lastApplied = a // the applier is moving (and calling alive): no need to ask
				continue
			}
			if err := l.probeCaughtUp(ctx, alive); err != nil {
				end()
				return l.cannotContinue(err)
			}
		}
	}
}

// probeCaughtUp calls alive if the stream holds nothing this node has not applied:
// silence is then nothing to hear. It also checks that the stream is still the one the
// state was built from (a stream deleted and created again, which the ordered consumer
// follows silently): if not, it returns ErrWrongLog.
func (l *Log) probeCaughtUp(ctx context.Context, alive func()) error {
	pctx, cancel := context.WithTimeout(ctx, min(l.cfg.StallTimeout/2, 2*time.Second))
	defer cancel()
	before := l.cfg.Store.Applied()
	s, err := l.cfg.JS.Stream(pctx, l.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return l.wrongLog("the stream %s was deleted", l.cfg.Stream)
	}
	if err != nil || l.hooks.Deaf.Load() {
		return nil
	}
	info := s.CachedInfo()
	if err := l.checkInfo(info, before); err != nil {
		return err
	}
	if end := info.State.LastSeq; end > l.cfg.Store.Applied() {
		if skipped, err := l.skipDeleted(pctx, end); err != nil || !skipped {
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
// outcome is the one every other node computes. Otherwise the applier applies it.
func (l *Log) applyOwn(id string, seq uint64, data []byte, job *decodeJob) {
	if l.cfg.NoOwnApply {
		return
	}
	var entries []checkpoint.Entry // nil: the apply decodes (the decoder was busy, or failed: the apply's error names seq)
	if job != nil && job.wait() == nil {
		entries = job.entries
	}
	results, applied, err := l.cfg.Store.ApplyIfNext(seq, data, entries)
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
	entries []checkpoint.Entry
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
			job.entries, job.err = checkpoint.DecodeEnvelope(0, job.data)
			close(job.done)
		}
	}
}

// runApplier applies what it consumes until the consumer ends. A fatal error (the
// state may be half-applied) ends it for good: supervise.Fatal.
func (l *Log) runApplier(ctx context.Context, it jetstream.MessagesContext, alive func()) error {
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
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
				return fmt.Errorf("logstream: log consumer closed: %w", err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Missed heartbeats and the like: the ordered consumer recreates itself
			// after connection trouble, and the supervisor does if it does not.
			l.log.Debug("log consumer error; continuing", "err", err)
			continue
		}
		if l.hooks.Deaf.Load() {
			<-ctx.Done() // the test's silent consumer: hears nothing until replaced
			return ctx.Err()
		}
		meta, err := msg.Metadata()
		if err != nil {
			err = fmt.Errorf("logstream: log message without metadata: %w", err)
			l.fail(err)
			return supervise.Fatal(err)
		}
		seq := meta.Sequence.Stream
		if seq > l.cfg.Store.Applied()+1 {
			if err := l.checkGap(ctx, seq); err != nil {
				if !errors.Is(err, ErrWrongLog) {
					return err // the stream could not be asked: open the consumer again
				}
				return l.cannotContinue(err)
			}
		}
		var results []error
		if l.hooks.FailApply.Load() { // as a storage failure does: nothing of it applied
			err = fmt.Errorf("logstream: apply %d: %w: injected (Hooks.FailApply)", seq, checkpoint.ErrStorage)
		} else {
			results, err = l.cfg.Store.Apply(seq, msg.Data())
		}
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
	l.notifyAppliedLocked()
	l.mu.Unlock()
	for i, t := range tickets {
		if i < len(results) {
			t.resolve(seq, results[i])
		} else {
			t.resolve(seq, fmt.Errorf("%w: message %d has %d results for %d entries", checkpoint.ErrCorruptLog, seq, len(results), len(tickets)))
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

// notifyApplied wakes whoever waits for the applied sequence to move.
func (l *Log) notifyApplied() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notifyAppliedLocked()
}

func (l *Log) notifyAppliedLocked() {
	close(l.mu.applied)
	l.mu.applied = make(chan struct{})
}

// cannotContinue stops the applier for good on a log this node cannot continue from.
func (l *Log) cannotContinue(err error) error {
	l.log.Error("this node cannot continue from the log", "err", err)
	l.fail(err)
	return supervise.Fatal(err)
}
