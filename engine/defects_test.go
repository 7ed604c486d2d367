package engine

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// A foreach over an empty list, or over null (what a Go step returns for a nil slice),
// runs zero items and succeeds, as ranging over a nil slice does in Go; the history says
// "0 items". A foreach over something that is not a list still fails, and says what it is.
func TestForeachOverEmptyOrNullRunsZeroItems(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: empty
inputs:
  list: {type: string, default: "[]"}
steps:
  - name: make
    uses: exec
    with:
      command: [sh, -c, 'printf "{\"xs\": %s}" "$LIST"']
      env: {LIST: "{{ inputs.list }}"}
  - name: each
    needs: [make]
    foreach: "{{ steps.make.output.xs }}"
    uses: noop
    with: {x: "{{ item }}"}
  - name: after
    needs: [each]
    uses: noop
`)
	for _, list := range []string{"[]", "null"} {
		v := runToEnd(t, e, "empty", map[string]any{"list": list})
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("foreach over %s: run %s: %s", list, v.Run.Status, v.Run.Error)
		}
		var each checkpoint.StepView
		for _, s := range v.Steps {
			if s.Name == "each" {
				each = s
			}
		}
		if each.Status != checkpoint.StepSucceeded || each.Items != 0 || each.ItemsDone != 0 || string(each.Output) != "[]" {
			t.Fatalf("foreach over %s: step %+v output %s, want succeeded with 0 items and []", list, each.Step, each.Output)
		}
		said := false
		for _, ev := range v.Events {
			if ev.Kind == checkpoint.KindStart && ev.Step == "each" && ev.Detail == "0 items" {
				said = true
			}
		}
		if !said {
			t.Fatalf("foreach over %s: the history does not say \"0 items\": %+v", list, v.Events)
		}
	}
	v := runToEnd(t, e, "empty", map[string]any{"list": `{"a": 1}`})
	if v.Run.Status != checkpoint.StatusFailed || !strings.Contains(v.Run.Error, "is an object, not a list") {
		t.Fatalf("foreach over an object: %s %q, want failed: is an object, not a list", v.Run.Status, v.Run.Error)
	}
}

// A claimed run that cannot be executed (its state unreadable, its workflow undecodable)
// is logged and its lease released; flowd does not panic. newRunExec returns no runExec
// with its error, and runClaimed once used that nil runExec before checking the error.
func TestRunClaimedThatCannotRunReleasesTheLease(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DisableScheduler = true })
	ctx := ctxT(t, 20*time.Second)
	const ghost = "no-such-run"
	lease, err := e.leases.Acquire(ctx, ghost, 7, e.cfg.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	e.runClaimed(ghost, 7, lease, slog.New(slog.DiscardHandler), false)
	select {
	case <-lease.Done():
	case <-ctx.Done():
		t.Fatal("the lease of a run that cannot run was kept")
	}
	// Released, not merely lapsed: another owner can take the key at once.
	next, err := e.leases.Acquire(ctx, ghost, 8, "other")
	if err != nil {
		t.Fatalf("lease not free after runClaimed gave up: %v", err)
	}
	_ = next.Release(ctx)
}
