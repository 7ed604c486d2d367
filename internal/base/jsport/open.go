package jsport

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// Options of Open.
type Options struct {
	// Replicas of every stream and bucket (Replicas(nc) gives the cluster's).
	Replicas int
	// TTL is the lease TTL: the leader and lease buckets' key TTL, the tasks' ack wait.
	TTL time.Duration
	// Admin is the admin path (nil: none): the term raise purges the leader bucket
	// through it.
	Admin  jetstream.JetStream
	Logger *slog.Logger
}

// Open opens (creating what is missing) every stream and bucket of a flow node and
// returns them as ports.
func Open(ctx context.Context, js jetstream.JetStream, o Options) (port.Ports, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var p port.Ports
	var err error
	if p.Log, err = OpenStream(ctx, js, LogConfig(o.Replicas)); err != nil {
		return p, fmt.Errorf("jsport: the log: %w", err)
	}
	if p.Leader, err = OpenKV(ctx, js, LeaderConfig(o.TTL, o.Replicas), log); err != nil {
		return p, err
	}
	if p.Leases, err = OpenKV(ctx, js, LeasesConfig(o.TTL, o.Replicas), log); err != nil {
		return p, err
	}
	if p.Tasks, err = OpenQueue(ctx, js, o.Replicas, o.TTL, log); err != nil {
		return p, err
	}
	if p.Nodes, err = OpenKV(ctx, js, NodesConfig(o.Replicas), log); err != nil {
		return p, err
	}
	if p.Cluster, err = OpenKV(ctx, js, ClusterConfig(o.Replicas), log); err != nil {
		return p, err
	}
	if p.Rates, err = OpenKV(ctx, js, RatesConfig(o.Replicas), log); err != nil {
		return p, err
	}
	if _, err := EnsureStream(ctx, js, DLQConfig(o.Replicas)); err != nil {
		return p, fmt.Errorf("jsport: the DLQ stream: %w", mapErr(err))
	}
	p.DLQ = Publisher{js}
	p.Snapshots = ObjectsOf(js, SnapshotsConfig(o.Replicas))
	if p.StepLogs, err = OpenStepLogs(ctx, js, o.Replicas); err != nil {
		return p, fmt.Errorf("jsport: the step logs' stream: %w", err)
	}
	admin := o.Admin
	if admin == nil {
		admin = js
	}
	p.Terms = termRaiser{admin}
	return p, nil
}

type termRaiser struct{ js jetstream.JetStream }

// RaiseTerms purges the leader bucket's stream below above+1, so that its next revision
// (the next term) is above every term the log applied.
func (r termRaiser) RaiseTerms(ctx context.Context, above int64) error {
	return RaiseTerms(ctx, r.js, above)
}

// RaiseTerms makes the leader bucket's next revision greater than above, through js
// (which must be allowed to purge the bucket: an admin path). epoch.Elector checks the
// range first.
func RaiseTerms(ctx context.Context, js jetstream.JetStream, above int64) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	s, err := js.Stream(ctx, "KV_"+port.LeaderBucket)
	if err != nil {
		return fmt.Errorf("jsport: raise terms: %w", mapErr(err))
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(uint64(above)+1)); err != nil {
		return fmt.Errorf("jsport: raise terms above %d: %w", above, mapErr(err))
	}
	return nil
}
