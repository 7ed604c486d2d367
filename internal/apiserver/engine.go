package apiserver

import (
	"context"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// Engine is what the API needs of a node, and all it may use: *engine.Engine
// implements it. Reads come from this node's state once CatchUp has returned; writes go
// through the engine, which writes them to the log.
type Engine interface {
	NodeID() string
	// Applied is the log sequence this node's state has applied.
	Applied() uint64
	// CatchUp waits until this node has applied the log as it is now.
	CatchUp(ctx context.Context) error
	IsLeader() bool
	// LeasesDegraded says whether a lease this node holds goes unrenewed.
	LeasesDegraded() bool
	// Leader is the leader the leader key names, with its term.
	Leader(ctx context.Context) (epoch.Leader, error)

	ValidateWorkflow(file string, data []byte) (*workflow.Workflow, error)
	ApplyWorkflow(ctx context.Context, file string, data []byte) (*workflow.Workflow, error)
	Workflows() ([]checkpoint.WorkflowVersion, error)
	Workflow(name string, version int) (*workflow.Workflow, error)
	Ticks(workflow string) ([]checkpoint.Tick, error)

	StartRun(ctx context.Context, workflow string, inputs map[string]any, opts engine.RunOptions) (string, error)
	Run(id string) (*checkpoint.RunView, error)
	ListRuns(opts checkpoint.ListOptions) ([]checkpoint.Run, string, error)
	RunsNewest(opts checkpoint.NewestOptions) ([]checkpoint.Run, string, error)
	RunsWithIDPrefix(prefix string, limit int) ([]checkpoint.Run, error)
	WaitRun(ctx context.Context, id string) (*checkpoint.Run, error)
	Retry(ctx context.Context, id string) error
	Cancel(ctx context.Context, id, reason string) error
	Purge(ctx context.Context, id string) error
	DrillZombie(ctx context.Context) (*checkpoint.RunView, error)

	// Snapshot writes a snapshot of this node's state now.
	Snapshot(ctx context.Context) (logstream.Snapshot, error)
	// LogBounds are the log's first and last sequences and the newest snapshot's.
	LogBounds(ctx context.Context) (first, last, snapshot uint64, err error)
	// Changed is closed when this node has applied more of the log.
	Changed() <-chan struct{}
}

var _ Engine = (*engine.Engine)(nil)
