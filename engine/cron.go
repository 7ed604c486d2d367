package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/backoff"
	"github.com/flowrun/flow/workflow"
)

// The cron service (leader only). For every workflow with a schedule it walks the fire
// times after the last one recorded in the log, and records each as a cron_tick entry
// with its outcome and the term: fired (with the run, whose ID is derived from the
// workflow and the tick, so a second fire of one tick is the same run and the log
// refuses it), skipped-overlap, missed, or caught-up. A tick more than CronGrace late is
// one the scheduler missed (no leader ran): the catch-up policy decides whether it
// fires. The log, not the timer, is the memory: a new leader carries on from the last
// recorded tick.

// cronWindow bounds the missed ticks looked at after an outage (per workflow).
const cronWindow = 1000

// CronRunID is the run ID of a workflow's tick.
func CronRunID(name string, tick time.Time) string { return workflow.TickRunID(name, tick) }

type cronPlan struct {
	wf    *workflow.Workflow
	ticks []time.Time // due fire times, oldest first
}

// cronDue returns, per scheduled workflow, the fire times due at now (after the last
// recorded one), and the earliest future fire time.
func (s *scheduler) cronDue(now time.Time) ([]cronPlan, time.Time, error) {
	vs, err := s.e.store.Workflows()
	if err != nil {
		return nil, time.Time{}, err
	}
	var plans []cronPlan
	var next time.Time
	for _, v := range vs {
		wf, err := s.e.Workflow(v.Name, v.Version)
		if err != nil || wf.Schedule == nil {
			continue
		}
		sched, err := workflow.CronParser.Parse(wf.Schedule.Cron)
		if err != nil {
			continue
		}
		loc, err := time.LoadLocation(wf.Schedule.Timezone)
		if err != nil {
			continue
		}
		// From the last recorded tick, or from when this version was applied.
		from := v.At
		ticks, err := s.e.store.Ticks(wf.Name)
		if err != nil {
			return nil, time.Time{}, err
		}
		if len(ticks) > 0 {
			from = ticks[len(ticks)-1].At
		}
		var due []time.Time
		t := sched.Next(from.In(loc))
		for !t.IsZero() && !t.After(now) {
			due = append(due, t)
			if len(due) > cronWindow {
				due = due[1:] // older than the window: not looked at
			}
			t = sched.Next(t)
		}
		if len(due) > 0 {
			plans = append(plans, cronPlan{wf: wf, ticks: due})
		}
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return plans, next, nil
}

// runCron fires due ticks until ctx ends, waking at the next fire time or when the
// log changes (a workflow applied).
func (s *scheduler) runCron(ctx context.Context) {
	retry := backoff.Policy{Base: 500 * time.Millisecond, Cap: 30 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		changed := s.e.store.ScheduleChanged()
		now := time.Now()
		plans, next, err := s.cronDue(now)
		if err != nil {
			s.e.log.Warn("cron", "err", err)
		}
		ok := err == nil
		for _, p := range plans {
			ok = s.fireTicks(ctx, p, now) && ok
		}
		wait := time.Minute
		if !next.IsZero() {
			wait = time.Until(next)
		}
		// A tick that could not be recorded (the log unreachable) wakes nothing: the
		// planner retries on its own, with backoff, rather than at the next fire time.
		if ok {
			failures = 0
		} else {
			wait = min(wait, retry.Ceiling(failures))
			failures++
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-changed:
		}
		t.Stop()
	}
}

// fireTicks records the due ticks of one workflow in order; false if one could not be
// recorded (the planner then retries soon instead of at the next fire time).
func (s *scheduler) fireTicks(ctx context.Context, p cronPlan, now time.Time) bool {
	sch := p.wf.Schedule
	lastMissed := -1
	for i, tick := range p.ticks {
		if now.Sub(tick) > s.e.cfg.CronGrace {
			lastMissed = i
		}
	}
	for i, tick := range p.ticks {
		outcome := checkpoint.TickFired
		if i <= lastMissed {
			switch {
			case sch.Catchup == "all", sch.Catchup == "latest" && i == lastMissed:
				outcome = checkpoint.TickCaughtUp
			default:
				outcome = checkpoint.TickMissed
			}
		}
		if (outcome == checkpoint.TickFired || outcome == checkpoint.TickCaughtUp) && sch.Overlap == "skip" && s.workflowActive(p.wf.Name) {
			outcome = checkpoint.TickSkippedOverlap
		}
		if err := s.recordTick(ctx, p.wf, tick, outcome); err != nil {
			if !errors.Is(err, checkpoint.ErrTickExists) {
				s.e.log.Warn("cron tick not recorded; retrying", "workflow", p.wf.Name, "tick", tick, "err", err)
				return false
			}
		}
	}
	return true
}

func (s *scheduler) workflowActive(name string) bool {
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusPending, checkpoint.StatusRunning} {
		runs, _, err := s.e.store.ListRuns(checkpoint.ListOptions{Workflow: name, Status: st, Limit: 1})
		if err == nil && len(runs) > 0 {
			return true
		}
	}
	return false
}

func (s *scheduler) recordTick(ctx context.Context, wf *workflow.Workflow, tick time.Time, outcome string) error {
	e := checkpoint.Entry{Kind: checkpoint.KindCronTick,
		Tick: &checkpoint.CronTick{Workflow: wf.Name, At: tick.UTC(), Outcome: outcome}}
	if outcome == checkpoint.TickFired || outcome == checkpoint.TickCaughtUp {
		inputs, err := ResolveInputs(wf, nil, tick)
		if err != nil {
			// A schedule cannot supply required inputs: record the tick, fire nothing.
			s.e.log.Warn("cron: the workflow's inputs have no defaults", "workflow", wf.Name, "err", err)
			e.Tick.Outcome = checkpoint.TickMissed
		} else {
			raw, _ := json.Marshal(inputs)
			id := CronRunID(wf.Name, tick)
			e.Run, e.Tick.RunID = id, id
			e.Submit = &checkpoint.Submit{Workflow: wf.Name, Version: wf.Version, Trigger: checkpoint.TriggerCron,
				ScheduledAt: tick.UTC(), MaxEpochs: wf.MaxEpochs, Inputs: raw}
			for _, st := range wf.Steps {
				e.Submit.Steps = append(e.Submit.Steps, checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
			}
		}
	}
	if _, err := s.write(ctx, e); err != nil {
		return fmt.Errorf("cron: %w", err)
	}
	s.e.log.Info("cron tick", "workflow", wf.Name, "tick", tick.UTC(), "outcome", e.Tick.Outcome, "run", e.Run, "term", s.term.Term())
	return nil
}
