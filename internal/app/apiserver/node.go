package apiserver

import (
	"context"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/nats-io/nats.go"
)

// Node is what the API needs of the node it answers for, and all it may use, in the
// wire's own types (package client's) and plain Go ones: the engine's API adapter
// (*engine.API, from engine.Engine.API) implements it. Reads come from the node's state
// once CatchUp has returned; writes go through the engine, which writes them to the log.
//
// An error the API answers with a code of its own (not_found, bad_request, conflict) is
// a *client.Error with that code and message; any other error is answered as internal,
// with its own message.
type Node interface {
	// Hosting is what the service needs of the node that hosts it (engine.API.Hosting):
	// the connection to register on, the supervisor to run its part under, and how long
	// the part may hear nothing before it is registered again.
	Hosting() (*nats.Conn, *supervise.Supervisor, time.Duration)
	// Status is this node as cluster status lists it (without its Problems: the
	// server's supervisor has those).
	Status() client.Node
	// Cluster is the leader, its term and the log's bounds as this node reads them
	// (zero when it cannot), without the Nodes.
	Cluster(ctx context.Context) client.ClusterStatus
	// ForgetNode removes a node gone for good from the cluster's members (a live one:
	// conflict); HoldClusterVersion sets or releases the operator's hold for ctx's actor.
	ForgetNode(ctx context.Context, node string) error
	HoldClusterVersion(ctx context.Context, hold bool, reason string) error
	// DumpLog is a page of the log from a sequence (0: the first), decoded whatever
	// each message's format, only the entries about run if run is set.
	DumpLog(ctx context.Context, from uint64, run string, limit int) (client.LogPage, error)
	// CatchUp waits until this node has applied the log as it is now.
	CatchUp(ctx context.Context) error
	// Changed is closed when this node has applied more of the log.
	Changed() <-chan struct{}

	// ValidateWorkflow's error, if any, says why the file is not valid.
	ValidateWorkflow(file string, yaml []byte) (client.Workflow, error)
	ApplyWorkflow(ctx context.Context, file string, yaml []byte) (client.Workflow, error)
	// Workflows are the latest version of each workflow, with AppliedAt, without Source.
	Workflows() ([]client.Workflow, error)
	// Workflow is a version (0: the latest), with its Source.
	Workflow(name string, version int) (client.Workflow, error)
	// WorkflowSteps calls step with each step of a version (0: the latest), in order.
	WorkflowSteps(name string, version int, step func(name, uses string, needs []string, foreach bool)) error
	// Schedules are cron.list's answer: each next three fire times and last five ticks.
	Schedules() ([]client.CronEntry, error)
	// Ticks are a workflow's recorded fire times, oldest first.
	Ticks(workflow string) ([]client.Tick, error)

	// Limits are the concurrency keys in use as this node's state has them.
	Limits(ctx context.Context) (client.Limits, error)

	StartRun(ctx context.Context, workflow string, opts client.StartOptions) (string, error)
	// Run is a run with its steps, epochs and fenced commits.
	Run(id string) (client.Run, error)
	History(id string) ([]client.Event, error)
	// RunLogs is a page of what run's steps printed after cursor after (""; the first),
	// narrowed to a step ("": all), an item (nil: all) and an attempt (0: all).
	RunLogs(ctx context.Context, run, step string, item *int, attempt int, after string) (client.StepLogPage, error)
	Verify(id string) (client.Verification, error)
	// Runs is a page of runs without their steps, newest first by creation time (or
	// oldest), filtered, and the next page's cursor.
	Runs(opts client.ListOptions) (client.RunPage, error)
	RunsWithIDPrefix(prefix string, limit int) ([]client.Run, error)
	// WaitRun returns nil once the run has ended, an error if ctx ends first.
	WaitRun(ctx context.Context, id string) error
	Retry(ctx context.Context, id string) error
	Cancel(ctx context.Context, id, reason string) error
	Purge(ctx context.Context, id string) error
	// Signal sends a signal to a run that has not ended (a conflict if it has); the
	// sender is ctx's actor (internal/base/audit).
	Signal(ctx context.Context, id, name string, opts client.SignalOptions) error
	// SignalWithStart signals run id, starting it as a run of opts.Start with
	// opts.Inputs first if it does not exist; it says whether it did.
	SignalWithStart(ctx context.Context, id, name string, opts client.SignalOptions) (bool, error)
	// Decide approves or rejects an approval step of a run (step "": the one it waits
	// on, or its only one) for ctx's actor, and returns the step decided: a conflict for
	// a run that has ended or no such step, forbidden for a person who may not decide.
	Decide(ctx context.Context, id, step string, approve bool, comment string) (string, error)
	DrillZombie(ctx context.Context) (client.Drill, error)

	// RetryFrom retries a run that ended from a step (opts.From): the step and its
	// dependents run again, with opts.Inputs changed (strings, converted to the declared
	// types); From "" with no inputs is Retry. A run that has not ended is a conflict.
	RetryFrom(ctx context.Context, id string, opts client.RetryOptions) error
	// PauseSchedule and ResumeSchedule pause and resume a workflow's schedule for ctx's
	// actor; resuming a schedule that is not paused is a conflict.
	PauseSchedule(ctx context.Context, workflow, reason string) error
	ResumeSchedule(ctx context.Context, workflow string) error
	// NextTicks are the next n fire times of a workflow's schedule.
	NextTicks(workflow string, n int) ([]client.NextTick, error)
	// Backfill starts a run per tick of the range that has none (cron.backfill).
	Backfill(ctx context.Context, workflow string, opts client.BackfillOptions) ([]client.BackfillTick, error)

	// Snapshot writes a snapshot of this node's state now.
	Snapshot(ctx context.Context) (client.Snapshot, error)

	// CanRepair says whether this node has an admin path over flow's streams (it embeds
	// its NATS server; a node's credential has none). Only such a node serves
	// cluster.repair, so that the request reaches one that can.
	CanRepair() bool
	// RepairStreams mends flow's streams and buckets that were sealed or reconfigured
	// (with dryRun, only says what it would do).
	RepairStreams(ctx context.Context, dryRun bool) (client.Repair, error)
}
