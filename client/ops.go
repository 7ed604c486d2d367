package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flow/internal/base/resend"
)

// ApplyWorkflow applies a workflow's YAML; file names it in errors. A changed YAML makes
// a new version; the same YAML again changes nothing.
func (c *Client) ApplyWorkflow(ctx context.Context, file string, yaml []byte) (Workflow, error) {
	var w Workflow
	err := c.call(ctx, "workflow.apply", Request{File: file, YAML: string(yaml)}, &w)
	return w, err
}

// ValidateWorkflow checks a workflow's YAML on the server (with the step kinds its
// nodes have registered) without applying it.
func (c *Client) ValidateWorkflow(ctx context.Context, file string, yaml []byte) (Workflow, error) {
	var w Workflow
	err := c.call(ctx, "workflow.validate", Request{File: file, YAML: string(yaml)}, &w)
	return w, err
}

// Workflows lists the latest version of every workflow.
func (c *Client) Workflows(ctx context.Context) ([]Workflow, error) {
	var ws []Workflow
	err := c.call(ctx, "workflow.list", Request{}, &ws)
	return ws, err
}

// Workflow is a workflow's latest version, with its source.
func (c *Client) Workflow(ctx context.Context, name string) (Workflow, error) {
	var w Workflow
	err := c.call(ctx, "workflow.show", Request{Name: name}, &w)
	return w, err
}

// StartOptions are a new run's optional settings.
type StartOptions struct {
	// ID is the run's ID (default: generated). Starting an ID that exists is a conflict,
	// so a caller that retries a start with the same ID starts one run. (The client's own
	// tries of one StartRun, after a try that went unanswered, are one start: a later try
	// that finds the run the first one started gets its ID, not the conflict.)
	ID string
	// Inputs are the run's inputs, as the workflow's inputs section declares them.
	Inputs map[string]string
	// Traceparent (W3C) makes the run's trace a part of the caller's: its spans, and
	// the traceparent its steps get, are in that trace.
	Traceparent string
	// Priority, if set, orders the run's admission among the queued runs (higher
	// first; -100 to 100; default: its workflow's priority:, else 0).
	Priority *int
}

// StartRun starts a run of the workflow's latest version and returns its ID.
func (c *Client) StartRun(ctx context.Context, workflow string, opts StartOptions) (string, error) {
	var started struct {
		ID string `json:"id"`
	}
	// The run's ID is fixed before the first try, so that a try sent again (the first
	// went unanswered) is the same start: without one given, it is derived from a nonce
	// the nodes can check (internal/base/resend).
	id, nonce := opts.ID, ""
	if id == "" {
		nonce = resend.NewNonce()
		id = resend.RunIDFor(time.Now(), nonce)
	}
	err := c.callWith(ctx, "run.start", Request{Workflow: workflow, ID: id, Inputs: opts.Inputs, Traceparent: opts.Traceparent, Priority: opts.Priority}, nonce, &started)
	return started.ID, err
}

// Run is a run with its steps, epochs and fenced commits.
func (c *Client) Run(ctx context.Context, id string) (Run, error) {
	var r Run
	err := c.call(ctx, "run.get", Request{ID: id}, &r)
	return r, err
}

// ListOptions select runs, newest first by creation time (oldest first with Oldest).
// The zero value lists the newest 100 runs.
type ListOptions struct {
	Workflow string            // only this workflow
	Status   string            // only this status (pending, running, waiting, succeeded, failed, cancelled, dead_lettered)
	Statuses []string          // or any of these
	Since    time.Time         // created at or after (zero: no bound)
	Until    time.Time         // created before (zero: no bound)
	Trigger  string            // only this trigger (manual, cron, backfill, retry, event, child, handler)
	Inputs   map[string]string // only runs with these input values (a non-string value as its JSON)
	Parent   string            // only this run's children and handler runs
	TopLevel bool              // no child runs, no handler runs
	Oldest   bool              // oldest first
	Limit    int               // at most this many (default 100, at most 10000)
	After    string            // the cursor of the previous page (RunPage.Next)
}

func (o ListOptions) request() Request {
	r := Request{Workflow: o.Workflow, Status: o.Status, Statuses: o.Statuses, Trigger: o.Trigger, Inputs: o.Inputs,
		Parent: o.Parent, TopLevel: o.TopLevel, Oldest: o.Oldest, Limit: o.Limit, After: o.After}
	if !o.Since.IsZero() {
		r.Since = o.Since.Format(time.RFC3339Nano)
	}
	if !o.Until.IsZero() {
		r.Until = o.Until.Format(time.RFC3339Nano)
	}
	return r
}

// Runs lists a page of runs without their steps, newest first by creation time. Use
// RunsPage to go on to the next page.
func (c *Client) Runs(ctx context.Context, opts ListOptions) ([]Run, error) {
	p, err := c.RunsPage(ctx, opts)
	return p.Runs, err
}

// RunsPage lists a page of runs without their steps, and the cursor of the next page
// ("" when no run is left). A page may hold fewer runs than the limit and still have a
// next one.
func (c *Client) RunsPage(ctx context.Context, opts ListOptions) (RunPage, error) {
	req := opts.request()
	req.Paged = true
	var raw json.RawMessage
	err := c.call(ctx, "run.list", req, &raw)
	var ce *Error
	if errors.As(err, &ce) && ce.Code == CodeBadRequest && strings.Contains(ce.Message, `unknown field "paged"`) {
		// A flowd from before pages refuses the fields it does not know: without them
		// (and without the filters it cannot apply) it answers its array of runs.
		old := Request{Workflow: opts.Workflow, Status: opts.Status, Limit: opts.Limit}
		if req.Since != "" || req.Until != "" || req.Trigger != "" || len(req.Statuses) > 0 || len(req.Inputs) > 0 ||
			req.Parent != "" || req.TopLevel || req.Oldest || req.After != "" {
			return RunPage{}, fmt.Errorf("%w (this flowd lists runs by workflow and status only: upgrade it for the other filters)", err)
		}
		err = c.call(ctx, "run.list", old, &raw)
	}
	if err != nil {
		return RunPage{}, err
	}
	var p RunPage
	if len(raw) > 0 && raw[0] == '[' { // a flowd from before pages: the array alone
		err := json.Unmarshal(raw, &p.Runs)
		return p, err
	}
	err = json.Unmarshal(raw, &p)
	return p, err
}

// WaitRun waits on the server, at most wait (0: the server's 30s; at most one minute),
// for the run to end, and returns it as it is then: look at Run.Terminal and ask again
// if it has not ended.
func (c *Client) WaitRun(ctx context.Context, id string, wait time.Duration) (Run, error) {
	req := Request{ID: id}
	if wait > 0 {
		req.Wait = wait.String()
	}
	var r Run
	err := c.call(ctx, "run.wait", req, &r)
	return r, err
}

// watchEvery is how often WatchRun reads the run.
const watchEvery = 200 * time.Millisecond

// WatchRun follows the run until it ends or ctx does, calling fn (if not nil) with the
// run each time its status, epoch or steps changed, and returns the run as it ended.
func (c *Client) WatchRun(ctx context.Context, id string, fn func(Run)) (Run, error) {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	last := ""
	for {
		r, err := c.Run(ctx, id)
		if err != nil {
			return r, err
		}
		if line := r.Progress(); fn != nil && line != last {
			fn(r)
			last = line
		}
		if r.Terminal() {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-tick.C:
		}
	}
}

// History is the run's events, in log order.
func (c *Client) History(ctx context.Context, id string) ([]Event, error) {
	var evs []Event
	err := c.call(ctx, "run.history", Request{ID: id}, &evs)
	return evs, err
}

// Verify checks the run's invariants again from the state.
func (c *Client) Verify(ctx context.Context, id string) (Verification, error) {
	var v Verification
	err := c.call(ctx, "run.verify", Request{ID: id}, &v)
	return v, err
}

// RetryRun starts a failed, dead-lettered or cancelled run again from its checkpoints.
func (c *Client) RetryRun(ctx context.Context, id string) (Change, error) {
	return c.change(ctx, "run.retry", id)
}

// CancelRun cancels a pending or running run.
func (c *Client) CancelRun(ctx context.Context, id string) (Change, error) {
	return c.change(ctx, "run.cancel", id)
}

// CancelRunFor cancels a pending or running run for reason (recorded as its error and in
// its history).
func (c *Client) CancelRunFor(ctx context.Context, id, reason string) (Change, error) {
	var ch Change
	err := c.call(ctx, "run.cancel", Request{ID: id, Reason: reason}, &ch)
	return ch, err
}

// SignalOptions are a signal's optional data and de-duplication key.
type SignalOptions struct {
	// Data is the signal's data: JSON, or empty.
	Data json.RawMessage
	// ID is the signal's key: a second signal with the same key is applied once, so a
	// caller that retries a signal with the same ID signals once.
	ID string
	// Start, if set, is signal-with-start: a workflow whose run is started under the
	// run ID given, with Inputs, if no run has that ID (the submit and the signal are one
	// log message). An existing run of that workflow is signalled and Inputs are unused.
	Start  string
	Inputs map[string]string
}

// Signal sends the signal name to a run that has not ended: kept in its inbox until a
// wait step takes it; a run waiting for it wakes. Signalling a run that has ended is a
// conflict. With opts.Start, a run id that does not exist is started first, as a run of
// that workflow with opts.Inputs, in the same log message as its signal (Signalled.Started
// says whether it was).
func (c *Client) Signal(ctx context.Context, id, name string, opts SignalOptions) (Signalled, error) {
	var out Signalled
	if len(opts.Data) > 0 && !json.Valid(opts.Data) {
		return out, &Error{Code: CodeBadRequest, Message: "signal data is not valid JSON"}
	}
	if opts.Start == "" && len(opts.Inputs) > 0 {
		return out, &Error{Code: CodeBadRequest, Message: "signal inputs are the inputs of the run --start starts: give --start WORKFLOW with them"}
	}
	err := c.call(ctx, "run.signal", Request{ID: id, Name: name, Data: opts.Data, SignalID: opts.ID, Workflow: opts.Start, Inputs: opts.Inputs}, &out)
	return out, err
}

// DecideOptions are an approval's or a rejection's step and comment.
type DecideOptions struct {
	// Step is the approval step ("": the one the run waits on, or its only one).
	Step    string
	Comment string
}

// Approve approves an approval step of a run for the person the server names: the
// person's role must be the step's approvers role or above (else ErrNotAuthorized).
func (c *Client) Approve(ctx context.Context, id string, opts DecideOptions) (Decided, error) {
	return c.decide(ctx, "run.approve", id, opts)
}

// Reject rejects an approval step of a run (the step fails), as Approve approves one.
func (c *Client) Reject(ctx context.Context, id string, opts DecideOptions) (Decided, error) {
	return c.decide(ctx, "run.reject", id, opts)
}

func (c *Client) decide(ctx context.Context, op, id string, opts DecideOptions) (Decided, error) {
	var out Decided
	err := c.call(ctx, op, Request{ID: id, Step: opts.Step, Comment: opts.Comment}, &out)
	return out, err
}

// RetryOptions are a retry's step and changed inputs: From "" retries the run from its
// checkpoints; with From, the step and every step that depends on it, directly or not,
// run again (the others keep their checkpoints), with Inputs (strings, converted to the
// declared types) changed. Inputs need From.
type RetryOptions struct {
	From   string
	Inputs map[string]string
	// Reason is recorded with the retry, in the run's history (a bulk operation's name).
	Reason string
}

// RetryRunFrom retries a run that ended from a step, with inputs changed.
func (c *Client) RetryRunFrom(ctx context.Context, id string, opts RetryOptions) (Change, error) {
	var ch Change
	err := c.call(ctx, "run.retry", Request{ID: id, From: opts.From, Inputs: opts.Inputs, Reason: opts.Reason}, &ch)
	return ch, err
}

// DeadLetters lists the dead-lettered runs (ListOptions.Status is ignored).
func (c *Client) DeadLetters(ctx context.Context, opts ListOptions) ([]Run, error) {
	var runs []Run
	err := c.call(ctx, "dlq.list", opts.request(), &runs)
	return runs, err
}

// DeadLetter is a dead-lettered run with its epoch history; a run that is not in the
// queue is not found.
func (c *Client) DeadLetter(ctx context.Context, id string) (Run, error) {
	var r Run
	err := c.call(ctx, "dlq.show", Request{ID: id}, &r)
	return r, err
}

// RetryDeadLetter retries a dead-lettered run (a new epoch; its epoch changes reset).
func (c *Client) RetryDeadLetter(ctx context.Context, id string) (Change, error) {
	return c.change(ctx, "dlq.retry", id)
}

// PurgeDeadLetter removes a run from the dead-letter queue for good: it ends cancelled,
// its history kept.
func (c *Client) PurgeDeadLetter(ctx context.Context, id string) (Change, error) {
	return c.change(ctx, "dlq.purge", id)
}

func (c *Client) change(ctx context.Context, op, id string) (Change, error) {
	var ch Change
	err := c.call(ctx, op, Request{ID: id}, &ch)
	return ch, err
}

// Schedules lists the scheduled workflows with their next fire times and last ticks.
func (c *Client) Schedules(ctx context.Context) ([]CronEntry, error) {
	var cs []CronEntry
	err := c.call(ctx, "cron.list", Request{}, &cs)
	return cs, err
}

// PauseSchedule pauses a workflow's schedule: nothing fires until ResumeSchedule; the
// ticks that come meanwhile are recorded as paused unless the schedule's catchup fires
// them at the resume. Pausing a paused schedule changes its reason.
func (c *Client) PauseSchedule(ctx context.Context, workflow, reason string) (ScheduleChanged, error) {
	var out ScheduleChanged
	err := c.call(ctx, "cron.pause", Request{Workflow: workflow, Reason: reason}, &out)
	return out, err
}

// ResumeSchedule resumes a paused schedule (a conflict if it is not paused).
func (c *Client) ResumeSchedule(ctx context.Context, workflow string) (ScheduleChanged, error) {
	var out ScheduleChanged
	err := c.call(ctx, "cron.resume", Request{Workflow: workflow}, &out)
	return out, err
}

// NextTicks are the next n fire times of a workflow's schedule (n 0: 5).
func (c *Client) NextTicks(ctx context.Context, workflow string, n int) ([]NextTick, error) {
	var out []NextTick
	err := c.call(ctx, "cron.next", Request{Workflow: workflow, N: n}, &out)
	return out, err
}

// BackfillOptions are a backfill's range (RFC 3339 or dates, both ends included; a
// date is midnight in the schedule's timezone; a To in the future is now), whether
// only the ticks the schedule recorded without a run (missed, paused, skipped) run,
// the order (oldest, the default, or newest), at most how many runs this call starts
// (0: all; the answer then ends with the last tick it started), and whether it only
// lists what would run.
type BackfillOptions struct {
	From, To   string
	OnlyMissed bool
	// IncludeFailed retries the run of a tick that failed or was dead-lettered (keeping
	// its run ID) instead of counting the tick as ran.
	IncludeFailed bool
	Order         string
	MaxParallel   int
	DryRun        bool
	// Priority, if set, is the backfill's runs' priority (default: the workflow's).
	Priority *int
}

// Backfill starts a run per tick of the range that has none, with the tick's own run ID
// (trigger backfill), so that a tick never runs twice; it answers each tick's outcome.
func (c *Client) Backfill(ctx context.Context, workflow string, opts BackfillOptions) ([]BackfillTick, error) {
	var out []BackfillTick
	err := c.call(ctx, "cron.backfill", Request{Workflow: workflow, From: opts.From, To: opts.To, OnlyMissed: opts.OnlyMissed,
		IncludeFailed: opts.IncludeFailed, Order: opts.Order, MaxParallel: opts.MaxParallel, DryRun: opts.DryRun, Priority: opts.Priority}, &out)
	return out, err
}

// Limits are the concurrency keys in use: each key's limit, the runs holding its slots
// and how many wait for one (`flowctl limits`).
func (c *Client) Limits(ctx context.Context) (Limits, error) {
	var l Limits
	err := c.call(ctx, "limits", Request{}, &l)
	return l, err
}

// ClusterStatus is the leader, its term and the nodes that answered.
func (c *Client) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	var st ClusterStatus
	err := c.call(ctx, "cluster.status", Request{}, &st)
	return st, err
}

// Snapshot makes the node that answers write a snapshot of its state now (it is kept
// with the newest few; the leader compacts the log below the newest).
func (c *Client) Snapshot(ctx context.Context) (Snapshot, error) {
	var snap Snapshot
	err := c.call(ctx, "cluster.snapshot", Request{}, &snap)
	return snap, err
}

// ForgetNode removes a node that is gone for good from the cluster's members, so that
// the cluster version can move past the log formats it read. A live node is a conflict.
func (c *Client) ForgetNode(ctx context.Context, node string) error {
	return c.call(ctx, "cluster.forget", Request{Name: node}, nil)
}

// HoldClusterVersion keeps the cluster version where it is (while an upgrade is tried)
// until ReleaseClusterVersion.
func (c *Client) HoldClusterVersion(ctx context.Context, reason string) error {
	return c.call(ctx, "cluster.hold", Request{Reason: reason}, nil)
}

// ReleaseClusterVersion ends an operator's hold on the cluster version.
func (c *Client) ReleaseClusterVersion(ctx context.Context) error {
	return c.call(ctx, "cluster.unhold", Request{}, nil)
}

// LogDumpOptions select log.dump's messages.
type LogDumpOptions struct {
	From  uint64 // the first sequence (0: the log's first)
	Run   string // only the entries about this run ("": all)
	Limit int    // messages per page (default 200, at most 1000)
}

// DumpLog reads a page of the log from opts.From, decoded whatever each message's
// format; LogPage.Next is where the next page starts (0: the end was reached).
func (c *Client) DumpLog(ctx context.Context, opts LogDumpOptions) (LogPage, error) {
	var page LogPage
	req := Request{ID: opts.Run, Limit: opts.Limit}
	if opts.From > 0 {
		req.From = strconv.FormatUint(opts.From, 10)
	}
	err := c.call(ctx, "log.dump", req, &page)
	return page, err
}

// DrillZombie runs the zombie drill: a worker paused past its lease, another taking
// over, and the paused one's commit fenced (about 1.5 lease TTLs).
func (c *Client) DrillZombie(ctx context.Context) (Drill, error) {
	var d Drill
	err := c.call(ctx, "drill.zombie", Request{}, &d)
	return d, err
}

// Repair mends flow's streams and buckets that were sealed or reconfigured (with
// dryRun, only says what it would do): the leader, leases, nodes and cluster buckets
// and the tasks stream are made anew, the log, the DLQ stream and the snapshots are
// refused (docs/security.md, "Sealing and repair"). Only a flowd that embeds its NATS
// server answers it; Streams lists every stream that differed.
func (c *Client) Repair(ctx context.Context, dryRun bool) (Repair, error) {
	var out Repair
	err := c.call(ctx, "cluster.repair", Request{DryRun: dryRun}, &out)
	return out, err
}

// LogOptions narrow run.logs: a step ("": every step), an item (nil: every item and the
// whole step), an attempt (0: every attempt), and the cursor (the last page's Next;
// "": from the first line).
type LogOptions struct {
	Step    string
	Item    *int
	Attempt int
	After   string
}

// RunLogs reads a page of what run's steps printed (stdout and stderr interleaved, each
// line once, with the step, item, attempt and epoch that printed it). Pass the page's
// Next as After for the lines that follow; once an ended run's page is empty there are
// no more (FollowLogs does that loop).
func (c *Client) RunLogs(ctx context.Context, id string, opts LogOptions) (StepLogPage, error) {
	var page StepLogPage
	err := c.call(ctx, "run.logs", Request{ID: id, Step: opts.Step, Item: opts.Item, Attempt: opts.Attempt, After: opts.After}, &page)
	return page, err
}

// FollowLogs calls line with each line of run's steps' logs, from the first (or
// opts.After), as they come while the run goes on, polling every poll (default 500ms),
// until the run has ended and every line it printed was given (nil), or ctx ends, or a
// read fails.
func (c *Client) FollowLogs(ctx context.Context, id string, opts LogOptions, poll time.Duration, line func(LogLine)) error {
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		page, err := c.RunLogs(ctx, id, opts)
		if err != nil {
			return err
		}
		for _, l := range page.Lines {
			line(l)
		}
		opts.After = page.Next
		if len(page.Lines) > 0 {
			continue // more may be there already
		}
		if page.Ended {
			return nil
		}
		t.Reset(poll)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
