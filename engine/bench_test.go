package engine

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// The engine workloads of docs/perf.md, every step durably checkpointed (embedded
// JetStream with SyncAlways, on disk):
//
//	W1: 1,000 runs x 5 no-op steps, at most 64 runs in flight: steps/s, runs/s.
//	W2: 200 runs x 10 no-op steps, one run at a time: run latency p50/p99, step p50.
//
// Run: go test -run '^$' -bench 'W1|W2|Queued' -benchtime 1x ./engine

func benchEngine(b testing.TB, workers int) *Engine {
	format1 := os.Getenv("FLOW_BENCH_FORMAT") == "1"
	e := startEngine(b, func(c *Config) {
		c.Workers = workers
		c.Lease.TTL = 10 * time.Second
		// FLOW_BENCH_FORMAT=1: the cluster version held at 1, every message in log
		// format 1 (JSON), to compare with format 2 (issue 28; docs/perf.md).
		c.HoldClusterVersion = format1
	})
	if !format1 {
		if err := e.Ops().WaitClusterVersion(ctxT(b, 20*time.Second), checkpoint.LogFormatBinary); err != nil {
			b.Fatal(err)
		}
	}
	// FLOW_BENCH_NO_ADMISSION=1: admission off (the code before issue 12), to compare.
	e.hooks.NoAdmission.Store(os.Getenv("FLOW_BENCH_NO_ADMISSION") == "1")
	return e
}

// reportLogBytes reports the log's bytes per run (the stream's bytes, every message
// since the start, over runs).
func reportLogBytes(b *testing.B, e *Engine, runs int) {
	s, err := e.js.Stream(ctxT(b, 10*time.Second), logstream.DefaultStream)
	if err != nil {
		b.Fatal(err)
	}
	info, err := s.Info(ctxT(b, 10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(info.State.Bytes)/float64(runs), "log-B/run")
}

func BenchmarkW1(b *testing.B) {
	for i := 0; i < b.N; i++ {
		e := benchEngine(b, 64)
		apply(b, e, workflow.ChainYAML("w1", 5))
		ctx := ctxT(b, 10*time.Minute)
		const runs, inflight = 1000, 64
		sem := make(chan struct{}, inflight)
		var wg sync.WaitGroup
		start := time.Now()
		for r := 0; r < runs; r++ {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				id, err := e.StartRun(ctx, "w1", nil, RunOptions{})
				if err != nil {
					b.Error(err)
					return
				}
				if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusSucceeded {
					b.Errorf("run %s: %v %v", id, err, r)
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.ReportMetric(float64(runs*5)/elapsed.Seconds(), "steps/s")
		b.ReportMetric(float64(runs)/elapsed.Seconds(), "runs/s")
		b.ReportMetric(float64(peakRSS())/(1<<20), "peak-RSS-MiB")
		reportLogBytes(b, e, runs)
	}
}

func BenchmarkW2(b *testing.B) { benchW2(b, benchEngine(b, 8)) }

// BenchmarkW2Unsynced: W2 with the embedded server's fsync off (not durable): what a run
// costs besides the disk.
func BenchmarkW2Unsynced(b *testing.B) {
	benchW2(b, startEngine(b, func(c *Config) { c.Workers, c.Lease.TTL, c.unsynced = 8, 10*time.Second, true }))
}

// benchW2 runs W2 on e and reports run and step latency; with -v it also logs the median
// run event by event (milliseconds after StartRun was called), to see where the time goes.
func benchW2(b *testing.B, e *Engine) {
	type run struct {
		total time.Duration
		marks []string
	}
	for i := 0; i < b.N; i++ {
		apply(b, e, workflow.ChainYAML("w2", 10))
		ctx := ctxT(b, 10*time.Minute)
		runs := make([]run, 0, 200)
		var stepLat []time.Duration
		for r := 0; r < 200; r++ {
			start := time.Now()
			id, err := e.StartRun(ctx, "w2", nil, RunOptions{})
			if err != nil {
				b.Fatal(err)
			}
			returned := time.Since(start)
			if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusSucceeded {
				b.Fatalf("run %s: %v %v", id, err, r)
			}
			total := time.Since(start)
			v, _ := e.Run(id)
			marks := []string{fmt.Sprintf("StartRun returned %.2f", ms(returned))}
			var prev time.Time
			for _, ev := range v.Events {
				marks = append(marks, fmt.Sprintf("%s %s %.2f", ev.Kind, ev.Step, ms(ev.At.Sub(start))))
				if ev.Kind == checkpoint.KindCommit && ev.Outcome == "accepted" {
					if !prev.IsZero() {
						stepLat = append(stepLat, ev.At.Sub(prev))
					}
					prev = ev.At
				}
			}
			runs = append(runs, run{total, append(marks, fmt.Sprintf("WaitRun returned %.2f", ms(total)))})
		}
		slices.SortFunc(runs, func(x, y run) int { return int(x.total - y.total) })
		slices.Sort(stepLat)
		b.Logf("median run of %d:\n%s", len(runs), strings.Join(runs[len(runs)/2].marks, "\n"))
		b.ReportMetric(ms(runs[len(runs)/2].total), "run-p50-ms")
		b.ReportMetric(ms(runs[len(runs)*99/100].total), "run-p99-ms")
		b.ReportMetric(ms(stepLat[len(stepLat)/2]), "step-p50-ms")
		reportLogBytes(b, e, len(runs)*(i+1))
	}
}

// BenchmarkQueued: the memory one waiting run holds, with 10,000 runs queued behind a
// workflow concurrency limit of 1 (the first run sleeps).
func BenchmarkQueued(b *testing.B) {
	for i := 0; i < b.N; i++ {
		e := benchEngine(b, 8)
		apply(b, e, "name: q\nconcurrency: 1\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
		ctx := ctxT(b, 10*time.Minute)
		before := heap()
		const n = 10000
		sem := make(chan struct{}, 64)
		var wg sync.WaitGroup
		for r := 0; r < n; r++ {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if _, err := e.StartRun(ctx, "q", nil, RunOptions{}); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		after := heap()
		b.ReportMetric(float64(int64(after)-int64(before))/n/1024, "KiB/queued-run")
		b.ReportMetric(float64(peakRSS())/(1<<20), "peak-RSS-MiB")
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// peakRSS is the process's high-water resident set (VmHWM), in bytes.
func peakRSS() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

var _ = context.Background
