package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/workflow"
	"github.com/robfig/cron/v3"
)

// Nightly operations (checkpoint/operations.go).

// PauseSchedule pauses a workflow's schedule: no tick fires until ResumeSchedule; the
// ticks that come meanwhile are recorded as paused unless the schedule's catchup fires
// them at the resume.
func (o Ops) PauseSchedule(ctx context.Context, name, reason string) error {
	e := o.e
	return e.scheduleChange(ctx, checkpoint.KindCronPause, name, reason)
}

// ResumeSchedule resumes a paused schedule.
func (o Ops) ResumeSchedule(ctx context.Context, name string) error {
	e := o.e
	return e.scheduleChange(ctx, checkpoint.KindCronResume, name, "")
}

func (e *Engine) scheduleChange(ctx context.Context, kind checkpoint.Kind, name, reason string) error {
	if err := e.running(); err != nil {
		return err
	}
	entry := checkpoint.Entry{Kind: kind, Actor: audit.Actor(ctx), Owner: e.cfg.NodeID, Schedule: &checkpoint.ScheduleChange{Workflow: name, Reason: reason}}
	if err := entry.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return e.clog.Writer.Write(ctx, entry).Await(ctx)
}

// ScheduleState is a workflow's pause state (nil: never paused).
func (o Ops) ScheduleState(name string) (*checkpoint.ScheduleState, error) {
	e := o.e
	return e.store.Schedule(name)
}

// NextTick is one coming fire time of a schedule: in its timezone and in UTC, and what
// a daylight-saving change does to that day.
type NextTick struct {
	Local time.Time
	UTC   time.Time
	// DST says, on a day whose UTC offset changes, that local times in the gap are
	// skipped and those in the overlap repeated ("" on other days).
	DST string
}

// NextTicks are the next n fire times of a workflow's schedule after now.
func (o Ops) NextTicks(name string, n int) ([]NextTick, error) {
	e := o.e
	if n < 1 || n > 1000 {
		return nil, fmt.Errorf("%w: -n %d: use 1 to 1000", ErrBadInput, n)
	}
	w, err := e.Workflow(name, 0)
	if err != nil {
		return nil, err
	}
	if w.Schedule == nil {
		return nil, fmt.Errorf("%w: workflow %s has no schedule", ErrBadInput, name)
	}
	return NextTicksOf(w.Schedule, e.cfg.Now(), n)
}

// NextTicksOf are a schedule's next n fire times after now.
func NextTicksOf(s *workflow.Schedule, now time.Time, n int) ([]NextTick, error) {
	sched, err := workflow.CronParser.Parse(s.Cron)
	if err != nil {
		return nil, err
	}
	loc, err := time.LoadLocation(s.Timezone)
	if err != nil {
		return nil, err
	}
	var out []NextTick
	t := now.In(loc)
	for len(out) < n {
		prev := t
		t = sched.Next(t)
		if t.IsZero() {
			break
		}
		note := dstNote(t)
		// A daylight-saving day between two fire times that has none: its local time
		// fell in the hour the clocks skipped (cron does not fire it).
		for d := dayAfter(prev); d.Before(dayOf(t)); d = dayAfter(d) {
			if dn := dstNote(d); dn != "" {
				note = fmt.Sprintf("no fire time on %s (%s)", d.Format("2006-01-02"), dn)
			}
		}
		out = append(out, NextTick{Local: t, UTC: t.UTC(), DST: note})
	}
	return out, nil
}

func dayOf(t time.Time) time.Time {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, t.Location())
}

func dayAfter(t time.Time) time.Time { return dayOf(t).AddDate(0, 0, 1) }

// dstNote describes the UTC offset change of t's local day, if it has one.
func dstNote(t time.Time) string {
	loc := t.Location()
	y, m, d := t.Date()
	start := time.Date(y, m, d, 0, 0, 0, 0, loc)
	end := start.AddDate(0, 0, 1).Add(-time.Second)
	_, a := start.Zone()
	_, b := end.Zone()
	if a == b {
		return ""
	}
	kind := "skipped (the clocks go forward)"
	if b < a {
		kind = "repeated (the clocks go back)"
	}
	return fmt.Sprintf("daylight-saving day: UTC%s to UTC%s; local times in the change are %s", offset(a), offset(b), kind)
}

func offset(sec int) string {
	sign := "+"
	if sec < 0 {
		sign, sec = "-", -sec
	}
	return fmt.Sprintf("%s%02d:%02d", sign, sec/3600, sec%3600/60)
}

// RetryOptions are a retry's: from a step (it and every step that depends on it run
// again; the others keep their checkpoints) with inputs changed.
type RetryOptions struct {
	From   string
	Inputs map[string]any
	// Reason is recorded with the retry (in the run's history): a bulk operation's
	// name, say.
	Reason string
}

// RetryFrom retries a run that ended from a step: the step and its dependents, directly
// or not, run again under a new epoch, with the given inputs changed.
func (e *Engine) RetryFrom(ctx context.Context, id string, opts RetryOptions) error {
	if err := e.running(); err != nil {
		return err
	}
	if opts.From == "" {
		if len(opts.Inputs) > 0 {
			return fmt.Errorf("%w: --input needs --from (a retry without it resumes from the checkpoints, whose inputs are fixed)", ErrBadInput)
		}
		return e.retry(ctx, id, opts.Reason)
	}
	r, err := e.store.Run(id)
	if err != nil {
		return err
	}
	w, err := e.specs.OfRun(r)
	if err != nil {
		return err
	}
	if w.Step(opts.From) == nil {
		var names []string
		for _, st := range w.Steps {
			names = append(names, st.Name)
		}
		return fmt.Errorf("%w: run %s has no step %q (steps: %v)", ErrBadInput, id, opts.From, names)
	}
	reset := Dependents(w, opts.From)
	if e.hooks.RetryResetsAll.Load() { // the control: every step runs again
		reset = reset[:0]
		for _, st := range w.Steps {
			reset = append(reset, st.Name)
		}
	}
	entry := checkpoint.Entry{Kind: checkpoint.KindRetry, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID, Steps: reset, Reason: opts.Reason}
	if len(opts.Inputs) > 0 {
		// Checked over the run's inputs with the changes on top: an input the retry does
		// not change (a required one among them) keeps its value.
		merged := map[string]any{}
		_ = json.Unmarshal(r.Inputs, &merged)
		maps.Copy(merged, opts.Inputs)
		typed, err := workflow.ResolveInputs(w, merged, r.ScheduledAt)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadInput, err)
		}
		changed := map[string]any{}
		for k := range opts.Inputs {
			changed[k] = typed[k]
		}
		entry.Output, _ = json.Marshal(changed)
	}
	err = e.clog.Writer.Write(ctx, entry).Await(ctx)
	if errors.Is(err, checkpoint.ErrConflict) {
		return fmt.Errorf("%w (run %s is %s)", err, id, r.Status)
	}
	return err
}

// Dependents is step and every step that depends on it, directly or not, in the
// workflow's order.
func Dependents(w *workflow.Workflow, step string) []string {
	set := map[string]bool{step: true}
	for changed := true; changed; {
		changed = false
		for _, st := range w.Steps {
			if set[st.Name] {
				continue
			}
			for _, n := range st.Needs {
				if set[n] {
					set[st.Name], changed = true, true
					break
				}
			}
		}
	}
	var out []string
	for _, st := range w.Steps {
		if set[st.Name] {
			out = append(out, st.Name)
		}
	}
	return slices.Clip(out)
}

// BackfillOptions are a backfill's range (both ends included), whether only ticks the
// schedule recorded without a run (missed, paused, skipped) run, the order, and whether
// it only lists what would run.
type BackfillOptions struct {
	From, To   time.Time
	OnlyMissed bool
	// IncludeFailed retries the run of a tick that failed or was dead-lettered (its run
	// ID kept: the tick still has one run) instead of counting the tick as ran.
	IncludeFailed bool
	Newest        bool // newest first (default: oldest first)
	DryRun        bool
	// Ticks, if set, are the fire times to backfill, instead of those of [From, To]: a
	// plan's ticks, one at a time (--max-parallel). A schedule's fire times are not
	// always found again from a range around one of them: an @every schedule's are
	// counted from the range's start.
	Ticks []time.Time
	// Priority, if set, is the runs' priority (default: the workflow's priority:).
	Priority *int
}

// BackfillTick is one tick of a backfill's range and what became of it: backfilled (a
// run started), would-run (--dry-run), ran (the tick already has its run: fired, caught
// up or backfilled before), or not-missed (--only-missed: the schedule never recorded it).
type BackfillTick struct {
	At      time.Time
	RunID   string
	Outcome string
}

// backfillRandomIDs, set at link time (-ldflags "-X .../engine.backfillRandomIDs=1") and
// empty in every release build, is Hooks.BackfillRandomIDs for a process
// (TestBackfillsAcrossALeaderKill's control).
var backfillRandomIDs string

// MaxBackfillTicks bounds one backfill's range.
const MaxBackfillTicks = 10000

// Backfill starts one run per tick of the range that has none, each with the tick's own
// run ID (a cron_tick entry, outcome backfilled, with its submit): whatever else fires or
// backfills the same tick, the log keeps one run of it.
func (o Ops) Backfill(ctx context.Context, name string, opts BackfillOptions) ([]BackfillTick, error) {
	e := o.e
	if err := e.running(); err != nil {
		return nil, err
	}
	w, err := e.Workflow(name, 0)
	if err != nil {
		return nil, err
	}
	if w.Schedule == nil {
		return nil, fmt.Errorf("%w: workflow %s has no schedule to backfill", ErrBadInput, name)
	}
	if now := e.cfg.Now(); opts.To.After(now) {
		opts.To = now // the schedule fires the future's ticks itself
	}
	if opts.To.Before(opts.From) {
		return nil, fmt.Errorf("%w: --to %s is before --from %s", ErrBadInput, opts.To.Format(time.RFC3339), opts.From.Format(time.RFC3339))
	}
	sched, err := workflow.CronParser.Parse(w.Schedule.Cron)
	if err != nil {
		return nil, err
	}
	loc, err := time.LoadLocation(w.Schedule.Timezone)
	if err != nil {
		return nil, err
	}
	var ticks []time.Time
	for _, t := range opts.Ticks {
		if t.After(opts.To) {
			return nil, fmt.Errorf("%w: the fire time %s is in the future", ErrBadInput, t.Format(time.RFC3339))
		}
		ticks = append(ticks, t.In(loc))
	}
	first := sched.Next(opts.From.In(loc).Add(-time.Nanosecond))
	if every, ok := sched.(cron.ConstantDelaySchedule); ok && opts.Ticks == nil {
		anchor, err := e.scheduleBegan(name, sched)
		if err != nil {
			return nil, err
		}
		first = onGrid(anchor, every.Delay, opts.From).In(loc)
	}
	for t := first; opts.Ticks == nil && !t.IsZero() && !t.After(opts.To); t = sched.Next(t) {
		if len(ticks) == MaxBackfillTicks {
			return nil, fmt.Errorf("%w: the range holds more than %d fire times: backfill it in parts", ErrBadInput, MaxBackfillTicks)
		}
		ticks = append(ticks, t)
	}
	if opts.Newest {
		slices.Reverse(ticks)
	}
	recorded, err := e.store.Ticks(name)
	if err != nil {
		return nil, err
	}
	byTime := map[int64]checkpoint.Tick{}
	for _, tk := range recorded {
		byTime[tk.At.UnixNano()] = tk
	}
	var out []BackfillTick
	for _, t := range ticks {
		bt := BackfillTick{At: t, RunID: workflow.TickRunID(name, t)}
		if e.hooks.BackfillRandomIDs.Load() || backfillRandomIDs != "" { // the control: a run per backfill, not per tick
			bt.RunID = NewRunID()
		}
		rec, seen := byTime[t.UnixNano()]
		failedRun := ""
		if opts.IncludeFailed && seen && checkpoint.TickRan(rec.Outcome) {
			failedRun = e.failedTickRun(rec, bt.RunID)
		}
		switch {
		case failedRun != "" && opts.DryRun:
			bt.RunID, bt.Outcome = failedRun, client.BackfillWouldRetry
		case failedRun != "":
			bt.RunID = failedRun
			reason := fmt.Sprintf("cron backfill --include-failed: the tick of %s at %s", name, t.UTC().Format(time.RFC3339))
			switch err := e.RetryFrom(ctx, failedRun, RetryOptions{Reason: reason}); {
			case err == nil:
				bt.Outcome = client.BackfillRetried
			case errors.Is(err, checkpoint.ErrConflict):
				bt.Outcome = "ran" // retried meanwhile (another backfill), or no longer failed
			default:
				return out, err
			}
		case seen && checkpoint.TickRan(rec.Outcome):
			bt.Outcome = "ran"
		case opts.OnlyMissed && !seen:
			bt.Outcome = "not-missed"
		case opts.DryRun:
			bt.Outcome = "would-run"
		default:
			sub, err := leader.TickSubmit(w, t, checkpoint.TriggerBackfill)
			if err != nil {
				return out, fmt.Errorf("%w: %w", ErrBadInput, err)
			}
			sub.KeyScheme = checkpoint.KeySchemeFor(e.store.ClusterVersion())
			if sub.Priority, err = e.priorityOf(ctx, w, RunOptions{Priority: opts.Priority}); err != nil {
				return out, err
			}
			entry := checkpoint.Entry{Kind: checkpoint.KindCronTick, Actor: audit.Actor(ctx), Owner: e.cfg.NodeID, Run: bt.RunID, Submit: sub,
				Tick: &checkpoint.CronTick{Workflow: name, At: t.UTC(), Outcome: checkpoint.TickBackfilled, RunID: bt.RunID}}
			if e.hooks.BackfillRandomIDs.Load() || backfillRandomIDs != "" {
				entry = checkpoint.Entry{Kind: checkpoint.KindSubmit, Actor: audit.Actor(ctx), Owner: e.cfg.NodeID, Run: bt.RunID, Submit: sub}
			}
			switch err := e.clog.Writer.Write(ctx, entry).Await(ctx); {
			case err == nil:
				bt.Outcome = checkpoint.TickBackfilled
			case errors.Is(err, checkpoint.ErrTickExists), errors.Is(err, checkpoint.ErrRunExists):
				bt.Outcome = "ran" // fired or backfilled meanwhile
			default:
				return out, err
			}
		}
		out = append(out, bt)
	}
	return out, nil
}

// failedTickRun is the run of a tick that ran, if it failed or was dead-lettered (""
// otherwise, or if it was retired): the run an --include-failed backfill retries.
func (e *Engine) failedTickRun(rec checkpoint.Tick, tickRunID string) string {
	id := cmp.Or(rec.RunID, tickRunID)
	r, err := e.store.Run(id)
	if err != nil || (r.Status != checkpoint.StatusFailed && r.Status != checkpoint.StatusDeadLettered) {
		return ""
	}
	return id
}

// scheduleBegan is the first fire time of the workflow's schedule as the leader's cron
// counts them: the first after its latest version was applied.
func (e *Engine) scheduleBegan(name string, sched cron.Schedule) (time.Time, error) {
	vs, err := e.store.Workflows()
	if err != nil {
		return time.Time{}, err
	}
	var at time.Time
	for _, v := range vs {
		if v.Name == name && v.At.After(at) {
			at = v.At
		}
	}
	return sched.Next(at), nil
}

// onGrid is the first of anchor + k·every (k of any sign) at or after from: an @every
// schedule's fire times are counted from when it began, not from a backfill's --from,
// so that a backfill's ticks are those the schedule fired or would have fired (and
// share their run IDs), not a grid of their own a second off theirs.
func onGrid(anchor time.Time, every time.Duration, from time.Time) time.Time {
	if every <= 0 {
		return from
	}
	t := anchor.Add(from.Sub(anchor) / every * every)
	if t.Before(from) {
		t = t.Add(every)
	}
	return t
}

// leaderTimerPass is the leader's timer and deadline pass (for tests).
func leaderTimerPass() time.Duration { return leader.TimerPass }
