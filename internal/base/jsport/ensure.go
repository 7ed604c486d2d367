package jsport

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// EnsureStream returns the stream, creating it if it does not exist. It never updates
// an existing stream: on a cluster, two nodes updating and creating one replicated
// stream at the same moment were measured to time out together (both, every time).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, cfg.Name)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("streams: stream %s: %w", cfg.Name, err)
	}
	s, err = js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, cfg.Name) // another node created it first
	}
	if err != nil {
		return nil, fmt.Errorf("streams: create stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// EnsureKV returns the bucket, creating it if it does not exist. It never updates an
// existing bucket: a node's credential may not (an update can seal it), and a
// bucket that differs from cfg (a changed --lease-ttl) is Check's finding, mended by
// Repair on an admin path.
func EnsureKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("streams: bucket %s: %w", cfg.Bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("streams: create bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Replicas is the replica count for flow's streams and buckets on the server nc is
// connected to: the cluster's size, at most 3 (1 for a single server).
func Replicas(nc *nats.Conn) int {
	if nc.ConnectedClusterName() == "" {
		return 1
	}
	// Servers lists the URLs given and those the cluster announced: its members.
	return max(1, min(len(nc.Servers()), 3))
}
