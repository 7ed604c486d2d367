// Package tasks is the task queue: the FLOW_TASKS work queue (port.Queue) from which
// every node's workers pull through one durable consumer. A task names a run and the
// epoch the leader assigned it; it is soft state, rebuilt from the log (the leader's
// reconcile queues again the task of a run assigned and not claimed). The stream's
// configuration and its cap are internal/base/jsport's.
package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/flowrun/flow/internal/base/ident"
	"github.com/flowrun/flow/internal/base/port"
)

// Task is a run's epoch, assigned by the leader, for a worker to take.
type Task struct {
	Run   string `json:"run"`
	Epoch int64  `json:"epoch"`
}

// ErrMalformed: a message on the queue is not a task of a run. Only the leader writes
// tasks, for runs of the state (whose IDs apply checked): anything else was forged or
// corrupted, and redelivering it would loop.
var ErrMalformed = errors.New("tasks: malformed task")

// Queue publishes tasks (the consumer is the port's: Consumer).
type Queue struct{ q port.Queue }

// New is the task queue on q.
func New(q port.Queue) *Queue { return &Queue{q: q} }

// msgID deduplicates a task: the same run and epoch queued twice within the queue's
// duplicate window is one task.
func msgID(t Task) string { return t.Run + "@" + strconv.FormatInt(t.Epoch, 10) }

// Publish queues a task and waits for the server's ack.
func (q *Queue) Publish(ctx context.Context, t Task) error {
	data, _ := json.Marshal(t)
	if err := q.q.Publish(ctx, msgID(t), data); err != nil {
		return fmt.Errorf("tasks: publish the task of %s: %w", t.Run, err)
	}
	return nil
}

// PublishAsync queues a task without waiting for its ack.
func (q *Queue) PublishAsync(t Task) (port.Ack, error) {
	data, _ := json.Marshal(t)
	f, err := q.q.PublishAsync(msgID(t), data)
	if err != nil {
		return nil, fmt.Errorf("tasks: publish the task of %s: %w", t.Run, err)
	}
	return f, nil
}

// Consumer is the workers' consumer, looked up (and made, with the queue, if missing)
// on every call.
func (q *Queue) Consumer(ctx context.Context) (port.Consumer, error) { return q.q.Consumer(ctx) }

// Decode reads a task, refusing anything but a run's epoch.
func Decode(data []byte) (Task, error) {
	var t Task
	if err := json.Unmarshal(data, &t); err != nil || !ident.ValidID(t.Run) || t.Epoch <= 0 {
		return Task{}, fmt.Errorf("%w: %q", ErrMalformed, data)
	}
	return t, nil
}
