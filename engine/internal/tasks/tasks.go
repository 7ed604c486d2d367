// Package tasks is the task queue: one JetStream work-queue stream, FLOW_TASKS, from
// which every node's workers pull through one durable consumer. A task names a run and
// the epoch the leader assigned it; it is soft state, rebuilt from the log (the leader's
// reconcile queues again the task of a run assigned and not claimed).
package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/ident"
	"github.com/flowrun/flow/internal/base/streams"
)

// Names of the queue.
const (
	Stream   = "FLOW_TASKS"
	Subject  = "flow.tasks"
	Consumer = "workers"
)

// Task is a run's epoch, assigned by the leader, for a worker to take.
type Task struct {
	Run   string `json:"run"`
	Epoch int64  `json:"epoch"`
}

// MaxBytes caps FLOW_TASKS. Tasks and leases both live in JetStream memory storage,
// whose budget the server checks against what is actually stored (64 MiB on the
// embedded server): a tasks stream without a cap could take it all, and every lease
// write would then fail with "insufficient resources" (issue 12). Admission keeps tasks
// to a few per worker slot, ~150 bytes each; the cap is the guard behind it, and what
// it leaves is the leases' own budget. A publish past it is refused (DiscardNew) and the
// reconcile queues the task again later. docs/decisions.md.
const MaxBytes int64 = 8 << 20

// ErrCapNotSet: an existing tasks stream could not be given its cap (for instance
// while it holds more than the cap, during an upgrade under a backlog).
var ErrCapNotSet = errors.New("tasks: the tasks stream's size cap could not be set")

// ErrMalformed: a message on the queue is not a task of a run. Only the leader writes
// tasks, for runs of the state (whose IDs apply checked): anything else was forged or
// corrupted, and redelivering it would loop.
var ErrMalformed = errors.New("tasks: malformed task")

// Cap is the cap for this server: MaxBytes, or an eighth of the account's memory
// limit when that is smaller (an external NATS with a tight budget).
func Cap(ctx context.Context, js jetstream.JetStream) int64 {
	info, err := js.AccountInfo(ctx)
	if err != nil || info.Limits.MaxMemory <= 0 {
		return MaxBytes
	}
	return max(min(MaxBytes, info.Limits.MaxMemory/8), 64<<10)
}

// Queue publishes and consumes tasks.
type Queue struct {
	js       jetstream.JetStream
	replicas int
	ttl      time.Duration
	log      *slog.Logger
}

// Open creates the stream (capped) and the consumer if needed. ttl is the lease TTL:
// a worker that dies before it acks a task leaves it to be redelivered after it.
func Open(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration, log *slog.Logger) (*Queue, error) {
	q := &Queue{js: js, replicas: replicas, ttl: ttl, log: log}
	if _, err := q.Consumer(ctx); err != nil {
		return nil, err
	}
	return q, nil
}

// Consumer makes sure the stream and the workers' consumer exist and returns the
// consumer (the task fetcher looks it up again after a restart: an external NATS
// server that restarted comes back without memory streams).
func (q *Queue) Consumer(ctx context.Context) (jetstream.Consumer, error) {
	if err := EnsureStream(ctx, q.js, q.replicas, Cap(ctx, q.js)); errors.Is(err, ErrCapNotSet) {
		// The node can still work: the cap is a guard behind admission, not the
		// mechanism. Refusing to start would turn an upgrade into an outage.
		q.log.Warn("the tasks stream keeps no size cap; leases share its memory budget (docs/decisions.md, Admission)", "err", err)
	} else if err != nil {
		return nil, err
	}
	cons, err := q.js.CreateOrUpdateConsumer(ctx, Stream, jetstream.ConsumerConfig{
		Durable:   Consumer,
		AckPolicy: jetstream.AckExplicitPolicy,
		// A worker acks once it has claimed the run; one that dies before that leaves
		// the task to be redelivered after a lease TTL.
		AckWait:       max(q.ttl, time.Second),
		MaxAckPending: 100000,
	})
	if err != nil {
		return nil, fmt.Errorf("tasks: consumer: %w", err)
	}
	return cons, nil
}

// StreamConfig is the tasks stream with the cap maxBytes (<= 0: none, for the negative
// control of the cap's test).
func StreamConfig(replicas int, maxBytes int64) jetstream.StreamConfig {
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "flow tasks: runs assigned an epoch, for a worker to take",
		Subjects:    []string{Subject},
		Retention:   jetstream.WorkQueuePolicy,
		// Memory storage: a task is soft state, rebuilt from the log (the reconciler
		// queues again the task of a run assigned but not claimed), so it needs no fsync.
		Storage:    jetstream.MemoryStorage,
		Replicas:   replicas,
		Duplicates: time.Minute,
		MaxBytes:   maxBytes,
		Discard:    jetstream.DiscardNew,
	}
}

// EnsureStream creates the tasks stream with the cap maxBytes if it does not exist. It
// never updates one: a node may not (an update can seal it: issue 36). A stream made
// before the cap, or one whose cap was changed, is the engine's check's finding, and
// an admin path sets the cap (streams.Repair; flowd embedding its server does it at
// start). ErrCapNotSet says the stream has another cap.
func EnsureStream(ctx context.Context, js jetstream.JetStream, replicas int, maxBytes int64) error {
	cfg := StreamConfig(replicas, maxBytes)
	s, err := streams.EnsureStream(ctx, js, cfg)
	if err != nil {
		return fmt.Errorf("tasks: stream: %w", err)
	}
	if info := s.CachedInfo(); info != nil && (info.Config.MaxBytes != cfg.MaxBytes || info.Config.Discard != cfg.Discard) {
		return fmt.Errorf("%w: it has max bytes %d and discard %v (run `%s`)", ErrCapNotSet, info.Config.MaxBytes, info.Config.Discard, streams.RepairCommand)
	}
	return nil
}

// msgID makes a repeat of a task (the same run and epoch) a no-op within the stream's
// duplicate window.
func msgID(t Task) string { return t.Run + "@" + strconv.FormatInt(t.Epoch, 10) }

// Publish queues a task and waits for the server's ack.
func (q *Queue) Publish(ctx context.Context, t Task) error {
	data, _ := json.Marshal(t)
	if _, err := q.js.Publish(ctx, Subject, data, jetstream.WithMsgID(msgID(t))); err != nil {
		return fmt.Errorf("tasks: publish the task of %s: %w", t.Run, err)
	}
	return nil
}

// PublishAsync queues a task without waiting for its ack.
func (q *Queue) PublishAsync(t Task) (jetstream.PubAckFuture, error) {
	data, _ := json.Marshal(t)
	f, err := q.js.PublishAsync(Subject, data, jetstream.WithMsgID(msgID(t)))
	if err != nil {
		return nil, fmt.Errorf("tasks: publish the task of %s: %w", t.Run, err)
	}
	return f, nil
}

// Decode reads a task message (ErrMalformed if it is not one).
func Decode(data []byte) (Task, error) {
	var t Task
	if err := json.Unmarshal(data, &t); err != nil || !ident.ValidID(t.Run) || t.Epoch <= 0 {
		return Task{}, fmt.Errorf("%w: %q", ErrMalformed, data)
	}
	return t, nil
}
