package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/workflow"
)

// Retry from a step (issue 27): a 4-step chain whose steps count their side effects in
// files; the third fails once. Retried from it, the first two do not run again; the third
// and the fourth run once more, with the changed input. The control resets every step
// (Hooks.RetryResetsAll): the first two run twice (a transfer re-sent).
func TestRetryFromAStepRunsItAndItsDependentsOnce(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "from-the-step", true: "control-resets-all"}[control], func(t *testing.T) {
			h := &testhooks.Hooks{}
			h.RetryResetsAll.Store(control)
			e := startEngineWith(t, h, nil)
			dir := t.TempDir()
			gate := filepath.Join(dir, "fail-c")
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			step := func(name, needs, extra string) string {
				return fmt.Sprintf("  - {name: %s, %s uses: exec, with: {command: [sh, -c, \"echo x >> %s/%s; %s echo '{\\\"at\\\": \\\"{{ inputs.day }}\\\"}'\"]}}\n",
					name, needs, dir, name, extra)
			}
			apply(t, e, "name: chain\ninputs:\n  day: {type: string, default: d1}\nsteps:\n"+
				step("a", "", "")+step("b", "needs: [a],", "")+step("c", "needs: [b],", fmt.Sprintf("if [ -f %s ]; then exit 3; fi;", gate))+step("d", "needs: [c],", ""))
			ctx := ctxT(t, 60*time.Second)
			id, err := e.StartRun(ctx, "chain", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusFailed || r.FailedStep != "c" {
				t.Fatalf("%v %+v", err, r)
			}
			os.Remove(gate)
			if err := e.RetryFrom(audit.WithActor(ctx, "ann"), id, RetryOptions{From: "c", Inputs: map[string]any{"day": "d2"}}); err != nil {
				t.Fatal(err)
			}
			awaitRun(t, e, id, 5*time.Second, "the retry applied", func(r *checkpoint.Run) bool { return !r.Status.Terminal() })
			r, err := e.WaitRun(ctx, id)
			if err != nil || r.Status != checkpoint.StatusSucceeded {
				t.Fatalf("%v %+v", err, r)
			}
			runs := func(step string) int {
				b, _ := os.ReadFile(filepath.Join(dir, step))
				return strings.Count(string(b), "x")
			}
			want := map[string]int{"a": 1, "b": 1, "c": 2, "d": 1}
			if control {
				want = map[string]int{"a": 2, "b": 2, "c": 2, "d": 1}
			}
			for s, n := range want {
				if got := runs(s); got != n {
					t.Fatalf("step %s ran %d times, want %d", s, got, n)
				}
			}
			if out := stepOutput(t, e, id, "d"); out["at"] != "d2" {
				t.Fatalf("d's output %v: the changed input", out)
			}
			if v := VerifyRun(mustView(t, e, id)); !v.OK {
				t.Fatalf("verify: %v", v.Violations)
			}
			hist, _ := e.Run(id)
			found := false
			for _, ev := range hist.Events {
				found = found || ev.Kind == checkpoint.KindRetry && ev.Actor == "ann" && strings.Contains(ev.Detail, `"day":"d2"`)
			}
			if !found {
				t.Fatalf("the retry, its actor and inputs are not in the history")
			}
		})
	}
}

func mustView(t *testing.T, e *Engine, id string) *checkpoint.RunView {
	t.Helper()
	v, err := e.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Retry --from refuses what cannot be: an unknown step, inputs without --from, a run
// that has not ended; nothing is written.
func TestRetryFromRefusesBadInput(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, "name: w\nsteps:\n  - {name: a, uses: wait, with: {signal: go}}\n")
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "w", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 10*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	for _, c := range []struct {
		opts RetryOptions
		want error
		msg  string
	}{
		{RetryOptions{From: "nope"}, ErrBadInput, `no step "nope"`},
		{RetryOptions{Inputs: map[string]any{"x": 1}}, ErrBadInput, "--input needs --from"},
		{RetryOptions{From: "a"}, checkpoint.ErrConflict, "only a run that ended"},
	} {
		if err := e.RetryFrom(ctx, id, c.opts); !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Fatalf("%+v: %v", c.opts, err)
		}
	}
}

// Pause (issue 27): an every-second schedule fires; paused (with the actor and a
// reason), nothing fires, across a restart of the node (a new leader); resumed with
// catchup latest, the last tick that came while paused fires (caught-up) and the others
// are recorded as paused.
func TestPauseAcrossARestartAndResumeWithCatchupLatest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	e := startEngineAt(t, dir)
	apply(t, e, "name: tick\nschedule:\n  cron: \"* * * * * *\"\n  catchup: latest\n  overlap: allow\nsteps:\n  - name: a\n    uses: noop\n")
	ctx := ctxT(t, 60*time.Second)
	if err := e.waitFor(ctx, func() bool { ticks, _ := e.store.Ticks("tick"); return len(ticks) >= 1 }); err != nil {
		t.Fatal(err)
	}
	if err := e.Ops().PauseSchedule(audit.WithActor(ctx, "ann"), "tick", "ledger incident"); err != nil {
		t.Fatal(err)
	}
	st, err := e.Ops().ScheduleState("tick")
	if err != nil || st == nil || !st.Paused || st.Actor != "ann" || st.Reason != "ledger incident" {
		t.Fatalf("state %+v (%v)", st, err)
	}
	pausedAt := time.Now()
	before, _ := e.store.Ticks("tick")
	stopEngine(e)
	e = startEngineAt(t, dir) // a new term: the pause is in the log
	defer stopEngine(e)
	waitUntil(t, pausedAt.Add(3500*time.Millisecond))
	during, _ := e.store.Ticks("tick")
	if len(during) > len(before)+1 { // one tick may have been in flight at the pause
		t.Fatalf("%d ticks recorded while paused", len(during)-len(before))
	}
	resumedAt := time.Now()
	if err := e.Ops().ResumeSchedule(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	if err := e.waitFor(ctx, func() bool {
		ticks, _ := e.store.Ticks("tick")
		return len(ticks) > 0 && ticks[len(ticks)-1].At.After(resumedAt)
	}); err != nil {
		t.Fatal(err)
	}
	ticks, _ := e.store.Ticks("tick")
	var paused, caught int
	for _, tk := range ticks[len(during):] {
		if tk.At.After(resumedAt.Add(-400 * time.Millisecond)) {
			continue // due after the resume, within the grace: fired as usual
		}
		switch tk.Outcome {
		case checkpoint.TickPaused:
			paused++
		case checkpoint.TickCaughtUp:
			caught++
		default:
			t.Fatalf("a tick of the pause recorded %s", tk.Outcome)
		}
	}
	if paused < 2 || caught != 1 {
		t.Fatalf("%d paused, %d caught up: want the pause's ticks paused but the latest, caught up", paused, caught)
	}
	if err := e.Ops().ResumeSchedule(ctx, "tick"); !errors.Is(err, checkpoint.ErrConflict) {
		t.Fatalf("resuming a running schedule: %v", err)
	}
	next, err := e.Ops().NextTicks("tick", 3)
	if err != nil || len(next) != 3 || next[1].UTC.Sub(next[0].UTC) != time.Second {
		t.Fatalf("next %+v %v", next, err)
	}
}

// cron next marks a daylight-saving day: Europe/Berlin goes forward on 2026-03-29 and
// back on 2026-10-25.
func TestNextTicksMarkDaylightSavingDays(t *testing.T) {
	// robfig/cron fires a local time that the clocks repeat twice (02:30 CEST, then
	// 02:30 CET): both are shown, marked; the day the clocks skip has no fire time.
	for _, c := range []struct {
		from time.Time
		want string
		both bool // the second fire time is on the same day, marked too
	}{
		// 02:30 does not exist on 2026-03-29: the next fire time is the 30th's, marked.
		{time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC), "no fire time on 2026-03-29 (daylight-saving day: UTC+01:00 to UTC+02:00; local times in the change are skipped", false},
		{time.Date(2026, 10, 24, 12, 0, 0, 0, time.UTC), "UTC+02:00 to UTC+01:00; local times in the change are repeated", true},
	} {
		next, err := NextTicksOf(&workflow.Schedule{Cron: "30 2 * * *", Timezone: "Europe/Berlin"}, c.from, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(next[0].DST, c.want) || (next[1].DST != "") != c.both {
			t.Fatalf("from %s: %+v", c.from, next)
		}
	}
}

// Backfill (issue 27): an every-second schedule fires, is paused for a few seconds and
// resumed with catchup none (the pause's ticks recorded as paused, no run). Two
// backfills of the whole range at once: the ticks that fired are left alone, each other
// tick gets one run, with its tick's run ID, recorded as backfilled. The control gives
// each backfilled run a new ID (Hooks.BackfillRandomIDs): ticks run twice.
func TestBackfillRunsEachTickOnce(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "tick-ids", true: "control-random-ids"}[control], func(t *testing.T) {
			e := startEngineWith(t, nil, func(c *Config) { c.CronGrace = 400 * time.Millisecond })
			e.hooks.BackfillRandomIDs.Store(control)
			apply(t, e, "name: tick\nschedule:\n  cron: \"* * * * * *\"\n  catchup: none\n  overlap: allow\nsteps:\n  - name: a\n    uses: noop\n")
			ctx := ctxT(t, 60*time.Second)
			if err := e.waitFor(ctx, func() bool { ticks, _ := e.store.Ticks("tick"); return len(ticks) >= 2 }); err != nil {
				t.Fatal(err)
			}
			if err := e.Ops().PauseSchedule(ctx, "tick", "backfill test"); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, time.Now().Add(3*time.Second))
			resumed := time.Now()
			if err := e.Ops().ResumeSchedule(ctx, "tick"); err != nil {
				t.Fatal(err)
			}
			if err := e.waitFor(ctx, func() bool { // the pause's ticks are recorded at the first pass after it
				ticks, _ := e.store.Ticks("tick")
				return len(ticks) > 0 && ticks[len(ticks)-1].At.After(resumed)
			}); err != nil {
				t.Fatal(err)
			}
			if err := e.Ops().PauseSchedule(ctx, "tick", "quiet for the backfill"); err != nil {
				t.Fatal(err)
			}
			ticks, _ := e.store.Ticks("tick")
			from, to := ticks[0].At, ticks[len(ticks)-1].At
			fired := map[time.Time]bool{}
			for _, tk := range ticks {
				fired[tk.At] = checkpoint.TickRan(tk.Outcome)
			}
			dry, err := e.Ops().Backfill(ctx, "tick", BackfillOptions{From: from, To: to, DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			would := 0
			for _, bt := range dry {
				if bt.Outcome == "would-run" {
					would++
				}
			}
			results := make(chan []BackfillTick, 2)
			for range 2 {
				go func() {
					r, err := e.Ops().Backfill(ctx, "tick", BackfillOptions{From: from, To: to})
					if err != nil {
						t.Error(err)
					}
					results <- r
				}()
			}
			<-results
			<-results
			runs, _, err := e.ListRuns(checkpoint.ListOptions{Workflow: "tick", Limit: 10000})
			if err != nil {
				t.Fatal(err)
			}
			perTick := map[time.Time]int{}
			for _, r := range runs {
				perTick[r.ScheduledAt]++
			}
			doubled := 0
			for at, n := range perTick {
				if n > 1 {
					doubled++
				}
				if n > 0 && !fired[at] && !control {
					if r, _ := e.store.Run(workflow.TickRunID("tick", at)); r == nil || r.Trigger != checkpoint.TriggerBackfill {
						t.Fatalf("tick %s's run is not its backfilled run: %+v", at, r)
					}
				}
			}
			t.Logf("%d ticks in the range, %d would run (dry run), %d runs, %d ticks with two", len(dry), would, len(runs), doubled)
			if control {
				if doubled == 0 {
					t.Fatalf("the control doubled no tick")
				}
				return
			}
			if would < 2 || doubled != 0 || len(perTick) != len(dry) {
				t.Fatalf("%d would run, %d doubled, %d ticks with runs of %d", would, doubled, len(perTick), len(dry))
			}
		})
	}
}

// Deadlines (issue 27): a run that has not succeeded by its workflow's deadline is marked
// deadline-missed once, by the leader, across a restart of the node (a new term) at the
// deadline; a run that succeeded before its deadline is not. (The store's guard, and
// its control NoDeadlineCheck, are in checkpoint/testdata/nightly.txt.)
func TestDeadlineMissedOnceAcrossARestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	e := startEngineAt(t, dir)
	apply(t, e, "name: late\ndeadline: 2s\ninputs:\n  hold: {type: bool, default: true}\nsteps:\n  - {name: w, if: \"{{ inputs.hold }}\", uses: wait, with: {signal: never}}\n")
	ctx := ctxT(t, 60*time.Second)
	late, err := e.StartRun(ctx, "late", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	quick, err := e.StartRun(ctx, "late", map[string]any{"hold": false}, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := e.WaitRun(ctx, quick); err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, r)
	}
	r, _ := e.store.Run(late)
	if d := r.Deadline.Sub(r.CreatedAt); r.Deadline.IsZero() || d < 1900*time.Millisecond || d > 2100*time.Millisecond {
		t.Fatalf("deadline %s for a run created at %s", r.Deadline, r.CreatedAt)
	}
	waitUntil(t, r.Deadline.Add(-200*time.Millisecond))
	stopEngine(e) // the deadline passes while no leader runs
	e = startEngineAt(t, dir)
	defer stopEngine(e)
	if err := e.waitFor(ctx, func() bool { r, _ := e.store.Run(late); return r != nil && r.DeadlineMissed }); err != nil {
		t.Fatal(err)
	}
	count := func(id string) int {
		v := mustView(t, e, id)
		n := 0
		for _, ev := range v.Events {
			if ev.Kind == checkpoint.KindDeadlineMissed && ev.Outcome == "accepted" {
				n++
			}
		}
		return n
	}
	waitUntil(t, time.Now().Add(2*leaderTimerPass())) // two more passes: nothing is marked twice
	if n := count(late); n != 1 {
		t.Fatalf("the late run was marked %d times", n)
	}
	if n := count(quick); n != 0 {
		t.Fatalf("the run that succeeded in time was marked %d times", n)
	}
	if got := e.store.DeadlinesMissed()["late"]; got != 1 {
		t.Fatalf("flow_runs_deadline_missed_total{workflow=late} = %d", got)
	}
}

// Handlers (issue 27): a failed run starts its on_failure steps once, as a handler run
// with the failed run's context ({{ run.id }}, {{ run.failed_step }}, {{ run.error }});
// the handler's own failure leaves the run failed; a retry that fails again starts a
// second one (once per event).
func TestFailureHandlerRunsOncePerFailure(t *testing.T) {
	e := startEngine(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "told")
	apply(t, e, fmt.Sprintf(`
name: nightly
steps:
  - {name: pay, uses: exec, with: {command: [sh, -c, "echo broke >&2; exit 3"]}}
on_failure:
  - name: tell
    uses: exec
    with: {command: [sh, -c, "echo '{{ run.id }} {{ run.failed_step }}' >> %s; exit 1"]}
`, log))
	ctx := ctxT(t, 60*time.Second)
	id, err := e.StartRun(ctx, "nightly", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.WaitRun(ctx, id)
	if err != nil || r.Status != checkpoint.StatusFailed {
		t.Fatalf("%v %+v", err, r)
	}
	h1 := id + ".on-failure.0"
	hr, err := e.WaitRun(ctx, h1)
	if err != nil || hr.Status != checkpoint.StatusFailed || hr.Handler == nil || hr.Handler.Run != id || hr.Trigger != checkpoint.TriggerHandler {
		t.Fatalf("the handler run: %v %+v", err, hr)
	}
	if r, _ := e.store.Run(id); r.Status != checkpoint.StatusFailed || len(r.HandlerRuns) != 1 {
		t.Fatalf("the run after its handler failed: %+v", r)
	}
	if err := e.Retry(ctx, id); err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 10*time.Second, "the retry applied", func(r *checkpoint.Run) bool { return !r.Status.Terminal() })
	if _, err := e.WaitRun(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitRun(ctx, id+".on-failure.1"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(log)
	if got := strings.Count(string(b), id+" pay\n"); got != 2 {
		t.Fatalf("the handler told %d times (%q), want once per failure", got, b)
	}
}

// A paused schedule fires nothing; the control has the leader ignore the pause
// (Hooks.IgnorePause): ticks go on firing while it is paused.
func TestPausedScheduleFiresNothing(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "paused", true: "control-ignore-pause"}[control], func(t *testing.T) {
			h := &testhooks.Hooks{}
			h.IgnorePause.Store(control)
			e := startEngineWith(t, h, func(c *Config) { c.CronGrace = 400 * time.Millisecond })
			apply(t, e, "name: tick\nschedule:\n  cron: \"* * * * * *\"\n  overlap: allow\nsteps:\n  - name: a\n    uses: noop\n")
			ctx := ctxT(t, 30*time.Second)
			if err := e.waitFor(ctx, func() bool { ticks, _ := e.store.Ticks("tick"); return len(ticks) >= 1 }); err != nil {
				t.Fatal(err)
			}
			if err := e.Ops().PauseSchedule(ctx, "tick", "quiet"); err != nil {
				t.Fatal(err)
			}
			before, _ := e.store.Ticks("tick")
			waitUntil(t, time.Now().Add(3*time.Second))
			after, _ := e.store.Ticks("tick")
			fired := len(after) - len(before)
			if control {
				if fired < 2 {
					t.Fatalf("the control fired %d ticks while paused", fired)
				}
				return
			}
			if fired > 1 { // one tick may have been planned before the pause applied
				t.Fatalf("%d ticks fired while paused", fired)
			}
		})
	}
}

// An @every schedule's backfill ticks are on the schedule's own grid, counted from its
// first fire time, whichever --from is given (before the anchor or after it).
func TestOnGridCountsFromTheSchedulesStart(t *testing.T) {
	anchor := time.Date(2026, 11, 29, 2, 0, 4, 0, time.UTC)
	for _, c := range []struct{ from, want time.Duration }{
		{0, 0}, {time.Second, 4 * time.Second}, {4 * time.Second, 4 * time.Second}, {5 * time.Second, 8 * time.Second},
		{-time.Second, 0}, {-4 * time.Second, -4 * time.Second}, {-5 * time.Second, -4 * time.Second}, {-9 * time.Second, -8 * time.Second},
	} {
		if got := onGrid(anchor, 4*time.Second, anchor.Add(c.from)); !got.Equal(anchor.Add(c.want)) {
			t.Errorf("from anchor%+v: %s; want anchor%+v", c.from, got.Sub(anchor), c.want)
		}
	}
}

// Issue 38: the on_deadline handler of a run started by hand sees the run's own data
// interval (the schedule's latest fire time at or before the run's start, as the run's
// templates saw it), not one that came after the run started: its handler run is
// created later, at the deadline, and a tick in between is no tick of the run.
func TestHandlerOfAManualRunSeesTheRunsInterval(t *testing.T) {
	e := startEngine(t, nil)
	dir := t.TempDir()
	apply(t, e, fmt.Sprintf(`
name: by-hand
schedule: {cron: "* * * * * *", catchup: none}
deadline: 2s
steps:
  - {name: w, uses: wait, with: {signal: never}}
on_deadline:
  - name: tell
    uses: exec
    with: {command: [sh, -c, "echo '{{ schedule.tick }}' > %s/{{ run.id }}"]}
`, dir))
	ctx := ctxT(t, 60*time.Second)
	if err := e.Ops().PauseSchedule(ctx, "by-hand", "only the run by hand"); err != nil {
		t.Fatal(err)
	}
	id, err := e.StartRun(ctx, "by-hand", nil, RunOptions{ID: "by-hand-1"})
	if err != nil {
		t.Fatal(err)
	}
	hr, err := e.WaitRun(ctx, id+".on-deadline.0")
	if err != nil || hr.Status != checkpoint.StatusSucceeded {
		t.Fatalf("the on_deadline handler run: %v %+v", err, hr)
	}
	r, err := e.store.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	wf, err := e.specs.OfRun(r)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, id))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(string(b))
	if want := workflow.Interval(wf, time.Time{}, r.CreatedAt)["tick"]; got != want {
		t.Fatalf("the handler saw schedule.tick %s; want the run's own, %v (the run started at %s, its handler run at %s)",
			got, want, r.CreatedAt.Format(time.RFC3339Nano), hr.CreatedAt.Format(time.RFC3339Nano))
	}
}

// Backfill --include-failed: the failed runs of a backfilled range are retried under
// their ticks' run IDs (one run a tick still), a dry run says would-retry and writes
// nothing, a backfill without the flag counts them as ran, and a second --include-failed
// backfill retries each again only once it failed again (never two retries at once:
// the retry rule refuses a run that is not failed).
func TestBackfillIncludeFailedRetriesTheTicksRuns(t *testing.T) {
	e := startEngineWith(t, nil, nil)
	apply(t, e, "name: nightly\nschedule: {cron: \"0 2 * * *\", catchup: none}\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n")
	ctx := ctxT(t, 60*time.Second)
	to := time.Now().Add(-24 * time.Hour)
	from := to.Add(-72 * time.Hour)
	first, err := e.Ops().Backfill(ctx, "nightly", BackfillOptions{From: from, To: to})
	if err != nil || len(first) != 3 {
		t.Fatalf("the first backfill: %+v %v", first, err)
	}
	for _, bt := range first {
		if r, err := e.WaitRun(ctx, bt.RunID); err != nil || r.Status != checkpoint.StatusFailed {
			t.Fatalf("run %s: %v %v", bt.RunID, r, err)
		}
	}
	outcomes := func(ticks []BackfillTick) map[string]int {
		m := map[string]int{}
		for _, bt := range ticks {
			m[bt.Outcome]++
		}
		return m
	}
	if got, _ := e.Ops().Backfill(ctx, "nightly", BackfillOptions{From: from, To: to}); outcomes(got)["ran"] != 3 {
		t.Fatalf("without --include-failed: %v", outcomes(got))
	}
	applied := e.Applied()
	dry, err := e.Ops().Backfill(ctx, "nightly", BackfillOptions{From: from, To: to, IncludeFailed: true, DryRun: true})
	if err != nil || outcomes(dry)[client.BackfillWouldRetry] != 3 || e.Applied() != applied {
		t.Fatalf("the dry run: %v %v (the log moved: %v)", outcomes(dry), err, e.Applied() != applied)
	}
	got, err := e.Ops().Backfill(ctx, "nightly", BackfillOptions{From: from, To: to, IncludeFailed: true})
	if err != nil || outcomes(got)[client.BackfillRetried] != 3 {
		t.Fatalf("--include-failed: %v %v", outcomes(got), err)
	}
	for i, bt := range got {
		if bt.RunID != first[i].RunID {
			t.Fatalf("tick %s: retried %s, want its run %s", bt.At, bt.RunID, first[i].RunID)
		}
		v, err := e.Run(bt.RunID)
		if err != nil {
			t.Fatal(err)
		}
		retries := 0
		for _, ev := range v.Events {
			if ev.Kind == checkpoint.KindRetry && ev.Outcome == "accepted" && strings.Contains(ev.Detail, "--include-failed") {
				retries++
			}
		}
		if retries != 1 {
			t.Fatalf("run %s: %d retries by the backfill, want 1", bt.RunID, retries)
		}
	}
	runs, _, err := e.ListRuns(checkpoint.ListOptions{Workflow: "nightly", Limit: 100})
	if err != nil || len(runs) != 3 {
		t.Fatalf("%d runs (%v), want 3: one a tick", len(runs), err)
	}
}

// A tick that never ran by its deadline (its schedule paused) starts the workflow's
// on_deadline handlers once: a handler run derived from the tick
// (<workflow>-<tick>.on-deadline.0) whose templates read the tick (schedule.tick), the
// run ID it would have had (run.id) and why it never ran (run.error: paused, by whom,
// why). A second leader's copy of the handler's submit (two leaders planned the same
// miss before either's write was applied) starts nothing more: the ID is the tick's.
// Control: RandomTickHandlerIDs, the handler's ID new at each write: the copy starts a
// second handler for the same tick.
func TestTickNeverRanStartsItsHandlerOnce(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "derived-id", true: "control-random-ids"}[control], func(t *testing.T) {
			e := startEngine(t, nil)
			if control {
				e.hooks.RandomTickHandlerIDs.Store(true)
			}
			apply(t, e, `name: nightly
deadline: 2s
schedule: {cron: "*/2 * * * * *", catchup: none}
steps:
  - {name: a, uses: noop}
on_deadline:
  - {name: tell, uses: noop, with: {why: "{{ run.error }}", id: "{{ run.id }}", tick: "{{ schedule.tick }}", handler: "{{ run.handler_id }}"}}
`)
			ctx := ctxT(t, 60*time.Second)
			if err := e.Ops().PauseSchedule(audit.WithActor(ctx, "ann"), "nightly", "ledger migration"); err != nil {
				t.Fatal(err)
			}
			// While the schedule is paused its ticks are not recorded (a resume may catch the
			// latest up), but each one's handler starts at its deadline.
			var h checkpoint.Run
			if err := e.waitFor(ctx, func() bool {
				runs, _ := e.RunsWithIDPrefix("nightly-", 1000)
				for _, r := range runs {
					if strings.Contains(r.ID, ".on-deadline") {
						h = r
						return true
					}
				}
				return false
			}); err != nil {
				t.Fatalf("no handler run for a paused tick: %v", err)
			}
			tick := h.ScheduledAt
			runID := workflow.TickRunID("nightly", tick)
			handlers := func() []checkpoint.Run {
				runs, err := e.RunsWithIDPrefix(runID+".on-deadline", 10)
				if err != nil {
					t.Fatal(err)
				}
				return runs
			}
			r, err := e.WaitRun(ctx, h.ID)
			if err != nil || r.Status != checkpoint.StatusSucceeded || r.Trigger != checkpoint.TriggerHandler {
				t.Fatalf("the handler run %s: %v %+v", h.ID, err, r)
			}
			var out struct{ Why, ID, Tick, Handler string }
			v := mustView(t, e, h.ID)
			if err := json.Unmarshal(v.Steps[0].Output, &out); err != nil {
				t.Fatal(err)
			}
			if !control && h.ID != runID+".on-deadline.0" {
				t.Fatalf("handler ID %s, want %s.on-deadline.0", h.ID, runID)
			}
			if out.ID != runID || out.Handler != h.ID || !strings.Contains(out.Why, "paused by ann (ledger migration)") ||
				!strings.Contains(out.Why, tick.UTC().Format(time.RFC3339)) || !strings.HasPrefix(out.Tick, tick.UTC().Format("2006-01-02T15:04:05")) {
				t.Fatalf("the handler's templates saw %+v; want the tick %s, its run ID %s and why it never ran", out, tick, runID)
			}
			// A second leader's copy of the same plan (both planned before either's write
			// was applied).
			wf, err := e.specs.Workflow("nightly", 1)
			if err != nil {
				t.Fatal(err)
			}
			copyOf, err := leader.HandlerOfTick(wf, tick, tick.Add(2*time.Second), "a copy", time.Now(), e.hooks.RandomTickHandlerIDs.Load())
			if err != nil || copyOf == nil {
				t.Fatalf("the copy: %v %v", copyOf, err)
			}
			err = e.clog.Writer.Write(ctx, *copyOf).Await(ctx)
			if control {
				if n := len(handlers()); n < 2 || err != nil {
					t.Fatalf("control: %d handler runs for the tick, the copy's write: %v; want the copy accepted as another", n, err)
				}
				return
			}
			if n := len(handlers()); n != 1 || !errors.Is(err, checkpoint.ErrRunExists) {
				t.Fatalf("after a second leader's copy: %d handler runs for the tick (want 1), the copy's write: %v (want: the run exists)", n, err)
			}
			// The resume records the paused ticks: one older than the grace as paused, with
			// its deadline, whose miss is then recorded; one within it fires late (and its
			// run may miss its deadline). Whichever, a handler that would start for the tick
			// is the one that did (the same ID): nothing more starts.
			if err := e.Ops().ResumeSchedule(ctx, "nightly"); err != nil {
				t.Fatal(err)
			}
			var recorded checkpoint.Tick
			if err := e.waitFor(ctx, func() bool {
				ticks, _ := e.store.Ticks("nightly")
				for _, tk := range ticks {
					if tk.At.Equal(tick) {
						recorded = tk
						return true
					}
				}
				return false
			}); err != nil {
				t.Fatalf("the paused tick after the resume: %v", err)
			}
			if recorded.RunID != "" {
				if _, err := e.WaitRun(ctx, recorded.RunID); err != nil {
					t.Fatal(err)
				}
			}
			waitUntil(t, time.Now().Add(2*leaderTimerPass())) // two more passes: the tick's miss, if any, is applied
			if n := len(handlers()); n != 1 {
				t.Fatalf("after the resume: %d handler runs for the tick, want 1", n)
			}
		})
	}
}
