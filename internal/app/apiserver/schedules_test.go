package apiserver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// nightlyYAML runs at 02:30 in Amsterdam.
const nightlyYAML = `name: nightly
schedule:
  cron: "30 2 * * *"
  timezone: Europe/Amsterdam
steps:
  - {name: a, uses: noop}
`

// An operator pauses a schedule with a reason: cron.list shows it paused, why, by whom
// and since when; resuming it twice is a conflict; a viewer may read cron.next but
// neither pause nor backfill.
func TestPauseResumeAndNextThroughTheAPI(t *testing.T) {
	e := startAuthEngine(t)
	serve(t, e)
	olga, vera := dialAs(t, e, "olga", "o-secret"), dialAs(t, e, "vera", "v-secret")
	ctx := ctxT(t, 60*time.Second)
	if _, err := olga.ApplyWorkflow(ctx, "nightly.yaml", []byte(nightlyYAML)); err != nil {
		t.Fatal(err)
	}
	ch, err := olga.PauseSchedule(ctx, "nightly", "incident 42")
	if err != nil || ch != (client.ScheduleChanged{Workflow: "nightly", Paused: true, Reason: "incident 42", By: "olga"}) {
		t.Fatalf("pause: %+v %v", ch, err)
	}
	cs, err := vera.Schedules(ctx)
	if err != nil || len(cs) != 1 {
		t.Fatalf("cron.list: %+v %v", cs, err)
	}
	if c := cs[0]; !c.Paused || c.PausedReason != "incident 42" || c.PausedBy != "olga" || c.PausedSince == "" {
		t.Fatalf("cron.list of a paused schedule: %+v", c)
	}
	if _, err := vera.PauseSchedule(ctx, "nightly", "no"); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatalf("a viewer's pause: %v; want not authorized", err)
	}
	if _, err := vera.Backfill(ctx, "nightly", client.BackfillOptions{From: "2026-01-01", To: "2026-01-02", DryRun: true}); !errors.Is(err, client.ErrNotAuthorized) {
		t.Fatalf("a viewer's backfill: %v; want not authorized", err)
	}
	next, err := vera.NextTicks(ctx, "nightly", 0)
	if err != nil || len(next) != 5 {
		t.Fatalf("cron.next: %+v %v", next, err)
	}
	for _, n := range next {
		if !strings.Contains(n.Local, "T02:30:00+0") || !strings.HasSuffix(n.UTC, "Z") {
			t.Fatalf("cron.next: %+v", n)
		}
	}
	if _, err := vera.NextTicks(ctx, "nightly", 1001); !isCode(err, client.CodeBadRequest) {
		t.Fatalf("n 1001: %v", err)
	}
	if ch, err = olga.ResumeSchedule(ctx, "nightly"); err != nil || ch.Paused || ch.By != "olga" {
		t.Fatalf("resume: %+v %v", ch, err)
	}
	if cs, _ = vera.Schedules(ctx); cs[0].Paused || cs[0].PausedReason != "" {
		t.Fatalf("cron.list after the resume: %+v", cs[0])
	}
	if _, err := olga.ResumeSchedule(ctx, "nightly"); !isCode(err, client.CodeConflict) {
		t.Fatalf("resuming a running schedule: %v; want a conflict", err)
	}
	if _, err := olga.PauseSchedule(ctx, "nope", ""); !isCode(err, client.CodeNotFound) {
		t.Fatalf("pausing an unknown workflow: %v; want not found", err)
	}
}

func isCode(err error, code string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == code
}

// A backfill of the last three days: a dry run lists three ticks that would run; the
// backfill starts them (trigger backfill, the tick's run ID); a second one of the same
// range starts nothing. max_parallel caps the runs one call starts.
func TestBackfillThroughTheAPI(t *testing.T) {
	e := startAuthEngine(t)
	serve(t, e)
	olga := dialAs(t, e, "olga", "o-secret")
	ctx := ctxT(t, 60*time.Second)
	if _, err := olga.ApplyWorkflow(ctx, "nightly.yaml", []byte(nightlyYAML)); err != nil {
		t.Fatal(err)
	}
	ams, _ := time.LoadLocation("Europe/Amsterdam")
	day := time.Now().In(ams).AddDate(0, 0, -4)
	from, to := day.Format(time.DateOnly), day.AddDate(0, 0, 3).Format(time.DateOnly) // 3 ticks: days -4, -3, -2
	dry, err := olga.Backfill(ctx, "nightly", client.BackfillOptions{From: from, To: to, DryRun: true})
	if err != nil || len(dry) != 3 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	for _, d := range dry {
		if d.Outcome != client.BackfillWouldRun || !strings.HasPrefix(d.RunID, "nightly-") {
			t.Fatalf("dry run: %+v", dry)
		}
	}
	if runs, _ := olga.Runs(ctx, client.ListOptions{Workflow: "nightly"}); len(runs) != 0 {
		t.Fatalf("a dry run started %d runs", len(runs))
	}
	// max_parallel 1, newest first: one run started, the answer ends with it.
	one, err := olga.Backfill(ctx, "nightly", client.BackfillOptions{From: from, To: to, Order: "newest", MaxParallel: 1})
	if err != nil || len(one) != 1 || one[0].Outcome != client.BackfillBackfilled || one[0].RunID != dry[2].RunID {
		t.Fatalf("max_parallel 1: %+v %v", one, err)
	}
	all, err := olga.Backfill(ctx, "nightly", client.BackfillOptions{From: from, To: to})
	if err != nil || len(all) != 3 {
		t.Fatalf("backfill: %+v %v", all, err)
	}
	want := []string{client.BackfillBackfilled, client.BackfillBackfilled, client.BackfillRan}
	for i, b := range all {
		if b.Outcome != want[i] || b.RunID != dry[i].RunID || b.At != dry[i].At {
			t.Fatalf("backfill: %+v; want outcomes %v and the dry run's IDs", all, want)
		}
	}
	for _, b := range all {
		r := waitUntil(t, e, b.RunID, client.Run.Terminal)
		if r.Trigger != "backfill" || r.Status != "succeeded" {
			t.Fatalf("run %s: trigger %s, %s", r.ID, r.Trigger, r.Status)
		}
	}
	again, err := olga.Backfill(ctx, "nightly", client.BackfillOptions{From: from, To: to})
	if err != nil || len(again) != 3 {
		t.Fatalf("second backfill: %+v %v", again, err)
	}
	for _, b := range again {
		if b.Outcome != client.BackfillRan {
			t.Fatalf("second backfill: %+v; want every tick ran", again)
		}
	}
	if runs, _ := olga.Runs(ctx, client.ListOptions{Workflow: "nightly"}); len(runs) != 3 {
		t.Fatalf("%d runs; want 3", len(runs))
	}
	for _, bad := range []client.BackfillOptions{{From: "yesterday", To: to}, {From: from, To: "2026-13-01"}, {From: from}, {From: from, To: to, Order: "sideways"}} {
		if _, err := olga.Backfill(ctx, "nightly", bad); !isCode(err, client.CodeBadRequest) {
			t.Errorf("backfill %+v: %v; want a bad request", bad, err)
		}
	}
}

// A backfill with max_parallel of an @every schedule starts the ticks its plan lists.
// Each tick used to be backfilled alone by a range from it to itself, and an @every
// schedule's fire times count from the range's start: none was found, and such a
// backfill started nothing and answered an empty list (found by the simulation, issue 37).
func TestBackfillOfAnEveryScheduleWithMaxParallel(t *testing.T) {
	e := startAuthEngine(t)
	serve(t, e)
	olga := dialAs(t, e, "olga", "o-secret")
	ctx := ctxT(t, 60*time.Second)
	src := "name: hourly\nschedule: {cron: \"@every 1h\"}\nsteps:\n  - {name: a, uses: noop}\n"
	if _, err := olga.ApplyWorkflow(ctx, "hourly.yaml", []byte(src)); err != nil {
		t.Fatal(err)
	}
	from := time.Now().Add(-5 * time.Hour).UTC().Truncate(time.Second)
	to := from.Add(3*time.Hour - time.Second) // three fire times of the schedule's grid, whole seconds
	opts := client.BackfillOptions{From: from.Format(time.RFC3339), To: to.Format(time.RFC3339), MaxParallel: 2}
	dry, err := olga.Backfill(ctx, "hourly", client.BackfillOptions{From: opts.From, To: opts.To, DryRun: true})
	if err != nil || len(dry) != 3 {
		t.Fatalf("dry run: %+v %v; want three ticks", dry, err)
	}
	got, err := olga.Backfill(ctx, "hourly", opts)
	if err != nil || len(got) != 2 {
		t.Fatalf("backfill with max_parallel 2: %+v %v; want two ticks backfilled", got, err)
	}
	for i, b := range got {
		if b.Outcome != client.BackfillBackfilled || b.At != dry[i].At || b.RunID != dry[i].RunID {
			t.Fatalf("backfill with max_parallel 2: %+v; want the dry run's first two ticks %+v backfilled", got, dry[:2])
		}
	}
	rest, err := olga.Backfill(ctx, "hourly", opts)
	if err != nil || len(rest) != 3 || rest[2].Outcome != client.BackfillBackfilled {
		t.Fatalf("the rest: %+v %v; want the third tick backfilled after two that ran", rest, err)
	}
}
