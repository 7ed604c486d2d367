package logstream

import (
	"context"
	"fmt"
	"sync"
)

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
		return fmt.Errorf("logstream: await: %w", ctx.Err())
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
