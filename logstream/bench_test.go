package logstream

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
)

// The benchmarks measure the end-to-end commit (publish -> apply -> await) beside the
// floor measured in the same run: one synced JetStream publish per entry, and one synced
// Pebble batch per entry. docs/perf.md has the numbers and how to read them.

var writerCounts = []int{1, 64}

// parallel runs n operations on w goroutines and reports ops/s and latency quantiles.
func parallel(b *testing.B, w int, op func(i int) error) {
	b.Helper()
	var next atomic.Int64
	lat := make([][]time.Duration, w)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				t := time.Now()
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
				lat[g] = append(lat[g], time.Since(t))
			}
		}(g)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkCommit: a foreach step's items committed through the Log by w writers.
func BenchmarkCommit(b *testing.B) { benchCommit(b, true) }

// BenchmarkCommitUnsynced: the same with the server's fsync off (not durable): the
// ceiling of the log path on the machine, to show how much of a commit is the fsync.
func BenchmarkCommitUnsynced(b *testing.B) { benchCommit(b, false) }

func benchCommit(b *testing.B, synced bool) {
	for _, w := range writerCounts {
		b.Run(fmt.Sprintf("writers=%d", w), func(b *testing.B) {
			env := startEnvSync(b, b.TempDir(), synced)
			ctx := context.Background()
			mustWrite := func(e checkpoint.Entry) uint64 {
				seq, err := write(ctx, env.log.Writer, e)
				if err != nil {
					b.Fatal(err)
				}
				return seq
			}
			// FLOW_BENCH_FORMAT=1: log format 1 (JSON); otherwise the cluster version is
			// raised first and the commits are in format 2 (issue 28; docs/perf.md).
			if os.Getenv("FLOW_BENCH_FORMAT") != "1" {
				mustWrite(checkpoint.Entry{Kind: checkpoint.KindClusterVersion, ClusterVersion: checkpoint.LogFormatBinary, Term: 1, Owner: "leader"})
			}
			mustWrite(submitEntry("bench", checkpoint.StepSpec{Name: "each", Foreach: true}))
			epoch := int64(mustWrite(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "bench", Term: 1}))
			mustWrite(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "bench", Epoch: epoch, Owner: "w"})
			out := json.RawMessage(`{"driver":"d-000123","cents":123456}`)
			cpu := processCPU()
			parallel(b, w, func(i int) error {
				return env.log.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "bench", Step: "each", Item: i, Epoch: epoch, Owner: "w", Output: out}).Await(ctx)
			})
			b.ReportMetric(float64(b.N)/float64(max(env.store.Applied(), 1)), "entries/msg")
			// The process's CPU (the writer, the applier and the embedded server) per entry.
			b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-us/entry")
		})
	}
}

// BenchmarkFloorSyncedPublish: one synced JetStream publish (SyncAlways, R1 file
// store, in process) per entry, the shape a log without group commit would have.
func BenchmarkFloorSyncedPublish(b *testing.B) {
	for _, w := range writerCounts {
		b.Run(fmt.Sprintf("writers=%d", w), func(b *testing.B) {
			env := startEnv(b, b.TempDir())
			ctx := context.Background()
			if _, err := env.js.CreateStream(ctx, jetstream.StreamConfig{Name: "FLOOR", Subjects: []string{"floor"}, Storage: jetstream.FileStorage}); err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 128)
			parallel(b, w, func(int) error {
				_, err := env.js.Publish(ctx, "floor", payload)
				return err
			})
		})
	}
}

// BenchmarkFloorPebbleSynced: one synced Pebble batch of ~100 bytes per entry.
func BenchmarkFloorPebbleSynced(b *testing.B) {
	for _, w := range writerCounts {
		b.Run(fmt.Sprintf("writers=%d", w), func(b *testing.B) {
			db, err := pebble.Open(filepath.Join(b.TempDir(), "floor"), &pebble.Options{FormatMajorVersion: pebble.FormatValueSeparation, Logger: pebble.DefaultLogger})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			val := make([]byte, 100)
			parallel(b, w, func(i int) error {
				batch := db.NewBatch()
				defer batch.Close()
				_ = batch.Set(binary.BigEndian.AppendUint64([]byte("k"), uint64(i)), val, nil)
				return batch.Commit(pebble.Sync)
			})
		})
	}
}

// processCPU is the CPU time this process used so far (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
