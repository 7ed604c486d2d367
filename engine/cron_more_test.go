package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/steps"
)

// overlap: skip (examples/payout/payout.yaml): while a run of the schedule is still
// running, each tick is recorded as skipped-overlap and submits no run; once the run has
// ended, the next tick fires again.
func TestCronOverlapSkipWhileARunIsRunning(t *testing.T) {
	release := make(chan struct{})
	reg := steps.NewRegistry(0)
	if err := reg.Register("block", blockUntil(release)); err != nil {
		t.Fatal(err)
	}
	e := startEngine(t, func(c *Config) { c.Registry = reg; c.CronGrace = 5 * time.Second })
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	apply(t, e, "name: hold\nschedule:\n  cron: \"* * * * * *\"\n  overlap: skip\nsteps:\n  - name: a\n    uses: block\n")
	ctx := ctxT(t, 30*time.Second)
	ticks := func() []checkpoint.Tick {
		tk, err := e.store.Ticks("hold")
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	if err := e.waitFor(ctx, func() bool { return len(ticks()) >= 1 }); err != nil {
		t.Fatalf("no tick: %v", err)
	}
	first := ticks()[0]
	if first.Outcome != checkpoint.TickFired || first.RunID == "" {
		t.Fatalf("first tick %+v: want fired with a run", first)
	}
	// Two more ticks while the first run holds its step.
	if err := e.waitFor(ctx, func() bool { return len(ticks()) >= 3 }); err != nil {
		t.Fatalf("ticks while the run holds: %v (have %+v)", err, ticks())
	}
	if r, err := e.store.Run(first.RunID); err != nil || (r.Status != checkpoint.StatusRunning && r.Status != checkpoint.StatusPending) {
		t.Fatalf("the first run is not holding: %+v %v", r, err)
	}
	for _, tk := range ticks()[1:3] {
		if tk.Outcome != checkpoint.TickSkippedOverlap || tk.RunID != "" {
			t.Fatalf("tick %s while %s runs: %+v; want skipped-overlap without a run", tk.At, first.RunID, tk)
		}
		if _, err := e.store.Run(CronRunID("hold", tk.At)); !errors.Is(err, checkpoint.ErrNotFound) {
			t.Fatalf("a skipped tick %s has a run: %v", tk.At, err)
		}
	}
	if runs, _, err := e.ListRuns(checkpoint.ListOptions{Workflow: "hold"}); err != nil || len(runs) != 1 {
		t.Fatalf("runs of hold while the first runs: %d %v; want 1", len(runs), err)
	}
	// The run ends: a later tick fires again.
	close(release)
	released = true
	if r, err := e.WaitRun(ctx, first.RunID); err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("first run: %+v %v", r, err)
	}
	if err := e.waitFor(ctx, func() bool {
		tk := ticks()
		return len(tk) > 3 && tk[len(tk)-1].Outcome == checkpoint.TickFired
	}); err != nil {
		t.Fatalf("no tick fired after the run ended: %v (ticks %+v)", err, ticks())
	}
}

// recordLastTick writes a cron tick for wf at `at` (outcome missed) as the scheduler
// would: the schedule's next fire times are walked from it. The engine runs no scheduler.
func recordLastTick(t *testing.T, e *Engine, wf string, at time.Time) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	if err := e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCronTick, Term: 1 << 40, Owner: "test",
		Tick: &checkpoint.CronTick{Workflow: wf, At: at, Outcome: checkpoint.TickMissed}}).Await(ctx); err != nil {
		t.Fatal(err)
	}
}

func dueTicks(t *testing.T, e *Engine, wf string, now time.Time) ([]time.Time, time.Time) {
	t.Helper()
	plans, next, err := leader.CronDue(e.store, e.specs, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		if p.Workflow.Name == wf {
			return p.Ticks, next
		}
	}
	return nil, next
}

// A schedule in Asia/Jakarta (UTC+7, no daylight saving) fires at its local time:
// "30 2 * * *" is 02:30 in Jakarta, 19:30 UTC of the day before, not 02:30 UTC.
// The fire times are those the leader walks (cronDue) from the last recorded tick.
func TestCronFiresInTheSchedulesTimezone(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DisableScheduler = true })
	apply(t, e, "name: jkt\nschedule:\n  cron: \"30 2 * * *\"\n  timezone: Asia/Jakarta\nsteps:\n  - name: a\n    uses: noop\n")
	recordLastTick(t, e, "jkt", time.Date(2026, 11, 26, 19, 30, 0, 0, time.UTC))
	due, next := dueTicks(t, e, "jkt", time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC))
	want := []time.Time{time.Date(2026, 11, 27, 19, 30, 0, 0, time.UTC), time.Date(2026, 11, 28, 19, 30, 0, 0, time.UTC)}
	if len(due) != len(want) {
		t.Fatalf("due ticks %v; want %v", due, want)
	}
	jkt, _ := time.LoadLocation("Asia/Jakarta")
	for i := range want {
		if !due[i].Equal(want[i]) {
			t.Fatalf("tick %d at %s (%s in Jakarta); want %s", i, due[i].UTC(), due[i].In(jkt), want[i])
		}
	}
	if wantNext := time.Date(2026, 11, 29, 19, 30, 0, 0, time.UTC); !next.Equal(wantNext) {
		t.Fatalf("next fire time %s; want %s", next.UTC(), wantNext)
	}
	// The run of a tick is named by the tick in UTC.
	if id := CronRunID("jkt", due[1]); id != "jkt-20261128T193000Z" {
		t.Fatalf("run ID %s", id)
	}
}

// On the spring-forward day in New York (2026-03-08) 02:30 does not exist and does not
// fire (docs/workflow-spec.md, "Schedules"); the days around it fire at 02:30 local, 07:30
// UTC before the change and 06:30 UTC after.
func TestCronSkipsANonexistentLocalTime(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DisableScheduler = true })
	apply(t, e, "name: nyc\nschedule:\n  cron: \"30 2 * * *\"\n  timezone: America/New_York\nsteps:\n  - name: a\n    uses: noop\n")
	recordLastTick(t, e, "nyc", time.Date(2026, 3, 6, 7, 30, 0, 0, time.UTC))
	due, _ := dueTicks(t, e, "nyc", time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC))
	want := []time.Time{
		time.Date(2026, 3, 7, 7, 30, 0, 0, time.UTC),
		time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC),
		time.Date(2026, 3, 10, 6, 30, 0, 0, time.UTC),
	}
	if len(due) != len(want) {
		t.Fatalf("due ticks %v; want %v", due, want)
	}
	for i := range want {
		if !due[i].Equal(want[i]) {
			t.Fatalf("tick %d at %s; want %s (all ticks %v)", i, due[i].UTC(), want[i], due)
		}
	}
}
