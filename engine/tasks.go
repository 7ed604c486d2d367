package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/streams"
)

// The task queue: one JetStream work-queue stream; every node's workers pull from one
// durable consumer. A task names a run and the epoch the leader assigned it.
const (
	tasksStream   = "FLOW_TASKS"
	tasksSubject  = "flow.tasks"
	tasksConsumer = "workers"
)

type task struct {
	Run   string `json:"run"`
	Epoch int64  `json:"epoch"`
}

// tasksMaxBytes caps FLOW_TASKS. Tasks and leases both live in JetStream memory
// storage, whose budget the server checks against what is actually stored (64 MiB on
// the embedded server): a tasks stream without a cap could take it all, and every lease
// write would then fail with "insufficient resources" (issue 12). Admission keeps tasks
// to a few per worker slot, ~150 bytes each; the cap is the guard behind it, and what
// it leaves is the leases' own budget. A publish past it is refused (DiscardNew) and the
// reconcile queues the task again later. docs/decisions.md.
const tasksMaxBytes int64 = 8 << 20

// errTasksCapNotSet: an existing tasks stream could not be given its cap (for instance
// while it holds more than the cap, during an upgrade under a backlog).
var errTasksCapNotSet = errors.New("engine: the tasks stream's size cap could not be set")

// tasksCap is the cap for this server: tasksMaxBytes, or an eighth of the account's
// memory limit when that is smaller (an external NATS with a tight budget).
func tasksCap(ctx context.Context, js jetstream.JetStream) int64 {
	info, err := js.AccountInfo(ctx)
	if err != nil || info.Limits.MaxMemory <= 0 {
		return tasksMaxBytes
	}
	return max(min(tasksMaxBytes, info.Limits.MaxMemory/8), 64<<10)
}

func openTasks(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration, log *slog.Logger) (jetstream.Consumer, error) {
	if err := ensureTasksStream(ctx, js, replicas, tasksCap(ctx, js)); errors.Is(err, errTasksCapNotSet) {
		// The node can still work: the cap is a guard behind admission, not the
		// mechanism. Refusing to start would turn an upgrade into an outage.
		log.Warn("the tasks stream keeps no size cap; leases share its memory budget (docs/decisions.md, Admission)", "err", err)
	} else if err != nil {
		return nil, err
	}
	return openTasksConsumer(ctx, js, ttl)
}

// ensureTasksStream creates the tasks stream with the cap maxBytes (<= 0: none, for
// the negative control of the cap's test), or sets the cap on an existing stream made
// before it had one.
func ensureTasksStream(ctx context.Context, js jetstream.JetStream, replicas int, maxBytes int64) error {
	if maxBytes <= 0 {
		maxBytes = -1
	}
	cfg := jetstream.StreamConfig{
		Name:        tasksStream,
		Description: "flow tasks: runs assigned an epoch, for a worker to take",
		Subjects:    []string{tasksSubject},
		Retention:   jetstream.WorkQueuePolicy,
		// Memory storage: a task is soft state, rebuilt from the log (the reconciler
		// queues again the task of a run assigned but not claimed), so it needs no fsync.
		Storage:    jetstream.MemoryStorage,
		Replicas:   replicas,
		Duplicates: time.Minute,
		MaxBytes:   maxBytes,
		Discard:    jetstream.DiscardNew,
	}
	s, err := streams.EnsureStream(ctx, js, cfg)
	if err != nil {
		return fmt.Errorf("engine: task stream: %w", err)
	}
	if info := s.CachedInfo(); info != nil && (info.Config.MaxBytes != cfg.MaxBytes || info.Config.Discard != cfg.Discard) {
		// A stream from before the cap (EnsureStream never updates): set it once.
		info.Config.MaxBytes, info.Config.Discard = cfg.MaxBytes, cfg.Discard
		if _, err := js.UpdateStream(ctx, info.Config); err != nil {
			return fmt.Errorf("%w: %w", errTasksCapNotSet, err)
		}
	}
	return nil
}

func openTasksConsumer(ctx context.Context, js jetstream.JetStream, ttl time.Duration) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, tasksStream, jetstream.ConsumerConfig{
		Durable:   tasksConsumer,
		AckPolicy: jetstream.AckExplicitPolicy,
		// A worker acks once it has claimed the run; one that dies before that leaves
		// the task to be redelivered after a lease TTL.
		AckWait:       max(ttl, time.Second),
		MaxAckPending: 100000,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: task consumer: %w", err)
	}
	return cons, nil
}

// publishTask queues a task; the message ID (run and epoch) makes a repeat a no-op.
func publishTask(ctx context.Context, js jetstream.JetStream, t task) error {
	data, _ := json.Marshal(t)
	_, err := js.Publish(ctx, tasksSubject, data, jetstream.WithMsgID(t.Run+"@"+strconv.FormatInt(t.Epoch, 10)))
	if err != nil {
		return fmt.Errorf("engine: publish task for %s: %w", t.Run, err)
	}
	return nil
}

// publishTaskAsync queues a task without waiting for its ack.
func publishTaskAsync(js jetstream.JetStream, t task) (jetstream.PubAckFuture, error) {
	data, _ := json.Marshal(t)
	f, err := js.PublishAsync(tasksSubject, data, jetstream.WithMsgID(t.Run+"@"+strconv.FormatInt(t.Epoch, 10)))
	if err != nil {
		return nil, fmt.Errorf("engine: publish task for %s: %w", t.Run, err)
	}
	return f, nil
}
