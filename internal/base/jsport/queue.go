package jsport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// Queue is the task queue (port.Queue) on the FLOW_TASKS work-queue stream, pulled by
// every node's workers through one durable consumer.
type Queue struct {
	js       jetstream.JetStream
	replicas int
	ackWait  time.Duration
	log      *slog.Logger
}

var _ port.Queue = (*Queue)(nil)

// OpenQueue creates the stream and the consumer if needed. A task not acknowledged
// within ackWait (the lease TTL, at least a second) is delivered again.
func OpenQueue(ctx context.Context, js jetstream.JetStream, replicas int, ackWait time.Duration, log *slog.Logger) (*Queue, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q := &Queue{js: js, replicas: replicas, ackWait: max(ackWait, time.Second), log: log}
	if _, err := q.Consumer(ctx); err != nil {
		return nil, err
	}
	return q, nil
}

// Consumer implements port.Queue: looked up on every call, and created with its stream
// if missing (memory storage: an external NATS server that restarted comes back
// without it).
func (q *Queue) Consumer(ctx context.Context) (port.Consumer, error) {
	if err := EnsureTasks(ctx, q.js, q.replicas, TasksCap(ctx, q.js)); errors.Is(err, ErrCapNotSet) {
		q.log.Warn("the tasks stream keeps no size cap; leases share its memory budget (docs/decisions.md, Admission)", "err", err)
	} else if err != nil {
		return nil, mapErr(err)
	}
	cons, err := q.js.CreateOrUpdateConsumer(ctx, port.TasksStream, jetstream.ConsumerConfig{
		Durable:   port.TasksConsumer,
		AckPolicy: jetstream.AckExplicitPolicy,
		// A task's worker acks once it has claimed the epoch; an unacked task is
		// redelivered after AckWait (a worker that died mid-claim).
		AckWait:       q.ackWait,
		MaxAckPending: 100000,
	})
	if err != nil {
		return nil, fmt.Errorf("jsport: tasks consumer: %w", mapErr(err))
	}
	return consumer{cons}, nil
}

// Publish implements port.Queue.
func (q *Queue) Publish(ctx context.Context, msgID string, data []byte) error {
	_, err := q.js.Publish(ctx, port.TasksSubject, data, jetstream.WithMsgID(msgID))
	return mapErr(err)
}

// PublishAsync implements port.Queue.
func (q *Queue) PublishAsync(msgID string, data []byte) (port.Ack, error) {
	f, err := q.js.PublishAsync(port.TasksSubject, data, jetstream.WithMsgID(msgID))
	if err != nil {
		return nil, mapErr(err)
	}
	return ack{f}, nil
}

type ack struct{ f jetstream.PubAckFuture }

func (a ack) Wait(ctx context.Context) error {
	select {
	case <-a.f.Ok():
		return nil
	case err := <-a.f.Err():
		return mapErr(err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

type consumer struct{ c jetstream.Consumer }

func (c consumer) Fetch(ctx context.Context, n int, wait time.Duration) ([]port.Delivery, error) {
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	batch, err := c.c.Fetch(n, jetstream.FetchContext(fctx))
	if err != nil {
		return nil, mapErr(err)
	}
	var out []port.Delivery
	for msg := range batch.Messages() {
		out = append(out, delivery{msg})
	}
	// An empty fetch the server answered ends without an error; one it never answered
	// ends with the context's deadline: silence, not "nothing for you".
	if err := batch.Error(); err != nil && len(out) == 0 {
		return nil, mapErr(err)
	}
	return out, nil
}

type delivery struct{ m jetstream.Msg }

func (d delivery) Data() []byte                  { return d.m.Data() }
func (d delivery) Ack() error                    { return d.m.Ack() }
func (d delivery) Nak(delay time.Duration) error { return d.m.NakWithDelay(delay) }
func (d delivery) Term() error                   { return d.m.Term() }
