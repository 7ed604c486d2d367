package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/natsnode"
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

func openTasks(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration) (jetstream.Consumer, error) {
	if _, err := natsnode.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:        tasksStream,
		Description: "flow tasks: runs assigned an epoch, for a worker to take",
		Subjects:    []string{tasksSubject},
		Retention:   jetstream.WorkQueuePolicy,
		// Memory storage: a task is soft state, rebuilt from the log (the reconciler
		// queues again the task of a run assigned but not claimed), so it needs no fsync.
		Storage:    jetstream.MemoryStorage,
		Replicas:   replicas,
		Duplicates: time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("engine: task stream: %w", err)
	}
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
