package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/internal/base/bytelimit"
	"github.com/flowrun/flow/internal/base/port"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/dlq"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/engine/internal/nodes"
	"github.com/flowrun/flow/engine/internal/rates"
	"github.com/flowrun/flow/engine/internal/specs"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/logstream"
)

// ErrNotStarted is returned by API calls before Start or after Stop.
var ErrNotStarted = errors.New("engine: not running")

// Engine is one flow node: a facade over its parts. Start opens the node's I/O
// (node.go: NATS, the log, the state, leases, the task queue) and starts its services:
// the leader's (engine/internal/leader: election, assignment, reclaim and reconcile,
// cron, snapshots and compaction, retention), the workers (engine/internal/worker),
// and the report of its applied sequence (engine/internal/nodes). The library API
// (api.go) reads the state and writes to the log; Health and Metrics are what a
// program around the engine may know of its insides.
type Engine struct {
	// signalBytes bounds each person's signal data per second on this node (signalrate.go).
	signalBytes *bytelimit.Limiter

	cfg   Config
	log   *slog.Logger
	hooks *testhooks.Hooks
	// people are the roles of the people this node's embedded server knows (--auth), by
	// name: approvals are counted only for them (Decide).
	people map[string]string

	// over, if set, is what the engine runs over instead of NATS (NewOver: the
	// simulation); ports are its streams and buckets, on JetStream or over.
	over  *Over
	ports port.Ports
	rates *rates.Limiter // paces rate-limited steps (set by Start)

	// The node's I/O, opened by Start (node.go).
	srv      *natsnode.Server // nil with an external NATS
	nc       *nats.Conn
	js       jetstream.JetStream
	replicas int
	store    *checkpoint.Store
	clog     *logstream.Log
	elector  *epoch.Elector
	leases   *epoch.Leases
	tasks    *tasks.Queue
	gate     *gate.Gate
	// tasksCap is the tasks stream's cap on this server; streamCheck the newest check of
	// flow's streams against what it wants (streams.go).
	tasksCap    int64
	streamCheck streamCheck
	// adminJS is this node's admin path over flow's streams (nil: none): js itself on
	// the embedded server, else adminNC's (Config.NATSAdminOptions).
	adminNC *nats.Conn
	adminJS jetstream.JetStream
	// triggers starts runs from messages while this node leads (triggers.go).
	triggers *triggerService
	// gatePasses counts the leader's looks at the roster (tests wait on it).
	gatePasses atomic.Int64
	// sup keeps the long-lived NATS interactions alive: the log's consumer, the
	// election, the lease watcher, the task fetcher (and the API service, which
	// internal/app/apiserver adds). internal/base/supervise.
	sup *supervise.Supervisor

	specs     *specs.Cache
	admission *leader.Admission
	leader    *leader.Service
	workers   *worker.Pool
	reporter  *nodes.Reporter
	// labels is the live nodes' worker labels, as last read (labels.go).
	labels labelView

	cancel  context.CancelFunc
	parts   sync.WaitGroup // the supervised parts
	stopped chan struct{}

	mu struct {
		sync.Mutex
		started, stopping bool
		waiters           map[string][]chan struct{} // WaitRun callers, by run ID
	}
}

// New checks cfg and returns an engine ready to Start. cfg is not changed: its zero
// fields take their defaults in the engine's own copy (Config.WithDefaults).
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	given := cfg.Registry != nil
	cfg = cfg.WithDefaults()
	if given && (cfg.ExecUser != nil || len(cfg.ExecEnv) > 0) {
		// A program's own registry runs its exec steps as flowd's settings say too.
		cfg.Registry.ConfigureExec(cfg.execOptions()...)
	}
	e := &Engine{cfg: cfg, signalBytes: newSignalLimiter(), log: cfg.Logger.With("node", cfg.NodeID), stopped: make(chan struct{}), hooks: new(testhooks.Hooks)}
	e.sup = supervise.New(supervise.WithLogger(e.log))
	e.triggers = newTriggerService(e)
	e.labels.e = e
	e.cfg.Lease.Supervisor = e.sup
	e.mu.waiters = map[string][]chan struct{}{}
	e.people = map[string]string{}
	if cfg.NATSAuth {
		for _, u := range cfg.NATSUsers {
			if u.Role != "node" && u.Name != "" {
				e.people[u.Name] = u.Role
			}
		}
	}
	return e, nil
}

// Start connects (or embeds) NATS, opens the state, replays the log, and starts the
// election, the workers and (while leading) the leader's services.
func (e *Engine) Start(ctx context.Context) (err error) {
	e.mu.Lock()
	if e.mu.started {
		e.mu.Unlock()
		return errors.New("engine: already started")
	}
	e.mu.started = true
	e.mu.Unlock()
	defer func() {
		if err != nil {
			e.closeAll()
		}
	}()
	if err := e.open(ctx); err != nil {
		return err
	}
	e.specs = specs.New(e.store)
	e.admission = leader.NewAdmission(leader.QueueAhead(e.cfg.Workers), e.hooks)
	log := nodeLog{e.clog}
	e.rates = rates.New(rates.Config{KV: e.ports.Rates, Clock: e.cfg.Clock, Logger: e.log,
		Local: e.ports.Rates == nil || ratesLocal != "" || e.hooks.RatesLocal.Load()})
	e.workers = worker.New(worker.Config{Node: e.cfg.NodeID, Workers: e.cfg.Workers, StepParallelism: e.cfg.StepParallelism,
		MaxOutputBytes: e.cfg.MaxOutputBytes, State: e.store, Specs: e.specs, Log: log, Leases: e.leases, Tasks: e.tasks,
		Registry: e.cfg.Registry, Rates: e.rates, Labels: e.cfg.Labels, TTL: e.cfg.Lease.TTL, ParkAfter: e.cfg.ParkAfter, StartChild: e.startChild, MaxRunTree: e.cfg.MaxRunTree, Silence: e.silence(), Backoff: e.cfg.Lease.Backoff, Clock: e.cfg.Clock,
		StepLogs: e.stepLogSink(), StepObserver: e.cfg.StepObserver, Hooks: e.hooks, Logger: e.log})
	if err := e.cfg.Registry.Register(worker.DrillStepKind, e.workers.DrillStep()); err != nil {
		return err
	}
	e.leader = leader.New(leader.Config{Node: e.cfg.NodeID, Elector: raisingElector{e.elector, e}, State: e.store, Specs: e.specs, Log: log,
		Leases: e.leases, Tasks: e.tasks, Snapshots: e.clog.Snapshots, Compactor: compactor{e},
		DeadLetters: func(ctx context.Context, m dlq.Message) error { return dlq.Publish(ctx, e.ports.DLQ, m) },
		Gate:        gatePromoter{e}, Placeable: e.labels.placeable, PriorityAging: e.cfg.PriorityAging,
		Admission: e.admission, TTL: e.cfg.Lease.TTL, ReconcileInterval: e.cfg.ReconcileInterval, LockDelay: e.cfg.LockDelay,
		CronGrace: e.cfg.CronGrace, SnapshotEvery: e.cfg.SnapshotEvery, Retention: e.cfg.Retention, Retired: e.removeStepLogs, Silence: e.silence(),
		Backoff: e.cfg.Lease.Backoff, Clock: e.cfg.Clock, Hooks: e.hooks, Logger: e.log})
	// A member of the cluster from now on: the cluster version does not move past what
	// this binary reads; a cluster already past it refuses this node (gate.go).
	if err := retrySetup(ctx, e.log, e.register); err != nil { // a cluster still electing its JetStream leader answers nothing yet
		return e.withStreamFindings(ctx, err)
	}
	e.reporter = nodes.NewReporter(e.ports.Nodes, e.cfg.NodeID, nodes.Report{Binary: Binary(), Formats: e.cfg.readFormats(), Labels: e.cfg.Labels}, e.store.Applied, e.cfg.Clock, e.log).WithRateWaits(e.rateWaits)
	// Live from now on: the leader's compaction keeps what this node still needs while it
	// catches up.
	e.reporter.Report(ctx)
	if err = e.clog.Start(ctx); err != nil {
		return err
	}
	// Catch up with the log before acting on the state.
	if err := e.clog.Applier.CatchUp(ctx); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel = cancel
	if !e.cfg.DisableScheduler {
		e.supervise(runCtx, e.leader.Part())
		if e.js != nil { // a simulated node has no JetStream to read messages from
			e.supervise(runCtx, e.triggers.part())
		}
	}
	e.supervise(runCtx, e.workers.Part())
	e.reporter.Start(runCtx)
	e.log.Info("flow node started", "nats", natsnode.Redact(e.natsURL()), "data_dir", e.cfg.DataDir, "workers", e.cfg.Workers)
	return nil
}

// Stop drains: it stops taking tasks, hands every running run back (requeue entry,
// lease released) so that another node resumes it at once, resigns the leadership, and
// closes everything. ctx bounds the drain.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	if !e.mu.started || e.mu.stopping {
		e.mu.Unlock()
		<-e.stopped
		return nil
	}
	e.mu.stopping = true
	e.mu.Unlock()
	if e.workers != nil {
		e.workers.Drain()
	}
	if e.cancel != nil {
		e.cancel()
	}
	e.parts.Wait() // the fetch loop has ended: no run starts any more
	if e.workers != nil {
		e.workers.Wait(ctx)
	}
	if e.reporter != nil {
		e.reporter.Stop()
	}
	e.closeAll()
	return nil
}

// supervise runs p under the engine's supervisor until ctx ends; Stop waits for it.
func (e *Engine) supervise(ctx context.Context, p supervise.Part) {
	done := e.sup.Go(ctx, p)
	e.parts.Add(1)
	go func() { defer e.parts.Done(); <-done }()
}

// statusChanged wakes the WaitRun callers of a run that ended, and stops this node's
// execution of a run ended from outside (the applier's goroutine, after each message).
func (e *Engine) statusChanged(run string, status checkpoint.RunStatus) {
	if !status.Terminal() {
		return
	}
	if w := e.workers; w != nil {
		w.RunEnded(run, status)
	}
	e.mu.Lock()
	ws := e.mu.waiters[run]
	delete(e.mu.waiters, run)
	e.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// silence is how long a supervised part of the engine may hear nothing from NATS
// before it is presumed cut off and started again: a lease TTL (a node that hears
// nothing for that long has lost its leases anyway), and at least the task fetch's
// wait with some room. The API service (internal/app/apiserver) uses the same limit.
func (e *Engine) silence() time.Duration { return max(e.cfg.Lease.TTL, 4*time.Second) }

// NodeID names this node.
func (e *Engine) NodeID() string { return e.cfg.NodeID }

// leading is the current term if this node leads, else nil.
func (e *Engine) leading() *epoch.Term {
	if e.leader == nil {
		return nil
	}
	return e.leader.Leading()
}

// isLeader reports whether this node leads now.
func (e *Engine) isLeader() bool { return e.leading() != nil }

// Leader is the leader the leader key names, with its term (whichever node asks).
func (e *Engine) Leader(ctx context.Context) (epoch.Leader, error) { return e.elector.Leader(ctx) }

// leasesDegraded says whether a lease this node holds goes unrenewed (its renewals are
// unanswered): such a node takes no new task.
func (e *Engine) leasesDegraded() bool { return e.workers != nil && e.workers.Degraded() }

// Applied is the log sequence this node's state has applied.
func (e *Engine) Applied() uint64 { return e.store.Applied() }

// Changed is closed when this node has applied more of the log (a fresh channel each
// call: take it before reading the state, then wait).
func (e *Engine) Changed() <-chan struct{} { return e.clog.Applier.Changed() }

// catchUpLimit bounds CatchUp.
const catchUpLimit = 5 * time.Second

// CatchUp waits (at most 5s) until this node has applied the log as it is now: a read
// after it sees every write acknowledged before it, whichever node made it.
func (e *Engine) CatchUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, catchUpLimit)
	defer cancel()
	return e.clog.Applier.CatchUp(ctx)
}

// nodeLog is the log as the services use it: the writer's one verb and the applier's
// progress.
type nodeLog struct{ l *logstream.Log }

func (n nodeLog) Write(ctx context.Context, entries ...checkpoint.Entry) *logstream.Future {
	return n.l.Writer.Write(ctx, entries...)
}
func (n nodeLog) LastSeq(ctx context.Context) (uint64, error) { return n.l.Applier.LastSeq(ctx) }
func (n nodeLog) Changed() <-chan struct{}                    { return n.l.Applier.Changed() }
func (n nodeLog) Failed() <-chan struct{}                     { return n.l.Applier.Failed() }
func (n nodeLog) Err() error                                  { return n.l.Applier.Err() }

// waitFor waits until cond holds, re-checking whenever the log applies a message.
func (e *Engine) waitFor(ctx context.Context, cond func() bool) error {
	for {
		changed := e.clog.Applier.Changed()
		if cond() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-e.clog.Applier.Failed():
			return e.clog.Applier.Err()
		}
	}
}

// ratesLocal is the control of the shared rate-limit bucket in real processes (-ldflags
// "-X github.com/flowrun/flow/engine.ratesLocal=1"; empty in every build of flowd): each
// node paces rate_limit keys alone, so n nodes start n times the rate
// (TestRateLimitHoldsAcrossNodes's control).
var ratesLocal string
