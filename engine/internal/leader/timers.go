package leader

import (
	"context"
	"errors"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/logstream"
)

// Durable timers (checkpoint/wait.go): a parked run's wait may have a time (a wait's or
// an approval's timeout, the end of a sleep). The leader wakes each run whose time has
// come with a wake entry naming the park it ends, so a wake written twice (two passes,
// two leaders) wakes once, and a deposed leader's is rejected for its term. A new leader
// fires what came due while there was none at its first pass: a timer is late by at
// most the failover plus one pass (TimerPass).

// TimerBatch bounds the wakes one pass writes; a full pass is followed by another.
const TimerBatch = 256

// TimerPass is the longest the leader sleeps between looks at the timer index: a park
// that sets an earlier timer than the one it sleeps towards is seen within it.
const TimerPass = time.Second

// PlanWakes is the wake entries for the parked runs due at now (without the term, which
// write adds), and when to look again.
func PlanWakes(st State, now time.Time, limit int) ([]checkpoint.Entry, time.Time, error) {
	due, next, err := st.DueTimers(now, limit)
	entries := make([]checkpoint.Entry, 0, len(due))
	for _, d := range due {
		entries = append(entries, checkpoint.Entry{Kind: checkpoint.KindWake, Run: d.Run, Step: d.Step, Item: checkpoint.ItemWhole, ParkSeq: d.ParkSeq, At: now})
	}
	return entries, next, err
}

// PlanDeadlines is the deadline-missed entries for the runs whose deadline is due at
// now and that have not succeeded (checkpoint/operations.go), and when to look again.
func PlanDeadlines(st State, now time.Time, limit int) ([]checkpoint.Entry, time.Time, error) {
	due, ticks, next, err := st.DueDeadlines(now, limit)
	entries := make([]checkpoint.Entry, 0, len(due)+len(ticks))
	for _, id := range due {
		entries = append(entries, checkpoint.Entry{Kind: checkpoint.KindDeadlineMissed, Run: id, At: now})
	}
	for _, t := range ticks { // a tick that never ran: "it did not even start"
		entries = append(entries, checkpoint.Entry{Kind: checkpoint.KindDeadlineMissed, Tick: &checkpoint.CronTick{Workflow: t.Workflow, At: t.At}, At: now})
	}
	return entries, next, err
}

func (t *termServices) runTimers(ctx context.Context) {
	s := t.s
	for ctx.Err() == nil {
		wait := TimerPass
		now := s.clock.Now()
		entries, next, err := PlanWakes(s.cfg.State, now, TimerBatch)
		if err != nil {
			s.log.Error("timers: read the timer index", "err", err)
		}
		missed, nextDeadline, err := PlanDeadlines(s.cfg.State, now, TimerBatch)
		if err != nil {
			s.log.Error("deadlines: read the deadline index", "err", err)
		}
		for _, e := range missed {
			if e.Run == "" {
				s.log.Warn("a tick never ran by its deadline", "workflow", e.Tick.Workflow, "tick", e.Tick.At)
				continue
			}
			s.log.Warn("a run has not succeeded by its deadline", "run", e.Run)
		}
		entries = append(entries, missed...)
		if next.IsZero() || !nextDeadline.IsZero() && nextDeadline.Before(next) {
			next = nextDeadline
		}
		for len(entries) > 0 && ctx.Err() == nil {
			n := min(len(entries), logstream.DefaultMaxBatchEntries)
			f := t.write(ctx, entries[:n]...)
			entries = entries[n:]
			if f == nil {
				return // the term is no longer trusted
			}
			if err := f.Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrConflict) && !errors.Is(err, checkpoint.ErrNotFound) {
				s.log.Error("timers: wake parked runs", "err", err)
			}
			wait = 0 // a full batch may have left more due
		}
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(s.clock.Now()), 0))
		}
		if wait == 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(wait):
		}
	}
}
