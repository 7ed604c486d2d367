package engine

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/beats"
)

// Runs of one concurrency key run one at a time, in arrival order, while a run of
// another key runs beside them; a queued run of a full key shows as waiting (kind
// concurrency, with its key and holder) and `limits` counts holders and waiters.
func TestKeyRunsOneAtATime(t *testing.T) {
	e := startEngine(t, nil)
	dir := t.TempDir()
	apply(t, e, beats.Workflow(t, "keyed", dir, 10, 1))
	ctx := ctxT(t, 60*time.Second)
	var same []string
	for i := 0; i < 4; i++ {
		id, err := e.StartRun(ctx, "keyed", map[string]any{"acct": "a"}, RunOptions{ID: fmt.Sprintf("a-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		same = append(same, id)
	}
	other, err := e.StartRun(ctx, "keyed", map[string]any{"acct": "b"}, RunOptions{ID: "b-0"})
	if err != nil {
		t.Fatal(err)
	}
	api := e.API()
	// Shown waiting for its key, and listed as it is shown: among the waiting runs, not
	// among the pending ones (asked while a-3 waited before and after the listings).
	listed := func(status string) bool {
		page, err := api.Runs(client.ListOptions{Workflow: "keyed", Status: status, Limit: 50})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(page.Runs, func(r client.Run) bool { return r.ID == "a-3" })
	}
	waiting := func() bool {
		r, err := api.Run("a-3")
		return err == nil && r.Status == "waiting" && r.Waiting != nil && r.Waiting.Kind == client.WaitConcurrency &&
			r.Waiting.Key == "acct-a" && r.Waiting.Limit == 1 && len(r.Waiting.Holders) == 1
	}
	pollUntil(t, 20*time.Second, "a later run of acct-a shown and listed waiting for its key", func() bool {
		if !waiting() {
			return false
		}
		inWaiting, inPending := listed("waiting"), listed("pending")
		if !waiting() {
			return false
		}
		if !inWaiting || inPending {
			t.Fatalf("a-3, waiting for its key: in --status waiting %v, in --status pending %v; want only the first", inWaiting, inPending)
		}
		return true
	})
	l, err := api.Limits(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(l.Keys, func(k client.KeyUse) bool { return k.Key == "acct-a" }); i < 0 || len(l.Keys[i].Holders) != 1 || l.Keys[i].Waiting < 1 {
		t.Fatalf("limits: %+v; want acct-a held by one run with runs waiting", l)
	}
	for _, id := range append(same, other) {
		r, err := e.WaitRun(ctx, id)
		if err != nil || r.Status != checkpoint.StatusSucceeded {
			t.Fatalf("run %s: %v %v", id, r, err)
		}
	}
	ivs := beats.Intervals(dir)
	if c := beats.Crossings(ivs, same); len(c) > 0 {
		t.Fatalf("runs of one key ran at once: %v", c)
	}
	order := slices.Clone(same)
	sort.Slice(order, func(i, j int) bool { return ivs[order[i]].First < ivs[order[j]].First })
	if !slices.Equal(order, same) {
		t.Fatalf("runs of one key started in the order %v; want their arrival order %v", order, same)
	}
	if len(beats.Crossings(ivs, []string{same[0], other})) == 0 && len(beats.Crossings(ivs, []string{same[1], other})) == 0 {
		t.Fatalf("the other key's run waited for acct-a's runs: %v", ivs)
	}
	if _, err := e.StartRun(ctx, "keyed", nil, RunOptions{}); err == nil || !strings.Contains(err.Error(), "acct") {
		t.Fatalf("a run without its key's input: %v; want it refused, naming the input", err)
	}
}

// The drain: a run cancelled while its owner goes on running its step (the owner has
// not stopped: Hooks.KeepEndedRunning, as a paused owner would) keeps its key's slot
// until its lease ends, so the next run of the key starts after the step stopped. The
// control (Hooks.NoSlotDrain: the slot free once the state ends the run) starts the next
// run beside it.
func TestKeySlotOutlivesACancelWhileTheOwnerRuns(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "guard", true: "control-no-drain"}[control], func(t *testing.T) {
			h := &testhooks.Hooks{}
			h.KeepEndedRunning.Store(true)
			h.NoSlotDrain.Store(control)
			e := startEngineWith(t, h, nil)
			dir := t.TempDir()
			apply(t, e, beats.Workflow(t, "keyed", dir, 40, 1))
			ctx := ctxT(t, 60*time.Second)
			for _, id := range []string{"first", "second"} {
				if _, err := e.StartRun(ctx, "keyed", map[string]any{"acct": "a"}, RunOptions{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			pollUntil(t, 20*time.Second, "the first run's step beating", func() bool { _, ok := beats.Intervals(dir)["first"]; return ok })
			if err := e.Cancel(ctx, "first", "test"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.WaitRun(ctx, "second"); err != nil {
				t.Fatal(err)
			}
			c := beats.Crossings(beats.Intervals(dir), []string{"first", "second"})
			if control && len(c) == 0 {
				t.Fatal("control: with the drain off the second run still waited for the first's step: the guard is not shown to matter")
			}
			if !control && len(c) > 0 {
				t.Fatalf("the second run of the key ran beside the cancelled first, whose step still ran: %v", beats.Intervals(dir))
			}
		})
	}
}
