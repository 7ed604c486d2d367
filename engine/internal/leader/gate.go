package leader

import (
	"context"
	"errors"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// Gate is the cluster version's roster (engine/internal/gate), as the leader uses it.
type Gate interface {
	// Promote records the live nodes that never registered, then promises the next
	// cluster version if every member reads it and nothing holds it. It returns the
	// promised version (which may be one promised before, by an earlier leader, and not
	// yet in the log; 0: none) and, when it cannot promise, why.
	Promote(ctx context.Context, applied int) (promised int, why string, err error)
}

// GatePass is how often the leader looks at the roster.
const GatePass = 5 * time.Second

// PlanClusterVersion is the entry that raises the cluster version to what the roster
// promised, or nil when the log has it already. A decision of the two numbers.
func PlanClusterVersion(applied, promised int, now time.Time) *checkpoint.Entry {
	if promised <= applied {
		return nil
	}
	return &checkpoint.Entry{Kind: checkpoint.KindClusterVersion, ClusterVersion: promised, At: now}
}

// runGate raises the cluster version when the roster allows: a promise first, then the
// entry (a leader that dies between the two leaves the promise to the next one, which
// writes the entry on its first pass).
func (t *termServices) runGate(ctx context.Context) {
	s := t.s
	lastWhy := ""
	tick := s.clock.NewTicker(GatePass)
	defer tick.Stop()
	for ctx.Err() == nil {
		applied := s.cfg.State.ClusterVersion()
		promised, why, err := s.cfg.Gate.Promote(ctx, applied)
		switch {
		case err != nil:
			s.log.Warn("cluster version: read or write the roster", "err", err)
		case why != lastWhy:
			s.log.Info("cluster version stays", "version", applied, "why", why)
			lastWhy = why
		}
		if e := PlanClusterVersion(applied, promised, s.clock.Now()); e != nil {
			f := t.write(ctx, *e)
			if f == nil {
				return // the term is no longer trusted
			}
			if err := f.Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrInvalidEntry) {
				s.log.Error("cluster version: raise", "version", promised, "err", err)
			} else if err == nil {
				s.log.Info("cluster version raised: writers use the new log format", "version", promised)
			}
		}
		select {
		case <-ctx.Done():
		case <-tick.Chan():
		}
	}
}
