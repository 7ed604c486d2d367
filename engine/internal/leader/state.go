package leader

import (
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// State is what the leader reads of this node's applied state: a *checkpoint.Store.
// The leader never writes to it; its entries reach it through the log.
type State interface {
	Run(id string) (*checkpoint.Run, error)
	EachRun(opts checkpoint.ListOptions, fn func(*checkpoint.Run) bool) error
	EachQueued(fn func(*checkpoint.Run) checkpoint.QueueVerdict) error
	EachQueuedAt(now time.Time, aging time.Duration, fn func(*checkpoint.Run) checkpoint.QueueVerdict) error
	ListRuns(opts checkpoint.ListOptions) ([]checkpoint.Run, string, error)
	// Held counts the runs holding an epoch: assigned and unclaimed, and running.
	Held() (assigned, running int)
	HeldByWorkflow() map[string]int
	// KeyHolders are the runs holding or parked, of the workflows given (nil: all).
	KeyHolders(workflows map[string]bool) []string
	// SlotWaiters are the runs parked for step slots, in park order; SlotKeysOf the
	// keys a run's step slots count against (checkpoint/slots.go).
	SlotWaiters() []checkpoint.SlotWaiter
	SlotKeysOf(run string) []checkpoint.SlotKey
	SlotHolders() []string
	// ReleaseCursor and Released give the runs that stopped holding since a cursor.
	ReleaseCursor() uint64
	Released(cursor uint64) (runs []string, next uint64, complete bool)
	QueuedRuns() int
	AssignedRuns() []string
	Workflows() ([]checkpoint.WorkflowVersion, error)
	Ticks(workflow string) ([]checkpoint.Tick, error)
	HighestTerm() int64
	// Schedule is a workflow's pause state (nil: never paused; checkpoint/operations.go).
	Schedule(workflow string) (*checkpoint.ScheduleState, error)
	// DueDeadlines gives the runs whose deadline passed unsucceeded (checkpoint/operations.go).
	DueDeadlines(now time.Time, limit int) ([]string, []checkpoint.DueTick, time.Time, error)
	// DueTimers gives the parked runs whose timer is due (checkpoint/wait.go).
	DueTimers(now time.Time, limit int) ([]checkpoint.Due, time.Time, error)
	Applied() uint64
	// ClusterVersion is the applied cluster version (checkpoint/cluster.go).
	ClusterVersion() int
	// ScheduleChanged is closed when a workflow or a tick is applied (cron wakes).
	ScheduleChanged() <-chan struct{}
}

var _ State = (*checkpoint.Store)(nil)

// Specs gives the decoded workflow versions (engine/internal/specs).
type Specs interface {
	Workflow(name string, version int) (*workflow.Workflow, error)
	OfRun(r *checkpoint.Run) (*workflow.Workflow, error)
}
