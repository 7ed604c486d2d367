package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Priorities order admission: with one worker busy and the room ahead of it taken,
// runs of priority -5, 0 and 5 (started in that order) are assigned highest first when
// the worker frees; a workflow's priority: is its runs' default, and run start's wins.
func TestPriorityOrdersAdmission(t *testing.T) {
	h := new(testhooks.Hooks)
	h.QueueAheadN.Store(1)
	e := startEngineWith(t, h, func(c *Config) { c.Workers = 1 })
	if err := e.Ops().WaitClusterVersion(ctxT(t, 30*time.Second), 3); err != nil {
		t.Fatal(err)
	}
	apply(t, e, "name: block\nsteps:\n  - {name: a, uses: sleep, with: {duration: 1h}}\n")
	apply(t, e, "name: quick\nsteps:\n  - {name: a, uses: noop}\n")
	apply(t, e, "name: urgent\npriority: 5\nsteps:\n  - {name: a, uses: noop}\n")
	ctx := ctxT(t, 60*time.Second)
	start := func(wf, id string, p *int) {
		if _, err := e.StartRun(ctx, wf, nil, RunOptions{ID: id, Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	start("block", "block", nil)
	pollUntil(t, 20*time.Second, "the blocker running", func() bool {
		r, err := e.store.Run("block")
		return err == nil && r.Status == checkpoint.StatusRunning
	})
	start("quick", "filler", nil) // takes the one room ahead of the worker
	pollUntil(t, 20*time.Second, "the filler assigned", func() bool {
		r, err := e.store.Run("filler")
		return err == nil && r.Epoch > 0
	})
	low, mid := -5, 0
	start("quick", "low", &low)
	start("quick", "mid", &mid)
	start("urgent", "high", nil)
	if err := e.Cancel(ctx, "block", "test"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"filler", "low", "mid", "high"} {
		if _, err := e.WaitRun(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	epoch := map[string]int64{}
	for _, id := range []string{"low", "mid", "high"} {
		v, err := e.Run(id)
		if err != nil || v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("run %s: %+v %v", id, v, err)
		}
		epoch[id] = v.Run.Epochs[0].Epoch
	}
	if !(epoch["high"] < epoch["mid"] && epoch["mid"] < epoch["low"]) {
		t.Fatalf("assigned at %v: want high, then mid, then low", epoch)
	}
	if v, _ := e.Run("high"); v.Run.Priority != 5 {
		t.Fatalf("urgent's run has priority %d, want its workflow's 5", v.Run.Priority)
	}
}

// A priority out of range, or other than 0 below cluster version 3, is refused with the
// fix, and nothing is written.
func TestPriorityRefused(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.HoldClusterVersion = true })
	apply(t, e, "name: quick\nsteps:\n  - {name: a, uses: noop}\n")
	ctx := ctxT(t, 10*time.Second)
	for _, c := range []struct {
		p    int
		want string
	}{{101, "priority 101: use -100 to 100"}, {5, "priority 5 needs cluster version 3"}} {
		p := c.p
		if _, err := e.StartRun(ctx, "quick", nil, RunOptions{ID: "p", Priority: &p}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("priority %d: %v; want %q", p, err, c.want)
		}
	}
	if _, err := e.store.Run("p"); err == nil {
		t.Fatal("a refused run was written")
	}
	if _, err := e.ApplyWorkflow(ctx, "u.yaml", []byte("name: urgent\npriority: 5\nsteps:\n  - {name: a, uses: noop}\n")); err == nil || !strings.Contains(err.Error(), "priority needs cluster version 3") {
		t.Fatalf("a workflow with priority: at version 1: %v", err)
	}
}

// A schedule's runs take the workflow's priority:, a backfill's its --priority.
func TestPriorityOfCronAndBackfillRuns(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.CronGrace = 400 * time.Millisecond })
	if err := e.Ops().WaitClusterVersion(ctxT(t, 30*time.Second), 3); err != nil {
		t.Fatal(err)
	}
	apply(t, e, "name: tick\npriority: 3\nschedule:\n  cron: \"* * * * * *\"\n  overlap: allow\nsteps:\n  - name: a\n    uses: noop\n")
	ctx := ctxT(t, 60*time.Second)
	var fired string
	if err := e.waitFor(ctx, func() bool {
		ticks, _ := e.store.Ticks("tick")
		for _, tk := range ticks {
			if tk.RunID != "" {
				fired = tk.RunID
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.Ops().PauseSchedule(ctx, "tick", "backfill"); err != nil {
		t.Fatal(err)
	}
	if r, err := e.store.Run(fired); err != nil || r.Priority != 3 {
		t.Fatalf("the schedule's run %s: priority %d, %v; want the workflow's 3", fired, r.Priority, err)
	}
	low := -4
	to := time.Now().Add(-time.Second).Truncate(time.Second)
	ticks, err := e.Ops().Backfill(ctx, "tick", BackfillOptions{From: to.Add(-3 * time.Second), To: to, Priority: &low})
	if err != nil {
		t.Fatal(err)
	}
	started := 0
	for _, bt := range ticks {
		if bt.Outcome != "backfilled" {
			continue
		}
		started++
		if r, err := e.store.Run(bt.RunID); err != nil || r.Priority != -4 {
			t.Fatalf("backfilled run %s: priority %d, %v; want -4", bt.RunID, r.Priority, err)
		}
	}
	if started == 0 {
		t.Fatalf("the backfill started nothing: %+v", ticks)
	}
}

// The client's priority range (what flowctl checks without linking the store) is the
// log's.
func TestPriorityRangeIsTheLogs(t *testing.T) {
	if client.MinPriority != checkpoint.MinPriority || client.MaxPriority != checkpoint.MaxPriority {
		t.Fatalf("client %d..%d, checkpoint %d..%d", client.MinPriority, client.MaxPriority, checkpoint.MinPriority, checkpoint.MaxPriority)
	}
}
