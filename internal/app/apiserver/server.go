package apiserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/resend"
	"github.com/flowrun/flow/internal/base/supervise"
)

// nodeSubject is answered by every node (cluster status gathers the answers).
const nodeSubject = client.Subject + ".node"

// Server serves the API for one node.
type Server struct {
	n       Node
	nc      *nats.Conn
	silence time.Duration
	sup     *supervise.Supervisor // whose Problems the node's answer carries
	// svc and node are the current registration (under mu): the "api" part registers
	// them again when its probe goes unanswered.
	svc       micro.Service
	node      *nats.Subscription
	stopServe context.CancelFunc
	served    <-chan struct{} // closed when the "api" part has ended
	// closing ends when Stop begins: a registration's stop then waits no longer for the
	// connection (stopRegistration).
	closing  context.Context
	closeNow context.CancelFunc
	// stops counts registrations made, and their stops begun and ended (tests wait on them).
	stops struct{ registrations, begun, done atomic.Int64 }
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
	// perUser bounds what one user (the server's word: Nats-Request-Info) holds of the
	// slots and of the waiting slots, so that one user cannot take them all and starve
	// the others: a request beyond it is refused at once (too_many_requests) rather than
	// queued behind the node's. Requests that name no user (flow's own account, a server
	// without accounts) have only the node's bounds.
	perUser perUserLimits
	mu      sync.Mutex
	stopped bool // under mu: no request starts after Stop began waiting
	// large bounds each user's bytes of large requests, before they are decoded (large.go).
	large largeLimiter
	// held counts each user's requests in the slots (under mu), by kind and user.
	held map[heldKey]int
	// The signals, approvals and rejections this node's API wrote (Counts).
	signals, approvals, rejections atomic.Int64
}

// Counts are what this node's API wrote of people's entries: signals, approvals and
// rejections (flowd's flow_signals_total and flow_approvals_total).
type Counts struct {
	Signals, Approvals, Rejections int64
}

// Counts reads the counters of the signals, approvals and rejections this node's API
// wrote (through NATS or Do).
func (s *Server) Counts() Counts {
	return Counts{Signals: s.signals.Load(), Approvals: s.approvals.Load(), Rejections: s.rejections.Load()}
}

// maxConcurrent bounds the requests one node handles at once, maxWaits the run.wait
// requests; more wait in NATS. maxPerUser and maxWaitsPerUser are one user's share of
// them (perUserLimits).
const (
	maxConcurrent   = 256
	maxWaits        = 1024
	maxPerUser      = maxConcurrent / 2
	maxWaitsPerUser = 64
)

// perUserLimits are one user's shares: of the request slots and of the waiting slots
// (0: no limit of one's own, the negative control of the tests).
type perUserLimits struct {
	requests, waits int
}

// heldKey is a kind of slot (a request, a wait) and a user.
type heldKey struct {
	wait bool
	user string
}

type handler func(ctx context.Context, r *client.Request) (any, error)

// badRequest is a request the server refuses before asking the node.
func badRequest(format string, args ...any) error {
	return &client.Error{Code: client.CodeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// Config is what Serve needs.
type Config struct {
	Node Node // required: the node the API answers for (engine.Engine.API)
	// Conn, Supervisor and Silence default to the Node's Hosting; set, they replace it.
	// Conn is the connection the service is registered on.
	Conn *nats.Conn
	// Supervisor keeps the service alive (a part named "api").
	Supervisor *supervise.Supervisor
	// Silence is how long the service may go without answering its own ping before it
	// is registered again (default 4s).
	Silence time.Duration
}

// firstStopWait bounds how long a first registration that failed waits for the
// connection before it stops what it made: Serve then fails, and so does the node.
const firstStopWait = 10 * time.Second

// defaultSilence is Config.Silence's default.
const defaultSilence = 4 * time.Second

// Serve registers the "flow" micro service on cfg.Conn. The service is a supervised
// part ("api"): it is alive while a ping through the server to its own endpoint is
// answered, and registered again when it is not.
func Serve(cfg Config) (*Server, error) {
	return serveWith(cfg, make(chan struct{}, maxConcurrent), make(chan struct{}, maxWaits), perUserLimits{maxPerUser, maxWaitsPerUser})
}

// serveWith is Serve with the request and run.wait slots and one user's shares of them
// given (tests size them).
func serveWith(cfg Config, slots, waiting chan struct{}, perUser perUserLimits) (*Server, error) {
	if cfg.Node == nil {
		return nil, errors.New("apiserver: Config needs a Node")
	}
	hostConn, hostSup, hostSilence := cfg.Node.Hosting()
	cfg.Conn = cmp.Or(cfg.Conn, hostConn)
	cfg.Supervisor = cmp.Or(cfg.Supervisor, hostSup)
	cfg.Silence = cmp.Or(cfg.Silence, hostSilence)
	if cfg.Conn == nil {
		return nil, errors.New("apiserver: the Node hosts on no connection and Config gives none")
	}
	if cfg.Silence <= 0 {
		cfg.Silence = defaultSilence
	}
	sup := cfg.Supervisor
	if sup == nil {
		sup = supervise.New()
	}
	s := &Server{n: cfg.Node, nc: cfg.Conn, silence: cfg.Silence, sup: sup, slots: slots, waiting: waiting, perUser: perUser, held: map[heldKey]int{}}
	s.waitCtx, s.stopWait = context.WithCancel(context.Background())
	s.closing, s.closeNow = context.WithCancel(context.Background())
	// The first registration is made here, so that a node that cannot serve fails to start.
	firstWait, cancelFirst := context.WithTimeout(s.closing, firstStopWait)
	err := s.register(firstWait)
	cancelFirst()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopServe = cancel
	first := true
	s.served = sup.Go(ctx, supervise.Part{Name: "api", Silence: s.silence,
		Run: func(ctx context.Context, alive func()) error {
			if !first {
				if err := waitConnected(ctx, s.nc); err != nil {
					return err
				}
				if err := s.register(s.closing); err != nil {
					return err
				}
			}
			first = false
			defer s.unregister()
			return s.probe(ctx, alive)
		}})
	return s, nil
}

// handlers are the API's operations.
func (s *Server) handlers() map[string]handler {
	h := s.allHandlers()
	if !s.n.CanRepair() {
		// Served only where it can be done: a request then reaches such a node (or
		// none answers, and flowctl says why).
		delete(h, "cluster.repair")
	}
	return h
}

func (s *Server) allHandlers() map[string]handler {
	return map[string]handler{
		"workflow.apply": s.workflowApply, "workflow.validate": s.workflowValidate,
		"workflow.list": s.workflowList, "workflow.show": s.workflowShow,
		"run.start": s.runStart, "run.get": s.runGet, "run.list": s.runList, "run.history": s.runHistory, "run.logs": s.runLogs,
		"run.verify": s.runVerify, "run.retry": s.runRetry, "run.cancel": s.runCancel, "run.wait": s.runWait,
		"run.signal": s.runSignal, "run.approve": s.runApprove, "run.reject": s.runReject,
		"dlq.list": s.dlqList, "dlq.show": s.dlqShow, "dlq.retry": s.dlqRetry, "dlq.purge": s.dlqPurge,
		"limits": s.limits, "cron.list": s.cronList, "cron.next": s.cronNext, "cron.pause": s.cronPause, "cron.resume": s.cronResume, "cron.backfill": s.cronBackfill,
		"cluster.status": s.clusterStatus, "cluster.snapshot": s.clusterSnapshot, "drill.zombie": s.drillZombie,
		"cluster.forget": s.clusterForget, "cluster.hold": s.clusterHold, "cluster.unhold": s.clusterUnhold, "log.dump": s.logDump,
		"cluster.repair": s.clusterRepair,
	}
}

// Do runs an operation in process, as a request on its subject would (after catching
// up with the log), for this node's own callers (the web UI): the same results, and a
// failure as a *client.Error with the same code and message. ctx carries the actor
// (internal/base/audit). Authorization is the caller's: NATS does not see these calls.
func (s *Server) Do(ctx context.Context, op string, req client.Request) (any, error) {
	h, ok := s.handlers()[op]
	if !ok {
		return nil, &client.Error{Code: client.CodeBadRequest, Message: "no operation " + op}
	}
	return s.call(ctx, h, &req)
}

// call answers a request from a state that has caught up with the log as it is now, so
// that whichever node answers, a client reads what it (or anyone) wrote before; a
// failure is a *client.Error with the code and message the client gets.
func (s *Server) call(ctx context.Context, h handler, r *client.Request) (any, error) {
	if err := s.caughtUp(ctx); err != nil {
		return nil, err
	}
	out, err := h(ctx, r)
	if err != nil {
		return nil, clientError(err)
	}
	return out, nil
}

func (s *Server) caughtUp(ctx context.Context) error {
	if err := s.n.CatchUp(ctx); err != nil {
		return &client.Error{Code: client.CodeInternal, Message: "this node cannot catch up with the log: " + err.Error()}
	}
	return nil
}

// clientError is err as the client gets it.
func clientError(err error) error {
	code, msg := classify(err)
	return &client.Error{Code: code, Message: msg}
}

// RunsPage is a page of runs newest first (run.list's selection), and the next page's
// cursor ("" at the end).
func (s *Server) RunsPage(ctx context.Context, opts client.ListOptions) (client.RunPage, error) {
	if err := s.caughtUp(ctx); err != nil {
		return client.RunPage{}, err
	}
	p, err := s.n.Runs(opts)
	if err != nil {
		return client.RunPage{}, clientError(err)
	}
	return p, nil
}

// RunsWithIDPrefix are the runs whose ID starts with prefix (the UI's search).
func (s *Server) RunsWithIDPrefix(ctx context.Context, prefix string, limit int) ([]client.Run, error) {
	if err := s.caughtUp(ctx); err != nil {
		return nil, err
	}
	runs, err := s.n.RunsWithIDPrefix(prefix, limit)
	if err != nil {
		return nil, clientError(err)
	}
	return runs, nil
}

// StepNeeds are the steps of a workflow version in their order, each with the steps it
// needs (the run page's graph).
func (s *Server) StepNeeds(name string, version int) ([]StepNeeds, error) {
	out := []StepNeeds{}
	err := s.n.WorkflowSteps(name, version, func(name, uses string, needs []string, foreach bool) {
		out = append(out, StepNeeds{Name: name, Needs: needs, Uses: uses, Foreach: foreach})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Versions are every version of a workflow, oldest first, each with its YAML.
func (s *Server) Versions(name string) ([]client.Workflow, error) {
	latest, err := s.n.Workflow(name, 0)
	if err != nil {
		return nil, err
	}
	var out []client.Workflow
	for v := 1; v <= latest.Version; v++ {
		w, err := s.n.Workflow(name, v)
		if err != nil {
			continue // a version retired or never stored: skip it
		}
		out = append(out, w)
	}
	return out, nil
}

// Ticks are a workflow's newest n recorded fire times, newest first (the UI's cron page;
// cron.list carries the last five).
func (s *Server) Ticks(name string, n int) ([]client.Tick, error) {
	ticks, err := s.n.Ticks(name)
	if err != nil {
		return nil, err
	}
	out := []client.Tick{}
	for i := len(ticks) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, ticks[i])
	}
	return out, nil
}

// StepNeeds is one step of a workflow with the steps it needs.
type StepNeeds struct {
	Name    string
	Uses    string
	Needs   []string
	Foreach bool
}

// Changed is closed when this node applies more of the log (the UI's live pages wait
// on it: one wait for every browser).
func (s *Server) Changed() <-chan struct{} { return s.n.Changed() }

// AppliedRun is run.get's answer from this node's state as it stands, without catching
// up with the log first: for a reader that Changed woke, which needs no round trip to
// the log to know it is current (the UI's one watcher of a run for all its live pages).
func (s *Server) AppliedRun(id string) (client.Run, error) {
	run, err := s.n.Run(id)
	if err != nil {
		return client.Run{}, clientError(err)
	}
	return run, nil
}

// Stop stops serving (run.wait requests in flight are answered with the run as it is).
func (s *Server) Stop() {
	s.closeNow()
	s.stopServe()
	<-s.served
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.stopWait()
	s.waits.Wait()
}

// async runs h on a goroutine of its own, owned by the server, once one of slots is free
// and if the user who asked holds fewer than their share (perUser) of this kind (wait:
// run.wait); a user at their share is refused at once, without queueing behind others.
func (s *Server) async(h micro.HandlerFunc, slots chan struct{}, wait bool) micro.HandlerFunc {
	limit := s.perUser.requests
	if wait {
		limit = s.perUser.waits
	}
	return func(req micro.Request) {
		key := heldKey{wait: wait, user: audit.Requester(req.Headers().Get(audit.RequestInfoHeader))}
		if why, hold, ok := s.large.admit(key.user, audit.ActorFromRequestInfo(req.Headers().Get(audit.RequestInfoHeader)), len(req.Data())); !ok {
			time.AfterFunc(hold, func() { s.fail(req, client.CodeTooManyRequests, why) }) // held back, with no goroutine
			return
		}
		if key.user != "" && limit > 0 && !s.hold(key, limit) {
			kind := "requests"
			if wait {
				kind = "run.wait requests"
			}
			s.fail(req, client.CodeTooManyRequests, fmt.Sprintf("too many requests: %s already has %d %s at once on this node, the most one user may (so that no user starves the others): let some end, or ask for fewer at once",
				audit.ActorFromRequestInfo(req.Headers().Get(audit.RequestInfoHeader)), limit, kind))
			return
		}
		release := func() {
			if key.user != "" && limit > 0 {
				s.release(key)
			}
		}
		slots <- struct{}{}
		s.mu.Lock()
		if s.stopped { // a message delivered while the subscription was going away
			s.mu.Unlock()
			<-slots
			release()
			s.fail(req, client.CodeInternal, "this node is stopping: try again (another node answers)")
			return
		}
		s.waits.Add(1)
		s.mu.Unlock()
		go func() {
			defer func() { <-slots; release(); s.waits.Done() }()
			h(req)
		}()
	}
}

// hold counts one more request of key, unless its user already holds limit of them.
func (s *Server) hold(key heldKey, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key] >= limit {
		return false
	}
	s.held[key]++
	return true
}

func (s *Server) release(key heldKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[key]--; s.held[key] <= 0 {
		delete(s.held, key)
	}
}

func (s *Server) wrap(h handler) micro.HandlerFunc {
	return func(req micro.Request) {
		var r client.Request
		dec := json.NewDecoder(strings.NewReader(string(req.Data())))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			s.fail(req, client.CodeBadRequest, "the request is not valid JSON for this operation: "+err.Error())
			return
		}
		if r.V != client.Version {
			s.fail(req, client.CodeBadRequest, fmt.Sprintf("request version %d; this server speaks version %d (upgrade flowctl or flowd)", r.V, client.Version))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Who asked, as the NATS server says (with auth, a person's request crosses from
		// the users' account and the server writes the header; docs/security.md).
		ctx = audit.WithActor(ctx, audit.ActorFromRequestInfo(req.Headers().Get(audit.RequestInfoHeader)))
		// Which try of the request this is, and a start's nonce (internal/base/resend).
		ctx = resend.WithTry(ctx, resend.Parse(req.Headers().Get(resend.HeaderNonce), req.Headers().Get(resend.HeaderTry)))
		out, err := s.call(ctx, h, &r)
		if err != nil {
			ce := &client.Error{Code: client.CodeInternal, Message: err.Error()}
			errors.As(err, &ce) // call's failures are all *client.Error
			s.fail(req, ce.Code, ce.Message)
			return
		}
		data, err := json.Marshal(out)
		if err != nil {
			s.fail(req, client.CodeInternal, "the answer does not encode: "+err.Error())
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
	_ = s.nc.PublishMsg(m)
}

func (s *Server) fail(req micro.Request, code, msg string) {
	h := nats.Header{}
	h.Set(micro.ErrorHeader, msg)
	h.Set(micro.ErrorCodeHeader, code)
	s.answer(req, &nats.Msg{Header: h})
}

// classify is the code and message the client gets for err: a *client.Error's (the
// server's refusals, and the node's errors with a code of their own), else internal.
func classify(err error) (string, string) {
	if ce := (*client.Error)(nil); errors.As(err, &ce) {
		return ce.Code, ce.Message
	}
	return client.CodeInternal, err.Error()
}
