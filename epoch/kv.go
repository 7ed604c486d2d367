package epoch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// latest is a key's newest revision as the bucket's leader has it.
type latest struct {
	rev     uint64
	value   []byte
	deleted bool // a delete, purge or lapse marker
	found   bool
}

// readLatest reads a key through the bucket's leader (port.KV.Latest): every decision
// made before a compare-and-set reads this way.
func readLatest(ctx context.Context, kv port.KV, key string) (latest, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	e, err := kv.Latest(ctx, key)
	if errors.Is(err, port.ErrKeyNotFound) {
		return latest{}, nil
	}
	if err != nil {
		return latest{}, fmt.Errorf("epoch: read %s/%s: %w", kv.Bucket(), key, err)
	}
	return latest{rev: e.Revision, value: e.Value, deleted: e.Op != port.OpPut, found: true}, nil
}

// withDefaultTimeout bounds a network call whose caller set no deadline. It is the one
// timer of this package on real time rather than Config.Clock: it decides nothing about
// ownership, it only stops a call the network swallowed, and it must fire even in a test
// whose fake clock stands still. (Contexts of withClockDeadline report no deadline, so
// calls under them get it too.)
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, 5*time.Second)
}

// isRevisionMismatch reports a compare-and-set conflict.
func isRevisionMismatch(err error) bool {
	return errors.Is(err, port.ErrWrongRevision) || errors.Is(err, port.ErrKeyExists)
}
