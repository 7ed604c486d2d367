package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/resend"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/workflow"
)

// API is the engine in the terms of its wire API: package client's types in and out,
// what the API service (internal/app/apiserver) answers requests with. The library API
// (StartRun, Run, WaitRun, ...) stays in the engine's own types; API maps them to
// client's, so that the API service knows nothing of checkpoint, epoch or logstream.
//
// Errors the API answers with a code of their own are a *client.Error with that code
// (not_found, bad_request, conflict) and the message the client gets; any other error
// is the API's internal error, with its own message.
type API struct{ e *Engine }

// API is e in its wire API's terms (flowd serves it: internal/app/apiserver).
func (e *Engine) API() *API { return &API{e: e} }

// Hosting is what the API service needs of the node that hosts it: the node's own NATS
// connection to register on (its credentials), the supervisor that keeps the node's
// parts alive (the service is one more, "api"), and how long a part may hear nothing
// before it is presumed cut off. Only the service hosted beside the engine takes them;
// the engine's library API (*Engine) hands out none of its insides.
func (a *API) Hosting() (*nats.Conn, *supervise.Supervisor, time.Duration) {
	return a.e.nc, a.e.sup, a.e.silence()
}

// Status is this node as cluster status lists it: its ID, the log sequence its state
// has applied, whether it leads, and whether a lease it holds goes unrenewed.
func (a *API) Status() client.Node {
	e := a.e
	return client.Node{ID: e.NodeID(), Applied: e.Applied(), Leader: e.isLeader(), LeasesDegraded: e.leasesDegraded(),
		Binary: Binary(), Formats: e.cfg.readFormats(), Labels: e.cfg.Labels}
}

// Cluster is what this node reads of the cluster: the leader the leader key names with
// its term, the log's first and last sequences and the newest snapshot's. What cannot
// be read is left zero; Nodes is left to the caller (the API gathers every node's
// Status).
func (a *API) Cluster(ctx context.Context) client.ClusterStatus {
	var st client.ClusterStatus
	if l, err := a.e.Leader(ctx); err == nil {
		st.Leader, st.Term = l.Node, l.Term
	}
	if first, last, snap, err := a.e.logBounds(ctx); err == nil {
		st.FirstSeq, st.LastSeq, st.SnapshotSeq = first, last, snap
	}
	st.Members = []client.ClusterMember{}
	r, applied, err := a.e.clusterRoster(ctx)
	st.ClusterVersion = applied
	if err != nil {
		st.VersionNote = "the roster cannot be read: " + err.Error()
		return st
	}
	if r.Version > applied {
		st.PromisedVersion = r.Version
	}
	_, st.VersionNote = r.Next(applied)
	if r.Hold != nil {
		st.Hold = &client.ClusterHold{By: r.Hold.By, Reason: r.Hold.Reason, At: ts(r.Hold.At)}
	}
	for _, id := range r.IDs() {
		m := r.Members[id]
		st.Members = append(st.Members, client.ClusterMember{ID: id, Binary: m.Binary, Formats: m.Formats, Hold: m.Hold, Inferred: m.Inferred, Since: ts(m.Since)})
	}
	return st
}

// ForgetNode removes a node that is gone for good from the cluster's members.
func (a *API) ForgetNode(ctx context.Context, node string) error {
	err := a.e.Ops().ForgetNode(ctx, node)
	for _, c := range []struct {
		sentinel error
		code     string
	}{{gate.ErrLive, client.CodeConflict}, {gate.ErrUnknown, client.CodeNotFound}} {
		if errors.Is(err, c.sentinel) {
			return &client.Error{Code: c.code, Message: strings.TrimPrefix(err.Error(), c.sentinel.Error()+": ")}
		}
	}
	return wireError(err)
}

// HoldClusterVersion sets (hold) or releases the operator's hold on the cluster version,
// for ctx's actor.
func (a *API) HoldClusterVersion(ctx context.Context, hold bool, reason string) error {
	return wireError(a.e.Ops().HoldClusterVersion(ctx, hold, audit.Actor(ctx), reason))
}

// DumpLog is a page of the log, decoded whatever each message's format (log.dump).
func (a *API) DumpLog(ctx context.Context, from uint64, run string, limit int) (client.LogPage, error) {
	msgs, next, first, err := a.e.Ops().DumpLog(ctx, from, run, limit)
	if err != nil {
		return client.LogPage{}, err
	}
	page := client.LogPage{Messages: make([]client.LogMessage, 0, len(msgs)), Next: next, FirstSeq: first}
	for _, d := range msgs {
		var m client.LogMessage
		m.Seq, m.Format, m.Revision, m.Node, m.Entries, m.Error = wireDump(d)
		page.Messages = append(page.Messages, m)
	}
	return page, nil
}

// CatchUp waits until this node has applied the log as it is now.
func (a *API) CatchUp(ctx context.Context) error { return a.e.CatchUp(ctx) }

// Changed is closed when this node has applied more of the log.
func (a *API) Changed() <-chan struct{} { return a.e.Changed() }

// ValidateWorkflow parses a workflow file with this engine's step kinds; its error says
// why the file is not valid.
func (a *API) ValidateWorkflow(file string, yaml []byte) (client.Workflow, error) {
	w, err := a.e.ValidateWorkflow(file, yaml)
	if err != nil {
		return client.Workflow{}, err
	}
	return wireWorkflow(w, false), nil
}

// ApplyWorkflow validates a workflow file and records it (ApplyWorkflow).
func (a *API) ApplyWorkflow(ctx context.Context, file string, yaml []byte) (client.Workflow, error) {
	w, err := a.e.ApplyWorkflow(ctx, file, yaml)
	if err != nil {
		return client.Workflow{}, wireError(err)
	}
	return wireWorkflow(w, false), nil
}

// Workflows are the latest version of every workflow, by name, each with the time it
// was applied and without its source.
func (a *API) Workflows() ([]client.Workflow, error) {
	vs, err := a.e.Workflows()
	if err != nil {
		return nil, wireError(err)
	}
	out := []client.Workflow{}
	for _, v := range vs {
		w, err := a.e.Workflow(v.Name, v.Version)
		if err != nil {
			return nil, wireError(err)
		}
		ww := wireWorkflow(w, false)
		ww.AppliedAt = ts(v.At)
		out = append(out, ww)
	}
	return out, nil
}

// Workflow is a workflow version (0: the latest), with its source.
func (a *API) Workflow(name string, version int) (client.Workflow, error) {
	w, err := a.e.Workflow(name, version)
	if err != nil {
		return client.Workflow{}, wireError(err)
	}
	return wireWorkflow(w, true), nil
}

// WorkflowSteps calls step with each step of a workflow version (0: the latest), in the
// file's order: its name, its kind, the steps it needs, and whether it runs per foreach
// item. (The wire's Workflow counts the steps; the web UI draws their graph.)
func (a *API) WorkflowSteps(name string, version int, step func(name, uses string, needs []string, foreach bool)) error {
	w, err := a.e.Workflow(name, version)
	if err != nil {
		return wireError(err)
	}
	for _, st := range w.Steps {
		step(st.Name, st.Uses, st.Needs, st.Foreach != "")
	}
	return nil
}

// Schedules are the workflows with a schedule (the latest version of each), each with
// its next three fire times from now and its last five recorded ticks.
func (a *API) Schedules() ([]client.CronEntry, error) {
	vs, err := a.e.Workflows()
	if err != nil {
		return nil, wireError(err)
	}
	out := []client.CronEntry{}
	for _, v := range vs {
		w, err := a.e.Workflow(v.Name, v.Version)
		if err != nil || w.Schedule == nil {
			continue
		}
		c := client.CronEntry{Workflow: w.Name, Cron: w.Schedule.Cron, Timezone: w.Schedule.Timezone, Overlap: w.Schedule.Overlap,
			Catchup: w.Schedule.Catchup, Next: []string{}, Last: []client.Tick{}}
		if sched, err := workflow.CronParser.Parse(w.Schedule.Cron); err == nil {
			loc, _ := time.LoadLocation(w.Schedule.Timezone)
			t := time.Now().In(loc)
			for i := 0; i < 3; i++ {
				t = sched.Next(t)
				c.Next = append(c.Next, t.Format(time.RFC3339))
			}
		}
		if st, err := a.e.Ops().ScheduleState(w.Name); err == nil && st != nil && st.Paused {
			c.Paused, c.PausedReason, c.PausedBy, c.PausedSince = true, st.Reason, st.Actor, ts(st.Since)
		}
		ticks, _ := a.e.Ops().Ticks(w.Name)
		for i := max(0, len(ticks)-5); i < len(ticks); i++ {
			c.Last = append(c.Last, wireTick(ticks[i]))
		}
		out = append(out, c)
	}
	return out, nil
}

// Ticks are the recorded fire times of a workflow's schedule, oldest first.
func (a *API) Ticks(workflow string) ([]client.Tick, error) {
	ticks, err := a.e.Ops().Ticks(workflow)
	if err != nil {
		return nil, wireError(err)
	}
	out := make([]client.Tick, 0, len(ticks))
	for _, t := range ticks {
		out = append(out, wireTick(t))
	}
	return out, nil
}

// StartRun submits a run of the latest version of a workflow (StartRun), its inputs as
// the wire gives them (strings, converted to the declared types).
func (a *API) StartRun(ctx context.Context, workflow string, opts client.StartOptions) (string, error) {
	inputs := map[string]any{}
	for k, v := range opts.Inputs {
		inputs[k] = v
	}
	id, err := a.e.StartRun(ctx, workflow, inputs, RunOptions{ID: opts.ID, Traceparent: opts.Traceparent, Priority: opts.Priority, Try: resend.TryOf(ctx)})
	return id, wireError(err)
}

// Run is a run with its steps, epochs and fenced commits.
func (a *API) Run(id string) (client.Run, error) {
	v, err := a.e.Run(id)
	if err != nil {
		return client.Run{}, wireError(err)
	}
	out := wireRun(&v.Run, v)
	a.e.maskInputs(&out, &v.Run)
	one := []client.Run{out}
	a.e.showKeyWaits(one, []checkpoint.Run{v.Run})
	a.e.showLabelWaits(one, []checkpoint.Run{v.Run})
	a.e.showRateWaits(one, []checkpoint.Run{v.Run})
	return one[0], nil
}

// History is a run's history, in log order.
func (a *API) History(id string) ([]client.Event, error) {
	v, err := a.e.Run(id)
	if err != nil {
		return nil, wireError(err)
	}
	out := []client.Event{}
	for _, e := range v.Events {
		out = append(out, client.Event{Seq: e.Seq, Kind: string(e.Kind), Epoch: e.Epoch, Term: e.Term, Owner: e.Owner, Actor: e.Actor,
			Step: e.Step, Item: e.Item, Outcome: e.Outcome, Detail: e.Detail, At: tsNano(e.At)})
	}
	return out, nil
}

// Verify re-checks a run's invariants from the state (VerifyRun).
func (a *API) Verify(id string) (client.Verification, error) {
	v, err := a.e.Run(id)
	if err != nil {
		return client.Verification{}, wireError(err)
	}
	return VerifyRun(v), nil
}

// Runs is a page of runs without their steps, newest first by creation time (oldest
// with opts.Oldest), filtered by opts, and the next page's cursor (QueryRuns).
func (a *API) Runs(opts client.ListOptions) (client.RunPage, error) {
	q := checkpoint.RunQuery{Since: opts.Since, Until: opts.Until, Workflow: opts.Workflow, Trigger: opts.Trigger,
		Inputs: opts.Inputs, Parent: opts.Parent, TopLevel: opts.TopLevel, Oldest: opts.Oldest, After: opts.After, Limit: opts.Limit}
	for _, st := range append([]string{opts.Status}, opts.Statuses...) {
		if st != "" && !slices.Contains(q.Statuses, checkpoint.RunStatus(st)) {
			q.Statuses = append(q.Statuses, checkpoint.RunStatus(st))
		}
	}
	// A queued run held back by its concurrency key is pending in the state and shown
	// waiting: `--status waiting` asks the state for pending runs too, and the page
	// keeps the runs whose shown status was asked for (it may then hold fewer than
	// Limit with a next cursor, as a page may).
	asked := slices.Clone(q.Statuses)
	if slices.Contains(asked, checkpoint.StatusWaiting) && !slices.Contains(asked, checkpoint.StatusPending) {
		q.Statuses = append(q.Statuses, checkpoint.StatusPending)
	}
	runs, next, err := a.e.QueryRuns(q)
	if err != nil {
		return client.RunPage{}, wireError(err)
	}
	page := client.RunPage{Runs: wireRuns(runs), Next: next}
	for i := range page.Runs {
		a.e.maskInputs(&page.Runs[i], &runs[i])
	}
	a.e.showKeyWaits(page.Runs, runs)
	a.e.showLabelWaits(page.Runs, runs)
	a.e.showRateWaits(page.Runs, runs)
	if len(asked) > 0 {
		page.Runs = slices.DeleteFunc(page.Runs, func(r client.Run) bool {
			return !slices.Contains(asked, checkpoint.RunStatus(r.Status))
		})
	}
	return page, nil
}

// RunsWithIDPrefix are the runs whose ID starts with prefix.
func (a *API) RunsWithIDPrefix(prefix string, limit int) ([]client.Run, error) {
	runs, err := a.e.RunsWithIDPrefix(prefix, limit)
	if err != nil {
		return nil, wireError(err)
	}
	out := wireRuns(runs)
	for i := range out {
		a.e.maskInputs(&out[i], &runs[i])
	}
	return out, nil
}

// WaitRun waits until a run ends (nil), or ctx does (an error).
func (a *API) WaitRun(ctx context.Context, id string) error {
	_, err := a.e.WaitRun(ctx, id)
	return wireError(err)
}

// Retry sends a failed, dead-lettered or cancelled run back to pending (Retry).
func (a *API) Retry(ctx context.Context, id string) error { return wireError(a.e.Retry(ctx, id)) }

// Cancel cancels a pending or running run, for reason ("": the default, Cancel).
func (a *API) Cancel(ctx context.Context, id, reason string) error {
	return wireError(a.e.Cancel(ctx, id, reason))
}

// RetryFrom retries a run that ended from a step with inputs changed (RetryFrom), the
// inputs as the wire gives them (strings, converted to the declared types).
func (a *API) RetryFrom(ctx context.Context, id string, opts client.RetryOptions) error {
	var inputs map[string]any
	if len(opts.Inputs) > 0 {
		inputs = map[string]any{}
		for k, v := range opts.Inputs {
			inputs[k] = v
		}
	}
	return wireError(a.e.RetryFrom(ctx, id, RetryOptions{From: opts.From, Inputs: inputs, Reason: opts.Reason}))
}

// PauseSchedule pauses a workflow's schedule for ctx's actor (PauseSchedule).
func (a *API) PauseSchedule(ctx context.Context, workflow, reason string) error {
	return wireError(a.e.Ops().PauseSchedule(ctx, workflow, reason))
}

// ResumeSchedule resumes a paused schedule (ResumeSchedule).
func (a *API) ResumeSchedule(ctx context.Context, workflow string) error {
	return wireError(a.e.Ops().ResumeSchedule(ctx, workflow))
}

// NextTicks are the next n fire times of a workflow's schedule (NextTicks).
func (a *API) NextTicks(workflow string, n int) ([]client.NextTick, error) {
	ticks, err := a.e.Ops().NextTicks(workflow, n)
	if err != nil {
		return nil, wireError(err)
	}
	out := make([]client.NextTick, 0, len(ticks))
	for _, t := range ticks {
		out = append(out, client.NextTick{Local: t.Local.Format(time.RFC3339), UTC: t.UTC.Format(time.RFC3339), DST: t.DST})
	}
	return out, nil
}

// Backfill starts a run per tick of the range that has none (Backfill). The range's
// ends are RFC 3339 or dates (midnight in the schedule's timezone). With MaxParallel N
// (and not a dry run), it starts at most N runs, one tick at a time, and answers the
// ticks up to the last one it started: the caller backfills the rest once they end.
func (a *API) Backfill(ctx context.Context, workflow string, opts client.BackfillOptions) ([]client.BackfillTick, error) {
	w, err := a.e.Workflow(workflow, 0)
	if err != nil {
		return nil, wireError(err)
	}
	if w.Schedule == nil {
		return nil, wireError(fmt.Errorf("%w: workflow %s has no schedule to backfill", ErrBadInput, workflow))
	}
	loc, err := time.LoadLocation(w.Schedule.Timezone)
	if err != nil {
		return nil, wireError(err)
	}
	from, err := ParseScheduleTime("from", opts.From, loc)
	if err != nil {
		return nil, wireError(err)
	}
	to, err := ParseScheduleTime("to", opts.To, loc)
	if err != nil {
		return nil, wireError(err)
	}
	eo := BackfillOptions{From: from, To: to, OnlyMissed: opts.OnlyMissed, IncludeFailed: opts.IncludeFailed, Newest: opts.Order == "newest", DryRun: opts.DryRun, Priority: opts.Priority}
	if opts.MaxParallel <= 0 || opts.DryRun {
		ticks, err := a.e.Ops().Backfill(ctx, workflow, eo)
		return wireBackfill(ticks, loc), wireError(err)
	}
	eo.DryRun = true
	plan, err := a.e.Ops().Backfill(ctx, workflow, eo)
	if err != nil {
		return nil, wireError(err)
	}
	var out []BackfillTick
	started := 0
	for _, t := range plan {
		if started == opts.MaxParallel {
			break
		}
		if t.Outcome != client.BackfillWouldRun && t.Outcome != client.BackfillWouldRetry {
			out = append(out, t)
			continue
		}
		one, err := a.e.Ops().Backfill(ctx, workflow, BackfillOptions{From: t.At, To: to, Ticks: []time.Time{t.At}, OnlyMissed: opts.OnlyMissed, IncludeFailed: opts.IncludeFailed, Priority: opts.Priority})
		out = append(out, one...)
		if err != nil {
			return wireBackfill(out, loc), wireError(err)
		}
		if len(one) == 1 && (one[0].Outcome == client.BackfillBackfilled || one[0].Outcome == client.BackfillRetried) {
			started++
		}
	}
	return wireBackfill(out, loc), nil
}

// ParseScheduleTime reads a backfill's end: RFC 3339, or a date (2006-01-02) meaning
// midnight in loc. A bad one is ErrBadInput naming what (from, to).
func ParseScheduleTime(what, s string, loc *time.Location) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, loc); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%w: %s %q: use RFC 3339 (2026-11-01T02:00:00Z) or a date (2026-11-01, midnight in the schedule's timezone)", ErrBadInput, what, s)
}

func wireBackfill(ticks []BackfillTick, loc *time.Location) []client.BackfillTick {
	out := make([]client.BackfillTick, 0, len(ticks))
	for _, t := range ticks {
		out = append(out, client.BackfillTick{At: t.At.In(loc).Format(time.RFC3339), RunID: t.RunID, Outcome: t.Outcome})
	}
	return out
}

// Signal sends a signal to a run that has not ended (Signal); it returns once the
// signal is in the log.
func (a *API) Signal(ctx context.Context, id, name string, opts client.SignalOptions) error {
	return wireError(a.e.Signal(ctx, id, name, SignalOptions{Data: opts.Data, ID: opts.ID}))
}

// SignalWithStart signals run id, starting it first as a run of opts.Start with
// opts.Inputs (strings, converted to the declared types) if no run id exists
// (SignalWithStart); it says whether it started it.
func (a *API) SignalWithStart(ctx context.Context, id, name string, opts client.SignalOptions) (bool, error) {
	inputs := map[string]any{}
	for k, v := range opts.Inputs {
		inputs[k] = v
	}
	started, err := a.e.SignalWithStart(ctx, id, name, opts.Start, inputs, SignalOptions{Data: opts.Data, ID: opts.ID})
	return started, wireError(err)
}

// Decide approves or rejects an approval step of a run for the person ctx names
// (Decide), and returns the step decided. A step that is not an approval step of the
// run, or a run that has ended, is a conflict; a person the node cannot name, or whose
// role is below the step's approvers role, is forbidden.
func (a *API) Decide(ctx context.Context, id, step string, approve bool, comment string) (string, error) {
	st, err := a.e.Decide(ctx, id, step, approve, comment)
	switch {
	case err == nil:
		return st, nil
	case errors.Is(err, ErrNoIdentity), errors.Is(err, ErrNotApprover):
		return "", &client.Error{Code: client.CodeForbidden, Message: "not authorized: " + strings.TrimPrefix(err.Error(), "engine: ")}
	case errors.Is(err, checkpoint.ErrInvalidEntry) && strings.Contains(err.Error(), "approval step"):
		// the run has no such approval step (or several, none waited on): the request
		// was well formed, the run is not what it expected
		return "", &client.Error{Code: client.CodeConflict, Message: err.Error()}
	}
	return "", wireError(err)
}

// Purge takes a dead-lettered run out of the dead-letter queue for good (Purge).
func (a *API) Purge(ctx context.Context, id string) error { return wireError(a.e.Purge(ctx, id)) }

// DrillZombie runs the zombie drill (DrillZombie): the run once it ended, and its
// verification.
func (a *API) DrillZombie(ctx context.Context) (client.Drill, error) {
	v, err := a.e.Ops().DrillZombie(ctx)
	if err != nil {
		return client.Drill{}, wireError(err)
	}
	return client.Drill{Run: wireRun(&v.Run, v), Verify: VerifyRun(v)}, nil
}

// Snapshot writes a snapshot of this node's state now.
func (a *API) Snapshot(ctx context.Context) (client.Snapshot, error) {
	snap, err := a.e.Ops().Snapshot(ctx)
	if err != nil {
		return client.Snapshot{}, wireError(err)
	}
	return client.Snapshot{Name: snap.Name, Seq: snap.Seq, Bytes: snap.Size}, nil
}

// wireError is err as the API answers it: a *client.Error with the code of the API's
// own (the thing not found, the input refused, the state in conflict), or err itself
// (the API's internal error).
func wireError(err error) error {
	var nf *checkpoint.NotFoundError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &nf):
		return &client.Error{Code: client.CodeNotFound, Message: nf.Error()} // the thing, without the layers it passed through
	case errors.Is(err, checkpoint.ErrNotFound):
		return &client.Error{Code: client.CodeNotFound, Message: err.Error()}
	case errors.Is(err, ErrTooMuchSignalData):
		return &client.Error{Code: client.CodeTooManyRequests, Message: strings.TrimPrefix(err.Error(), "engine: ")}
	case errors.Is(err, ErrBadInput), errors.Is(err, checkpoint.ErrInvalidEntry):
		return &client.Error{Code: client.CodeBadRequest, Message: strings.TrimPrefix(err.Error(), ErrBadInput.Error()+": ")}
	case errors.Is(err, checkpoint.ErrConflict), errors.Is(err, checkpoint.ErrRunExists):
		return &client.Error{Code: client.CodeConflict, Message: err.Error()}
	}
	return err
}
