package logstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// The Applier's checks that the log is one this node's state can continue from: the
// same stream (its identity), and no message missing between the applied sequence and
// the next one delivered.

// Identity names a stream by its name and creation time: a stream deleted and created
// again under the same name has another (JetStream keeps one creation time for all of a
// stream's replicas).
func Identity(name string, created time.Time) string {
	return name + "@" + created.UTC().Format(time.RFC3339Nano)
}

// checkLog refuses a log this node's state cannot continue from: another stream than
// the one the state was built from (its identity is recorded in the state), or one that
// no longer holds the messages after the applied sequence (purged past it). A state
// without an identity (new, or from a flowd that did not record one) records this log's.
func (a *Applier) checkLog(ctx context.Context) error {
	before := a.store.Applied()
	info, err := a.src.Info(ctx)
	if err != nil {
		if errors.Is(err, port.ErrNotFound) {
			return a.wrongLog("the stream %s does not exist (it was deleted); this node's state was built from it", a.stream)
		}
		return fmt.Errorf("logstream: stream info: %w", err)
	}
	return a.checkInfo(info, before)
}

// checkInfo is checkLog on stream info already fetched; appliedBefore is the applied
// sequence read before it was (the node may apply more meanwhile: the log's end is
// compared with what was applied before it was read, its start with what is applied
// after).
func (a *Applier) checkInfo(info port.StreamInfo, appliedBefore uint64) error {
	if a.hooks.NoLogCheck { // the controls of docs/testing.md's "log's identity and continuity"
		return nil
	}
	id := Identity(a.stream, info.Created)
	have, err := a.store.LogIdentity()
	if err != nil {
		return err
	}
	applied := a.store.Applied()
	switch {
	case have == "":
		if err := a.store.SetLogIdentity(id); err != nil {
			return err
		}
	case have != id:
		return a.wrongLog("this node's state was built from the stream %s, and the stream now is %s: it was deleted and created again, so its sequences are not the ones applied", have, id)
	}
	if first := info.FirstSeq; first > applied+1 {
		if applied == 0 { // an empty state (or one whose unsynced writes a crash lost)
			return a.wrongLog("this node has no state and the log starts at sequence %d: messages 1 to %d were purged (compacted), and no snapshot bridges the gap", first, first-1)
		}
		return a.wrongLog("this node applied the log up to sequence %d, and the log now starts at %d: messages %d to %d were purged before this node applied them, and no snapshot bridges the gap",
			applied, first, applied+1, first-1)
	}
	if appliedBefore > info.LastSeq {
		return a.wrongLog("this node applied the log up to sequence %d, and the log ends at %d: it is not the log this state was built from", appliedBefore, info.LastSeq)
	}
	return nil
}

// wrongLog is ErrWrongLog with what happened and how to recover.
func (a *Applier) wrongLog(format string, args ...any) error {
	return fmt.Errorf("%w: %s. To recover, stop this node, move its state aside (the data dir's state folder) and start it again: it rebuilds its state from the log (docs/operations.md, \"Disaster recovery\")",
		ErrWrongLog, fmt.Sprintf(format, args...))
}

// checkGap is called when the consumer delivers seq beyond the next one to apply: the
// sequences between must have been deleted (they count as seen), not purged from below.
func (a *Applier) checkGap(ctx context.Context, seq uint64) error {
	if a.hooks.NoLogCheck {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := a.src.Info(ictx)
	if err != nil {
		return fmt.Errorf("logstream: stream info at a gap before %d: %w", seq, err)
	}
	applied := a.store.Applied()
	if first := info.FirstSeq; first > applied+1 {
		return a.wrongLog("this node applied the log up to sequence %d, and the log now starts at %d: messages %d to %d were purged before this node applied them",
			applied, first, applied+1, first-1)
	}
	return nil
}

// skipDeleted moves the applied sequence to end when the log holds no message after
// the applied one up to end (they were deleted): otherwise a node waits for a message
// that will never come (the stream's last one, deleted). It reports whether it did.
func (a *Applier) skipDeleted(ctx context.Context, end uint64) (bool, error) {
	applied := a.store.Applied()
	if end <= applied {
		return false, nil
	}
	next, has, err := a.src.NextSeq(ctx, applied+1)
	if err != nil || has && next <= end {
		return false, nil // a message is there (the consumer brings it), or we cannot tell
	}
	if err := a.store.Skip(end); err != nil {
		return false, err
	}
	a.log.Info("the log's last messages were deleted; counted as seen", "from", applied+1, "to", end)
	a.notifyApplied()
	return true, nil
}
