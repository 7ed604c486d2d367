package worker

// What a Pool is built from: the ports it reads and writes through, its Config, and
// the Stats it keeps.

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/rates"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steplog"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
	"github.com/jonboulle/clockwork"
)

// State is what workers read of this node's applied state: a *checkpoint.Store.
type State interface {
	Run(id string) (*checkpoint.Run, error)
	Steps(id string) ([]checkpoint.Step, error)
	Items(run, step string) ([]checkpoint.Item, error)
}

// Specs gives the workflow version a run started with (engine/internal/specs).
type Specs interface {
	OfRun(r *checkpoint.Run) (*workflow.Workflow, error)
}

// Log is the log as workers use it: one write verb, and the applier's progress.
type Log interface {
	Write(ctx context.Context, entries ...checkpoint.Entry) *logstream.Future
	Changed() <-chan struct{}
	Failed() <-chan struct{}
	Err() error
}

// Leases takes a run's lease for an epoch (an *epoch.Leases).
type Leases interface {
	Acquire(ctx context.Context, run string, ep int64, worker string) (*epoch.Lease, error)
}

// Tasks is where tasks come from: the workers' consumer, looked up again after a restart.
type Tasks interface {
	Consumer(ctx context.Context) (port.Consumer, error)
}

// Config of a Pool. Every field without a default is required.
type Config struct {
	Node            string
	Workers         int // runs executed at once
	StepParallelism int // steps of one run at once
	MaxOutputBytes  int // a foreach step's aggregate output above it is summarised
	State           State
	Specs           Specs
	Log             Log
	Leases          Leases
	Tasks           Tasks
	Registry        *steps.Registry
	// Rates paces the attempts of steps with a rate_limit (nil: they go unpaced, which
	// only tests that declare none may leave).
	Rates *rates.Limiter
	// Labels are this node's worker labels: a task of a run whose workflow needs a label
	// it lacks (workflow.Workflow.Labels) is put back for a node that has it.
	Labels []string
	// TTL is the lease TTL: it paces retries and bounds how long a stopped step may
	// take to die (StopGrace).
	TTL time.Duration
	// Silence is how long the task fetch loop may hear nothing before it is restarted.
	Silence time.Duration
	// StartChild starts a workflow step's child run (child.go); nil: this pool starts none.
	StartChild StartChild
	// MaxRunTree is the node's bound on a run's tree (engine Config.MaxRunTree; 0: none):
	// a foreach whose children would pass it fails before it starts any.
	MaxRunTree int
	// ParkAfter is the shortest sleep that parks the run instead of holding a worker
	// (default: three lease TTLs).
	ParkAfter time.Duration
	// Backoff paces retries of a failing fetch.
	Backoff backoff.Policy
	// Clock reads the time (default: the real one).
	Clock clockwork.Clock
	// StepLogs keeps what each step attempt prints (nil: nothing is kept).
	StepLogs *steplog.Sink
	// StepObserver, if set, is told of every finished step attempt (metrics).
	StepObserver func(kind string, d time.Duration, err error)
	Hooks        *testhooks.Hooks
	Logger       *slog.Logger
}

// Stats are counters of a pool's work, for metrics and tests.
type Stats struct {
	Stolen     atomic.Int64 // epochs stopped with lock-stolen-mid-run
	HandedBack atomic.Int64 // runs handed back on drain
	// TasksNotHere counts tasks put back because their run needs a worker label this
	// node lacks.
	TasksNotHere atomic.Int64
	// TasksDeferred counts tasks put back because another holder still had the run's
	// lease (a zombie of an older epoch): they come back after a quarter of a lease TTL.
	TasksDeferred atomic.Int64
	StepAttempts  atomic.Int64
	StepFailures  atomic.Int64
	Parked        atomic.Int64 // epochs that ended parked on a wait
	SlotWaits     atomic.Int64 // steps that asked to park for their concurrency keys' slots
}
