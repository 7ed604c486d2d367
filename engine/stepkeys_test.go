package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/beats"
)

// A step's concurrency key: the keyed step of runs of one key runs one at a time, while
// their other steps do not wait; a run whose step waits for the slot is parked (no
// lease, no worker), shown waiting with kind concurrency, its key and the holder, and
// counted by `limits`. The control (Hooks.NoStepSlots: workers run the step without
// its slot) runs them at once.
func TestStepKeyRunsOneStepAtATime(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "guard", true: "control-no-step-slots"}[control], func(t *testing.T) {
			h := &testhooks.Hooks{}
			h.NoStepSlots.Store(control)
			e := startEngineWith(t, h, nil)
			dir := t.TempDir()
			apply(t, e, beats.StepWorkflow(t, "paystep", dir, 15, 1))
			ctx := ctxT(t, 60*time.Second)
			var same []string
			for i := range 3 {
				id, err := e.StartRun(ctx, "paystep", map[string]any{"acct": "a"}, RunOptions{ID: fmt.Sprintf("s-%d", i)})
				if err != nil {
					t.Fatal(err)
				}
				same = append(same, id)
			}
			api := e.API()
			if !control {
				pollUntil(t, 20*time.Second, "a run parked for its step's slot, shown waiting with the key and its holder", func() bool {
					for _, id := range same {
						r, err := api.Run(id)
						if err == nil && r.Status == "waiting" && r.Waiting != nil && r.Waiting.Kind == client.WaitConcurrency &&
							r.Waiting.Step == "pay" && r.Waiting.Key == "acct-a" && r.Waiting.Limit == 1 && len(r.Waiting.Holders) == 1 && r.Waiting.Holders[0] != id {
							return true
						}
					}
					return false
				})
				l, err := api.Limits(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if i := slices.IndexFunc(l.Keys, func(k client.KeyUse) bool { return k.Key == "acct-a" }); i < 0 || len(l.Keys[i].Holders) > 1 {
					t.Fatalf("limits: %+v; want acct-a held by at most one run", l)
				}
			}
			for _, id := range same {
				r, err := e.WaitRun(ctx, id)
				if err != nil || r.Status != checkpoint.StatusSucceeded {
					t.Fatalf("run %s: %v %v", id, r, err)
				}
			}
			crossed := beats.Crossings(beats.Intervals(dir), same)
			switch {
			case !control && len(crossed) > 0:
				t.Fatalf("the keyed steps of one key ran at once: %v", crossed)
			case control && len(crossed) == 0:
				t.Fatalf("control: without the step's slot the keyed steps still ran one at a time; the test cannot see the guard")
			}
			if !control {
				// The owners' commits gave every slot back.
				for _, id := range same {
					v, err := e.store.View(id)
					if err != nil {
						t.Fatal(err)
					}
					if len(v.Run.Slots) != 0 || len(v.Run.Draining) != 0 {
						t.Fatalf("run %s ended holding slots: %+v %+v", id, v.Run.Slots, v.Run.Draining)
					}
				}
			}
		})
	}
}
