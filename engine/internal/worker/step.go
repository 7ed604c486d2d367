package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/rates"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/steplog"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// scope is what st's templates see.
func (x *runExec) scope(st *workflow.Step) map[string]any {
	inputs, _ := decodeJSON(x.run.Inputs).(map[string]any)
	if inputs == nil {
		inputs = map[string]any{}
	}
	stepsScope := map[string]any{}
	x.mu.Lock()
	for _, n := range x.wf.Reads(st.Name) { // not Ancestors: quadratic per run in a chain
		stepsScope[n] = map[string]any{"output": x.outputs[n]}
	}
	x.mu.Unlock()
	scope := map[string]any{
		"inputs": inputs,
		"steps":  stepsScope,
		"run":    runScope(x.run, x.wf, x.epoch),
	}
	if iv := workflow.Interval(x.wf, x.run.ScheduledAt, intervalStart(x.run)); iv != nil {
		scope["schedule"] = iv
	}
	return scope
}

// intervalStart is the start a run's data interval is read at when it has no tick (a run
// started by hand): its creation, or for a handler run, the handled run's (it handles
// that run's interval: a tick that came after the handled run started is none of its).
func intervalStart(r *checkpoint.Run) time.Time {
	if r.Handler != nil && !r.Handler.RunCreatedAt.IsZero() {
		return r.Handler.RunCreatedAt
	}
	return r.CreatedAt
}

// runStep runs one step (all its items) and checkpoints it.
func (x *runExec) runStep(st *workflow.Step) error {
	scope := x.scope(st)
	if st.If != "" {
		v, err := render(st.If, scope)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, fmt.Errorf("if: %w", err))
		}
		if !workflow.Truthy(v) {
			if err := x.write(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Skipped: true, Output: json.RawMessage(`{}`)}); err != nil {
				return err
			}
			x.finish(st.Name, map[string]any{})
			return nil
		}
	}
	if err := x.stepSlots(st, scope); err != nil {
		return err
	}
	if st.Uses == steps.KindWorkflow {
		return x.traced(st, func() error { return x.runChild(st, scope) })
	}
	if st.Foreach != "" {
		return x.runForeach(st, scope)
	}
	if st.Uses == steps.KindWait || st.Uses == steps.KindApproval || st.Uses == steps.KindSleep {
		with, err := renderWith(st.With, scope)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, steps.Permanent(err))
		}
		if x.waits(st, with) {
			return x.traced(st, func() error { return x.runWait(st, with) })
		}
	}
	x.note(checkpoint.Entry{Kind: checkpoint.KindStart, Step: st.Name, Item: checkpoint.ItemWhole})
	out, attempts, err := x.attempts(st, checkpoint.ItemWhole, scope)
	if err != nil {
		return x.failStep(st, checkpoint.ItemWhole, attempts, err)
	}
	if err := x.commit(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Output: out, Attempt: attempts}); err != nil {
		return err
	}
	x.finish(st.Name, decodeOutput(out))
	return nil
}

func (x *runExec) finish(step string, out any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.done[step] = true
	x.outputs[step] = out
}

// failStep records a step's final failure and returns it. When the epoch itself is
// ending (stolen, drained, a sibling failed, the run timed out), the step did not fail
// on its own: nothing is recorded and the epoch's cause is returned.
func (x *runExec) failStep(st *workflow.Step, item, attempts int, cause error) error {
	if x.isStolen() {
		return errStolen
	}
	if c := context.Cause(x.ctx); c != nil {
		return c
	}
	if err := x.write(checkpoint.Entry{Kind: checkpoint.KindFail, Step: st.Name, Item: item, Error: cause.Error(), Final: true, Attempt: attempts}); err != nil {
		return err
	}
	return fmt.Errorf("step %s: %w", st.Name, cause)
}

type stepTimeout struct{ d time.Duration }

func (e stepTimeout) Error() string { return fmt.Sprintf("step timeout %s", e.d) }

// attempts runs a step (or one item) with its retry policy.
func (x *runExec) attempts(st *workflow.Step, item int, scope map[string]any) (json.RawMessage, int, error) {
	kind, ok := x.p.cfg.Registry.Get(st.Uses)
	if !ok {
		return nil, 0, steps.Permanentf("unknown step kind %q on this node", st.Uses)
	}
	with, err := renderWith(st.With, scope)
	if err != nil {
		return nil, 0, steps.Permanent(err)
	}
	key := x.idempotencyKey(st, item, scope)
	policy := backoff.Policy{Base: time.Duration(st.Retry.InitialInterval), Cap: time.Duration(st.Retry.MaxInterval), Multiplier: st.Retry.Multiplier, NoJitter: true}
	restarts := 0 // attempts run again after a trust-deadline stop the lease outlived
	for attempt := 1; ; attempt++ {
		if err := x.paced(st, item, attempt); err != nil {
			return nil, attempt, err
		}
		if err := x.lease.Check(); err != nil {
			return nil, attempt, x.steal(err)
		}
		sctx, cancel := x.ctx, context.CancelFunc(func() {})
		if st.Timeout > 0 {
			sctx, cancel = context.WithTimeoutCause(x.ctx, time.Duration(st.Timeout), stepTimeout{time.Duration(st.Timeout)})
		}
		x.p.stats.StepAttempts.Add(1)
		began := x.p.clock.Now()
		sctx, span := x.startStepSpan(sctx, st.Name, st.Uses, item, attempt)
		mask := x.masker()
		lw := x.p.cfg.StepLogs.Open(steplog.Key{Run: x.run.ID, Step: st.Name, Item: item, Attempt: attempt, Epoch: x.epoch}, mask)
		out, err := kind.Run(sctx, steps.Input{Run: x.run.ID, Workflow: x.run.Workflow, Step: st.Name, Item: item, Epoch: x.epoch,
			Attempt: attempt, IdempotencyKey: key, With: with, Logger: newTeeLogger(x.log, lw),
			StopGrace: x.p.stopGrace(), TrustUntil: x.lease.TrustUntil, Stdout: lw.Stream("stdout"), Stderr: lw.Stream("stderr")})
		lw.Close() // what the step printed is kept, under this epoch, whatever became of it
		out, err = mask.JSON(out), maskError(mask, err)
		if obs := x.p.cfg.StepObserver; obs != nil {
			obs(st.Uses, x.p.clock.Since(began), err)
		}
		timedOut := sctx.Err() != nil && x.ctx.Err() == nil
		cancel()
		if err == nil && len(out) == 0 {
			out = json.RawMessage(`{}`)
		}
		if err == nil && !json.Valid(out) {
			err = steps.Permanentf("step %s returned output that is not JSON", st.Name)
		}
		if err != nil && timedOut {
			err = fmt.Errorf("%w: %v", stepTimeout{time.Duration(st.Timeout)}, err)
		}
		state := AttemptState{Err: err, Attempt: attempt, Max: st.Retry.MaxAttempts, EpochEnded: x.ctx.Err() != nil, Restarts: restarts}
		if errors.Is(err, steps.ErrTrustDeadline) {
			state.LeaseErr = x.lease.Check()
		}
		d := DecideAttempt(state)
		endStepSpan(span, err, d.Action == AttemptRetry || d.Action == AttemptAgain)
		if err != nil {
			x.p.stats.StepFailures.Add(1)
		}
		switch d.Action {
		case AttemptDone:
			return out, attempt, nil
		case AttemptEpochEnded:
			return nil, attempt, context.Cause(x.ctx)
		case AttemptSteal:
			return nil, attempt, x.steal(d.Cause)
		case AttemptFail:
			return nil, attempt, err
		case AttemptAgain:
			restarts++
			attempt-- // not the step's failure: the user's retry policy is not spent on it
			x.log.Warn("step stopped at its trust deadline while the lease held (a renewal reached this node after the step's init gave up); running it again",
				"step", st.Name, "item", item, "restart", restarts)
			continue
		}
		restarts = 0
		x.note(checkpoint.Entry{Kind: checkpoint.KindFail, Step: st.Name, Item: item, Error: err.Error(), Attempt: attempt})
		x.log.Info("step failed; retrying", "step", st.Name, "item", item, "attempt", attempt, "err", err)
		if serr := policy.Sleep(x.ctx, attempt-1); serr != nil {
			return nil, attempt, context.Cause(x.ctx)
		}
	}
}

// runForeach runs the items that have no checkpoint yet, each checkpointed on its own,
// then checkpoints the step with the list of item outputs.
func (x *runExec) runForeach(st *workflow.Step, scope map[string]any) error {
	v, err := render(st.Foreach, scope)
	if err != nil {
		return x.failStep(st, checkpoint.ItemWhole, 1, fmt.Errorf("foreach: %w", err))
	}
	items, ok := v.([]any)
	if !ok && v != nil {
		return x.failStep(st, checkpoint.ItemWhole, 1, fmt.Errorf("foreach: %s is %s, not a list", st.Foreach, jsonKind(v)))
	}
	// null (a nil slice marshalled by a Go step) is an empty list, as ranging over a nil
	// slice is in Go: zero items, and the step succeeds with an empty output list.
	x.note(checkpoint.Entry{Kind: checkpoint.KindStart, Step: st.Name, Item: checkpoint.ItemWhole, Items: len(items)})
	done, err := x.p.cfg.State.Items(x.run.ID, st.Name)
	if err != nil {
		return err
	}
	have := make(map[int]bool, len(done))
	for _, it := range done {
		have[it.Index] = true
	}
	sem := make(chan struct{}, max(st.Parallelism, 1))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, item := range items {
		if have[i] {
			continue
		}
		if x.ctx.Err() != nil {
			break
		}
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-x.ctx.Done():
		}
		if x.ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(i int, item any) {
			defer wg.Done()
			defer func() { <-sem }()
			itemScope := make(map[string]any, len(scope)+1)
			for k, v := range scope {
				itemScope[k] = v
			}
			itemScope["item"] = item
			out, attempts, err := x.attempts(st, i, itemScope)
			if err == nil {
				err = x.write(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: i, Output: out})
			} else {
				err = x.failStep(st, i, attempts, fmt.Errorf("item %d: %w", i, err))
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}(i, item)
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if x.ctx.Err() != nil {
		return context.Cause(x.ctx)
	}
	return x.commitForeach(st)
}

// commitForeach checkpoints a foreach step whose items all have theirs, with the list of
// item outputs.
func (x *runExec) commitForeach(st *workflow.Step) error {
	all, err := x.p.cfg.State.Items(x.run.ID, st.Name)
	if err != nil {
		return err
	}
	outs := make([]json.RawMessage, len(all))
	for i, it := range all {
		outs[i] = it.Output
	}
	agg, _ := json.Marshal(outs)
	if len(agg) > x.p.cfg.MaxOutputBytes {
		agg, _ = json.Marshal(map[string]any{"items": len(all), "truncated": true})
	}
	if err := x.commit(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Output: agg}); err != nil {
		return err
	}
	x.finish(st.Name, decodeOutput(agg))
	return nil
}

// jsonKind names a decoded JSON value's kind for error messages.
func jsonKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case float64, json.Number, int, int64:
		return "a number"
	}
	return fmt.Sprintf("a %T", v)
}

func render(src string, scope map[string]any) (any, error) {
	t, err := workflow.ParseTemplate(src)
	if err != nil {
		return nil, err
	}
	return t.Render(scope)
}

// renderWith renders every string of a step's `with`, recursively.
func renderWith(with map[string]any, scope map[string]any) (map[string]any, error) {
	out, err := renderValue(with, scope)
	if err != nil {
		return nil, err
	}
	m, _ := out.(map[string]any)
	return m, nil
}

func renderValue(v any, scope map[string]any) (any, error) {
	switch x := v.(type) {
	case string:
		return render(x, scope)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			r, err := renderValue(e, scope)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, err := renderValue(e, scope)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

func decodeOutput(raw json.RawMessage) any {
	if v := decodeJSON(raw); v != nil {
		return v
	}
	return map[string]any{}
}

// decodeJSON decodes inputs and outputs for templates with numbers as json.Number, so
// that an int64 (an ID, an amount in cents) reaches the next step exactly: through
// float64, 9007199254740993 became ...992. nil for empty or invalid JSON.
func decodeJSON(raw []byte) any {
	if len(raw) == 0 {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil
	}
	return v
}

// idempotencyKey is the key of a step's (or item's) attempts: run, step and item; in a
// run of key scheme 2, an http step's also covers its request (steps.RequestKey),
// rendered with run.epoch as 0, so that a request that names its epoch still has one
// key in every epoch.
func (x *runExec) idempotencyKey(st *workflow.Step, item int, scope map[string]any) string {
	if x.run.KeyScheme != checkpoint.KeySchemeRequest || st.Uses != steps.KindHTTP || keySchemeOff != "" || x.p.hooks.KeySchemeOff.Load() {
		return steps.IdempotencyKey(x.run.ID, st.Name, item)
	}
	epochless := maps.Clone(scope)
	if run, ok := scope["run"].(map[string]any); ok {
		run = maps.Clone(run)
		run["epoch"] = int64(0) // the same in every epoch
		epochless["run"] = run
	}
	with, err := renderWith(st.With, epochless)
	if err != nil { // it rendered with the real epoch, so this does not happen
		return steps.IdempotencyKey(x.run.ID, st.Name, item)
	}
	return steps.RequestKey(x.run.ID, st.Name, item, with)
}

// keySchemeOff is the control of the request's key in real processes (-ldflags "-X
// github.com/flowrun/flow/engine/internal/worker.keySchemeOff=1"; empty in every
// release): every run's keys are its run, step and item only, and `retry --from
// transfer --input date=...` sends another day's credits under the paid day's keys.
var keySchemeOff string

// runScope is what templates see as run: the run's ID and epoch, its error and failed
// step ("" while it has none); in a handler run, those of the run it handles (its own
// ID as run.handler_id); in the handler run of a tick that never ran (its spec says
// which: workflow.HandledTick), the ID the tick's run would have had and why it never
// ran as run.error.
func runScope(r *checkpoint.Run, wf *workflow.Workflow, epoch int64) map[string]any {
	if wf != nil && wf.Handles != nil && r.Trigger == checkpoint.TriggerHandler && r.Handler == nil {
		return map[string]any{"id": wf.Handles.Run, "epoch": epoch, "error": wf.Handles.Why, "failed_step": "", "handler_id": r.ID}
	}
	if h := r.Handler; h != nil {
		return map[string]any{"id": h.Run, "epoch": epoch, "error": h.Error, "failed_step": h.FailedStep, "handler_id": r.ID}
	}
	return map[string]any{"id": r.ID, "epoch": epoch, "error": r.Error, "failed_step": r.FailedStep}
}

// paced waits for a rate-limited step's moment (engine/internal/rates): every attempt
// is a start the downstream sees. The wait holds the epoch's worker and lease: the
// moment is reserved, and known (docs/decisions.md, "Rate limits: a reserved moment").
// The epoch's end ends the wait, and the lease is checked after it, before the start.
func (x *runExec) paced(st *workflow.Step, item, attempt int) error {
	if st.RateLimit == nil || x.p.cfg.Rates == nil {
		return nil
	}
	err := x.p.cfg.Rates.Wait(x.ctx, *st.RateLimit, rates.Waiter{Run: x.run.ID, Step: st.Name, Item: item, Attempt: attempt})
	if err != nil && x.ctx.Err() != nil {
		return context.Cause(x.ctx)
	}
	return err
}
