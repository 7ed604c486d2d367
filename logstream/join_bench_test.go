package logstream

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/port"
)

// BenchmarkJoin measures how long a node with an empty data dir takes to start from the
// newest snapshot and the log after it, after R runs went through the log (R = 10,000
// and 200,000, or FLOW_JOIN_RUNS), with the ended runs retired as they age (a retention
// that keeps the last 1,000) or all kept; and, for comparison, a replay of the whole
// log. Each run is two messages (submit and assign; claim, commit, complete). The
// server does not fsync here: the subject is the join, not the disk (docs/perf.md).
//
//	go test -run '^$' -bench Join -benchtime 1x -timeout 1h ./logstream
func BenchmarkJoin(b *testing.B) {
	sizes := []int{10_000, 200_000}
	if s := os.Getenv("FLOW_JOIN_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		sizes = []int{n}
	}
	for _, runs := range sizes {
		for _, retire := range []bool{true, false} {
			b.Run(fmt.Sprintf("runs=%d/retention=%v", runs, retire), func(b *testing.B) {
				for range b.N {
					benchJoin(b, runs, retire)
				}
			})
		}
	}
}

func benchJoin(b *testing.B, runs int, retire bool) {
	dir := b.TempDir()
	env := startEnvSync(b, dir, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	const kept = 1000
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	entry := func(e checkpoint.Entry) []byte {
		e.At = at
		raw, err := json.Marshal(e)
		if err != nil {
			b.Fatal(err)
		}
		return raw
	}
	seq := uint64(0)
	compacted := false // the soak compacts as it goes: the whole log can no longer be replayed
	publish := func(version int, entries ...[]byte) {
		if _, err := env.js.PublishAsync(port.LogSubject, checkpoint.EncodeJSONEnvelope("bench", version, entries)); err != nil {
			b.Fatal(err)
		}
		seq++
	}
	for i := range runs {
		id := fmt.Sprintf("run-%07d", i)
		publish(1, entry(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Submit: &checkpoint.Submit{Workflow: "w", Version: 1,
			Trigger: checkpoint.TriggerManual, MaxEpochs: 3, Steps: []checkpoint.StepSpec{{Name: "a"}}}}),
			entry(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: id, Term: 1}))
		epoch := int64(seq)
		second := [][]byte{
			entry(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: id, Epoch: epoch, Owner: "w"}),
			entry(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: id, Step: "a", Item: checkpoint.ItemWhole, Epoch: epoch, Owner: "w", Output: json.RawMessage(`{"paid":12345}`)}),
			entry(checkpoint.Entry{Kind: checkpoint.KindComplete, Run: id, Epoch: epoch, Owner: "w", Status: checkpoint.StatusSucceeded}),
		}
		version := 1
		if retire && i >= kept {
			second = append(second, entry(checkpoint.Entry{Kind: checkpoint.KindRetire, Run: fmt.Sprintf("run-%07d", i-kept), Term: 1}))
			version = 2
		}
		publish(version, second...)
		if i%2000 == 0 {
			<-env.js.PublishAsyncComplete()
		}
		if retire && i > 0 && i%100_000 == 0 { // the soak: snapshot, compact, record the sizes
			<-env.js.PublishAsyncComplete()
			logBytes, stateBytes := compactAndMeasure(b, ctx, env, dir)
			compacted = true
			b.Logf("after %d runs: log %.1f MiB, state %.1f MiB", i, float64(logBytes)/(1<<20), float64(stateBytes)/(1<<20))
		}
	}
	<-env.js.PublishAsyncComplete()
	if err := env.log.Applier.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	if env.store.Applied() != seq {
		b.Fatalf("applied %d of %d", env.store.Applied(), seq)
	}
	// A replay of the whole log, for comparison (while it is whole).
	replay := time.Duration(0)
	if !compacted {
		began := time.Now()
		replayed := startLogOn(b, env, filepath.Join(dir, "replay"), "replay")
		if err := replayed.Applier.CatchUp(ctx); err != nil {
			b.Fatal(err)
		}
		replay = time.Since(began)
		replayed.Stop()
		replayed.Applier.Store().Close()
	}

	snap, _ := snapshotAndPurge(b, ctx, env)
	// The join: restore the newest snapshot, open the state, catch up.
	b.ResetTimer()
	began := time.Now()
	state := filepath.Join(dir, "joined")
	if err := PrepareState(ctx, logStream(env.js), snapshotsOf(env.js), state, env.log.Applier.log); err != nil {
		b.Fatal(err)
	}
	joined := startLogOn(b, env, state, "joined")
	if err := joined.Applier.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	join := time.Since(began)
	b.StopTimer()
	if _, err := joined.Applier.Store().Run(fmt.Sprintf("run-%07d", runs-1)); err != nil {
		b.Fatalf("the joined node lacks the last run: %v", err)
	}
	joined.Stop()
	joined.Applier.Store().Close()
	b.ReportMetric(float64(join.Milliseconds()), "join-ms")
	if replay > 0 {
		b.ReportMetric(float64(replay.Milliseconds()), "replay-ms")
	}
	b.ReportMetric(float64(snap.Size)/(1<<20), "snapshot-MiB")
	logBytes, stateBytes := compactAndMeasure(b, ctx, env, dir)
	b.ReportMetric(float64(logBytes)/(1<<20), "log-MiB")
	b.ReportMetric(float64(stateBytes)/(1<<20), "state-MiB")
}

// compactAndMeasure catches the node up, snapshots, purges the log below the snapshot
// and returns the log's and the state's sizes on disk.
func compactAndMeasure(b *testing.B, ctx context.Context, env *testEnv, dir string) (logBytes, stateBytes uint64) {
	b.Helper()
	if err := env.log.Applier.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	_, stream := snapshotAndPurge(b, ctx, env)
	info, err := stream.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	_ = filepath.Walk(filepath.Join(dir, "state"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			stateBytes += uint64(fi.Size())
		}
		return nil
	})
	return info.State.Bytes, stateBytes
}

// startLogOn opens a state in dir and a started Log over it.
func startLogOn(b *testing.B, env *testEnv, dir, node string) *Log {
	b.Helper()
	store, err := checkpoint.OpenStore(dir, checkpoint.StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	l, err := Open(testConfig(env.js, store, node))
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Start(ctx); err != nil {
		b.Fatal(err)
	}
	return l
}

// snapshotAndPurge writes a snapshot of the environment's node and purges the log below
// it, as the leader's compaction does with one node.
func snapshotAndPurge(b *testing.B, ctx context.Context, env *testEnv) (Snapshot, jetstream.Stream) {
	b.Helper()
	snap, err := env.log.Snapshots.Take(ctx)
	if err != nil {
		b.Fatal(err)
	}
	stream, err := env.js.Stream(ctx, DefaultStream)
	if err != nil {
		b.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(snap.Seq+1)); err != nil {
		b.Fatal(err)
	}
	return snap, stream
}
