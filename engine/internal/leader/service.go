package leader

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/dlq"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/logstream"
)

// Log is the log as the leader uses it: one write verb, and the applier's progress.
type Log interface {
	Write(ctx context.Context, entries ...checkpoint.Entry) *logstream.Future
	// LastSeq is the log's last sequence now (the stream's).
	LastSeq(ctx context.Context) (uint64, error)
	Changed() <-chan struct{}
	Failed() <-chan struct{}
	Err() error
}

// Elector campaigns for the term (an *epoch.Elector).
type Elector interface {
	Campaign(ctx context.Context, opts ...epoch.CampaignOption) (*epoch.Term, error)
	RaiseTerms(ctx context.Context, above int64) error
}

// Leases is how the leader sees the run leases (an *epoch.Leases).
type Leases interface {
	Watch(ctx context.Context) (*epoch.LeaseWatcher, error)
	// Holder reads a run's lease from the server: its value, and whether it is held.
	Holder(ctx context.Context, run string) (epoch.LeaseValue, bool, error)
}

// Tasks queues the tasks of assigned epochs (a *tasks.Queue).
type Tasks interface {
	Publish(ctx context.Context, t tasks.Task) error
	PublishAsync(t tasks.Task) (port.Ack, error)
}

// Snapshots takes and lists the state's snapshots (a *logstream.Snapshots).
type Snapshots interface {
	Take(ctx context.Context) (logstream.Snapshot, error)
	List(ctx context.Context) ([]logstream.Snapshot, error)
}

// Compactor is what compaction needs besides the decision (KeepFrom): the other live
// nodes' applied sequences, the log's first sequence, and the purge.
type Compactor interface {
	LiveApplied(ctx context.Context) (low uint64, any bool, err error)
	FirstSeq(ctx context.Context) (uint64, error)
	Purge(ctx context.Context, keep uint64) error
}

// Config of the leader's service. Every field without a default is required.
type Config struct {
	Node      string
	Elector   Elector
	State     State
	Specs     Specs
	Log       Log
	Leases    Leases
	Tasks     Tasks
	Snapshots Snapshots
	Compactor Compactor
	// Gate raises the cluster version (gate.go); nil: never raised.
	Gate Gate
	// Placeable says whether a live node has every one of labels (a run's runs_on:
	// PlanAssign); nil: every run is placeable.
	Placeable func(labels []string) bool
	// PriorityAging raises a queued run's priority by one for each PriorityAging it has
	// waited (PlanAssign; 0: priorities alone, no starvation bound).
	PriorityAging time.Duration
	// DeadLetters publishes a dead-lettered run's notice (dlq.Publish).
	DeadLetters func(ctx context.Context, m dlq.Message) error
	Admission   *Admission
	// TTL is the lease TTL.
	TTL               time.Duration
	ReconcileInterval time.Duration
	LockDelay         time.Duration
	CronGrace         time.Duration
	SnapshotEvery     uint64
	Retention         time.Duration
	// Retired, if set, is told of the runs a retention pass retired (their step logs go
	// with them); what it does is best effort.
	Retired func(ctx context.Context, runs []string)
	// Silence is how long the election part may hear nothing before it is restarted.
	Silence time.Duration
	// Backoff paces campaigns after a term below the applied term.
	Backoff backoff.Policy
	Clock   clockwork.Clock // default: the real one
	Hooks   *testhooks.Hooks
	Logger  *slog.Logger
}

// Service is the leader's work: it campaigns for the term and, while it holds one,
// runs the term's services (term.go); when the term ends it campaigns again. It is the
// node's supervised part "election" (Part).
type Service struct {
	cfg   Config
	log   *slog.Logger
	hooks *testhooks.Hooks
	clock clockwork.Clock

	mu   sync.Mutex
	term *epoch.Term // while leading
	// problem says why this node cannot lead now ("" when it can): its won term is
	// below the applied term. /readyz shows it.
	problem atomic.Value
}

// New returns the service, ready to be supervised.
func New(cfg Config) *Service {
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: cfg.Logger, hooks: testhooks.OrProduction(cfg.Hooks), clock: cfg.Clock}
}

// Part is the election, for the node's supervisor: it is alive while the campaign hears
// the server (the leader's renewals, the answers to its bids) or while its term is
// trusted, and a campaign that fails or falls silent is started again, so a node that
// lost its term bids again whatever happened to its watch meanwhile.
func (s *Service) Part() supervise.Part {
	return supervise.Part{Name: "election", Silence: s.cfg.Silence, Run: s.run}
}

// Leading is the current term if this node leads, else nil.
func (s *Service) Leading() *epoch.Term {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.term
}

// Problem says why this node's election cannot give it a term that schedules ("" when
// nothing is wrong).
func (s *Service) Problem() string {
	p, _ := s.problem.Load().(string)
	return p
}

// failedApplier is closed when this node's applier stopped for good (never, with the
// NoSitOut control on).
func (s *Service) failedApplier() <-chan struct{} {
	if s.hooks.NoSitOut.Load() {
		return nil
	}
	return s.cfg.Log.Failed()
}

func (s *Service) run(ctx context.Context, alive func()) error {
	staleTerms := 0 // terms won in a row below the applied term
	for ctx.Err() == nil {
		select {
		case <-s.failedApplier():
			// A node whose state no longer follows the log must not schedule from it:
			// it leaves the election (and says so in /readyz) until it is restarted.
			s.log.Error("the applier stopped: this node no longer takes part in elections", "err", s.cfg.Log.Err())
			return s.sitOut(ctx, alive)
		default:
		}
		term, err := s.cfg.Elector.Campaign(ctx, epoch.Heard(alive))
		if err != nil {
			return err
		}
		if high := s.cfg.State.HighestTerm(); term.Term() < high {
			// Every entry of this term would be rejected as stale: the leader bucket's
			// revisions are below a term the log has applied (the bucket was reset, or an
			// entry with a high term was accepted). Raise the bucket's terms above it and
			// campaign again, after a pause that grows while it keeps happening.
			staleTerms++
			problem := fmt.Sprintf("won term %d, below the applied term %d: raising the leader bucket's terms", term.Term(), high)
			if s.hooks.NoTermRaise.Load() {
				problem = fmt.Sprintf("won term %d, below the applied term %d (raising is switched off)", term.Term(), high)
			} else if err := s.cfg.Elector.RaiseTerms(ctx, high); err != nil {
				problem = fmt.Sprintf("won term %d, below the applied term %d, and cannot raise it: %v", term.Term(), high, err)
			}
			s.log.Error("leader term below the applied term", "term", term.Term(), "highest_applied", high, "problem", problem)
			s.problem.Store(problem)
			resign(term)
			if s.cfg.Backoff.Sleep(ctx, min(staleTerms, 8)) != nil {
				return ctx.Err()
			}
			continue
		}
		staleTerms = 0
		s.problem.Store("")
		s.lead(ctx, term, alive)
	}
	return ctx.Err()
}

// lead runs the term's services until the term ends (or ctx does), then resigns it.
func (s *Service) lead(ctx context.Context, term *epoch.Term, alive func()) {
	s.mu.Lock()
	s.term = term
	s.mu.Unlock()
	s.log.Info("leading", "term", term.Term())
	trusted := make(chan struct{})
	go func() { // alive while the term is renewed; it ends when the term does
		defer close(trusted)
		tick := s.clock.NewTicker(max(s.cfg.Silence/4, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-term.Done():
				return
			case <-ctx.Done():
				return
			case <-tick.Chan():
				if term.Check() == nil {
					alive()
				}
			}
		}
	}()
	newTermServices(s, term).run(ctx)
	s.mu.Lock()
	s.term = nil
	s.mu.Unlock()
	resign(term)
	<-trusted
}

func resign(term *epoch.Term) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = term.Resign(ctx)
}

// sitOut keeps the election part alive, doing nothing, until ctx ends.
func (s *Service) sitOut(ctx context.Context, alive func()) error {
	tick := s.clock.NewTicker(max(s.cfg.Silence/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		alive()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.Chan():
		}
	}
}
