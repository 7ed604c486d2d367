package jsport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// Flow's streams and buckets as a node creates them. A node never updates one that
// exists (EnsureStream, EnsureKV): one that differs is the engine's finding (Check),
// mended on an admin path (Repair).

// LogConfig is the checkpoint log: file storage, synced by the server, deduplicated by
// the writer's message IDs for port.LogDuplicates.
func LogConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        port.LogStream,
		Description: "flow checkpoint log: every change to run state, in order",
		Subjects:    []string{port.LogSubject},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    max(replicas, 1),
		Duplicates:  port.LogDuplicates,
	}
}

// leaseLike is a bucket whose keys lapse TTL after their last write, leaving a marker
// that watchers see as a purge (port.OpPurge).
func leaseLike(name string, ttl time.Duration, replicas int, storage jetstream.StorageType) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         name,
		Description:    "flow ownership: keys lapse when their holder stops renewing",
		History:        1,
		TTL:            ttl,
		LimitMarkerTTL: max(port.MinMarkerTTL, ttl),
		Storage:        storage,
		Replicas:       max(replicas, 1),
	}
}

// LeaderConfig is the leader bucket for a lease TTL: file storage, so that its
// revisions (the terms) survive a server's restart.
func LeaderConfig(ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	return leaseLike(port.LeaderBucket, ttl, replicas, jetstream.FileStorage)
}

// LeasesConfig is the run leases' bucket for a lease TTL (memory storage).
func LeasesConfig(ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	return leaseLike(port.LeaseBucket, ttl, replicas, jetstream.MemoryStorage)
}

// NodesReportTTL is port.NodesReportTTL.
const NodesReportTTL = port.NodesReportTTL

// NodesConfig is the nodes' reports bucket.
func NodesConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: port.NodesBucket, TTL: NodesReportTTL,
		Description: "flow nodes' applied log sequences (compaction keeps what they need)", Storage: jetstream.MemoryStorage, Replicas: max(replicas, 1)}
}

// ClusterConfig is the cluster's roster bucket (file storage, no expiry: a member stays
// until it is forgotten).
func ClusterConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: port.ClusterBucket, History: 1,
		Description: "flow's cluster roster: each node's log formats, and the promised cluster version",
		Storage:     jetstream.FileStorage, Replicas: max(replicas, 1)}
}

// RatesConfig is the rate limits' bucket: one entry per key, its next moment (file
// storage: a cluster restarted does not forget the moments it reserved ahead).
func RatesConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: port.RatesBucket, History: 64, // a reservation reads its own write back after others wrote
		Description: "flow rate limits: each key's next moment a rate-limited step may start",
		Storage:     jetstream.FileStorage, Replicas: max(replicas, 1)}
}

// DLQConfig is the dead-letter notices' stream.
func DLQConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        port.DLQStream,
		Description: "flow dead-letter notices: runs past max_epochs",
		Subjects:    []string{port.DLQSubject + ">"},
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Duplicates:  24 * time.Hour,
		MaxAge:      30 * 24 * time.Hour,
	}
}

// SnapshotsConfig is the snapshots' object store.
func SnapshotsConfig(replicas int) jetstream.ObjectStoreConfig {
	return jetstream.ObjectStoreConfig{Bucket: port.SnapshotBucket,
		Description: "flow state snapshots: the state at a log sequence", Storage: jetstream.FileStorage, Replicas: max(replicas, 1)}
}

// TasksMaxBytes caps FLOW_TASKS. Tasks and leases both live in JetStream memory storage,
// whose budget the server checks against what is actually stored (64 MiB on the
// embedded server): a tasks stream without a cap could take it all, and every lease
// write would then fail with "insufficient resources". Admission keeps tasks
// to a few per worker slot, ~150 bytes each; the cap is the guard behind it, and what
// it leaves is the leases' own budget. A publish past it is refused (DiscardNew) and the
// reconcile queues the task again later. docs/decisions.md.
const TasksMaxBytes int64 = 8 << 20

// ErrCapNotSet: an existing tasks stream could not be given its cap (for instance
// while it holds more than the cap, during an upgrade under a backlog).
var ErrCapNotSet = errors.New("jsport: the tasks stream's size cap could not be set")

// TasksCap is the tasks stream's cap on this server: TasksMaxBytes, or an eighth of the
// account's memory when that is less (at least 64 KiB).
func TasksCap(ctx context.Context, js jetstream.JetStream) int64 {
	info, err := js.AccountInfo(ctx)
	if err != nil || info.Limits.MaxMemory <= 0 {
		return TasksMaxBytes
	}
	return max(min(TasksMaxBytes, info.Limits.MaxMemory/8), 64<<10)
}

// TasksConfig is the task queue: a work queue in memory storage, deduplicated by task
// (run and epoch) for port.TaskDuplicates, capped at maxBytes (<= 0: no cap).
func TasksConfig(replicas int, maxBytes int64) jetstream.StreamConfig {
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        port.TasksStream,
		Description: "flow tasks: runs assigned an epoch, for a worker to take",
		Subjects:    []string{port.TasksSubject},
		Retention:   jetstream.WorkQueuePolicy,
		// Memory: a task is soft state (the reconcile queues it again from the log).
		Storage:    jetstream.MemoryStorage,
		Replicas:   max(replicas, 1),
		Duplicates: port.TaskDuplicates,
		MaxBytes:   maxBytes,
		Discard:    jetstream.DiscardNew,
	}
}

// EnsureTasks creates the tasks stream if needed, and says (ErrCapNotSet) when an
// existing one lacks its cap: a node may not update it; cluster repair does.
func EnsureTasks(ctx context.Context, js jetstream.JetStream, replicas int, maxBytes int64) error {
	cfg := TasksConfig(replicas, maxBytes)
	s, err := EnsureStream(ctx, js, cfg)
	if err != nil {
		return fmt.Errorf("jsport: tasks stream: %w", err)
	}
	if info := s.CachedInfo(); info != nil && (info.Config.MaxBytes != cfg.MaxBytes || info.Config.Discard != cfg.Discard) {
		return fmt.Errorf("%w: it has max bytes %d and discard %v (run `%s`)", ErrCapNotSet, info.Config.MaxBytes, info.Config.Discard, RepairCommand)
	}
	return nil
}

// StepLogsConfig is the stream of what steps printed: one subject per run (removed with
// the run by the leader's retention), file storage, messages older than StepLogsMaxAge
// dropped (a backstop for a removal that failed). No byte cap: JetStream reserves a
// stream's max_bytes against the server's storage limit at creation, and a cap large
// enough for a busy cluster is refused outright by a server with a smaller limit
// ("insufficient storage"), which would keep flowd from starting. Each step attempt's
// part is bounded by the writer (steplog.Config.Limit); the server's own limit
// (max_file_store) bounds the whole.
func StepLogsConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        port.StepLogStream,
		Description: "flow step logs: what each step attempt printed, by run",
		Subjects:    []string{port.StepLogSubject + ">"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      StepLogsMaxAge,
		Replicas:    max(replicas, 1),
		Duplicates:  port.LogDuplicates,
	}
}

// StepLogsMaxAge is how long FLOW_STEPLOGS keeps a message at most: 90 days, three
// times the default retention of runs.
const StepLogsMaxAge = 90 * 24 * time.Hour

// EventsMaxAge is how long FLOW_EVENTS keeps a message: longer than any outage a
// trigger's messages should outlive; a message is consumed once its run is in the log.
const EventsMaxAge = 7 * 24 * time.Hour

// EventsConfig is FLOW_EVENTS: the subjects of the workflows' triggers that name no
// stream of their own (engine/triggers.go keeps the list), file storage, a week of
// messages at most, JetStream's de-duplication by Nats-Msg-Id within its window.
func EventsConfig(replicas int, subjects []string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        port.EventsStream,
		Description: "flow events: messages that start or signal runs (workflows' on: triggers)",
		Subjects:    subjects,
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      EventsMaxAge,
		MaxBytes:    1 << 30,
		Replicas:    max(replicas, 1),
	}
}
