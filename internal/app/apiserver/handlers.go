package apiserver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/ident"
)

// maxWait bounds one run.wait (below the 2m every request gets); a client wanting
// longer asks again.
const maxWait = time.Minute

// runWait answers with the run once it has ended, or as it is when the wait (default
// 30s) passes or the server stops: the client looks at the status and may ask again.
func (s *Server) runWait(ctx context.Context, r *client.Request) (any, error) {
	d := 30 * time.Second
	if r.Wait != "" {
		var err error
		if d, err = time.ParseDuration(r.Wait); err != nil || d <= 0 || d > maxWait {
			return nil, badRequest("wait %q: use a duration from 1ms to %s, such as 30s", r.Wait, maxWait)
		}
	}
	if _, err := s.run(r); err != nil { // unknown runs fail now, not after the wait
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	stop := context.AfterFunc(s.waitCtx, cancel)
	defer stop()
	if err := s.n.WaitRun(wctx, r.ID); err != nil && wctx.Err() == nil {
		return nil, err
	}
	return s.runGet(ctx, r)
}

func needID(r *client.Request) error {
	if r.ID == "" {
		return badRequest("a run ID is required")
	}
	if !ident.ValidID(r.ID) {
		return badRequest("%q is not a run ID: %s", r.ID, ident.IDRule)
	}
	return nil
}

func (s *Server) workflowValidate(_ context.Context, r *client.Request) (any, error) {
	w, err := s.n.ValidateWorkflow(r.File, []byte(r.YAML))
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return w, nil
}

func (s *Server) workflowApply(ctx context.Context, r *client.Request) (any, error) {
	if r.YAML == "" {
		return nil, badRequest("the workflow file is empty")
	}
	w, err := s.n.ApplyWorkflow(ctx, r.File, []byte(r.YAML))
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (s *Server) workflowList(context.Context, *client.Request) (any, error) {
	ws, err := s.n.Workflows()
	if err != nil {
		return nil, err
	}
	return ws, nil
}

func (s *Server) workflowShow(_ context.Context, r *client.Request) (any, error) {
	if r.Name == "" {
		return nil, badRequest("a workflow name is required")
	}
	w, err := s.n.Workflow(r.Name, 0)
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (s *Server) runStart(ctx context.Context, r *client.Request) (any, error) {
	if r.Workflow == "" {
		return nil, badRequest("a workflow name is required")
	}
	id, err := s.n.StartRun(ctx, r.Workflow, client.StartOptions{ID: r.ID, Inputs: r.Inputs, Traceparent: r.Traceparent, Priority: r.Priority})
	if err != nil {
		return nil, err
	}
	return map[string]string{"id": id}, nil
}

// run is the run r names.
func (s *Server) run(r *client.Request) (client.Run, error) {
	if err := needID(r); err != nil {
		return client.Run{}, err
	}
	return s.n.Run(r.ID)
}

func (s *Server) runGet(_ context.Context, r *client.Request) (any, error) {
	run, err := s.run(r)
	if err != nil {
		return nil, err
	}
	return run, nil
}

// runStatuses are the statuses a run can have on the wire (checkpoint.RunStatus's
// values; TestRunStatusesAreTheStates checks they agree).
var runStatuses = []string{"pending", "running", "waiting", "succeeded", "failed", "cancelled", "dead_lettered"}

func (s *Server) runList(_ context.Context, r *client.Request) (any, error) {
	for _, st := range append([]string{r.Status}, r.Statuses...) {
		if st != "" && !slices.Contains(runStatuses, st) {
			return nil, badRequest("status %q: use pending, running, waiting, succeeded, failed, cancelled or dead_lettered", st)
		}
	}
	if len(r.Statuses) > len(runStatuses) {
		return nil, badRequest("%d statuses: there are %d", len(r.Statuses), len(runStatuses))
	}
	if r.Limit < 0 || r.Limit > 10000 {
		return nil, badRequest("limit %d: use 1 to 10000", r.Limit)
	}
	if len(r.Inputs) > 32 {
		return nil, badRequest("%d input filters: at most 32", len(r.Inputs))
	}
	opts := client.ListOptions{Workflow: r.Workflow, Status: r.Status, Statuses: r.Statuses, Trigger: r.Trigger, Inputs: r.Inputs,
		Parent: r.Parent, TopLevel: r.TopLevel, Oldest: r.Oldest, After: r.After, Limit: cmp.Or(r.Limit, 100)}
	for _, b := range []struct {
		name, text string
		t          *time.Time
	}{{"since", r.Since, &opts.Since}, {"until", r.Until, &opts.Until}} {
		if b.text == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, b.text)
		if err != nil {
			return nil, badRequest("%s %q: give an RFC 3339 time (flowctl takes dates and durations too, and sends RFC 3339)", b.name, b.text)
		}
		*b.t = t
	}
	p, err := s.n.Runs(opts)
	if err != nil {
		return nil, err
	}
	if r.Paged || r.After != "" {
		return p, nil
	}
	return p.Runs, nil // the bare array, as before pages
}

func (s *Server) runHistory(_ context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	events, err := s.n.History(r.ID)
	if err != nil {
		return nil, err
	}
	return events, nil
}

func (s *Server) runLogs(ctx context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	switch {
	case r.Step != "" && !ident.ValidName(r.Step):
		return nil, badRequest("run.logs: step %q is not a step name: use a-z, 0-9, '-' and '_'", r.Step)
	case r.Item != nil && *r.Item < 0:
		return nil, badRequest("run.logs: item %d: items count from 0", *r.Item)
	case r.Attempt < 0:
		return nil, badRequest("run.logs: attempt %d: attempts count from 1 (0: every attempt)", r.Attempt)
	}
	return s.n.RunLogs(ctx, r.ID, r.Step, r.Item, r.Attempt, r.After)
}

func (s *Server) runVerify(_ context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	v, err := s.n.Verify(r.ID)
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (s *Server) runRetry(ctx context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if r.From == "" && len(r.Inputs) > 0 {
		return nil, badRequest("inputs need a step to retry from (a retry without one resumes from the checkpoints, whose inputs are fixed)")
	}
	if len(r.Reason) > 1000 {
		return nil, badRequest("the reason is %d bytes: at most 1000", len(r.Reason))
	}
	var err error
	if r.From == "" && r.Reason == "" {
		err = s.n.Retry(ctx, r.ID)
	} else {
		err = s.n.RetryFrom(ctx, r.ID, client.RetryOptions{From: r.From, Inputs: r.Inputs, Reason: r.Reason})
	}
	if err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "pending"}, nil
}

func (s *Server) runCancel(ctx context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if len(r.Reason) > 1000 {
		return nil, badRequest("the reason is %d bytes: at most 1000", len(r.Reason))
	}
	if err := s.n.Cancel(ctx, r.ID, r.Reason); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "cancelled"}, nil
}

func (s *Server) runSignal(ctx context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if r.Name == "" {
		return nil, badRequest("a signal name is required")
	}
	if !ident.ValidName(r.Name) {
		return nil, badRequest("signal name %q: use 1-64 of a-z, 0-9, '_' or '-'", r.Name)
	}
	if len(r.Data) > 0 && !json.Valid(r.Data) {
		return nil, badRequest("signal data is not valid JSON")
	}
	opts := client.SignalOptions{Data: r.Data, ID: r.SignalID}
	if r.Workflow == "" {
		if len(r.Inputs) > 0 {
			return nil, badRequest("inputs are for the run a signal-with-start starts: give the workflow (flowctl run signal RUN NAME --start WORKFLOW --input K=V)")
		}
		if err := s.n.Signal(ctx, r.ID, r.Name, opts); err != nil {
			return nil, err
		}
		s.signals.Add(1)
		return client.Signalled{ID: r.ID, Signal: r.Name, SignalID: r.SignalID}, nil
	}
	if !ident.ValidName(r.Workflow) {
		return nil, badRequest("workflow %q: a workflow name is 1-64 of a-z, 0-9, '_' or '-'", r.Workflow)
	}
	opts.Start, opts.Inputs = r.Workflow, r.Inputs
	started, err := s.n.SignalWithStart(ctx, r.ID, r.Name, opts)
	if err != nil {
		return nil, err
	}
	s.signals.Add(1)
	return client.Signalled{ID: r.ID, Signal: r.Name, SignalID: r.SignalID, Started: started}, nil
}

func (s *Server) runApprove(ctx context.Context, r *client.Request) (any, error) {
	return s.decide(ctx, r, true)
}

func (s *Server) runReject(ctx context.Context, r *client.Request) (any, error) {
	return s.decide(ctx, r, false)
}

func (s *Server) decide(ctx context.Context, r *client.Request, approve bool) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	step, err := s.n.Decide(ctx, r.ID, r.Step, approve, r.Comment)
	if err != nil {
		return nil, err
	}
	decision := "reject"
	if approve {
		decision = "approve"
		s.approvals.Add(1)
	} else {
		s.rejections.Add(1)
	}
	return client.Decided{ID: r.ID, Step: step, Decision: decision}, nil
}

func (s *Server) limits(ctx context.Context, _ *client.Request) (any, error) {
	if err := s.n.CatchUp(ctx); err != nil {
		return nil, err
	}
	return s.n.Limits(ctx)
}

func (s *Server) dlqList(ctx context.Context, r *client.Request) (any, error) {
	r.Status = deadLettered
	return s.runList(ctx, r)
}

// deadLettered is the status of the runs in the dead-letter queue.
const deadLettered = "dead_lettered"

func (s *Server) dlqRun(r *client.Request) (client.Run, error) {
	run, err := s.run(r)
	if err != nil {
		return client.Run{}, err
	}
	if run.Status != deadLettered {
		return client.Run{}, &client.Error{Code: client.CodeNotFound, Message: fmt.Sprintf("run %s is not in the dead-letter queue (it is %s)", r.ID, run.Status)}
	}
	return run, nil
}

func (s *Server) dlqShow(_ context.Context, r *client.Request) (any, error) {
	run, err := s.dlqRun(r)
	if err != nil {
		return nil, err
	}
	return run, nil
}

func (s *Server) dlqRetry(ctx context.Context, r *client.Request) (any, error) {
	if _, err := s.dlqRun(r); err != nil {
		return nil, err
	}
	r.From, r.Inputs = "", nil // a dead letter is retried from its checkpoints
	return s.runRetry(ctx, r)
}

// dlqPurge removes a run from the queue for good: it ends cancelled, history kept.
func (s *Server) dlqPurge(ctx context.Context, r *client.Request) (any, error) {
	if _, err := s.dlqRun(r); err != nil {
		return nil, err
	}
	if err := s.n.Purge(ctx, r.ID); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "cancelled"}, nil
}

func (s *Server) cronList(context.Context, *client.Request) (any, error) {
	cron, err := s.n.Schedules()
	if err != nil {
		return nil, err
	}
	return cron, nil
}

func needWorkflow(r *client.Request) error {
	if r.Workflow == "" {
		return badRequest("a workflow name is required")
	}
	if !ident.ValidName(r.Workflow) {
		return badRequest("workflow %q: use 1-64 of a-z, 0-9, '_' or '-'", r.Workflow)
	}
	return nil
}

func (s *Server) cronPause(ctx context.Context, r *client.Request) (any, error) {
	if err := needWorkflow(r); err != nil {
		return nil, err
	}
	if err := s.n.PauseSchedule(ctx, r.Workflow, r.Reason); err != nil {
		return nil, err
	}
	return client.ScheduleChanged{Workflow: r.Workflow, Paused: true, Reason: r.Reason, By: audit.Actor(ctx)}, nil
}

func (s *Server) cronResume(ctx context.Context, r *client.Request) (any, error) {
	if err := needWorkflow(r); err != nil {
		return nil, err
	}
	if err := s.n.ResumeSchedule(ctx, r.Workflow); err != nil {
		return nil, err
	}
	return client.ScheduleChanged{Workflow: r.Workflow, Paused: false, By: audit.Actor(ctx)}, nil
}

// defaultNext is how many fire times cron.next answers without n.
const defaultNext = 5

func (s *Server) cronNext(_ context.Context, r *client.Request) (any, error) {
	if err := needWorkflow(r); err != nil {
		return nil, err
	}
	n := r.N
	if n == 0 {
		n = defaultNext
	}
	if n < 1 || n > 1000 {
		return nil, badRequest("n %d: use 1 to 1000", r.N)
	}
	return s.n.NextTicks(r.Workflow, n)
}

func (s *Server) cronBackfill(ctx context.Context, r *client.Request) (any, error) {
	if err := needWorkflow(r); err != nil {
		return nil, err
	}
	if r.From == "" || r.To == "" {
		return nil, badRequest("a backfill needs from and to (RFC 3339, or a date such as 2026-11-01)")
	}
	if r.Order != "" && r.Order != "oldest" && r.Order != "newest" {
		return nil, badRequest("order %q: use oldest or newest", r.Order)
	}
	if r.MaxParallel < 0 || r.MaxParallel > 10000 {
		return nil, badRequest("max_parallel %d: use 0 (all) to 10000", r.MaxParallel)
	}
	return s.n.Backfill(ctx, r.Workflow, client.BackfillOptions{From: r.From, To: r.To, OnlyMissed: r.OnlyMissed,
		IncludeFailed: r.IncludeFailed, Order: r.Order, MaxParallel: r.MaxParallel, DryRun: r.DryRun, Priority: r.Priority})
}

func (s *Server) drillZombie(ctx context.Context, _ *client.Request) (any, error) {
	d, err := s.n.DrillZombie(ctx)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (s *Server) nodeInfo() client.Node {
	n := s.n.Status()
	if s.sup != nil {
		n.Problems = s.sup.Problems()
	}
	return n
}

// clusterStatus asks every node (a scatter of node requests) and the leader key.
func (s *Server) clusterStatus(ctx context.Context, _ *client.Request) (any, error) {
	st := s.n.Cluster(ctx)
	st.Nodes = []client.Node{}
	nc := s.nc
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(nodeSubject, inbox, nil); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(300 * time.Millisecond) // gather the nodes' answers
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var n client.Node
		if json.Unmarshal(m.Data, &n) == nil {
			st.Nodes = append(st.Nodes, n)
		}
	}
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].ID < st.Nodes[j].ID })
	for i := range st.Members {
		for _, n := range st.Nodes {
			if n.ID == st.Members[i].ID {
				st.Members[i].Live = true
			}
		}
	}
	return st, nil
}

func (s *Server) clusterForget(ctx context.Context, r *client.Request) (any, error) {
	if !ident.ValidID(r.Name) {
		return nil, badRequest("cluster.forget needs the node's ID (name): %s", ident.IDRule)
	}
	return nil, s.n.ForgetNode(ctx, r.Name)
}

func (s *Server) clusterHold(ctx context.Context, r *client.Request) (any, error) {
	if len(r.Reason) > 1000 {
		return nil, badRequest("the reason is %d bytes: at most 1000", len(r.Reason))
	}
	return nil, s.n.HoldClusterVersion(ctx, true, r.Reason)
}

func (s *Server) clusterUnhold(ctx context.Context, _ *client.Request) (any, error) {
	return nil, s.n.HoldClusterVersion(ctx, false, "")
}

// clusterRepair mends flow's streams (admin: it ends every lease and the term held).
func (s *Server) clusterRepair(ctx context.Context, r *client.Request) (any, error) {
	return s.n.RepairStreams(ctx, r.DryRun)
}

func (s *Server) logDump(ctx context.Context, r *client.Request) (any, error) {
	var from uint64
	if r.From != "" {
		n, err := strconv.ParseUint(r.From, 10, 64)
		if err != nil || n == 0 {
			return nil, badRequest("log.dump: from %q is not a log sequence (a whole number from 1)", r.From)
		}
		from = n
	}
	if r.ID != "" && !ident.ValidID(r.ID) {
		return nil, badRequest("log.dump: run ID %q: %s", r.ID, ident.IDRule)
	}
	if r.Limit < 0 || r.Limit > 1000 {
		return nil, badRequest("log.dump: limit %d: use 1 to 1000 (0: 200)", r.Limit)
	}
	return s.n.DumpLog(ctx, from, r.ID, r.Limit)
}

func (s *Server) clusterSnapshot(ctx context.Context, _ *client.Request) (any, error) {
	snap, err := s.n.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return snap, nil
}
