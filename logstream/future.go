package logstream

import (
	"context"
	"fmt"
	"sync"
)

// Future is the pending outcome of one Writer.Write: its entries share one log message,
// so they are decided together, each on its own (hashicorp/raft's ApplyFuture). The
// caller awaits it or not; an unawaited Future costs nothing more.
type Future struct {
	a    *Applier // its stop and failure end a wait
	n    int      // entries
	once sync.Once
	done chan struct{}
	seq  uint64  // the message's sequence, once known
	errs []error // one verdict per entry, once done (unless err)
	err  error   // the write's own failure (refused, stopped, outcome unknown): every entry's
}

func newFuture(a *Applier, n int) *Future {
	return &Future{a: a, n: n, done: make(chan struct{})}
}

// failedFuture is a Future already resolved with err for every entry.
func failedFuture(a *Applier, n int, err error) *Future {
	f := newFuture(a, n)
	f.fail(err)
	return f
}

// resolve gives the entries their verdicts from the message applied at seq.
func (f *Future) resolve(seq uint64, errs []error) {
	f.once.Do(func() {
		f.seq, f.errs = seq, errs
		close(f.done)
	})
}

// fail gives every entry err: the write never reached a verdict.
func (f *Future) fail(err error) {
	f.once.Do(func() {
		f.err = err
		close(f.done)
	})
}

// wait waits until the future is resolved (nil) or the wait ends without an outcome:
// ctx ends, the applier stops or fails.
func (f *Future) wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	default:
	}
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("logstream: await: %w", ctx.Err())
	case <-f.a.failed:
		select { // it may have been resolved just before
		case <-f.done:
			return nil
		default:
			return f.a.Err()
		}
	case <-f.a.stopped:
		select {
		case <-f.done:
			return nil
		default:
			return ErrStopped
		}
	}
}

// Await waits until this node has applied the write's message and returns nil if every
// entry was accepted, else the first entry's rejection in the order written (errors.Is
// it with checkpoint.ErrFenced, ErrStaleTerm, ...). A write refused before publishing
// (ErrOutputTooLarge, checkpoint.ErrInvalidEntry, ErrStopped) or of unknown outcome
// (ErrAppendUncertain) returns that; a wait that ends first returns why (ctx's error,
// ErrStopped, the applier's error), and the outcome stays unknown to the caller.
func (f *Future) Await(ctx context.Context) error {
	if err := f.wait(ctx); err != nil {
		return err
	}
	if f.err != nil {
		return f.err
	}
	for _, err := range f.errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Results waits like Await and returns each entry's outcome, in the order written: nil
// if it was accepted, else its rejection. When the write failed as a whole, or the wait
// ended first, every entry's outcome is that error.
func (f *Future) Results(ctx context.Context) []error {
	out := make([]error, f.n)
	err := f.wait(ctx)
	if err == nil {
		err = f.err
	}
	if err != nil {
		for i := range out {
			out[i] = err
		}
		return out
	}
	copy(out, f.errs)
	return out
}

// Seq is the sequence of the log message that holds the write's entries, once Await
// (or Results) returned their verdicts; 0 before, and when the write never reached a
// verdict. An assign's epoch is this sequence.
func (f *Future) Seq() uint64 {
	select {
	case <-f.done:
		return f.seq
	default:
		return 0
	}
}
