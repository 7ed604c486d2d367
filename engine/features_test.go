package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/steps"
)

func TestForeachIfAndAggregate(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: fan
inputs:
  skip: {type: bool, default: true}
steps:
  - name: list
    uses: noop
    with: {drivers: [{id: d1, cents: 100}, {id: d2, cents: 250}, {id: d3, cents: 5}]}
  - name: pay
    needs: [list]
    foreach: "{{ steps.list.output.drivers }}"
    parallelism: 2
    uses: noop
    with: {driver: "{{ item.id }}", cents: "{{ item.cents }}"}
  - name: optional
    needs: [pay]
    if: "{{ not inputs.skip }}"
    uses: noop
  - name: report
    needs: [pay, optional]
    uses: noop
    with: {first: "{{ steps.pay.output.0.driver }}"}
`)
	v := runToEnd(t, e, "fan", nil)
	if v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("status %s: %s", v.Run.Status, v.Run.Error)
	}
	byName := map[string]checkpoint.StepView{}
	for _, s := range v.Steps {
		byName[s.Name] = s
	}
	if p := byName["pay"]; p.Items != 3 || p.ItemsDone != 3 || len(p.ItemCheckpoints) != 3 {
		t.Fatalf("pay = %+v", p.Step)
	}
	if byName["optional"].Status != checkpoint.StepSkipped {
		t.Fatalf("optional = %s", byName["optional"].Status)
	}
	if got := output(t, v, "report"); got["first"] != "d1" {
		t.Fatalf("report %v", got)
	}
	v = runToEnd(t, e, "fan", map[string]any{"skip": "false"})
	for _, s := range v.Steps {
		if s.Name == "optional" && s.Status != checkpoint.StepSucceeded {
			t.Fatalf("optional with skip=false: %s", s.Status)
		}
	}
}

// A step whose containment init stopped it at the lease's trust deadline did not fail
// (worker.DecideAttempt): while the lease holds (a renewal reached the node after the
// init's copy of the deadline passed, as on a loaded node) it runs again without
// spending the retry policy, here twice with max_attempts 1, and the run succeeds; a step
// stopped so every time makes the node give the epoch up after worker.MaxTrustRestarts
// restarts, as if the lease had lapsed: the run moves on in new epochs, counted, until
// max_epochs dead-letters it, and it is never failed with the watchdog's message. The
// control for the first half is the transcript (testdata/attempt.txt): before it, this
// run failed at its first stop (CI of stop 34, the poison test).
func TestAStepStoppedAtATrustDeadlineTheLeaseOutlivedRunsAgain(t *testing.T) {
	stopped := func() error { return fmt.Errorf("signal: terminated (%w)", steps.ErrTrustDeadline) }
	var calls, always atomic.Int32
	reg := steps.NewRegistry(0)
	_ = reg.Register("late-renewal", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		if calls.Add(1) <= 2 {
			return nil, stopped()
		}
		return json.RawMessage(`{"ok":true}`), nil
	}))
	_ = reg.Register("never-renewed-in-time", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		always.Add(1)
		return nil, stopped()
	}))
	e := startEngine(t, func(c *Config) { c.Registry = reg })
	apply(t, e, `
name: late
steps:
  - name: a
    uses: late-renewal
    retry: {max_attempts: 1}
`)
	v := runToEnd(t, e, "late", nil)
	if v.Run.Status != checkpoint.StatusSucceeded || calls.Load() != 3 || v.Steps[0].Attempts != 1 || v.Run.EpochChanges != 0 {
		t.Fatalf("status %s calls %d attempts %d epoch changes %d err %q", v.Run.Status, calls.Load(), v.Steps[0].Attempts, v.Run.EpochChanges, v.Run.Error)
	}
	apply(t, e, `
name: sick
max_epochs: 1
steps:
  - name: a
    uses: never-renewed-in-time
    retry: {max_attempts: 1}
`)
	v = runToEnd(t, e, "sick", nil)
	if v.Run.Status != checkpoint.StatusDeadLettered || strings.Contains(v.Run.Error, "trust deadline passed") {
		t.Fatalf("status %s err %q epochs %+v", v.Run.Status, v.Run.Error, v.Run.Epochs)
	}
	if n, want := always.Load(), int32(2*(worker.MaxTrustRestarts+1)); n != want {
		t.Fatalf("the step ran %d times over two epochs, want %d (%d restarts in each)", n, want, worker.MaxTrustRestarts)
	}
}

func TestRetriesThenSuccessAndFinalFailure(t *testing.T) {
	var calls atomic.Int32
	reg := steps.NewRegistry(0)
	_ = reg.Register("flaky", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		if calls.Add(1) < 3 {
			return nil, errors.New("transient")
		}
		return json.RawMessage(`{"ok":true}`), nil
	}))
	_ = reg.Register("broken", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		return nil, steps.Permanentf("bad request")
	}))
	e := startEngine(t, func(c *Config) { c.Registry = reg })
	apply(t, e, `
name: flaky
steps:
  - name: a
    uses: flaky
    retry: {max_attempts: 3, initial_interval: 10ms, max_interval: 20ms}
`)
	v := runToEnd(t, e, "flaky", nil)
	if v.Run.Status != checkpoint.StatusSucceeded || v.Steps[0].Attempts != 3 {
		t.Fatalf("status %s attempts %d err %q", v.Run.Status, v.Steps[0].Attempts, v.Run.Error)
	}
	apply(t, e, `
name: broken
steps:
  - name: a
    uses: noop
  - name: b
    needs: [a]
    uses: broken
    retry: {max_attempts: 5, initial_interval: 10ms}
`)
	v = runToEnd(t, e, "broken", nil)
	if v.Run.Status != checkpoint.StatusFailed || v.Run.FailedStep != "b" || !strings.Contains(v.Run.Error, "bad request") || v.Steps[1].Attempts != 1 {
		t.Fatalf("run %+v step b %+v", v.Run, v.Steps[1].Step)
	}
}

// An exec step that ignores SIGTERM is still killed at its timeout, and the run fails
// with the timeout.
func TestStepTimeoutKillsStubbornProcess(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: stubborn
steps:
  - name: hang
    uses: exec
    timeout: 300ms
    with: {command: [sh, -c, "trap '' TERM; while true; do sleep 0.05; done"]}
`)
	start := time.Now()
	v := runToEnd(t, e, "stubborn", nil)
	if v.Run.Status != checkpoint.StatusFailed || !strings.Contains(v.Run.Error, "step timeout 300ms") {
		t.Fatalf("run %s: %q", v.Run.Status, v.Run.Error)
	}
	if d := time.Since(start); d > 300*time.Millisecond+steps.KillGrace+3*time.Second {
		t.Fatalf("took %s", d)
	}
}

func TestTemplateErrorAtRunTimeFailsTheStep(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: tmpl
steps:
  - name: a
    uses: noop
    with: {x: 1}
  - name: b
    needs: [a]
    uses: noop
    with: {y: "{{ steps.a.output.nothere }}"}
`)
	v := runToEnd(t, e, "tmpl", nil)
	if v.Run.Status != checkpoint.StatusFailed || !strings.Contains(v.Run.Error, `has no "nothere" (it has: x)`) {
		t.Fatalf("run %s: %q", v.Run.Status, v.Run.Error)
	}
}

func TestBadInputsChangeNothing(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, "name: typed\ninputs:\n  n: {type: int}\nsteps:\n  - name: a\n    uses: noop\n")
	ctx := ctxT(t, 10*time.Second)
	before := e.store.Applied()
	for _, in := range []map[string]any{nil, {"n": "three"}, {"n": "3", "m": "1"}} {
		if _, err := e.StartRun(ctx, "typed", in, RunOptions{}); !errors.Is(err, ErrBadInput) {
			t.Fatalf("inputs %v: %v", in, err)
		}
	}
	if _, err := e.StartRun(ctx, "nope", nil, RunOptions{}); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "apply it first") {
		t.Fatalf("unknown workflow: %v", err)
	}
	if _, err := e.ApplyWorkflow(ctx, "bad.yaml", []byte("name: x\nsteps:\n  - name: a\n    uses: teleport\n")); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "bad.yaml:4:11") {
		t.Fatalf("bad workflow: %v", err)
	}
	if e.store.Applied() != before {
		t.Fatalf("bad input wrote to the log (%d -> %d)", before, e.store.Applied())
	}
}

// Applying a changed workflow makes a new version; a run keeps the version it started with.
func TestVersionsAndRetryFromFailedStep(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(dir, "fixed")
	e := startEngine(t, nil)
	apply(t, e, `
name: v
steps:
  - name: a
    uses: exec
    with: {command: [sh, -c, "echo a >> `+filepath.Join(dir, "log")+`; echo '{}'"]}
  - name: b
    needs: [a]
    uses: exec
    with: {command: [sh, -c, "test -e `+flag+`"]}
`)
	v := runToEnd(t, e, "v", nil)
	if v.Run.Status != checkpoint.StatusFailed || v.Run.FailedStep != "b" || v.Run.Version != 1 {
		t.Fatalf("run %+v", v.Run)
	}
	apply(t, e, "name: v\nsteps:\n  - name: z\n    uses: noop\n")
	if w, _ := e.Workflow("v", 0); w.Version != 2 {
		t.Fatalf("latest version %d", w.Version)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if err := e.Retry(ctx, v.Run.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.waitFor(ctx, func() bool { r, _ := e.store.Run(v.Run.ID); return r.Status == checkpoint.StatusSucceeded }); err != nil {
		t.Fatal(err)
	}
	r, _ := e.store.View(v.Run.ID)
	log, _ := os.ReadFile(filepath.Join(dir, "log"))
	if string(log) != "a\n" || r.Run.Version != 1 || r.Run.Epochs[len(r.Run.Epochs)-1].Reason != checkpoint.ReasonRetried || r.Run.EpochChanges != 0 {
		t.Fatalf("after retry: log %q version %d epochs %+v", log, r.Run.Version, r.Run.Epochs)
	}
}

func TestCancelRunning(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, "name: slow\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
	ctx := ctxT(t, 20*time.Second)
	id, err := e.StartRun(ctx, "slow", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.waitFor(ctx, func() bool { r, _ := e.store.Run(id); return r.Status == checkpoint.StatusRunning }); err != nil {
		t.Fatal(err)
	}
	if err := e.Cancel(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	r, err := e.WaitRun(ctx, id)
	if err != nil || r.Status != checkpoint.StatusCancelled {
		t.Fatalf("%v %+v", err, r)
	}
	if err := e.Cancel(ctx, id, ""); !errors.Is(err, checkpoint.ErrConflict) {
		t.Fatalf("cancel twice: %v", err)
	}
}
