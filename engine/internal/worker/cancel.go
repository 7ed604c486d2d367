package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// ErrRunEnded is the cause of an epoch stopped because the log ended its run from
// outside: an operator's cancel (written on any node) or a dead-letter.
var ErrRunEnded = errors.New("engine: the run ended while this node executed it")

// endedFromOutside tells the statuses that only someone other than the run's owner
// sets: a run this node executes that takes one of them must stop at once.
func endedFromOutside(s checkpoint.RunStatus) bool {
	return s == checkpoint.StatusCancelled || s == checkpoint.StatusDeadLettered
}

// stopEnded stops this node's execution of a run the log has just ended from outside
// (invariant 8: a cancelled run's step process is stopped). It is called from the
// applier's goroutine after each applied message, for every run whose status the
// message changed (checkpoint.StoreOptions.OnStatus), so it must not block: it only
// cancels the run's context; the steps stop (every process of an exec step gets SIGTERM,
// then SIGKILL after its grace) and execute releases the lease on its own goroutine.
//
// Why this trigger: the cancel entry may be written on any node, and every node applies
// every entry, so the apply is the one place that sees it everywhere, exactly once, and
// at no cost to other entries: the hook runs for status changes only and returns after
// one comparison unless the run was cancelled or dead-lettered. (Re-reading the runs in
// p.mu.running on every Changed() would cost a Pebble read per running run per applied
// message on the W2 path.)
func (p *Pool) RunEnded(run string, status checkpoint.RunStatus) {
	if !endedFromOutside(status) {
		return
	}
	// Counted before the lookup: a runExec not yet registered at the lookup sees the
	// count move when it starts (checkEnded) and reads the run's status itself.
	p.runsEnded.Add(1)
	if p.hooks.KeepEndedRunning.Load() {
		return
	}
	x := p.running(run)
	if x != nil {
		x.end(fmt.Errorf("%w: %s", ErrRunEnded, status))
	}
}

// end stops the epoch because its run ended: no more writes (the log would refuse them
// anyway: the run is over), every step's context cancelled with the cause.
func (x *runExec) end(cause error) {
	if x.ended.Swap(true) {
		return
	}
	x.log.Info("run ended from outside; stopping its steps", "cause", cause)
	x.cancel(cause)
}

// checkEnded closes the gap between newRunExec's read of the run and the registration
// in p.mu.running: a cancel applied in between found nothing to stop. It costs one
// atomic load unless a run ended (anywhere) meanwhile; then one read of this run.
func (x *runExec) checkEnded() {
	if x.p.hooks.KeepEndedRunning.Load() {
		return
	}
	if endedFromOutside(x.run.Status) {
		x.end(fmt.Errorf("%w: %s", ErrRunEnded, x.run.Status))
		return
	}
	if x.p.runsEnded.Load() == x.endedSeen {
		return
	}
	if r, err := x.p.cfg.State.Run(x.run.ID); err == nil && endedFromOutside(r.Status) {
		x.end(fmt.Errorf("%w: %s", ErrRunEnded, r.Status))
	}
}

// stopGrace is the most time a step may take to stop once its context is cancelled
// (steps.Input.StopGrace; an exec step's SIGTERM-to-SIGKILL grace is cut to it).
//
// A lost lease's kill switch fires at most 2/3 TTL after the last renewal was sent, and
// the server lets another node take the lease no sooner than a TTL after it: TTL/3
// between them. The grace is TTL/4 so that the SIGKILL lands before the lease can move
// with TTL/12 to spare for the timers and the scheduling between the kill switch and
// the SIGTERM (docs/decisions.md).
func (p *Pool) stopGrace() time.Duration { return p.cfg.TTL / 4 }
