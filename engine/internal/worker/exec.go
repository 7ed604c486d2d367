package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steplog"
	"github.com/flowrun/flow/workflow"
)

// ReasonStolen is logged (and returned) when a worker finds its run was taken over:
// a commit fenced, or its lease lost.
const ReasonStolen = "lock-stolen-mid-run"

// errStolen stops everything a run's epoch is doing.
var errStolen = errors.New(ReasonStolen)

// ErrDrain is the cause when a draining node hands a run back (DecideEnd hands the run
// back on it).
var ErrDrain = errors.New("engine: draining")

// runExec runs one epoch of one run.
type runExec struct {
	p      *Pool
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
	// is written, the steps are stopped (cancel.go). endedSeen is p.runsEnded when the run
	// was read, so that execute can tell whether one ended since.
	ended     atomic.Bool
	endedSeen uint64
	// fresh: the epoch was assigned in the submit's own message (the leader's own
	// run), so no step can have a checkpoint yet: execute skips reading them.
	fresh bool
	// mask masks the run's secret inputs in its steps' logs, outputs and errors.
	mask *steplog.Masker
	// span is the epoch's trace span (trace.go); ended once, by execute or by whoever
	// abandons the epoch before it.
	span trace.Span
}

func newRunExec(p *Pool, id string, ep int64, lease *epoch.Lease) (*runExec, error) {
	endedSeen := p.runsEnded.Load() // before the read: checkEnded covers what follows
	r, err := p.cfg.State.Run(id)
	if err != nil {
		return nil, err
	}
	wf, err := p.cfg.Specs.OfRun(r)
	if err != nil {
		return nil, err
	}
	x := &runExec{p: p, run: r, wf: wf, epoch: ep, lease: lease, outputs: map[string]any{}, done: map[string]bool{},
		log: p.log.With("run", id, "epoch", ep, "workflow", r.Workflow), endedSeen: endedSeen, mask: Masker(wf, r)}
	// The epoch's work ends when the lease ends (kill switch) or the run is drained.
	x.ctx, x.cancel = context.WithCancelCause(x.startSpan(lease.Context()))
	return x, nil
}

// drain asks the run to stop and hand itself back.
func (x *runExec) drain() { x.cancel(ErrDrain) }

// handBack releases the run cleanly: a requeue entry, then the lease.
func (x *runExec) handBack() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if x.lease.Check() == nil {
		err := x.p.cfg.Log.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindRequeue, Run: x.run.ID, Epoch: x.epoch, Owner: x.p.cfg.Node}).Await(ctx)
		if err != nil {
			x.log.Warn("hand-back not recorded; the lease will lapse", "err", err)
		}
	}
	_ = x.lease.Release(ctx)
	x.p.stats.HandedBack.Add(1)
	x.spanEvent("handed back")
	x.log.Info("run handed back")
}

// stop marks the epoch stolen: nothing more is written, everything is cancelled.
func (x *runExec) steal(cause error) error {
	x.mu.Lock()
	first := !x.stolen
	x.stolen = true
	x.mu.Unlock()
	if first {
		x.p.stats.Stolen.Add(1)
		x.log.Warn(ReasonStolen, "cause", cause)
		x.spanEvent(ReasonStolen, attribute.String("cause", fmt.Sprint(cause)))
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
func (x *runExec) write(entry checkpoint.Entry) error { return x.writeAll(entry)[0] }

// writeAll appends entries of this epoch in one log message and returns each outcome.
func (x *runExec) writeAll(es ...checkpoint.Entry) []error {
	fail := func(err error) []error {
		errs := make([]error, len(es))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if x.isStolen() {
		return fail(errStolen)
	}
	if x.ended.Load() {
		return fail(ErrRunEnded)
	}
	x.mu.Lock()
	drill := x.drillZombie
	x.mu.Unlock()
	if err := x.lease.Check(); err != nil && !drill {
		return fail(x.steal(err))
	}
	for i := range es {
		es[i].Run, es[i].Epoch, es[i].Owner = x.run.ID, x.epoch, x.p.cfg.Node
	}
	// Writes outlive a cancelled step: use a context of their own, bounded.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), 30*time.Second)
	defer cancel()
	errs := x.p.cfg.Log.Write(ctx, es...).Results(ctx)
	for i, err := range errs {
		if errors.Is(err, checkpoint.ErrFenced) {
			x.spanEvent("commit fenced", attribute.String("flow.entry", string(es[i].Kind)), attribute.String("flow.step", es[i].Step), attribute.String("error", err.Error()))
		}
		if err != nil && !IsVerdict(err) {
			errs[i] = x.steal(err)
		}
	}
	return errs
}

// IsVerdict tells the log's judgement of an entry (refused for what it says: the step's
// output too large, a conflict with the run's state) from not knowing the outcome: the
// log unreachable or slower than the write's deadline, the node stopping. Fenced is a
// verdict too, but on the epoch. Not knowing ends the epoch like a lost lease (the run
// is reclaimed and resumes from what the log holds); it never fails the run, which would
// make an infrastructure outage look like the run's own failure.
func IsVerdict(err error) bool {
	return !errors.Is(err, checkpoint.ErrFenced) && (errors.Is(err, checkpoint.ErrConflict) ||
		errors.Is(err, checkpoint.ErrInvalidEntry) || errors.Is(err, logstream.ErrOutputTooLarge))
}

// commit writes a whole step's checkpoint. When it is the run's last step (every other
// one done), the run's completion rides in the same log message: one synced write and
// one round trip less per run. The log judges the completion on its own (a run succeeds
// only when every step has), so a refused one is written again by execute.
func (x *runExec) commit(entry checkpoint.Entry) error {
	if !x.othersDone(entry.Step) {
		return x.write(entry)
	}
	errs := x.writeAll(entry, checkpoint.Entry{Kind: checkpoint.KindComplete, Status: checkpoint.StatusSucceeded, Output: x.runOutputs(entry.Step, entry.Output)})
	if errors.Is(errs[0], logstream.ErrOutputTooLarge) {
		return x.write(entry) // fits alone but not with the completion: execute completes
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

// note appends an entry without waiting for its outcome (step starts, retry notes): the
// log makes such a write a note, which rides with the next message (logstream's
// Writer.Write).
func (x *runExec) note(entry checkpoint.Entry) {
	if x.isStolen() || x.ended.Load() || x.lease.Check() != nil {
		return
	}
	entry.Run, entry.Epoch, entry.Owner = x.run.ID, x.epoch, x.p.cfg.Node
	x.p.cfg.Log.Write(context.WithoutCancel(x.ctx), entry)
}

type stepResult struct {
	step string
	err  error
}

// execute runs the DAG from the checkpoints to the end of the run or of the epoch.
func (x *runExec) execute() {
	defer func() {
		// Release in the background: the slot is free as soon as the run is.
		x.p.wg.Add(1)
		go func() {
			defer x.p.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = x.lease.Release(ctx)
		}()
	}()
	x.checkEnded() // a cancel applied before this run was registered in p.mu.running
	if x.wf.Timeout > 0 {
		deadline := x.run.CreatedAt.Add(time.Duration(x.wf.Timeout))
		var cancel context.CancelFunc
		x.ctx, cancel = context.WithDeadlineCause(x.ctx, deadline, fmt.Errorf("run timeout %s", time.Duration(x.wf.Timeout)))
		defer cancel()
	}
	if !x.fresh { // reading them was ~50 µs of a W2 run's start
		stored, err := x.p.cfg.State.Steps(x.run.ID)
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
	// parked: once a step asks to park, nothing new starts, and the run parks on one
	// wait when none runs (parkFirst), chosen by what the waits are, not by which asked
	// first: sibling waits that woke together ask in the order the Go scheduler ran
	// them, and the state (and a simulation seed's replay) must not depend on it.
	var parked *parkRequest
	for {
		ready := ReadySteps(x.wf, x.isDone, running, x.p.cfg.StepParallelism, failed != nil || parked != nil || x.ctx.Err() != nil)
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
		if p := asPark(res.err); p != nil {
			parked = x.parkFirst(parked, p) // the running siblings finish; the run parks once none runs
			continue
		}
		if res.err != nil {
			if failed == nil {
				failed = &res
			}
			x.cancel(res.err) // siblings stop: the run fails (or was stolen)
		}
	}
	x.mu.Lock()
	end := EndState{Completed: x.completed, Done: len(x.done)}
	x.mu.Unlock()
	end.Stolen, end.Ended, end.Total = x.isStolen(), x.ended.Load(), len(x.wf.Steps)
	end.Cause, end.LeaseCause = context.Cause(x.ctx), context.Cause(x.lease.Context())
	if failed != nil {
		end.FailedStep, end.FailedErr = failed.step, failed.err
	}
	end.Parked = parked != nil
	d := DecideEnd(end)
	defer func() { x.endSpan(d.Action.String(), d.Cause) }()
	switch d.Action {
	case EndNothing:
		if end.Completed && !end.Stolen { // with the last commit; a drain meanwhile has nothing to hand back
			x.log.Info("run finished", "status", checkpoint.StatusSucceeded)
		}
	case EndHandBack:
		x.handBack()
	case EndPark:
		x.park(parked)
	case EndSteal:
		_ = x.steal(d.Cause)
	case EndFailed, EndSucceeded:
		x.complete(d.Status(), d.Step, d.Msg)
	}
}

func (x *runExec) complete(status checkpoint.RunStatus, step, msg string) {
	var outputs json.RawMessage
	if status == checkpoint.StatusSucceeded {
		outputs = x.runOutputs("", nil)
	}
	if err := x.write(checkpoint.Entry{Kind: checkpoint.KindComplete, Status: status, Step: step, Error: msg, Output: outputs}); err != nil {
		x.log.Warn("complete not recorded", "err", err)
		return
	}
	x.log.Info("run finished", "status", status, "step", step, "error", msg)
}

// runOutputs renders the workflow's outputs over its steps' outputs (and last's, being
// committed with the completion), or nil when it has none. A template that cannot be
// rendered (it reads a skipped step's output) gives null: the run has succeeded.
func (x *runExec) runOutputs(last string, lastOut json.RawMessage) json.RawMessage {
	if len(x.wf.Outputs) == 0 {
		return nil
	}
	inputs, _ := decodeJSON(x.run.Inputs).(map[string]any)
	stepsScope := map[string]any{}
	x.mu.Lock()
	for n, out := range x.outputs {
		stepsScope[n] = map[string]any{"output": out}
	}
	x.mu.Unlock()
	if last != "" {
		stepsScope[last] = map[string]any{"output": decodeOutput(lastOut)}
	}
	scope := map[string]any{"inputs": inputs, "steps": stepsScope, "run": runScope(x.run, x.wf, x.epoch)}
	out := make(map[string]any, len(x.wf.Outputs))
	for name, src := range x.wf.Outputs {
		v, err := render(src, scope)
		if err != nil {
			x.log.Warn("output not rendered", "output", name, "err", err)
		}
		out[name] = v
	}
	raw, err := json.Marshal(out)
	if err != nil || len(raw) > x.p.cfg.MaxOutputBytes && x.p.cfg.MaxOutputBytes > 0 {
		raw, _ = json.Marshal(map[string]any{"truncated": true})
	}
	return raw
}

func (x *runExec) isDone(step string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.done[step]
}
