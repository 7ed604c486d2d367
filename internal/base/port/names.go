package port

import (
	"context"
	"encoding/base64"
	"time"
)

// Flow's streams and buckets, by name.
const (
	LogStream      = "FLOW_LOG"       // the checkpoint log
	LogSubject     = "flow.log"       // its one subject
	LeaderBucket   = "FLOW_LEADER"    // the leader key; its revisions are terms
	LeaseBucket    = "FLOW_LEASES"    // run leases, lapsing by the bucket's TTL
	TasksStream    = "FLOW_TASKS"     // the task queue
	TasksSubject   = "flow.tasks"     // its one subject
	TasksConsumer  = "workers"        // every node's workers pull through it
	NodesBucket    = "FLOW_NODES"     // each live node's applied sequence
	ClusterBucket  = "FLOW_CLUSTER"   // the cluster's roster and version
	DLQStream      = "FLOW_DLQ"       // dead-letter notices
	DLQSubject     = "flow.dlq."      // a notice's subject is this and the run's ID
	SnapshotBucket = "FLOW_SNAPSHOTS" // state snapshots (an object store)
	StepLogStream  = "FLOW_STEPLOGS"  // what steps printed
	EventsStream   = "FLOW_EVENTS"    // the messages of workflows' triggers (on:), on their own subjects
	RatesBucket    = "FLOW_RATES"     // each rate_limit key's next moment (engine/internal/rates)
	StepLogSubject = "flow.steplogs." // a run's records are on this and its ID (StepLogToken)
)

// Windows the shell relies on.
const (
	// LogDuplicates is how long the log deduplicates a message ID: a publish retried
	// within it is not appended twice (logstream's writer retries for far less).
	LogDuplicates = 2 * time.Minute
	// TaskDuplicates is the task queue's: a task queued again within it is dropped.
	TaskDuplicates = time.Minute
	// MinMarkerTTL is the least a lapse marker stays in a bucket: watchers must see it.
	MinMarkerTTL = time.Second
	// NodesReportTTL is how long a node's report in NodesBucket lives: a node silent
	// that long is not live.
	NodesReportTTL = time.Minute
)

// Ports is everything a flow node asks of NATS.
type Ports struct {
	Log       Stream
	Leader    KV // its revisions are the terms
	Leases    KV
	Tasks     Queue
	Nodes     KV
	Cluster   KV
	DLQ       Publisher
	Snapshots Objects
	// StepLogs keeps what steps printed (nil: nothing is kept).
	StepLogs StepLogs
	// Rates holds the rate limits' cells (nil: rate-limited steps pace on this node
	// alone, as a node of an older build would not know them at all).
	Rates KV
	// Terms raises the leader bucket's revisions (the admin path; nil: none).
	Terms TermRaiser
}

// TermRaiser makes the leader bucket's next revision, the next term, greater than
// above: a leader whose won term is below a term the log applied raises it so (the
// bucket was made anew, or a forged entry's term was accepted).
type TermRaiser interface {
	RaiseTerms(ctx context.Context, above int64) error
}

// StepLogToken is run's subject token under StepLogSubject: its ID in unpadded
// base64url, whose letters are all a subject token may hold (an ID's dots would split
// it, and a person chooses IDs).
func StepLogToken(run string) string { return base64.RawURLEncoding.EncodeToString([]byte(run)) }

type callTagKey struct{}

// WithCallTag names the calls made with ctx (a rate reservation's: its run, step, item
// and attempt). JetStream ignores it; the simulation orders calls made at one moment by
// what they ask, and two goroutines asking the same (three items reserving one key's
// moment) are told apart by it rather than by which the Go scheduler ran first.
func WithCallTag(ctx context.Context, tag string) context.Context {
	return context.WithValue(ctx, callTagKey{}, tag)
}

// CallTag is ctx's call tag ("" for none).
func CallTag(ctx context.Context) string {
	tag, _ := ctx.Value(callTagKey{}).(string)
	return tag
}
