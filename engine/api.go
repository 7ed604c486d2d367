package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/ident"
	"github.com/flowrun/flow/internal/base/resend"
	"github.com/flowrun/flow/internal/base/tracing"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// Errors of the library API (wrapped with context).
var (
	// ErrBadInput: the request is wrong (unknown input, wrong type, ...); nothing changed.
	ErrBadInput = errors.New("engine: bad input")
)

func (e *Engine) running() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.mu.started || e.mu.stopping || e.clog == nil {
		return ErrNotStarted
	}
	return nil
}

// ValidateWorkflow parses a workflow file with this engine's step kinds, checking each
// step's with with its kind's checker (registered Go kinds' included).
func (e *Engine) ValidateWorkflow(file string, data []byte) (*workflow.Workflow, error) {
	return workflow.LoadWith(file, data, workflow.Options{Kinds: e.cfg.Registry.Has, With: e.cfg.Registry.CheckWith})
}

// ApplyWorkflow validates a workflow and records it; a changed source makes a new
// version (an unchanged one keeps its version). It returns the version.
func (e *Engine) ApplyWorkflow(ctx context.Context, file string, data []byte) (*workflow.Workflow, error) {
	if err := e.running(); err != nil {
		return nil, err
	}
	w, err := e.ValidateWorkflow(file, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	if err := e.checkChildLoop(w); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadInput, file, err)
	}
	// What a node of an older release would ignore (a run taken by a node without the
	// labels, a step started unpaced, admission by submission only) needs every node on
	// this release: cluster version 3.
	var needs3 []string
	if w.Priority != 0 {
		needs3 = append(needs3, "priority")
	}
	if len(w.Labels()) > 0 {
		needs3 = append(needs3, "runs_on")
	}
	if len(w.RateLimits()) > 0 {
		needs3 = append(needs3, "rate_limit")
	}
	if w.StepKeys() {
		needs3 = append(needs3, "concurrency on a step")
	}
	if len(needs3) > 0 && !e.flowControlVersion(ctx) {
		return nil, fmt.Errorf("%w: %s: %s needs cluster version %d (every node on this release; the cluster is at %d): finish the upgrade (flowctl cluster status), then apply it again",
			ErrBadInput, file, needs3[0], checkpoint.LogFormatFlowControl, e.store.ClusterVersion())
	}
	spec, err := json.Marshal(w)
	if err != nil {
		return nil, err
	}
	if err := e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindWorkflow, Actor: audit.Actor(ctx), Owner: e.cfg.NodeID,
		Workflow: &checkpoint.WorkflowDef{Name: w.Name, Digest: w.Digest, Spec: spec}}).Await(ctx); err != nil {
		return nil, err
	}
	v, err := e.store.Workflow(w.Name, 0)
	if err != nil {
		return nil, err
	}
	w.Version = v.Version
	return w, nil
}

// Workflow returns a workflow version (0: the latest). Versions never change, so
// decoded ones are cached.
func (e *Engine) Workflow(name string, version int) (*workflow.Workflow, error) {
	return e.specs.Workflow(name, version)
}

// RunOptions adjust StartRun.
type RunOptions struct {
	ID          string    // default: generated
	Trigger     string    // default manual
	ScheduledAt time.Time // cron runs
	// Parent makes the run a child of a workflow step (engine/internal/worker/child.go),
	// started by the parent's epoch ParentEpoch.
	Parent      *checkpoint.ParentRef
	ParentEpoch int64
	// Traceparent, a W3C traceparent, makes the run's trace a part of the caller's
	// (flowctl run start --traceparent). The run's spans are in ctx's trace otherwise
	// (a child run's, its parent step's), or in a trace of their own.
	Traceparent string
	// Try is the API request's try (internal/base/resend): an ID derived from its nonce
	// is as new as a generated one, and a try sent again finds its own run.
	Try resend.Try
	// Priority, if set, is the run's priority (checkpoint.Submit.Priority); default its
	// workflow's, and for a child of a workflow without one, its parent's.
	Priority *int
}

// StartRun submits a run of the latest version of a workflow. inputs are checked
// against the workflow's types (strings are converted: "3" for an int); missing
// inputs take their defaults.
func (e *Engine) StartRun(ctx context.Context, name string, inputs map[string]any, opts RunOptions) (string, error) {
	if err := e.running(); err != nil {
		return "", err
	}
	w, err := e.Workflow(name, 0)
	if err != nil {
		if errors.Is(err, checkpoint.ErrNotFound) {
			return "", fmt.Errorf("%w: no workflow %q: apply it first (flowctl workflow apply -f FILE)", ErrBadInput, name)
		}
		return "", err
	}
	at := e.cfg.Now()
	if !opts.ScheduledAt.IsZero() {
		at = opts.ScheduledAt
	}
	resolved, err := ResolveInputs(w, inputs, at)
	if err != nil {
		return "", err
	}
	id := opts.ID
	generated, derived := id == "", false
	if generated {
		id = NewRunID()
	} else if derived = resend.Derived(id, opts.Try.Nonce); derived {
		// The client derived the ID from its nonce: new, unless a try of this same start
		// (or a forger who brute-forced the six characters) got there first.
		_, err := e.store.Run(id)
		generated = errors.Is(err, checkpoint.ErrNotFound)
	}
	if !ident.ValidID(id) {
		return "", fmt.Errorf("%w: run ID %q: %s", ErrBadInput, id, ident.IDRule)
	}
	if !generated && !derived && opts.Parent == nil {
		if err := e.checkChosenID(id); err != nil {
			return "", err
		}
	}
	submit, err := e.submitOf(ctx, w, id, resolved, at, opts)
	if err != nil {
		return "", err
	}
	sub := submit.Submit
	if err := tracing.ValidTraceparent(opts.Traceparent); err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	// The run's trace starts here: the submit span, whose context the log keeps for every
	// node and epoch of the run (a new field: only once the cluster version has it).
	tctx := tracing.WithTraceparent(ctx, opts.Traceparent)
	if tracing.Enabled() {
		var span trace.Span
		tctx, span = tracing.Tracer().Start(tctx, "flow.run.submit", trace.WithAttributes(
			attribute.String("flow.run.id", id), attribute.String("flow.workflow", w.Name), attribute.Int("flow.workflow.version", w.Version),
			attribute.String("flow.trigger", sub.Trigger)))
		defer span.End()
	}
	if e.store.ClusterVersion() >= checkpoint.LogFormatBinary {
		sub.Trace = tracing.Traceparent(tctx)
	}
	// The leader's short path (leader.Service.StartHere) only for a run ID made here
	// (or derived from a client's nonce) and a workflow without a concurrency limit.
	short := false
	if (generated || e.hooks.FastPathGivenIDs.Load()) && w.Concurrency == 0 && len(w.ConcurrencyKeys) == 0 && len(w.Labels()) == 0 && e.leader != nil {
		short, err = e.leader.StartHere(tctx, submit, e.workers)
	}
	if !short {
		err = e.clog.Writer.Write(ctx, submit).Await(ctx)
	}
	if errors.Is(err, checkpoint.ErrRunExists) && opts.Try.Resent() && e.sameStart(id, submit) {
		return id, nil // an earlier try of this start got through; its answer was lost
	}
	if err != nil && !short {
		return "", err
	}
	// The short path names the run even when its caller left before the outcome: the
	// run goes on (its reserved worker follows the assign in the log).
	return id, err
}

// submitOf is the submit entry of run id of w with its resolved inputs, as StartRun
// writes it (without its trace): refused (ErrBadInput) when a concurrency key of w
// cannot render from the inputs.
func (e *Engine) submitOf(ctx context.Context, w *workflow.Workflow, id string, resolved map[string]any, at time.Time, opts RunOptions) (checkpoint.Entry, error) {
	trigger := opts.Trigger
	if trigger == "" {
		trigger = checkpoint.TriggerManual
	}
	raw, _ := json.Marshal(resolved)
	var err error
	if _, err := w.Keys(resolved); err != nil {
		// A key that cannot render would be counted under workflow.UnrenderedKey, with
		// every run like it: refuse it here, where the caller can give the input.
		return checkpoint.Entry{}, fmt.Errorf("%w: workflow %s: %v; give the input it reads (--input NAME=VALUE)", ErrBadInput, w.Name, err)
	}
	// The run names its workflow version; the definition itself is in the log once.
	sub := &checkpoint.Submit{Workflow: w.Name, Version: w.Version, Trigger: trigger, ScheduledAt: opts.ScheduledAt,
		MaxEpochs: w.MaxEpochs, Inputs: raw, Parent: opts.Parent}
	if opts.Parent != nil {
		sub.Trigger = checkpoint.TriggerChild
	}
	sub.Deadline = workflow.DeadlineFor(w, opts.ScheduledAt, at)
	sub.Handlers = leader.HandlerSpecs(w)
	sub.KeyScheme = checkpoint.KeySchemeFor(e.store.ClusterVersion())
	if sub.Priority, err = e.priorityOf(ctx, w, opts); err != nil {
		return checkpoint.Entry{}, err
	}
	for _, st := range w.Steps {
		sub.Steps = append(sub.Steps, checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
	}
	submit := checkpoint.Entry{Kind: checkpoint.KindSubmit, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID, Submit: sub}
	if opts.Parent != nil {
		// The child's submit is the parent's epoch's write, fenced like its commits, and
		// carries this node's bound on the parent's whole tree.
		submit.Epoch, sub.MaxTree = opts.ParentEpoch, e.cfg.MaxRunTree
	}
	return submit, nil
}

// sameStart reports whether the run id is the one submit would have started: the same
// workflow version, trigger, inputs and starter. A try sent again after an unanswered one
// is then answered as the first would have been.
func (e *Engine) sameStart(id string, submit checkpoint.Entry) bool {
	r, err := e.store.Run(id)
	if err != nil {
		return false
	}
	sub := submit.Submit
	return r.Workflow == sub.Workflow && r.Version == sub.Version && r.Trigger == sub.Trigger &&
		r.StartedBy == submit.Actor && bytes.Equal(r.Inputs, sub.Inputs) && r.Parent == nil && sub.Parent == nil
}

// NewRunID is a time-ordered run ID: 20261129-101500.123-k3j9x2.
func NewRunID() string { return resend.NewRunID(time.Now()) }

// ResolveInputs checks inputs against the workflow, converts strings to the declared
// types and fills defaults, rendering helpers at `at` (workflow.ResolveInputs); its
// errors wrap ErrBadInput.
func ResolveInputs(w *workflow.Workflow, given map[string]any, at time.Time) (map[string]any, error) {
	in, err := workflow.ResolveInputs(w, given, at)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	return in, nil
}

// Run returns everything the state knows about a run.
func (e *Engine) Run(id string) (*checkpoint.RunView, error) { return e.store.View(id) }

// ListRuns lists runs.
func (e *Engine) ListRuns(opts checkpoint.ListOptions) ([]checkpoint.Run, string, error) {
	return e.store.ListRuns(opts)
}

// QueryRuns returns a page of runs by creation time, filtered, and the next page's
// cursor (run list, the web UI's runs page).
func (e *Engine) QueryRuns(q checkpoint.RunQuery) ([]checkpoint.Run, string, error) {
	return e.store.QueryRuns(q)
}

// RunsWithIDPrefix returns runs whose ID starts with prefix.
func (e *Engine) RunsWithIDPrefix(prefix string, limit int) ([]checkpoint.Run, error) {
	return e.store.RunsWithIDPrefix(prefix, limit)
}

// WaitRun waits until a run ends (succeeded, failed, cancelled, dead-lettered).
func (e *Engine) WaitRun(ctx context.Context, id string) (*checkpoint.Run, error) {
	ended := make(chan struct{})
	e.mu.Lock()
	e.mu.waiters[id] = append(e.mu.waiters[id], ended)
	e.mu.Unlock()
	defer func() { // unregister unless statusChanged already did
		e.mu.Lock()
		defer e.mu.Unlock()
		ws := e.mu.waiters[id]
		for i, w := range ws {
			if w == ended {
				e.mu.waiters[id] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(e.mu.waiters[id]) == 0 {
			delete(e.mu.waiters, id)
		}
	}()
	if st, err := e.store.Status(id); err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
		return nil, err
	} else if err == nil && st.Terminal() {
		return e.store.Run(id)
	}
	select {
	case <-ended:
		return e.store.Run(id)
	case <-ctx.Done():
		return nil, fmt.Errorf("engine: wait for run %s: %w", id, ctx.Err())
	case <-e.clog.Applier.Failed():
		return nil, e.clog.Applier.Err()
	}
}

// Cancel cancels a pending or running run.
func (e *Engine) Cancel(ctx context.Context, id, reason string) error {
	if err := e.running(); err != nil {
		return err
	}
	if reason == "" {
		reason = "cancelled by an operator"
	}
	return e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCancel, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID, Reason: reason}).Await(ctx)
}

// Retry sends a failed, dead-lettered or cancelled run back to pending; it resumes from
// its checkpoints with a new epoch and epoch_changes reset.
func (e *Engine) Retry(ctx context.Context, id string) error { return e.retry(ctx, id, "") }

func (e *Engine) retry(ctx context.Context, id, reason string) error {
	if err := e.running(); err != nil {
		return err
	}
	return e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindRetry, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID, Reason: reason}).Await(ctx)
}

// Purge takes a dead-lettered run out of the dead-letter queue for good (it ends
// cancelled; its history stays).
func (e *Engine) Purge(ctx context.Context, id string) error {
	if err := e.running(); err != nil {
		return err
	}
	return e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindPurge, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID}).Await(ctx)
}

// DrillStepKind is the step kind of the zombie drill, registered on every engine.
const DrillStepKind = worker.DrillStepKind

// DrillWorkflow is the workflow `flowctl drill zombie` runs.
const DrillWorkflow = worker.DrillWorkflow

// DrillZombie runs the drill and returns the run once it ended.
func (o Ops) DrillZombie(ctx context.Context) (*checkpoint.RunView, error) {
	e := o.e
	if _, err := e.ApplyWorkflow(ctx, "drill-zombie.yaml", []byte(DrillWorkflow)); err != nil {
		return nil, err
	}
	id, err := e.StartRun(ctx, "flow-drill-zombie", nil, RunOptions{})
	if err != nil {
		return nil, err
	}
	if _, err := e.WaitRun(ctx, id); err != nil {
		return nil, err
	}
	// The new owner may finish before the paused one wakes: wait for its fenced commit.
	if err := e.waitFor(ctx, func() bool {
		r, err := e.store.Run(id)
		return err == nil && r.Fenced > 0
	}); err != nil {
		return nil, fmt.Errorf("engine: drill: the paused worker's commit never reached the log: %w", err)
	}
	return e.Run(id)
}

// Snapshot writes a snapshot of this node's state now (flowctl cluster snapshot).
func (o Ops) Snapshot(ctx context.Context) (logstream.Snapshot, error) {
	e := o.e
	return e.clog.Snapshots.Take(ctx)
}

// logBounds are the log's first and last sequences and the newest snapshot's (0: none).
func (e *Engine) logBounds(ctx context.Context) (first, last, snapshot uint64, err error) {
	info, err := e.ports.Log.Info(ctx)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("engine: log bounds: %w", err)
	}
	snaps, err := e.clog.Snapshots.List(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	if len(snaps) > 0 {
		snapshot = snaps[len(snaps)-1].Seq
	}
	return info.FirstSeq, info.LastSeq, snapshot, nil
}

// Workflows lists every applied workflow version.
func (e *Engine) Workflows() ([]checkpoint.WorkflowVersion, error) { return e.store.Workflows() }

// Ticks are the recorded fire times of a workflow's schedule, oldest first.
func (o Ops) Ticks(workflow string) ([]checkpoint.Tick, error) {
	e := o.e
	return e.store.Ticks(workflow)
}

// ReasonStolen is logged (and returned) when a worker finds its run was taken over: a
// commit fenced, or its lease lost.
const ReasonStolen = worker.ReasonStolen

// CronRunID is the run ID of a workflow's tick (workflow.TickRunID).
func CronRunID(name string, tick time.Time) string { return workflow.TickRunID(name, tick) }

// leadershipProblem says why this node's election cannot give it a term that
// schedules ("" when nothing is wrong).
func (e *Engine) leadershipProblem() string {
	if e.leader == nil {
		return ""
	}
	return e.leader.Problem()
}

// priorityOf is the priority of a run of w started with opts: opts.Priority, else w's,
// else (a child of a workflow without one) its parent's. Refused (ErrBadInput): one out
// of range, or one other than 0 below cluster version 3, where no node may write it.
func (e *Engine) priorityOf(ctx context.Context, w *workflow.Workflow, opts RunOptions) (int, error) {
	p := w.Priority
	switch {
	case opts.Priority != nil:
		p = *opts.Priority
	case p == 0 && opts.Parent != nil:
		if parent, err := e.store.Run(opts.Parent.Run); err == nil {
			p = parent.Priority
		}
	}
	if p < checkpoint.MinPriority || p > checkpoint.MaxPriority {
		return 0, fmt.Errorf("%w: priority %d: use %d to %d (higher first)", ErrBadInput, p, checkpoint.MinPriority, checkpoint.MaxPriority)
	}
	if p != 0 && !e.flowControlVersion(ctx) {
		return 0, fmt.Errorf("%w: priority %d needs cluster version %d (every node on this release; the cluster is at %d): leave it out, or finish the upgrade (flowctl cluster status)",
			ErrBadInput, p, checkpoint.LogFormatFlowControl, e.store.ClusterVersion())
	}
	return p, nil
}

// flowControlWait is how long a request that needs cluster version 3 (runs_on, a
// priority) waits for it: a cluster just started raises it within a leader's first looks
// at the roster, and flowd --workflows applies its files at once.
const flowControlWait = 5 * time.Second

// flowControlVersion says whether the cluster is at version 3 (the flow-control
// entries), waiting up to flowControlWait (or ctx) for it to be raised.
func (e *Engine) flowControlVersion(ctx context.Context) bool {
	if e.store.ClusterVersion() >= checkpoint.LogFormatFlowControl {
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, flowControlWait)
	defer cancel()
	return e.Ops().WaitClusterVersion(wctx, checkpoint.LogFormatFlowControl) == nil
}
