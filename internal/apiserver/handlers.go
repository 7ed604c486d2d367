package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/ident"
	"github.com/flowrun/flow/workflow"
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
	if _, err := s.view(r); err != nil { // unknown runs fail now, not after the wait
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	stop := context.AfterFunc(s.waitCtx, cancel)
	defer stop()
	if _, err := s.e.WaitRun(wctx, r.ID); err != nil && wctx.Err() == nil {
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
	w, err := s.e.ValidateWorkflow(r.File, []byte(r.YAML))
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return toWorkflow(w, false), nil
}

func (s *Server) workflowApply(ctx context.Context, r *client.Request) (any, error) {
	if r.YAML == "" {
		return nil, badRequest("the workflow file is empty")
	}
	w, err := s.e.ApplyWorkflow(ctx, r.File, []byte(r.YAML))
	if err != nil {
		return nil, err
	}
	return toWorkflow(w, false), nil
}

func toWorkflow(w *workflow.Workflow, source bool) client.Workflow {
	out := client.Workflow{Name: w.Name, Version: w.Version, Description: w.Description, Steps: len(w.Steps)}
	if w.Schedule != nil {
		out.Schedule = w.Schedule.Cron + " " + w.Schedule.Timezone
	}
	if source {
		out.Source = w.Source
	}
	return out
}

func (s *Server) workflowList(context.Context, *client.Request) (any, error) {
	vs, err := s.e.Workflows()
	if err != nil {
		return nil, err
	}
	out := []client.Workflow{}
	for _, v := range vs {
		w, err := s.e.Workflow(v.Name, v.Version)
		if err != nil {
			return nil, err
		}
		ww := toWorkflow(w, false)
		ww.AppliedAt = ts(v.At)
		out = append(out, ww)
	}
	return out, nil
}

func (s *Server) workflowShow(_ context.Context, r *client.Request) (any, error) {
	if r.Name == "" {
		return nil, badRequest("a workflow name is required")
	}
	w, err := s.e.Workflow(r.Name, 0)
	if err != nil {
		return nil, err
	}
	return toWorkflow(w, true), nil
}

func (s *Server) runStart(ctx context.Context, r *client.Request) (any, error) {
	if r.Workflow == "" {
		return nil, badRequest("a workflow name is required")
	}
	inputs := map[string]any{}
	for k, v := range r.Inputs {
		inputs[k] = v
	}
	id, err := s.e.StartRun(ctx, r.Workflow, inputs, engine.RunOptions{ID: r.ID})
	if err != nil {
		return nil, err
	}
	return map[string]string{"id": id}, nil
}

func (s *Server) view(r *client.Request) (*checkpoint.RunView, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	return s.e.Run(r.ID)
}

func (s *Server) runGet(_ context.Context, r *client.Request) (any, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	return runJSON(&v.Run, v), nil
}

func (s *Server) runList(_ context.Context, r *client.Request) (any, error) {
	st := checkpoint.RunStatus(r.Status)
	if st != "" && !checkpoint.ValidRunStatus(st) {
		return nil, badRequest("status %q: use pending, running, succeeded, failed, cancelled or dead_lettered", r.Status)
	}
	if r.Limit < 0 || r.Limit > 10000 {
		return nil, badRequest("limit %d: use 1 to 10000", r.Limit)
	}
	runs, _, err := s.e.ListRuns(checkpoint.ListOptions{Workflow: r.Workflow, Status: st, After: r.After, Limit: r.Limit})
	if err != nil {
		return nil, err
	}
	out := []client.Run{}
	for i := range runs {
		out = append(out, runJSON(&runs[i], nil))
	}
	return out, nil
}

func (s *Server) runHistory(_ context.Context, r *client.Request) (any, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	out := []client.Event{}
	for _, e := range v.Events {
		out = append(out, client.Event{Seq: e.Seq, Kind: string(e.Kind), Epoch: e.Epoch, Term: e.Term, Owner: e.Owner, Actor: e.Actor,
			Step: e.Step, Item: e.Item, Outcome: e.Outcome, Detail: e.Detail, At: tsNano(e.At)})
	}
	return out, nil
}

func (s *Server) runVerify(_ context.Context, r *client.Request) (any, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	return verify(v), nil
}

func (s *Server) runRetry(ctx context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if err := s.e.Retry(ctx, r.ID); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "pending"}, nil
}

func (s *Server) runCancel(ctx context.Context, r *client.Request) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if err := s.e.Cancel(ctx, r.ID, ""); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "cancelled"}, nil
}

func (s *Server) dlqList(ctx context.Context, r *client.Request) (any, error) {
	r.Status = string(checkpoint.StatusDeadLettered)
	return s.runList(ctx, r)
}

func (s *Server) dlqRun(r *client.Request) (*checkpoint.RunView, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	if v.Run.Status != checkpoint.StatusDeadLettered {
		return nil, &apiError{client.CodeNotFound, fmt.Sprintf("run %s is not in the dead-letter queue (it is %s)", r.ID, v.Run.Status)}
	}
	return v, nil
}

func (s *Server) dlqShow(_ context.Context, r *client.Request) (any, error) {
	v, err := s.dlqRun(r)
	if err != nil {
		return nil, err
	}
	return runJSON(&v.Run, v), nil
}

func (s *Server) dlqRetry(ctx context.Context, r *client.Request) (any, error) {
	if _, err := s.dlqRun(r); err != nil {
		return nil, err
	}
	return s.runRetry(ctx, r)
}

// dlqPurge removes a run from the queue for good: it ends cancelled, history kept.
func (s *Server) dlqPurge(ctx context.Context, r *client.Request) (any, error) {
	if _, err := s.dlqRun(r); err != nil {
		return nil, err
	}
	if err := s.e.Purge(ctx, r.ID); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "cancelled"}, nil
}

func (s *Server) cronList(context.Context, *client.Request) (any, error) {
	vs, err := s.e.Workflows()
	if err != nil {
		return nil, err
	}
	out := []client.CronEntry{}
	for _, v := range vs {
		w, err := s.e.Workflow(v.Name, v.Version)
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
		ticks, _ := s.e.Ticks(w.Name)
		for i := max(0, len(ticks)-5); i < len(ticks); i++ {
			c.Last = append(c.Last, client.Tick{At: ts(ticks[i].At), Outcome: ticks[i].Outcome, RunID: ticks[i].RunID, Term: ticks[i].Term, Owner: ticks[i].Owner})
		}
		out = append(out, c)
	}
	return out, nil
}

func (s *Server) drillZombie(ctx context.Context, _ *client.Request) (any, error) {
	v, err := s.e.DrillZombie(ctx)
	if err != nil {
		return nil, err
	}
	return client.Drill{Run: runJSON(&v.Run, v), Verify: verify(v)}, nil
}

func (s *Server) nodeInfo() client.Node {
	n := client.Node{ID: s.e.NodeID(), Applied: s.e.Applied(), Leader: s.e.IsLeader(), LeasesDegraded: s.e.LeasesDegraded()}
	if s.sup != nil {
		n.Problems = s.sup.Problems()
	}
	return n
}

// clusterStatus asks every node (a scatter of node requests) and the leader key.
func (s *Server) clusterStatus(ctx context.Context, _ *client.Request) (any, error) {
	st := client.ClusterStatus{Nodes: []client.Node{}}
	if l, err := s.e.Leader(ctx); err == nil {
		st.Leader, st.Term = l.Node, l.Term
	}
	if first, last, snap, err := s.e.LogBounds(ctx); err == nil {
		st.FirstSeq, st.LastSeq, st.SnapshotSeq = first, last, snap
	}
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
	return st, nil
}

func (s *Server) clusterSnapshot(ctx context.Context, _ *client.Request) (any, error) {
	snap, err := s.e.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return client.Snapshot{Name: snap.Name, Seq: snap.Seq, Bytes: snap.Size}, nil
}
