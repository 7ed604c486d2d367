package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
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
		var pairs [][]checkpoint.Entry // a tick's miss with its handler's submit: one message each
		for _, e := range missed {
			if e.Run == "" {
				s.log.Warn("a tick never ran by its deadline", "workflow", e.Tick.Workflow, "tick", e.Tick.At)
				h, err := TickHandler(s.cfg.State, s.cfg.Specs, checkpoint.DueTick{Workflow: e.Tick.Workflow, At: e.Tick.At}, now, s.hooks.RandomTickHandlerIDs.Load())
				if err != nil {
					s.log.Error("deadlines: the on_deadline handler of a tick that never ran", "workflow", e.Tick.Workflow, "tick", e.Tick.At, "err", err)
				}
				if h != nil {
					pairs = append(pairs, []checkpoint.Entry{e, *h})
					continue
				}
			} else {
				s.log.Warn("a run has not succeeded by its deadline", "run", e.Run)
			}
			entries = append(entries, e)
		}
		paused, err := PlanPausedTickHandlers(s.cfg.State, s.cfg.Specs, now, TimerBatch, s.hooks.RandomTickHandlerIDs.Load())
		if err != nil {
			s.log.Error("deadlines: the on_deadline handlers of a paused schedule's ticks", "err", err)
		}
		for _, h := range paused {
			s.log.Warn("a paused schedule's tick never ran by its deadline: starting its on_deadline handler", "run", h.Run)
			pairs = append(pairs, []checkpoint.Entry{h})
		}
		for _, p := range pairs {
			for i := range p {
				if p[i].Submit != nil { // a copy: the plan's entries are the plan's
					sub := *p[i].Submit
					sub.KeyScheme = checkpoint.KeySchemeFor(s.cfg.State.ClusterVersion())
					p[i].Submit = &sub
				}
			}
			f := t.write(ctx, p...)
			if f == nil {
				return
			}
			// A conflict, or a run that exists: another leader's copy, or a handler
			// started while the schedule was paused, landed first.
			if err := f.Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrConflict) && !errors.Is(err, checkpoint.ErrNotFound) && !errors.Is(err, checkpoint.ErrRunExists) {
				s.log.Error("deadlines: a tick's miss and its handler", "err", err)
			}
			wait = 0
		}
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

// TickHandler is the submit of the on_deadline handler run of a tick that never ran by
// its deadline, written in the same message as the tick's deadline-missed entry (nil
// when the workflow's latest version has no on_deadline steps). Its ID is derived from
// the tick (ChildID(TickRunID, "on-deadline", 0)), so a second leader's copy of the
// message starts nothing: the tick's miss is recorded once and a run ID is taken once.
// It runs the handler steps as a handler of a run does (its spec is the handler
// workflow), and its templates read the tick (schedule.tick, as the run would have) and
// why it never ran (run.error; run.id is the run ID the tick would have had). Only
// entries every reader of the log already knows: a submit carrying its spec.
func TickHandler(st State, specs Specs, t checkpoint.DueTick, now time.Time, randomID bool) (*checkpoint.Entry, error) {
	wf, err := latestVersion(st, specs, t.Workflow)
	if wf == nil || err != nil {
		return nil, err // the workflow is gone: nobody to tell
	}
	ticks, err := st.Ticks(t.Workflow)
	if err != nil {
		return nil, err
	}
	var tick *checkpoint.Tick
	for i := range ticks {
		if ticks[i].At.Equal(t.At) {
			tick = &ticks[i]
		}
	}
	if tick == nil {
		return nil, nil
	}
	pause, err := st.Schedule(t.Workflow)
	if err != nil {
		return nil, err
	}
	return HandlerOfTick(wf, t.At, tick.Deadline, whyNeverRan(tick.Outcome, t.At, tick.Deadline, pause), now, randomID)
}

// PlanPausedTickHandlers is the handler submits of the ticks of paused schedules whose
// deadline has passed: a paused schedule records its ticks only when it is resumed (so
// that catchup can fire the latest), but the night that did not run is told at its
// deadline, while the pause lasts. A tick whose handler run exists is skipped, and the
// handler's ID is the tick's: the one a later deadline-missed entry (at the resume)
// would start, so each tick's handler starts once. At most limit.
func PlanPausedTickHandlers(st State, specs Specs, now time.Time, limit int, randomID bool) ([]checkpoint.Entry, error) {
	vs, err := st.Workflows()
	if err != nil {
		return nil, err
	}
	var out []checkpoint.Entry
	for _, v := range vs {
		wf, err := specs.Workflow(v.Name, v.Version)
		if err != nil || wf.Schedule == nil || wf.Deadline == "" || wf.HandlerWorkflow(workflow.OnDeadline) == nil {
			continue
		}
		pause, err := st.Schedule(wf.Name)
		if err != nil {
			return out, err
		}
		if pause == nil || !pause.Paused {
			continue
		}
		sched, loc, ok := scheduleOf(wf)
		if !ok {
			continue
		}
		from := pause.Since
		if ticks, err := st.Ticks(wf.Name); err == nil && len(ticks) > 0 && ticks[len(ticks)-1].At.After(from) {
			from = ticks[len(ticks)-1].At
		}
		var due []time.Time // the newest CronWindow ticks since the pause
		for t := sched.Next(from.In(loc)); !t.IsZero() && !t.After(now); t = sched.Next(t) {
			if d := workflow.DeadlineFor(wf, t, t); !d.IsZero() && !d.After(now) {
				due = append(due, t)
				if len(due) > CronWindow {
					due = due[1:]
				}
			}
		}
		for _, t := range due {
			id := checkpoint.ChildID(workflow.TickRunID(wf.Name, t), "on-deadline", 0)
			if r, err := st.Run(id); err == nil && r != nil && !randomID {
				continue
			}
			d := workflow.DeadlineFor(wf, t, t)
			e, err := HandlerOfTick(wf, t, d, whyNeverRan(checkpoint.TickPaused, t, d, pause), now, randomID)
			if err != nil {
				return out, err
			}
			out = append(out, *e)
			if len(out) >= limit {
				return out, nil
			}
		}
	}
	return out, nil
}

// latestVersion is the latest version of a workflow (nil: none).
func latestVersion(st State, specs Specs, name string) (*workflow.Workflow, error) {
	vs, err := st.Workflows()
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		if v.Name == name {
			return specs.Workflow(v.Name, v.Version)
		}
	}
	return nil, nil
}

// HandlerOfTick is the submit of the on_deadline handler run of wf's tick at (nil: wf
// has none), with its deadline and why it never ran.
func HandlerOfTick(wf *workflow.Workflow, at, deadline time.Time, why string, now time.Time, randomID bool) (*checkpoint.Entry, error) {
	hw := wf.HandlerWorkflow(workflow.OnDeadline)
	if hw == nil {
		return nil, nil
	}
	runID := workflow.TickRunID(wf.Name, at)
	hw.Handles = &workflow.HandledTick{Run: runID, Tick: at.UTC(), Deadline: deadline.UTC(), Why: why}
	spec, err := json.Marshal(hw)
	if err != nil {
		return nil, err
	}
	inputs, err := workflow.ResolveInputs(wf, nil, at)
	if err != nil {
		inputs = map[string]any{} // the tick could not have run for want of them: the handler still tells
	}
	raw, _ := json.Marshal(inputs)
	sub := &checkpoint.Submit{Workflow: wf.Name, Version: wf.Version, Trigger: checkpoint.TriggerHandler, ScheduledAt: at.UTC(),
		MaxEpochs: wf.MaxEpochs, Inputs: raw, Spec: spec}
	for _, st := range hw.Steps {
		sub.Steps = append(sub.Steps, checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
	}
	id := checkpoint.ChildID(runID, "on-deadline", 0)
	if randomID {
		id = checkpoint.ChildID(runID, fmt.Sprintf("on-deadline-%d", now.UnixNano()), 0)
	}
	return &checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, At: now, Submit: sub}, nil
}

// whyNeverRan says why a tick without a run never ran.
func whyNeverRan(outcome string, at, deadline time.Time, pause *checkpoint.ScheduleState) string {
	head := fmt.Sprintf("the tick at %s never ran by its deadline %s: ", at.UTC().Format(time.RFC3339), deadline.UTC().Format(time.RFC3339))
	switch outcome {
	case checkpoint.TickPaused:
		why := "the schedule was paused"
		if pause != nil && pause.Actor != "" {
			why += " by " + pause.Actor
		}
		if pause != nil && pause.Reason != "" {
			why += " (" + pause.Reason + ")"
		}
		return head + why
	case checkpoint.TickSkippedOverlap:
		return head + "it was skipped because a run of the workflow was still going (overlap: skip)"
	default:
		return head + "it was recorded as " + outcome + " (no leader fired it within the grace, or its inputs have no defaults)"
	}
}
