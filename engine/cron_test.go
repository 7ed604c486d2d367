package engine

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

func startEngineAt(t *testing.T, dir string) *Engine {
	t.Helper()
	e, err := New(Config{NodeID: "node-a", DataDir: dir, NATSListen: "-", Lease: testLease, CronGrace: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

func stopEngine(e *Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.Stop(ctx)
}

// A every-second schedule fires one run per tick, with an ID derived from the tick;
// ticks that fall while no leader runs are recorded by the next leader according to the
// catch-up policy.
func TestCronFiresAndCatchesUp(t *testing.T) {
	for _, policy := range []string{"none", "latest", "all"} {
		t.Run(policy, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			e := startEngineAt(t, dir)
			apply(t, e, "name: tick\nschedule:\n  cron: \"* * * * * *\"\n  catchup: "+policy+"\n  overlap: allow\nsteps:\n  - name: a\n    uses: noop\n")
			ctx := ctxT(t, 30*time.Second)
			if err := e.waitFor(ctx, func() bool { ticks, _ := e.store.Ticks("tick"); return len(ticks) >= 2 }); err != nil {
				t.Fatal(err)
			}
			ticks, _ := e.store.Ticks("tick")
			first := ticks[0]
			if first.Outcome != checkpoint.TickFired || first.RunID != CronRunID("tick", first.At) {
				t.Fatalf("first tick %+v", first)
			}
			r, err := e.WaitRun(ctx, first.RunID)
			if err != nil || r.Trigger != checkpoint.TriggerCron || !r.ScheduledAt.Equal(first.At) || r.Status != checkpoint.StatusSucceeded {
				t.Fatalf("cron run %+v %v", r, err)
			}
			stopEngine(e)
			downAt := time.Now()
			waitUntil(t, downAt.Add(2500*time.Millisecond)) // no leader: ticks are missed
			e = startEngineAt(t, dir)
			defer stopEngine(e)
			upAt := time.Now()
			if err := e.waitFor(ctx, func() bool {
				ticks, _ := e.store.Ticks("tick")
				return len(ticks) > 0 && ticks[len(ticks)-1].At.After(upAt)
			}); err != nil {
				t.Fatal(err)
			}
			ticks, _ = e.store.Ticks("tick")
			var outage []checkpoint.Tick
			for i := 1; i < len(ticks); i++ {
				if ticks[i].At.Sub(ticks[i-1].At) != time.Second {
					t.Fatalf("ticks %s and %s: a fire time was skipped or repeated", ticks[i-1].At, ticks[i].At)
				}
				if ticks[i].At.After(downAt) && ticks[i].At.Before(upAt.Add(-400*time.Millisecond)) {
					outage = append(outage, ticks[i])
				}
			}
			if len(outage) < 2 {
				t.Fatalf("only %d ticks fell in the outage", len(outage))
			}
			for i, tk := range outage {
				want := checkpoint.TickMissed
				if policy == "all" || (policy == "latest" && i == len(outage)-1) {
					want = checkpoint.TickCaughtUp
				}
				if tk.Outcome != want {
					t.Fatalf("%s policy: outage tick %d of %d is %s, want %s", policy, i+1, len(outage), tk.Outcome, want)
				}
				_, err := e.store.Run(CronRunID("tick", tk.At))
				if (want == checkpoint.TickMissed) != errors.Is(err, checkpoint.ErrNotFound) {
					t.Fatalf("tick %s (%s): run lookup %v", tk.At, tk.Outcome, err)
				}
			}
		})
	}
}

// waitUntil waits for a wall-clock moment (the test needs cron ticks to pass).
func waitUntil(t *testing.T, at time.Time) {
	t.Helper()
	time.Sleep(time.Until(at)) // the passing of cron fire times is what is tested
}
