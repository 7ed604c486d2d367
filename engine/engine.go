package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/dlq"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/backoff"
	"github.com/flowrun/flow/internal/natsnode"
	"github.com/flowrun/flow/internal/streams"
	"github.com/flowrun/flow/internal/supervise"
	"github.com/flowrun/flow/internal/testhooks"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steps"
)

// ErrNotStarted is returned by API calls before Start or after Stop.
var ErrNotStarted = errors.New("engine: not running")

// Engine is one flow node. New, then Start; Stop ends it.
type Engine struct {
	cfg Config
	log *slog.Logger

	srv      *natsnode.Server // nil with an external NATS
	nc       *nats.Conn
	js       jetstream.JetStream
	store    *checkpoint.Store
	clog     *logstream.Log
	elector  *epoch.Elector
	leases   *epoch.Leases
	tasks    jetstream.Consumer
	replicas int
	// sup keeps the long-lived NATS interactions alive: the log's consumer, the
	// election, the lease watcher, the task fetcher (and the API service, which
	// internal/api adds). internal/supervise.
	sup         *supervise.Supervisor
	tasksOpened atomic.Bool // the task fetcher has used e.tasks (a restart looks it up again)

	cancel  context.CancelFunc
	runCtx  context.Context // the workers' context, cancelled by Stop
	slots   chan struct{}   // one per run this node executes (Workers)
	wg      sync.WaitGroup
	stopped chan struct{}
	stats   Stats
	specs   sync.Map // "name@version" -> *workflow.Workflow

	// hooks are the tests' switches and signals (internal/testhooks); production's
	// zero value unless a test in this package set them before Start.
	hooks *testhooks.Hooks
	// nodes is NodesBucket: every node's applied sequence, for compaction (compact.go).
	nodes jetstream.KeyValue

	holdingBack atomic.Bool // the worker loop is waiting out a degraded lease
	// leadershipProblem says why this node cannot lead now ("" when it can): its won
	// term is below the applied term (runLeadership). /readyz shows it.
	leadershipProblem atomic.Value

	// admission (admission.go): assigns written and not yet applied, and whether runs
	// wait for room.
	admitting  atomic.Int64
	backlogged atomic.Bool // the scheduler's last pass left runs waiting for room

	// Cancel propagation (cancel.go): runs cancelled or dead-lettered so far.
	runsEnded atomic.Uint64

	mu struct {
		sync.Mutex
		started, stopping bool
		term              *epoch.Term
		running           map[string]*runExec        // by run ID
		waiters           map[string][]chan struct{} // WaitRun callers, by run ID
	}
}

// New checks cfg and returns an engine ready to Start.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID), stopped: make(chan struct{}), hooks: new(testhooks.Hooks)}
	e.sup = supervise.New(supervise.WithLogger(e.log))
	e.cfg.Lease.Supervisor = e.sup
	if err := cfg.Registry.Register(DrillStepKind, steps.Func(e.drillPause)); err != nil {
		return nil, err
	}
	e.mu.running = map[string]*runExec{}
	e.mu.waiters = map[string][]chan struct{}{}
	return e, nil
}

// Start connects (or embeds) NATS, opens the state, replays the log, and starts the
// election, the workers and (while leading) the scheduler.
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
	if e.cfg.NATSURL == "" {
		listen := e.cfg.NATSListen
		if listen == "-" {
			listen = ""
		}
		e.srv, err = natsnode.Start(natsnode.Config{DataDir: filepath.Join(e.cfg.DataDir, "nats"), Listen: listen,
			ServerName: e.cfg.NodeID, Logger: e.log, NoSync: e.cfg.unsynced, Auth: e.cfg.NATSAuth, Users: natsUsers(e.cfg.NATSUsers),
			TLS: natsnode.TLSFiles(e.cfg.NATSServerTLS)})
		if err != nil {
			return err
		}
		e.nc, err = e.srv.Connect(append(e.connOptions(), nats.Name(e.cfg.NodeID))...)
	} else {
		e.nc, err = natsnode.Connect(e.cfg.NATSURL, e.cfg.NodeID, append(e.connOptions(), e.cfg.NATSOptions...)...)
	}
	if err != nil {
		return err
	}
	if e.js, err = jetstream.New(e.nc); err != nil {
		return fmt.Errorf("engine: jetstream: %w", err)
	}
	e.replicas = streams.Replicas(e.nc)
	if e.srv == nil {
		e.warnIfUnsynced()
	}
	// A node with no state, or one behind the log's first sequence, starts from the
	// newest snapshot (the log after it is applied as usual).
	if err := logstream.PrepareState(ctx, e.js, "", filepath.Join(e.cfg.DataDir, "state"), e.log); err != nil {
		return err
	}
	if e.store, err = checkpoint.OpenStore(filepath.Join(e.cfg.DataDir, "state"), checkpoint.StoreOptions{Hooks: e.hooks, OnStatus: e.statusChanged}); err != nil {
		return err
	}
	// Streams and buckets are created by whichever node comes first; on a cluster two
	// nodes creating one replicated stream at once can time out: retry for a while.
	err = retrySetup(ctx, e.log, func(ctx context.Context) error {
		return e.setupJetStream(ctx)
	})
	if err != nil {
		return err
	}
	// Live from now on: the leader's compaction keeps what this node still needs while it
	// catches up (reportApplied goes on reporting once started).
	e.putReport(ctx)
	if err = e.clog.Start(ctx); err != nil {
		return err
	}
	// Catch up with the log before acting on the state.
	if err := e.clog.Applier.CatchUp(ctx); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel, e.runCtx = cancel, runCtx
	e.slots = make(chan struct{}, e.cfg.Workers)
	if !e.cfg.DisableScheduler {
		e.supervise(runCtx, supervise.Part{Name: "election", Silence: e.Silence(), Run: e.runLeadership})
	}
	e.supervise(runCtx, supervise.Part{Name: "tasks", Silence: e.Silence(), Run: e.runWorkers})
	e.wg.Add(1)
	go func() { defer e.wg.Done(); e.reportApplied(runCtx) }()
	e.log.Info("flow node started", "nats", natsnode.Redact(e.natsURL()), "data_dir", e.cfg.DataDir, "workers", e.cfg.Workers)
	return nil
}

// warnIfUnsynced says at start what flow cannot promise on an external NATS server that
// does not fsync every write. It warns rather than refuses: a stock nats-server syncs
// every 2 minutes, and a user trying flow on one should get a running node and the facts.
func (e *Engine) warnIfUnsynced() {
	switch streams.ServerSyncPolicy(e.nc, 2*time.Second) {
	case streams.SyncPeriodic:
		e.log.Warn("the NATS server does not fsync every write: a commit it acknowledged can be lost on a power cut; " +
			"set sync_interval: always in its jetstream block (docs/operations.md, \"Durability\")")
	case streams.SyncUnknown:
		e.log.Warn("cannot tell whether the NATS server fsyncs every write (its monitoring answers the system account only); " +
			"unless its jetstream block sets sync_interval: always, a commit it acknowledged can be lost on a power cut (docs/operations.md, \"Durability\")")
	}
}

func (e *Engine) natsURL() string {
	if e.srv != nil {
		if u := e.srv.ClientURL(); u != "" {
			return u
		}
		return "in-process"
	}
	return e.cfg.NATSURL
}

func (e *Engine) setupJetStream(ctx context.Context) (err error) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	logCfg := logstream.DefaultConfig()
	logCfg.JS, logCfg.Store, logCfg.Node, logCfg.Replicas = e.js, e.store, e.cfg.NodeID, e.replicas
	logCfg.MaxOutputBytes, logCfg.Logger, logCfg.Supervisor, logCfg.Hooks = e.cfg.MaxOutputBytes, e.log, e.sup, e.hooks
	if e.clog, err = logstream.Open(sctx, logCfg); err != nil {
		return err
	}
	e.cfg.MaxOutputBytes = e.clog.Writer.MaxOutputBytes() // fitted to the server's max_payload
	if e.elector, err = epoch.NewElector(sctx, e.js, e.cfg.NodeID, e.cfg.Lease, e.replicas); err != nil {
		return err
	}
	leaseCfg := e.cfg.Lease
	leaseCfg.Hooks = e.hooks // the lease guards' negative controls are for run leases
	if e.leases, err = epoch.NewLeases(sctx, e.js, leaseCfg, e.replicas); err != nil {
		return err
	}
	if e.tasks, err = openTasks(sctx, e.js, e.replicas, e.leases.Config().TTL, e.log); err != nil {
		return err
	}
	if e.nodes, err = openNodes(sctx, e.js, e.replicas); err != nil {
		return err
	}
	return dlq.Open(sctx, e.js, e.replicas)
}

// retrySetup retries fn on timeouts for up to a minute, with backoff.
func retrySetup(ctx context.Context, log *slog.Logger, fn func(context.Context) error) error {
	policy := backoff.Policy{Base: 200 * time.Millisecond, Cap: 3 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for attempt := 0; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || !isTimeout(err) {
			return err
		}
		log.Warn("JetStream set-up timed out; retrying", "err", err, "attempt", attempt)
		if serr := policy.Sleep(ctx, attempt); serr != nil {
			return err
		}
	}
}

func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// Changed is closed when this node has applied more of the log (a fresh channel each
// call: take it before reading the state, then wait).
func (e *Engine) Changed() <-chan struct{} { return e.clog.Applier.Changed() }

// ClientURL is the NATS URL that clients (flowctl) reach this node's NATS at.
func (e *Engine) ClientURL() string { return e.natsURL() }

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
	running := make([]*runExec, 0, len(e.mu.running))
	for _, x := range e.mu.running {
		running = append(running, x)
	}
	e.mu.Unlock()
	for _, x := range running {
		x.drain()
	}
	if e.cancel != nil {
		e.cancel()
	}
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		e.log.Warn("drain did not finish in time; leases will lapse", "err", ctx.Err())
		<-done
	}
	e.closeAll()
	return nil
}

// statusChanged wakes the WaitRun callers of a run that ended, and stops this node's
// execution of a run cancelled from outside (applier goroutine).
func (e *Engine) statusChanged(run string, status checkpoint.RunStatus) {
	if !status.Terminal() {
		return
	}
	e.stopEnded(run, status)
	e.mu.Lock()
	ws := e.mu.waiters[run]
	delete(e.mu.waiters, run)
	e.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// Stats are counters of this node's work, for metrics and tests.
type Stats struct {
	Stolen     atomic.Int64 // epochs stopped with lock-stolen-mid-run
	HandedBack atomic.Int64 // runs handed back on drain
	// TasksDeferred counts tasks put back because another holder still had the run's
	// lease (a zombie of an older epoch): they come back after a quarter of a lease TTL.
	TasksDeferred atomic.Int64
	StepAttempts  atomic.Int64
	StepFailures  atomic.Int64
}

// Stats returns this node's counters.
func (e *Engine) Stats() *Stats { return &e.stats }

func (e *Engine) closeAll() {
	if e.clog != nil {
		e.clog.Stop()
	}
	if e.store != nil {
		e.store.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.srv != nil {
		e.srv.Shutdown()
	}
	select {
	case <-e.stopped:
	default:
		close(e.stopped)
	}
}

// Store is this node's state (read-only use).
func (e *Engine) Store() *checkpoint.Store { return e.store }

// Log is this node's checkpoint log.
func (e *Engine) Log() *logstream.Log { return e.clog }

// JetStream is the engine's JetStream context.
func (e *Engine) JetStream() jetstream.JetStream { return e.js }

// Conn is the engine's NATS connection.
func (e *Engine) Conn() *nats.Conn { return e.nc }

// NodeID names this node.
func (e *Engine) NodeID() string { return e.cfg.NodeID }

// Counters are this node's lease and election counters.
func (e *Engine) Counters() *epoch.Counters { return e.leases.Config().Counters }

// Applied is the log sequence this node's state has applied.
func (e *Engine) Applied() uint64 { return e.store.Applied() }

// catchUpLimit bounds CatchUp.
const catchUpLimit = 5 * time.Second

// CatchUp waits (at most 5s) until this node has applied the log as it is now: a read
// after it sees every write acknowledged before it, whichever node made it.
func (e *Engine) CatchUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, catchUpLimit)
	defer cancel()
	return e.clog.Applier.CatchUp(ctx)
}

// LeadershipProblem says why this node's election cannot give it a term that
// schedules ("" when nothing is wrong).
func (e *Engine) LeadershipProblem() string {
	p, _ := e.leadershipProblem.Load().(string)
	return p
}

// IsLeader reports whether this node leads now.
func (e *Engine) IsLeader() bool { return e.Leading() != nil }

// Leader is the leader the leader key names, with its term (whichever node asks).
func (e *Engine) Leader(ctx context.Context) (epoch.Leader, error) { return e.elector.Leader(ctx) }

// Workflows lists every applied workflow version.
func (e *Engine) Workflows() ([]checkpoint.WorkflowVersion, error) { return e.store.Workflows() }

// Ticks are the recorded fire times of a workflow's schedule, oldest first.
func (e *Engine) Ticks(workflow string) ([]checkpoint.Tick, error) { return e.store.Ticks(workflow) }

// Leading is the current term if this node leads, else nil.
func (e *Engine) Leading() *epoch.Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.term
}

// runLeadership campaigns, runs the scheduler while leading, and campaigns again. It
// is the supervised part "election": it is alive while the campaign hears the server
// (the leader's renewals, the answers to its bids) or while its term is trusted, and
// a campaign that fails or falls silent is started again, so a node that lost its term
// bids again whatever happened to its watch meanwhile (issue 17).
func (e *Engine) runLeadership(ctx context.Context, alive func()) error {
	staleTerms := 0 // terms won in a row below the applied term
	for ctx.Err() == nil {
		select {
		case <-e.failedApplier():
			// A node whose state no longer follows the log must not schedule from it:
			// it leaves the election (and says so in /readyz) until it is restarted.
			e.log.Error("the applier stopped: this node no longer takes part in elections", "err", e.clog.Applier.Err())
			return e.sitOut(ctx, alive)
		default:
		}
		term, err := e.elector.Campaign(ctx, epoch.Heard(alive))
		if err != nil {
			return err
		}
		if high := e.store.HighestTerm(); term.Term() < high {
			// Every entry of this term would be rejected as stale: the leader bucket's
			// revisions are below a term the log has applied (the bucket was reset, or an
			// entry with a high term was accepted). Raise the bucket's terms above it and
			// campaign again, after a pause that grows while it keeps happening.
			staleTerms++
			problem := fmt.Sprintf("won term %d, below the applied term %d: raising the leader bucket's terms", term.Term(), high)
			if e.hooks.NoTermRaise.Load() {
				problem = fmt.Sprintf("won term %d, below the applied term %d (raising is switched off)", term.Term(), high)
			} else if err := e.elector.RaiseTerms(ctx, high); err != nil {
				problem = fmt.Sprintf("won term %d, below the applied term %d, and cannot raise it: %v", term.Term(), high, err)
			}
			e.log.Error("leader term below the applied term", "term", term.Term(), "highest_applied", high, "problem", problem)
			e.leadershipProblem.Store(problem)
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = term.Resign(rctx)
			cancel()
			if e.cfg.Lease.Backoff.Sleep(ctx, min(staleTerms, 8)) != nil {
				return ctx.Err()
			}
			continue
		}
		staleTerms = 0
		e.leadershipProblem.Store("")
		e.mu.Lock()
		e.mu.term = term
		e.mu.Unlock()
		e.log.Info("leading", "term", term.Term())
		trusted := make(chan struct{})
		go func() { // alive while the term is renewed; it ends when the term does
			defer close(trusted)
			tick := time.NewTicker(max(e.Silence()/4, 10*time.Millisecond))
			defer tick.Stop()
			for {
				select {
				case <-term.Done():
					return
				case <-ctx.Done():
					return
				case <-tick.C:
					if term.Check() == nil {
						alive()
					}
				}
			}
		}()
		s := newScheduler(e, term)
		s.run(ctx)
		e.mu.Lock()
		e.mu.term = nil
		e.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = term.Resign(rctx)
		cancel()
		<-trusted
	}
	return ctx.Err()
}

// failedApplier is closed when this node's applier stopped for good (never, with the
// NoSitOut control on).
func (e *Engine) failedApplier() <-chan struct{} {
	if e.hooks.NoSitOut.Load() {
		return nil
	}
	return e.clog.Applier.Failed()
}

// sitOut keeps the election part alive, doing nothing, until ctx ends.
func (e *Engine) sitOut(ctx context.Context, alive func()) error {
	tick := time.NewTicker(max(e.Silence()/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		alive()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// supervise runs p under the engine's supervisor until ctx ends; Stop waits for it.
func (e *Engine) supervise(ctx context.Context, p supervise.Part) {
	done := e.sup.Go(ctx, p)
	e.wg.Add(1)
	go func() { defer e.wg.Done(); <-done }()
}

// Silence is how long a supervised part of the engine may hear nothing from NATS
// before it is presumed cut off and started again: a lease TTL (a node that hears
// nothing for that long has lost its leases anyway), and at least the task fetch's
// wait with some room.
// The API service (internal/api) uses the same limit.
func (e *Engine) Silence() time.Duration { return max(e.cfg.Lease.TTL, 4*time.Second) }

// connOptions make a silent connection noticed within a lease TTL: a ping every
// quarter TTL, and the connection is declared stale (and replaced) after two go
// unanswered. nats.go's defaults (2 minutes, 2 pings) would leave a node cut off by a
// silent partition believing itself connected for four minutes. Reconnects are logged
// and counted (flow_nats_reconnects_total).
func (e *Engine) connOptions() []nats.Option {
	ping := max(e.cfg.Lease.TTL/4, 100*time.Millisecond)
	return []nats.Option{
		nats.PingInterval(ping), nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			e.log.Warn("NATS connection lost; reconnecting", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			e.log.Info("NATS connection recovered", "server", nc.ConnectedUrlRedacted())
		}),
	}
}

// Supervisor reports the health of the node's long-lived NATS interactions.
func (e *Engine) Supervisor() *supervise.Supervisor { return e.sup }

func natsUsers(users []NATSUser) []natsnode.User {
	out := make([]natsnode.User, len(users))
	for i, u := range users {
		out[i] = natsnode.User{Name: u.Name, Password: u.Password, NKey: u.NKey, Role: u.Role}
	}
	return out
}
