package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/streams"
	"github.com/flowrun/flow/logstream"
)

// NodesBucket holds each live node's applied sequence, so that the leader never purges
// a message a live node still needs. A node that stops reporting for nodeReportTTL is
// not live: if the log is purged past it meanwhile, it restores a snapshot when it
// starts again.
const NodesBucket = "FLOW_NODES"

const (
	nodeReportEvery = 5 * time.Second
	nodeReportTTL   = time.Minute
)

// nodeReport is what a node says of itself in NodesBucket.
type nodeReport struct {
	Applied uint64    `json:"applied"`
	At      time.Time `json:"at"`
}

func openNodes(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	return streams.EnsureKV(ctx, js, jetstream.KeyValueConfig{Bucket: NodesBucket, TTL: nodeReportTTL,
		Description: "flow nodes' applied log sequences (compaction keeps what they need)", Storage: jetstream.MemoryStorage, Replicas: replicas})
}

// reportApplied puts this node's applied sequence in NodesBucket now and every
// nodeReportEvery until ctx ends.
func (e *Engine) reportApplied(ctx context.Context) {
	tick := time.NewTicker(nodeReportEvery)
	defer tick.Stop()
	for {
		e.putReport(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// putReport puts this node's applied sequence in NodesBucket.
func (e *Engine) putReport(ctx context.Context) {
	b, _ := json.Marshal(nodeReport{Applied: e.store.Applied(), At: time.Now().UTC()})
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.nodes.Put(pctx, e.cfg.NodeID, b); err != nil {
		e.log.Debug("report the applied sequence", "err", err)
	}
}

// liveApplied is the lowest applied sequence a live node reported, and whether any did.
func (e *Engine) liveApplied(ctx context.Context) (uint64, bool, error) {
	keys, err := e.nodes.ListKeys(ctx)
	if err != nil {
		return 0, false, err
	}
	low, any := uint64(0), false
	for k := range keys.Keys() {
		if k == e.cfg.NodeID {
			continue // this node's own applied sequence is read directly (compact)
		}
		entry, err := e.nodes.Get(ctx, k)
		if err != nil {
			continue // expired meanwhile
		}
		var r nodeReport
		if json.Unmarshal(entry.Value(), &r) != nil {
			continue
		}
		if !any || r.Applied < low {
			low, any = r.Applied, true
		}
	}
	return low, any, nil
}

// Snapshot writes a snapshot of this node's state now (flowctl cluster snapshot).
func (e *Engine) Snapshot(ctx context.Context) (logstream.Snapshot, error) {
	return e.clog.Snapshots.Take(ctx)
}

// LogBounds are the log's first and last sequences and the newest snapshot's (0: none).
func (e *Engine) LogBounds(ctx context.Context) (first, last, snapshot uint64, err error) {
	s, err := e.js.Stream(ctx, logstream.DefaultStream)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("engine: log bounds: %w", err)
	}
	info := s.CachedInfo()
	snaps, err := e.clog.Snapshots.List(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	if len(snaps) > 0 {
		snapshot = snaps[len(snaps)-1].Seq
	}
	return info.State.FirstSeq, info.State.LastSeq, snapshot, nil
}

// compact purges the log below the oldest sequence a live node still needs, and never
// past the newest snapshot: a node that needs more restores that snapshot. It returns
// the new first sequence (0 if nothing was purged).
func (e *Engine) compact(ctx context.Context, snapshotSeq uint64) (uint64, error) {
	low, any, err := e.liveApplied(ctx)
	if err != nil {
		return 0, fmt.Errorf("engine: compact: read the nodes' reports: %w", err)
	}
	keep := snapshotSeq + 1 // the first message a node restored from the snapshot needs
	if any {
		keep = min(keep, low+1)
	}
	keep = min(keep, e.store.Applied()+1) // and this node's own
	s, err := e.js.Stream(ctx, logstream.DefaultStream)
	if err != nil {
		return 0, fmt.Errorf("engine: compact: %w", err)
	}
	if keep <= s.CachedInfo().State.FirstSeq {
		return 0, nil
	}
	if killDuringPurge != "" {
		e.killDuringPurge(s, keep)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(keep)); err != nil {
		return 0, fmt.Errorf("engine: compact the log below %d: %w", keep, err)
	}
	e.log.Info("log compacted", "first_seq", keep, "snapshot_seq", snapshotSeq)
	return keep, nil
}

// killDuringPurge, set at link time (-ldflags "-X .../engine.killDuringPurge=1") and empty
// in every other build, makes the leader SIGKILL its own process while its first purge
// of the log is under way (with the embedded server, the server dies mid-purge too): the
// real-process test that a node still starts after a crash during a purge (clustertest
// TestCrashDuringSnapshotRestoreAndPurge).
var killDuringPurge string

func (e *Engine) killDuringPurge(s jetstream.Stream, keep uint64) {
	e.log.Warn("test build: this process kills itself during the purge (killDuringPurge)", "below", keep)
	go func() { _ = s.Purge(context.Background(), jetstream.WithPurgeSequence(keep)) }()
	// A jitter of up to a millisecond, so that repeated runs land at different points of
	// the purge: fault injection, not synchronisation.
	time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond))))
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// runSnapshots is the leader's snapshot duty: every SnapshotEvery applied messages it
// writes a snapshot and compacts the log; between snapshots it compacts again as the
// nodes' reports move (a node that was behind caught up), until ctx (the term) ends.
func (s *scheduler) runSnapshots(ctx context.Context) {
	e := s.e
	last := uint64(0)
	if snaps, err := e.clog.Snapshots.List(ctx); err == nil && len(snaps) > 0 {
		last = snaps[len(snaps)-1].Seq
	}
	tick := time.NewTicker(nodeReportEvery)
	defer tick.Stop()
	for {
		changed := e.clog.Applier.Changed()
		if e.store.Applied() >= last+e.cfg.SnapshotEvery {
			snap, err := e.Snapshot(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				e.log.Error("snapshot failed; trying again in a minute", "err", err)
				select { // a pause, so that a failing snapshot is not retried on every message
				case <-ctx.Done():
					return
				case <-time.After(time.Minute):
				}
				continue
			}
			last = snap.Seq
			s.compactTo(ctx, last)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
			if last > 0 {
				s.compactTo(ctx, last)
			}
		}
	}
}

func (s *scheduler) compactTo(ctx context.Context, snapshotSeq uint64) {
	if _, err := s.e.compact(ctx, snapshotSeq); err != nil && ctx.Err() == nil {
		s.e.log.Error("compaction failed; trying again later", "err", err)
	}
}

// retireBatch bounds the runs one retention pass retires (a message holds 256 entries).
const retireBatch = 1024

// retentionEvery is how often the leader looks for runs to retire: a tenth of the
// retention, between a second and ten minutes (a pass reads every ended run).
func (e *Engine) retentionEvery() time.Duration {
	return min(max(e.cfg.Retention/10, time.Second), 10*time.Minute)
}

// runRetention is the leader's retention duty: it writes, through the log, a retire
// entry for every run that ended (succeeded, failed, cancelled) longer than Retention
// ago, so that every node removes the same runs with their history. Dead-lettered runs
// stay until purged.
func (s *scheduler) runRetention(ctx context.Context) {
	tick := time.NewTicker(s.e.retentionEvery())
	defer tick.Stop()
	for {
		for s.retireOnce(ctx) == retireBatch { // a full pass: there may be more now
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// retireOnce retires up to retireBatch runs whose end is older than the retention and
// returns how many it asked to retire.
func (s *scheduler) retireOnce(ctx context.Context) int {
	cutoff := s.e.cfg.Now().Add(-s.e.cfg.Retention)
	var entries []checkpoint.Entry
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusSucceeded, checkpoint.StatusFailed, checkpoint.StatusCancelled} {
		err := s.e.store.EachRun(checkpoint.ListOptions{Status: st}, func(r *checkpoint.Run) bool {
			if r.UpdatedAt.Before(cutoff) {
				entries = append(entries, checkpoint.Entry{Kind: checkpoint.KindRetire, Run: r.ID})
			}
			return len(entries) < retireBatch && ctx.Err() == nil
		})
		if err != nil || len(entries) >= retireBatch {
			break
		}
	}
	asked := len(entries)
	for len(entries) > 0 && ctx.Err() == nil {
		n := min(len(entries), 256)
		batch := entries[:n]
		entries = entries[n:]
		if err := s.term.Check(); err != nil {
			return 0
		}
		for i := range batch {
			batch[i].Term, batch[i].Owner = s.term.Term(), s.e.cfg.NodeID
		}
		if err := s.e.clog.Writer.Write(ctx, batch...).Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrConflict) && !errors.Is(err, checkpoint.ErrNotFound) {
			s.e.log.Error("retention: retire runs", "err", err)
			return 0
		}
	}
	if asked > 0 {
		s.e.log.Info("retention: retired runs that ended before the cutoff", "runs", asked, "cutoff", cutoff)
	}
	return asked
}
