package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/backoff"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// ReasonStolen is logged (and returned) when a worker finds its run was taken over:
// a commit fenced, or its lease lost.
const ReasonStolen = "lock-stolen-mid-run"

// errStolen stops everything a run's epoch is doing.
var errStolen = errors.New(ReasonStolen)

// errDrain is the cause when a draining node hands a run back.
var errDrain = errors.New("engine: draining")

// runExec runs one epoch of one run.
type runExec struct {
	e      *Engine
	run    *checkpoint.Run
	wf     *workflow.Workflow
	epoch  int64
	lease  *epoch.Lease
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu          sync.Mutex
	outputs     map[string]any // decoded outputs of finished steps
	done        map[string]bool
	stolen      bool
	completed   bool // the run's completion was written with its last commit
	drillZombie bool // the zombie drill: writes skip the local lease check
	// ended: the log ended the run from outside (cancelled, dead-lettered): nothing more
	// is written, the steps are stopped (cancel.go). endedSeen is e.runsEnded when the run
	// was read, so that execute can tell whether one ended since.
	ended     atomic.Bool
	endedSeen uint64
	// fresh: the epoch was assigned in the submit's own message (the leader's own
	// run), so no step can have a checkpoint yet: execute skips reading them.
	fresh bool
}

func newRunExec(e *Engine, id string, ep int64, lease *epoch.Lease) (*runExec, error) {
	endedSeen := e.runsEnded.Load() // before the read: checkEnded covers what follows
	r, err := e.store.Run(id)
	if err != nil {
		return nil, err
	}
	wf, err := e.runWorkflow(r)
	if err != nil {
		return nil, err
	}
	x := &runExec{e: e, run: r, wf: wf, epoch: ep, lease: lease, outputs: map[string]any{}, done: map[string]bool{},
		log: e.log.With("run", id, "epoch", ep, "workflow", r.Workflow), endedSeen: endedSeen}
	// The epoch's work ends when the lease ends (kill switch) or the run is drained.
	x.ctx, x.cancel = context.WithCancelCause(lease.Context())
	return x, nil
}

// drain asks the run to stop and hand itself back.
func (x *runExec) drain() { x.cancel(errDrain) }

// handBack releases the run cleanly: a requeue entry, then the lease.
func (x *runExec) handBack() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if x.lease.Check() == nil {
		_, err := x.e.clog.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindRequeue, Run: x.run.ID, Epoch: x.epoch, Owner: x.e.cfg.NodeID})
		if err != nil {
			x.log.Warn("hand-back not recorded; the lease will lapse", "err", err)
		}
	}
	_ = x.lease.Release(ctx)
	x.e.stats.HandedBack.Add(1)
	x.log.Info("run handed back")
}

// stop marks the epoch stolen: nothing more is written, everything is cancelled.
func (x *runExec) steal(cause error) error {
	x.mu.Lock()
	first := !x.stolen
	x.stolen = true
	x.mu.Unlock()
	if first {
		x.e.stats.Stolen.Add(1)
		x.log.Warn(ReasonStolen, "cause", cause)
	}
	x.cancel(errStolen)
	return errStolen
}

func (x *runExec) isStolen() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stolen
}

// write appends an entry of this epoch, after the local lease check; a fenced outcome
// or a lost lease steals the run.
func (x *runExec) write(e checkpoint.Entry) error { return x.writeAll(e)[0] }

// writeAll appends entries of this epoch in one log message and returns each outcome.
func (x *runExec) writeAll(es ...checkpoint.Entry) []error {
	errs := make([]error, len(es))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if x.isStolen() {
		return fail(errStolen)
	}
	if x.ended.Load() {
		return fail(errRunEnded)
	}
	x.mu.Lock()
	drill := x.drillZombie
	x.mu.Unlock()
	if err := x.lease.Check(); err != nil && !drill {
		return fail(x.steal(err))
	}
	for i := range es {
		es[i].Run, es[i].Epoch, es[i].Owner = x.run.ID, x.epoch, x.e.cfg.NodeID
	}
	// Writes outlive a cancelled step: use a context of their own, bounded.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), 30*time.Second)
	defer cancel()
	tickets, err := x.e.clog.WriteAll(ctx, es...)
	if len(tickets) == 0 { // nothing was queued
		if !isVerdict(err) {
			err = x.steal(err)
		}
		return fail(err)
	}
	for i, t := range tickets {
		errs[i] = t.Await(ctx)
		if errs[i] != nil && !isVerdict(errs[i]) {
			errs[i] = x.steal(errs[i])
		}
	}
	return errs
}

// isVerdict tells the log's judgement of an entry (refused for what it says: the step's
// output too large, a conflict with the run's state) from not knowing the outcome: the
// log unreachable or slower than the write's deadline, the node stopping. Fenced is a
// verdict too, but on the epoch. Not knowing ends the epoch like a lost lease (the run
// is reclaimed and resumes from what the log holds); it never fails the run, which would
// make an infrastructure outage look like the run's own failure.
func isVerdict(err error) bool {
	return !errors.Is(err, checkpoint.ErrFenced) && (errors.Is(err, checkpoint.ErrConflict) ||
		errors.Is(err, checkpoint.ErrInvalidEntry) || errors.Is(err, logstream.ErrOutputTooLarge))
}

// commit writes a whole step's checkpoint. When it is the run's last step (every other
// one done), the run's completion rides in the same log message: one synced write and
// one round trip less per run. The log judges the completion on its own (a run succeeds
// only when every step has), so a refused one is written again by execute.
func (x *runExec) commit(e checkpoint.Entry) error {
	if !x.othersDone(e.Step) {
		return x.write(e)
	}
	errs := x.writeAll(e, checkpoint.Entry{Kind: checkpoint.KindComplete, Status: checkpoint.StatusSucceeded})
	if errors.Is(errs[0], logstream.ErrOutputTooLarge) {
		return x.write(e) // fits alone but not with the completion: execute completes
	}
	if errs[0] == nil && errs[1] == nil {
		x.mu.Lock()
		x.completed = true
		x.mu.Unlock()
	}
	return errs[0]
}

func (x *runExec) othersDone(step string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, st := range x.wf.Steps {
		if st.Name != step && !x.done[st.Name] {
			return false
		}
	}
	return true
}

// note appends an entry without waiting for its outcome (step starts, retry notes).
func (x *runExec) note(e checkpoint.Entry) {
	if x.isStolen() || x.ended.Load() || x.lease.Check() != nil {
		return
	}
	e.Run, e.Epoch, e.Owner = x.run.ID, x.epoch, x.e.cfg.NodeID
	_, _ = x.e.clog.AppendNote(context.WithoutCancel(x.ctx), e)
}

type stepResult struct {
	step string
	err  error
}

// execute runs the DAG from the checkpoints to the end of the run or of the epoch.
func (x *runExec) execute() {
	defer func() {
		// Release in the background: the slot is free as soon as the run is.
		x.e.wg.Add(1)
		go func() {
			defer x.e.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = x.lease.Release(ctx)
		}()
	}()
	x.checkEnded() // a cancel applied before this run was registered in e.mu.running
	if x.wf.Timeout > 0 {
		deadline := x.run.CreatedAt.Add(time.Duration(x.wf.Timeout))
		var cancel context.CancelFunc
		x.ctx, cancel = context.WithDeadlineCause(x.ctx, deadline, fmt.Errorf("run timeout %s", time.Duration(x.wf.Timeout)))
		defer cancel()
	}
	if !x.fresh { // reading them was ~50 µs of a W2 run's start
		stored, err := x.e.store.Steps(x.run.ID)
		if err != nil {
			x.log.Error("read steps", "err", err)
			return
		}
		for _, st := range stored {
			if st.Status == checkpoint.StepSucceeded || st.Status == checkpoint.StepSkipped {
				x.done[st.Name] = true
				x.outputs[st.Name] = decodeOutput(st.Output)
			}
		}
	}
	results := make(chan stepResult)
	running := map[string]bool{}
	var failed *stepResult
	for {
		ready := readySteps(x.wf, x.isDone, running, x.e.cfg.StepParallelism, failed != nil || x.ctx.Err() != nil)
		var res stepResult
		if len(ready) == 1 && len(running) == 0 {
			// A lone step runs on this goroutine: a chain's steps then cost no goroutine
			// start (whose stack grows through the write path every time) and no two
			// hand-offs each (docs/perf.md).
			res = stepResult{ready[0].Name, x.runStep(ready[0])}
		} else {
			for _, st := range ready {
				running[st.Name] = true
				go func(st *workflow.Step) { results <- stepResult{st.Name, x.runStep(st)} }(st)
			}
			if len(running) == 0 {
				break
			}
			res = <-results
			delete(running, res.step)
		}
		if res.err != nil {
			if failed == nil {
				failed = &res
			}
			x.cancel(res.err) // siblings stop: the run fails (or was stolen)
		}
	}
	x.mu.Lock()
	end := endState{completed: x.completed, done: len(x.done)}
	x.mu.Unlock()
	end.stolen, end.ended, end.total = x.isStolen(), x.ended.Load(), len(x.wf.Steps)
	end.cause, end.leaseCause = context.Cause(x.ctx), context.Cause(x.lease.Context())
	if failed != nil {
		end.failedStep, end.failedErr = failed.step, failed.err
	}
	d := decideEnd(end)
	switch d.action {
	case endNothing:
		if end.completed && !end.stolen { // with the last commit; a drain meanwhile has nothing to hand back
			x.log.Info("run finished", "status", checkpoint.StatusSucceeded)
		}
	case endHandBack:
		x.handBack()
	case endSteal:
		_ = x.steal(d.cause)
	case endFailed, endSucceeded:
		x.complete(d.status(), d.step, d.msg)
	}
}

func (x *runExec) complete(status checkpoint.RunStatus, step, msg string) {
	if err := x.write(checkpoint.Entry{Kind: checkpoint.KindComplete, Status: status, Step: step, Error: msg}); err != nil {
		x.log.Warn("complete not recorded", "err", err)
		return
	}
	x.log.Info("run finished", "status", status, "step", step, "error", msg)
}

func (x *runExec) isDone(step string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.done[step]
}

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
	return map[string]any{
		"inputs": inputs,
		"steps":  stepsScope,
		"run":    map[string]any{"id": x.run.ID, "epoch": x.epoch},
	}
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
	if st.Foreach != "" {
		return x.runForeach(st, scope)
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
	kind, ok := x.e.cfg.Registry.Get(st.Uses)
	if !ok {
		return nil, 0, steps.Permanentf("unknown step kind %q on this node", st.Uses)
	}
	with, err := renderWith(st.With, scope)
	if err != nil {
		return nil, 0, steps.Permanent(err)
	}
	policy := backoff.Policy{Base: time.Duration(st.Retry.InitialInterval), Cap: time.Duration(st.Retry.MaxInterval), Multiplier: st.Retry.Multiplier, NoJitter: true}
	for attempt := 1; ; attempt++ {
		if err := x.lease.Check(); err != nil {
			return nil, attempt, x.steal(err)
		}
		sctx, cancel := x.ctx, context.CancelFunc(func() {})
		if st.Timeout > 0 {
			sctx, cancel = context.WithTimeoutCause(x.ctx, time.Duration(st.Timeout), stepTimeout{time.Duration(st.Timeout)})
		}
		x.e.stats.StepAttempts.Add(1)
		began := time.Now()
		out, err := kind.Run(sctx, steps.Input{Run: x.run.ID, Workflow: x.run.Workflow, Step: st.Name, Item: item, Epoch: x.epoch,
			Attempt: attempt, IdempotencyKey: steps.IdempotencyKey(x.run.ID, st.Name, item), With: with, Logger: x.log,
			StopGrace: x.e.stopGrace()})
		if obs := x.e.cfg.StepObserver; obs != nil {
			obs(st.Uses, time.Since(began), err)
		}
		timedOut := sctx.Err() != nil && x.ctx.Err() == nil
		cancel()
		if err == nil {
			if len(out) == 0 {
				out = json.RawMessage(`{}`)
			}
			if !json.Valid(out) {
				return nil, attempt, steps.Permanentf("step %s returned output that is not JSON", st.Name)
			}
			return out, attempt, nil
		}
		x.e.stats.StepFailures.Add(1)
		if x.ctx.Err() != nil {
			return nil, attempt, context.Cause(x.ctx)
		}
		if timedOut {
			err = fmt.Errorf("%w: %v", stepTimeout{time.Duration(st.Timeout)}, err)
		}
		if steps.IsPermanent(err) || attempt >= st.Retry.MaxAttempts {
			return nil, attempt, err
		}
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
	done, err := x.e.store.Items(x.run.ID, st.Name)
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
	all, err := x.e.store.Items(x.run.ID, st.Name)
	if err != nil {
		return err
	}
	outs := make([]json.RawMessage, len(all))
	for i, it := range all {
		outs[i] = it.Output
	}
	agg, _ := json.Marshal(outs)
	if len(agg) > x.e.cfg.MaxOutputBytes {
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
