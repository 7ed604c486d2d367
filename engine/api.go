package engine

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/audit"
	"github.com/flowrun/flow/internal/ident"
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
	if version > 0 {
		if w, ok := e.specs.Load(name + "@" + strconv.Itoa(version)); ok {
			return w.(*workflow.Workflow), nil
		}
	}
	v, err := e.store.Workflow(name, version)
	if err != nil {
		return nil, err
	}
	if w, ok := e.specs.Load(name + "@" + strconv.Itoa(v.Version)); ok {
		return w.(*workflow.Workflow), nil
	}
	w, err := workflow.Decode(v.Spec)
	if err != nil {
		return nil, err
	}
	w.Version = v.Version
	e.specs.Store(name+"@"+strconv.Itoa(v.Version), w)
	return w, nil
}

// RunOptions adjust StartRun.
type RunOptions struct {
	ID          string    // default: generated
	Trigger     string    // default manual
	ScheduledAt time.Time // cron runs
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
	generated := id == ""
	if generated {
		id = NewRunID()
	}
	if !ident.ValidID(id) {
		return "", fmt.Errorf("%w: run ID %q: %s", ErrBadInput, id, ident.IDRule)
	}
	trigger := opts.Trigger
	if trigger == "" {
		trigger = checkpoint.TriggerManual
	}
	raw, _ := json.Marshal(resolved)
	// The run names its workflow version; the definition itself is in the log once.
	sub := &checkpoint.Submit{Workflow: w.Name, Version: w.Version, Trigger: trigger, ScheduledAt: opts.ScheduledAt,
		MaxEpochs: w.MaxEpochs, Inputs: raw}
	for _, st := range w.Steps {
		sub.Steps = append(sub.Steps, checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
	}
	submit := checkpoint.Entry{Kind: checkpoint.KindSubmit, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID, Submit: sub}
	// Only a run ID made here is surely new: with a given ID (a client's, a cron tick's)
	// the submit may be refused as a repeat while the assign, judged on its own, would
	// give the existing run an epoch past its workflow's limits.
	// The short path is an assign like the scheduler's: only with room under admission
	// and no older run waiting for one (admission.go).
	if term := e.Leading(); (generated || e.hooks.FastPathGivenIDs.Load()) && term != nil && w.Concurrency == 0 && term.Check() == nil && e.admit() {
		defer e.admitted()
		return id, e.submitAndAssign(ctx, submit, term)
	}
	if err := e.clog.Writer.Write(ctx, submit).Await(ctx); err != nil {
		return "", err
	}
	return id, nil
}

// submitAndAssign is StartRun on the leader: the run's first assign (with the term) rides
// in the submit's log message and the task is queued at once, instead of the scheduler
// reacting to the applied submit with a message of its own (one synced write and one
// round trip less per run). Runs of a workflow with a concurrency limit, and runs whose ID
// was given, always wait for the scheduler. The log judges the assign like any other: if it is refused (the term
// ended meanwhile), the run is pending without an epoch and the next leader assigns it.
//
// When this node has a free worker slot, the assign also names it as the epoch's worker
// (the claim rides in the same entry) and the run starts here without a task: one more
// synced write and two round trips less (docs/decisions.md).
func (e *Engine) submitAndAssign(ctx context.Context, submit checkpoint.Entry, term *epoch.Term) error {
	assign := checkpoint.Entry{Kind: checkpoint.KindAssign, Run: submit.Run, Term: term.Term(), Owner: e.cfg.NodeID}
	own := e.reserveOwnRun()
	if own {
		assign.Worker = e.cfg.NodeID
	}
	f := e.clog.Writer.Write(ctx, submit, assign)
	if own {
		// The reserved slot (and its count in e.wg) follows the assign's outcome in the
		// log, not the caller, whose ctx may end first; nor the engine's context: Stop
		// cancels it while the log still applies what is in flight, and an accepted
		// assign must then be handed back (runOwn does, its lease acquire failing). A
		// write refused before publishing is resolved at once: the slot goes back.
		go func() {
			actx, cancel := context.WithTimeout(context.WithoutCancel(e.runCtx), 3*logstream.DefaultPublishTimeout)
			err := f.Results(actx)[1]
			cancel()
			if err != nil {
				e.releaseOwnRun()
				return
			}
			e.runOwn(submit.Run, int64(f.Seq()))
		}()
	}
	errs := f.Results(ctx)
	if errs[0] != nil {
		return errs[0]
	}
	if errs[1] != nil {
		e.log.Info("assign with the submit refused; the scheduler assigns the run", "run", submit.Run, "err", errs[1])
		return nil
	}
	if !own {
		if err := publishTask(ctx, e.js, task{Run: submit.Run, Epoch: int64(f.Seq())}); err != nil {
			e.log.Warn("task not queued; reconcile will retry", "run", submit.Run, "err", err)
		}
	}
	return nil
}

// NewRunID is a time-ordered run ID: 20261129-101500.123-k3j9x2.
func NewRunID() string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	var b strings.Builder
	b.WriteString(time.Now().UTC().Format("20060102-150405.000"))
	b.WriteByte('-')
	for i := 0; i < 6; i++ {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(digits))))
		b.WriteByte(digits[n.Int64()])
	}
	return b.String()
}

// ResolveInputs checks inputs against the workflow, converts strings to the declared
// types and fills defaults (rendering helpers such as {{ yesterday }} at `at`, in the
// schedule's timezone).
func ResolveInputs(w *workflow.Workflow, given map[string]any, at time.Time) (map[string]any, error) {
	declared := map[string]workflow.Input{}
	for _, in := range w.Inputs {
		declared[in.Name] = in
	}
	var unknown []string
	for k := range given {
		if _, ok := declared[k]; !ok {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		var names []string
		for _, in := range w.Inputs {
			names = append(names, in.Name)
		}
		return nil, fmt.Errorf("%w: workflow %s has no input %s (inputs: %s)", ErrBadInput, w.Name, strings.Join(unknown, ", "), strings.Join(names, ", "))
	}
	loc := time.UTC
	if w.Schedule != nil {
		if l, err := time.LoadLocation(w.Schedule.Timezone); err == nil {
			loc = l
		}
	}
	helpers := map[string]any{
		"now":       at.In(loc).Format(time.RFC3339),
		"today":     at.In(loc).Format("2006-01-02"),
		"yesterday": at.In(loc).AddDate(0, 0, -1).Format("2006-01-02"),
	}
	out := map[string]any{}
	for _, in := range w.Inputs {
		v, ok := given[in.Name]
		if !ok {
			if !in.HasDefault {
				return nil, fmt.Errorf("%w: input %s is required (type %s)", ErrBadInput, in.Name, in.Type)
			}
			v = in.Default
			if s, isStr := v.(string); isStr && strings.Contains(s, "{{") {
				r, err := renderHelpers(s, helpers)
				if err != nil {
					return nil, fmt.Errorf("%w: input %s default: %v", ErrBadInput, in.Name, err)
				}
				v = r
			}
		}
		cv, err := convertInput(in, v)
		if err != nil {
			return nil, err
		}
		out[in.Name] = cv
	}
	return out, nil
}

func renderHelpers(src string, helpers map[string]any) (any, error) {
	t, err := workflow.ParseTemplate(src)
	if err != nil {
		return nil, err
	}
	return t.Render(helpers)
}

func convertInput(in workflow.Input, v any) (any, error) {
	if s, ok := v.(string); ok && in.Type != "string" {
		var conv any
		var err error
		switch in.Type {
		case "int":
			// int64, never float64: 9007199254740993 must arrive as itself.
			conv, err = strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		case "number":
			conv, err = strconv.ParseFloat(strings.TrimSpace(s), 64)
		case "bool":
			conv, err = strconv.ParseBool(strings.TrimSpace(s))
		case "list", "object":
			err = json.Unmarshal([]byte(s), &conv)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: input %s=%q is not a %s", ErrBadInput, in.Name, s, in.Type)
		}
		v = conv
	}
	switch n := v.(type) {
	case int:
		v = int64(n)
	case json.Number: // from a Go client's JSON: keep an int exact
		if in.Type == "int" {
			i, err := n.Int64()
			if err != nil {
				return nil, fmt.Errorf("%w: input %s=%s is not an int (64-bit)", ErrBadInput, in.Name, n)
			}
			v = i
		} else if f, err := n.Float64(); err == nil {
			v = f
		}
	}
	if err := workflow.CheckType(in.Type, v); err != nil {
		return nil, fmt.Errorf("%w: input %s: %v", ErrBadInput, in.Name, err)
	}
	return v, nil
}

// Run returns everything the state knows about a run.
func (e *Engine) Run(id string) (*checkpoint.RunView, error) { return e.store.View(id) }

// ListRuns lists runs.
func (e *Engine) ListRuns(opts checkpoint.ListOptions) ([]checkpoint.Run, string, error) {
	return e.store.ListRuns(opts)
}

// RunsNewest returns a page of runs, newest first (the web UI's list).
func (e *Engine) RunsNewest(opts checkpoint.NewestOptions) ([]checkpoint.Run, string, error) {
	return e.store.RunsNewest(opts)
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
func (e *Engine) Retry(ctx context.Context, id string) error {
	if err := e.running(); err != nil {
		return err
	}
	return e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindRetry, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID}).Await(ctx)
}

// Purge takes a dead-lettered run out of the dead-letter queue for good (it ends
// cancelled; its history stays).
func (e *Engine) Purge(ctx context.Context, id string) error {
	if err := e.running(); err != nil {
		return err
	}
	return e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindPurge, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID}).Await(ctx)
}
