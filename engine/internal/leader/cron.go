package leader

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// The cron decisions. For every workflow with a schedule the leader walks the fire
// times after the last one recorded in the log, and records each as a cron_tick entry
// with its outcome and the term: fired (with the run, whose ID is derived from the
// workflow and the tick, so a second fire of one tick is the same run and the log
// refuses it), skipped-overlap, missed, or caught-up. A tick more than the grace late is
// one the scheduler missed (no leader ran): the catch-up policy decides whether it
// fires. The log, not a timer, is the memory: a new leader carries on from the last
// recorded tick.

// CronWindow bounds the missed ticks looked at after an outage (per workflow).
const CronWindow = 1000

// CronPlan is one workflow's due fire times, oldest first.
type CronPlan struct {
	Workflow *workflow.Workflow
	Ticks    []time.Time
	// Pause is the schedule's pause state (nil: never paused): the ticks that came
	// while it was paused and do not fire are recorded as paused, not missed.
	Pause *checkpoint.ScheduleState
}

// CronDue returns, per scheduled workflow, the fire times due at now (after the last
// recorded one, or after the version was applied), and the earliest future fire time
// (zero if none).
func CronDue(st State, specs Specs, now time.Time) ([]CronPlan, time.Time, error) {
	vs, err := st.Workflows()
	if err != nil {
		return nil, time.Time{}, err
	}
	var plans []CronPlan
	var next time.Time
	for _, v := range vs {
		wf, err := specs.Workflow(v.Name, v.Version)
		if err != nil || wf.Schedule == nil {
			continue
		}
		sched, loc, ok := scheduleOf(wf)
		if !ok {
			continue
		}
		pause, err := st.Schedule(wf.Name)
		if err != nil {
			return nil, time.Time{}, err
		}
		if pause != nil && pause.Paused {
			continue // nothing fires while paused; the resume wakes cron (ScheduleChanged)
		}
		from := v.At
		ticks, err := st.Ticks(wf.Name)
		if err != nil {
			return nil, time.Time{}, err
		}
		// The last tick the schedule itself recorded: a backfill's ticks are an
		// operator's, anywhere in the past, and move nothing here.
		for i := len(ticks) - 1; i >= 0; i-- {
			if ticks[i].Outcome != checkpoint.TickBackfilled || ticks[i].Scheduled {
				from = ticks[i].At
				break
			}
		}
		var due []time.Time
		t := sched.Next(from.In(loc))
		for !t.IsZero() && !t.After(now) {
			due = append(due, t)
			if len(due) > CronWindow {
				due = due[1:] // older than the window: not looked at
			}
			t = sched.Next(t)
		}
		if len(due) > 0 {
			plans = append(plans, CronPlan{Workflow: wf, Ticks: due, Pause: pause})
		}
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return plans, next, nil
}

// PlanTicks turns one workflow's due ticks into cron_tick entries, in order. A tick
// more than grace before now was missed: with catchup all every missed tick fires
// (caught-up), with latest only the last missed one, with none none; one that came while
// the schedule was paused and does not fire is recorded as paused. A tick that would
// fire is skipped (skipped-overlap) under overlap skip while a run of the workflow is
// pending or running: active says whether one was before these ticks, and a tick fired
// here makes the next ones see one. A workflow whose inputs have no defaults cannot be
// fired by a schedule: its ticks are recorded as missed, and warn says why.
func PlanTicks(p CronPlan, now time.Time, grace time.Duration, active bool) (entries []checkpoint.Entry, warn error) {
	wf, sch := p.Workflow, p.Workflow.Schedule
	lastMissed := -1
	for i, tick := range p.Ticks {
		if now.Sub(tick) > grace {
			lastMissed = i
		}
	}
	for i, tick := range p.Ticks {
		outcome := checkpoint.TickFired
		if i <= lastMissed {
			switch {
			case sch.Catchup == "all", sch.Catchup == "latest" && i == lastMissed:
				outcome = checkpoint.TickCaughtUp
			case p.Pause.PausedInterval(tick):
				outcome = checkpoint.TickPaused // it came while an operator had paused the schedule
			default:
				outcome = checkpoint.TickMissed
			}
		}
		fires := outcome == checkpoint.TickFired || outcome == checkpoint.TickCaughtUp
		if fires && sch.Overlap == "skip" && active {
			outcome, fires = checkpoint.TickSkippedOverlap, false
		}
		e := checkpoint.Entry{Kind: checkpoint.KindCronTick,
			Tick: &checkpoint.CronTick{Workflow: wf.Name, At: tick.UTC(), Outcome: outcome}}
		if !fires { // no run: the tick's own deadline counts if nothing runs it by then
			e.Tick.Deadline = workflow.DeadlineFor(wf, tick, tick)
		}
		if fires {
			sub, err := TickSubmit(wf, tick, checkpoint.TriggerCron)
			if err != nil {
				warn = err
				e.Tick.Outcome = checkpoint.TickMissed
				e.Tick.Deadline = workflow.DeadlineFor(wf, tick, tick)
			} else {
				id := workflow.TickRunID(wf.Name, tick)
				e.Run, e.Tick.RunID, e.Submit = id, id, sub
				active = true
			}
		}
		entries = append(entries, e)
	}
	return entries, warn
}

// TickSubmit is the submit of a run for a tick: its inputs resolved as at the tick.
func TickSubmit(wf *workflow.Workflow, tick time.Time, trigger string) (*checkpoint.Submit, error) {
	inputs, err := workflow.ResolveInputs(wf, nil, tick)
	if err != nil {
		return nil, fmt.Errorf("workflow %s: its inputs have no defaults for a scheduled run: %w", wf.Name, err)
	}
	raw, _ := json.Marshal(inputs)
	sub := &checkpoint.Submit{Workflow: wf.Name, Version: wf.Version, Trigger: trigger,
		ScheduledAt: tick.UTC(), MaxEpochs: wf.MaxEpochs, Inputs: raw, Priority: wf.Priority}
	sub.Handlers = HandlerSpecs(wf)
	if trigger != checkpoint.TriggerBackfill { // a backfilled tick's deadline passed long ago: no alarm
		sub.Deadline = workflow.DeadlineFor(wf, tick, tick)
	}
	for _, st := range wf.Steps {
		sub.Steps = append(sub.Steps, checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
	}
	return sub, nil
}

// WorkflowActive says whether a run of the workflow is pending, running or waiting
// (overlap): a run parked on its approval has not finished either.
func WorkflowActive(st State, name string) bool {
	for _, s := range []checkpoint.RunStatus{checkpoint.StatusPending, checkpoint.StatusRunning, checkpoint.StatusWaiting} {
		runs, _, err := st.ListRuns(checkpoint.ListOptions{Workflow: name, Status: s, Limit: 1})
		if err == nil && len(runs) > 0 {
			return true
		}
	}
	return false
}

// HandlerSpecs is what a run's submit carries of its workflow's handlers (nil: none).
func HandlerSpecs(wf *workflow.Workflow) map[string][]checkpoint.StepSpec {
	var out map[string][]checkpoint.StepSpec
	for _, event := range workflow.HandlerEvents {
		for _, st := range wf.Handlers[event] {
			if out == nil {
				out = map[string][]checkpoint.StepSpec{}
			}
			out[event] = append(out[event], checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
		}
	}
	return out
}

// scheduleOf is wf's schedule and its timezone (false: it has none that parses; applied
// workflows were validated, so only a newer binary's syntax fails here).
func scheduleOf(wf *workflow.Workflow) (cron.Schedule, *time.Location, bool) {
	if wf.Schedule == nil {
		return nil, nil, false
	}
	sched, err := workflow.CronParser.Parse(wf.Schedule.Cron)
	if err != nil {
		return nil, nil, false
	}
	loc, err := time.LoadLocation(wf.Schedule.Timezone)
	if err != nil {
		return nil, nil, false
	}
	return sched, loc, true
}
