package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/supervise"
	"github.com/flowrun/flow/workflow"
)

// Subject is the prefix of every operation: flow.v1.<op>.
const Subject = "flow.v1"

// nodeSubject is answered by every node (cluster status gathers the answers).
const nodeSubject = "flow.v1.node"

// Server serves the API for one engine.
type Server struct {
	e *engine.Engine
	// svc and node are the current registration (under mu): the "api" part registers
	// them again when its probe goes unanswered.
	svc       micro.Service
	node      *nats.Subscription
	stopServe context.CancelFunc
	served    <-chan struct{} // closed when the "api" part has ended
	// Requests are handled each on a goroutine of its own (an endpoint's subscription
	// delivers one message at a time: a slow or waiting handler would hold up the rest),
	// at most maxConcurrent at once, all ended by Stop.
	waitCtx  context.Context
	stopWait context.CancelFunc
	waits    sync.WaitGroup
	slots    chan struct{} // requests at once
	// waiting bounds the run.wait requests on their own, so that waits (up to a minute
	// each) never take the slots of the other requests.
	waiting chan struct{}
	mu      sync.Mutex
	stopped bool // under mu: no request starts after Stop began waiting
}

// maxConcurrent bounds the requests one node handles at once, maxWaits the run.wait
// requests; more wait in NATS.
const (
	maxConcurrent = 256
	maxWaits      = 1024
)

type handler func(ctx context.Context, r *Req) (any, error)

// apiError is an error with a code for the client.
type apiError struct {
	code, msg string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{CodeBadRequest, fmt.Sprintf(format, args...)}
}

// Serve registers the "flow" micro service on the engine's connection. The service is
// a supervised part of the engine ("api"): it is alive while a ping through the server
// to its own endpoint is answered, and registered again when it is not.
func Serve(e *engine.Engine) (*Server, error) {
	return serveWith(e, make(chan struct{}, maxConcurrent), make(chan struct{}, maxWaits))
}

// serveWith is Serve with the request and run.wait slots given (tests size them).
func serveWith(e *engine.Engine, slots, waiting chan struct{}) (*Server, error) {
	s := &Server{e: e, slots: slots, waiting: waiting}
	s.waitCtx, s.stopWait = context.WithCancel(context.Background())
	// The first registration is made here, so that a node that cannot serve fails to start.
	if err := s.register(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopServe = cancel
	first := true
	s.served = e.Supervisor().Go(ctx, supervise.Part{Name: "api", Silence: e.Silence(),
		Run: func(ctx context.Context, alive func()) error {
			if !first {
				if err := waitConnected(ctx, e.Conn()); err != nil {
					return err
				}
				if err := s.register(); err != nil {
					return err
				}
			}
			first = false
			defer s.unregister()
			return s.probe(ctx, alive)
		}})
	return s, nil
}

// register adds the service's endpoints and the node subscription.
func (s *Server) register() error {
	nc := s.e.Conn()
	svc, err := micro.AddService(nc, micro.Config{Name: "flow", Version: "1.0.0",
		Description: "flow workflow engine API"})
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	ops := map[string]handler{
		"workflow.apply": s.workflowApply, "workflow.validate": s.workflowValidate,
		"workflow.list": s.workflowList, "workflow.show": s.workflowShow,
		"run.start": s.runStart, "run.get": s.runGet, "run.list": s.runList, "run.history": s.runHistory,
		"run.verify": s.runVerify, "run.retry": s.runRetry, "run.cancel": s.runCancel,
		"dlq.list": s.dlqList, "dlq.show": s.dlqShow, "dlq.retry": s.dlqRetry, "dlq.purge": s.dlqPurge,
		"cron.list": s.cronList, "cluster.status": s.clusterStatus, "drill.zombie": s.drillZombie,
	}
	ops["run.wait"] = s.runWait
	for op, h := range ops {
		name := strings.ReplaceAll(op, ".", "-")
		slots := s.slots
		if op == "run.wait" {
			slots = s.waiting
		}
		if err := svc.AddEndpoint(name, s.async(s.wrap(h), slots), micro.WithEndpointSubject(Subject+"."+op),
			micro.WithEndpointQueueGroup("flow-api")); err != nil {
			stopService(nc, svc, nil)
			return fmt.Errorf("api: endpoint %s: %w", op, err)
		}
	}
	node, err := nc.Subscribe(nodeSubject, func(m *nats.Msg) {
		b, _ := json.Marshal(s.nodeInfo())
		_ = m.Respond(b)
	})
	if err != nil {
		stopService(nc, svc, nil)
		return err
	}
	// A round trip: the server has every subscription before a client can ask.
	if err := nc.Flush(); err != nil {
		stopService(nc, svc, node)
		return fmt.Errorf("api: %w", err)
	}
	s.mu.Lock()
	s.svc, s.node = svc, node
	s.mu.Unlock()
	return nil
}

func (s *Server) unregister() {
	s.mu.Lock()
	svc, node := s.svc, s.node
	s.svc, s.node = nil, nil
	s.mu.Unlock()
	if svc != nil {
		stopService(s.e.Conn(), svc, node)
	}
}

// stopService stops a registration, once the connection is up (for at most
// stopWaitLimit). A micro service stops by draining its subscriptions, and nats.go
// keeps a draining subscription through a reconnect, sends it to the new server, then
// drops it on the client without unsubscribing: the server goes on giving it requests
// of the queue group that nobody answers (measured: 9 of 20 cluster.status requests
// lost after a healed partition). Draining while connected does not leave one.
func stopService(nc *nats.Conn, svc micro.Service, node *nats.Subscription) {
	ctx, cancel := context.WithTimeout(context.Background(), stopWaitLimit)
	defer cancel()
	_ = waitConnected(ctx, nc)
	if node != nil {
		_ = node.Unsubscribe()
	}
	_ = svc.Stop()
	// A round trip: once it is back, the server has taken the unsubscriptions, and a
	// request sent after Stop goes to another node (or to none), not to this one.
	_ = nc.FlushTimeout(2 * time.Second)
}

// stopWaitLimit bounds how long a registration waits for the connection to stop.
const stopWaitLimit = 10 * time.Second

// waitConnected returns once nc is connected, or closed (nothing then to wait for),
// or ctx ends.
func waitConnected(ctx context.Context, nc *nats.Conn) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !nc.IsConnected() && !nc.IsClosed() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// probe pings this node's own service through the server until ctx ends: an answer
// shows the server still delivers its requests to it.
func (s *Server) probe(ctx context.Context, alive func()) error {
	s.mu.Lock()
	subject, err := micro.ControlSubject(micro.PingVerb, s.svc.Info().Name, s.svc.Info().ID)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	every := max(s.e.Silence()/4, 10*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		if _, err := s.e.Conn().RequestWithContext(pctx, subject, nil); err == nil {
			alive()
		}
		cancel()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Stop stops serving (run.wait requests in flight are answered with the run as it is).
func (s *Server) Stop() {
	s.stopServe()
	<-s.served
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.stopWait()
	s.waits.Wait()
}

// async runs h on a goroutine of its own, owned by the server, once one of slots is free.
func (s *Server) async(h micro.HandlerFunc, slots chan struct{}) micro.HandlerFunc {
	return func(req micro.Request) {
		slots <- struct{}{}
		s.mu.Lock()
		if s.stopped { // a message delivered while the subscription was going away
			s.mu.Unlock()
			<-slots
			s.fail(req, CodeInternal, "this node is stopping: try again (another node answers)")
			return
		}
		s.waits.Add(1)
		s.mu.Unlock()
		go func() {
			defer func() { <-slots; s.waits.Done() }()
			h(req)
		}()
	}
}

// maxWait bounds one run.wait (below the 2m every request gets); a client wanting
// longer asks again.
const maxWait = time.Minute

// runWait answers with the run once it has ended, or as it is when the wait (default
// 30s) passes or the server stops: the client looks at the status and may ask again.
func (s *Server) runWait(ctx context.Context, r *Req) (any, error) {
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

func (s *Server) wrap(h handler) micro.HandlerFunc {
	return func(req micro.Request) {
		var r Req
		dec := json.NewDecoder(strings.NewReader(string(req.Data())))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			s.fail(req, CodeBadRequest, "the request is not valid JSON for this operation: "+err.Error())
			return
		}
		if r.V != Version {
			s.fail(req, CodeBadRequest, fmt.Sprintf("request version %d; this server speaks version %d (upgrade flowctl or flowd)", r.V, Version))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Answer from a state that has caught up with the log as it is now, so that
		// whichever node answers, a client reads what it (or anyone) wrote before.
		if err := s.catchUp(ctx); err != nil {
			s.fail(req, CodeInternal, "this node cannot catch up with the log: "+err.Error())
			return
		}
		out, err := h(ctx, &r)
		if err != nil {
			code, msg := classify(err)
			s.fail(req, code, msg)
			return
		}
		data, err := json.Marshal(out)
		if err != nil {
			s.fail(req, CodeInternal, "the answer does not encode: "+err.Error())
			return
		}
		s.answer(req, &nats.Msg{Data: data})
	}
}

// Answers go out on the connection, not through micro.Request's methods: requests are
// answered on goroutines of their own after micro's handler has returned, and micro
// reads the request's error field for its statistics right then, while Request.Error
// would write it (a data race, seen under -race by TestErrorAnswersDoNotRaceWithMicro).
// The headers are micro's, so every client reads them alike; micro's own statistics
// count these requests but not their errors (flow's metrics do not use them).
func (s *Server) answer(req micro.Request, m *nats.Msg) {
	m.Subject = req.Reply()
	if m.Subject == "" {
		return // a request nobody waits for
	}
	_ = s.e.Conn().PublishMsg(m)
}

func (s *Server) fail(req micro.Request, code, msg string) {
	h := nats.Header{}
	h.Set(micro.ErrorHeader, msg)
	h.Set(micro.ErrorCodeHeader, code)
	s.answer(req, &nats.Msg{Header: h})
}

func (s *Server) catchUp(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	last, err := s.e.Log().LastSeq(cctx)
	if err != nil {
		return err
	}
	return s.e.Log().WaitApplied(cctx, last)
}

func classify(err error) (string, string) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae.code, ae.msg
	case errors.Is(err, checkpoint.ErrNotFound):
		var nf *checkpoint.NotFoundError
		if errors.As(err, &nf) {
			return CodeNotFound, nf.Error() // the thing, without the layers it passed through
		}
		return CodeNotFound, err.Error()
	case errors.Is(err, engine.ErrBadInput), errors.Is(err, checkpoint.ErrInvalidEntry):
		return CodeBadRequest, strings.TrimPrefix(err.Error(), "engine: bad input: ")
	case errors.Is(err, checkpoint.ErrConflict), errors.Is(err, checkpoint.ErrRunExists):
		return CodeConflict, err.Error()
	}
	return CodeInternal, err.Error()
}

func needID(r *Req) error {
	if r.ID == "" {
		return badRequest("a run ID is required")
	}
	if !checkpoint.ValidID(r.ID) {
		return badRequest("%q is not a run ID: %s", r.ID, checkpoint.IDRule)
	}
	return nil
}

func (s *Server) workflowValidate(_ context.Context, r *Req) (any, error) {
	w, err := s.e.ValidateWorkflow(r.File, []byte(r.YAML))
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return toWorkflow(w, false), nil
}

func (s *Server) workflowApply(ctx context.Context, r *Req) (any, error) {
	if r.YAML == "" {
		return nil, badRequest("the workflow file is empty")
	}
	w, err := s.e.ApplyWorkflow(ctx, r.File, []byte(r.YAML))
	if err != nil {
		return nil, err
	}
	return toWorkflow(w, false), nil
}

func toWorkflow(w *workflow.Workflow, source bool) Workflow {
	out := Workflow{Name: w.Name, Version: w.Version, Description: w.Description, Steps: len(w.Steps)}
	if w.Schedule != nil {
		out.Schedule = w.Schedule.Cron + " " + w.Schedule.Timezone
	}
	if source {
		out.Source = w.Source
	}
	return out
}

func (s *Server) workflowList(context.Context, *Req) (any, error) {
	vs, err := s.e.Store().Workflows()
	if err != nil {
		return nil, err
	}
	out := []Workflow{}
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

func (s *Server) workflowShow(_ context.Context, r *Req) (any, error) {
	if r.Name == "" {
		return nil, badRequest("a workflow name is required")
	}
	w, err := s.e.Workflow(r.Name, 0)
	if err != nil {
		return nil, err
	}
	return toWorkflow(w, true), nil
}

func (s *Server) runStart(ctx context.Context, r *Req) (any, error) {
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

func (s *Server) view(r *Req) (*checkpoint.RunView, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	return s.e.Run(r.ID)
}

func (s *Server) runGet(_ context.Context, r *Req) (any, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	return FromRun(&v.Run, v), nil
}

func (s *Server) runList(_ context.Context, r *Req) (any, error) {
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
	out := []Run{}
	for i := range runs {
		out = append(out, FromRun(&runs[i], nil))
	}
	return out, nil
}

func (s *Server) runHistory(_ context.Context, r *Req) (any, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	out := []Event{}
	for _, e := range v.Events {
		out = append(out, Event{Seq: e.Seq, Kind: string(e.Kind), Epoch: e.Epoch, Term: e.Term, Owner: e.Owner,
			Step: e.Step, Item: e.Item, Outcome: e.Outcome, Detail: e.Detail, At: tsNano(e.At)})
	}
	return out, nil
}

func (s *Server) runVerify(_ context.Context, r *Req) (any, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	return Verify(v), nil
}

func (s *Server) runRetry(ctx context.Context, r *Req) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if err := s.e.Retry(ctx, r.ID); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "pending"}, nil
}

func (s *Server) runCancel(ctx context.Context, r *Req) (any, error) {
	if err := needID(r); err != nil {
		return nil, err
	}
	if err := s.e.Cancel(ctx, r.ID, ""); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "cancelled"}, nil
}

func (s *Server) dlqList(ctx context.Context, r *Req) (any, error) {
	r.Status = string(checkpoint.StatusDeadLettered)
	return s.runList(ctx, r)
}

func (s *Server) dlqRun(r *Req) (*checkpoint.RunView, error) {
	v, err := s.view(r)
	if err != nil {
		return nil, err
	}
	if v.Run.Status != checkpoint.StatusDeadLettered {
		return nil, &apiError{CodeNotFound, fmt.Sprintf("run %s is not in the dead-letter queue (it is %s)", r.ID, v.Run.Status)}
	}
	return v, nil
}

func (s *Server) dlqShow(_ context.Context, r *Req) (any, error) {
	v, err := s.dlqRun(r)
	if err != nil {
		return nil, err
	}
	return FromRun(&v.Run, v), nil
}

func (s *Server) dlqRetry(ctx context.Context, r *Req) (any, error) {
	if _, err := s.dlqRun(r); err != nil {
		return nil, err
	}
	return s.runRetry(ctx, r)
}

// dlqPurge removes a run from the queue for good: it ends cancelled, history kept.
func (s *Server) dlqPurge(ctx context.Context, r *Req) (any, error) {
	if _, err := s.dlqRun(r); err != nil {
		return nil, err
	}
	if err := s.e.Purge(ctx, r.ID); err != nil {
		return nil, err
	}
	return map[string]string{"id": r.ID, "status": "cancelled"}, nil
}

func (s *Server) cronList(context.Context, *Req) (any, error) {
	vs, err := s.e.Store().Workflows()
	if err != nil {
		return nil, err
	}
	out := []CronEntry{}
	for _, v := range vs {
		w, err := s.e.Workflow(v.Name, v.Version)
		if err != nil || w.Schedule == nil {
			continue
		}
		c := CronEntry{Workflow: w.Name, Cron: w.Schedule.Cron, Timezone: w.Schedule.Timezone, Overlap: w.Schedule.Overlap,
			Catchup: w.Schedule.Catchup, Next: []string{}, Last: []Tick{}}
		if sched, err := workflow.CronParser.Parse(w.Schedule.Cron); err == nil {
			loc, _ := time.LoadLocation(w.Schedule.Timezone)
			t := time.Now().In(loc)
			for i := 0; i < 3; i++ {
				t = sched.Next(t)
				c.Next = append(c.Next, t.Format(time.RFC3339))
			}
		}
		ticks, _ := s.e.Store().Ticks(w.Name)
		for i := max(0, len(ticks)-5); i < len(ticks); i++ {
			c.Last = append(c.Last, Tick{At: ts(ticks[i].At), Outcome: ticks[i].Outcome, RunID: ticks[i].RunID})
		}
		out = append(out, c)
	}
	return out, nil
}

// Drill is the evidence of a zombie drill.
type Drill struct {
	Run    Run          `json:"run"`
	Verify Verification `json:"verify"`
}

func (s *Server) drillZombie(ctx context.Context, _ *Req) (any, error) {
	v, err := s.e.DrillZombie(ctx)
	if err != nil {
		return nil, err
	}
	return Drill{Run: FromRun(&v.Run, v), Verify: Verify(v)}, nil
}

func (s *Server) nodeInfo() Node {
	return Node{ID: s.e.NodeID(), Applied: s.e.Store().Applied(), Leader: s.e.Leading() != nil}
}

// clusterStatus asks every node (a scatter of node requests) and the leader key.
func (s *Server) clusterStatus(ctx context.Context, _ *Req) (any, error) {
	st := ClusterStatus{Nodes: []Node{}}
	if l, err := s.e.Elector().Leader(ctx); err == nil {
		st.Leader, st.Term = l.Node, l.Term
	}
	nc := s.e.Conn()
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
		var n Node
		if json.Unmarshal(m.Data, &n) == nil {
			st.Nodes = append(st.Nodes, n)
		}
	}
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].ID < st.Nodes[j].ID })
	return st, nil
}
