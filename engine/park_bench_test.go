package engine

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// BenchmarkParked is issue 26's measurement (docs/perf.md, not a timed test):
// FLOW_PARKED_RUNS (default 2,000; the figure is 100,000) runs of a workflow
// that waits for a signal, started 64 at a time on one node with 64 workers, until all
// are parked; then the leases and tasks held (both must be 0) and the process's peak
// RSS; then every run signalled, 64 at a time: signals/s (accepted by the log) and
// resumes/s (the runs' ends after their signals), with W1 measured on the same node
// after it.
//
// Run: FLOW_PARKED_RUNS=100000 go test -run '^$' -bench Parked -benchtime 1x -timeout 2h -v ./engine
func BenchmarkParked(b *testing.B) {
	n := 2000
	if v := os.Getenv("FLOW_PARKED_RUNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 100 {
			b.Fatalf("FLOW_PARKED_RUNS=%q: use a whole number of at least 100", v)
		}
	}
	for i := 0; i < b.N; i++ {
		e := benchEngine(b, 64)
		apply(b, e, "name: parked\nsteps:\n  - {name: w, uses: wait, with: {signal: go}}\n  - {name: after, needs: [w], uses: noop}\n")
		ctx := ctxT(b, 2*time.Hour)
		ids := make([]string, n)
		start := time.Now()
		each(b, n, func(i int) error {
			id, err := e.StartRun(ctx, "parked", nil, RunOptions{})
			ids[i] = id
			return err
		})
		waitCount(b, e, checkpoint.StatusWaiting, n)
		parkTime := time.Since(start)
		assigned, running := e.store.Held()
		leases := 0
		for _, id := range ids[:min(n, 500)] { // a sample: a held lease is a KV read each
			if _, held, err := e.leases.Holder(ctx, id); err == nil && held {
				leases++
			}
		}
		rss := peakRSS()
		b.Logf("%d runs parked in %s (%.0f runs/s); held: %d assigned, %d running, %d of %d sampled leases; peak RSS %d MiB",
			n, parkTime.Round(time.Millisecond), float64(n)/parkTime.Seconds(), assigned, running, leases, min(n, 500), rss>>20)
		if assigned != 0 || running != 0 || leases != 0 {
			b.Fatalf("parked runs hold epochs or leases")
		}
		start = time.Now()
		each(b, n, func(i int) error {
			return e.Signal(ctx, ids[i], "go", SignalOptions{})
		})
		signalTime := time.Since(start)
		waitCount(b, e, checkpoint.StatusSucceeded, n)
		resumeTime := time.Since(start)
		b.Logf("signalled %d runs in %s (%.0f signals/s); all resumed and ended in %s (%.0f resumes/s)",
			n, signalTime.Round(time.Millisecond), float64(n)/signalTime.Seconds(), resumeTime.Round(time.Millisecond), float64(n)/resumeTime.Seconds())
		b.ReportMetric(float64(n)/parkTime.Seconds(), "parks/s")
		b.ReportMetric(float64(n)/signalTime.Seconds(), "signals/s")
		b.ReportMetric(float64(n)/resumeTime.Seconds(), "resumes/s")
		b.ReportMetric(float64(rss>>20), "peak-rss-MiB")
	}
}

// each calls fn for 0..n-1, 64 at a time, and fails the benchmark on the first error.
func each(b *testing.B, n int, fn func(i int) error) {
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var once sync.Once
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				once.Do(func() { b.Error(fmt.Errorf("%d: %w", i, err)) })
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// waitCount waits, on the applier's progress, until n runs have status.
func waitCount(b *testing.B, e *Engine, status checkpoint.RunStatus, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for {
		changed := e.Changed()
		if got, err := e.store.CountRuns(status); err == nil && got >= n {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			got, _ := e.store.CountRuns(status)
			b.Fatalf("%d of %d runs %s after an hour", got, n, status)
		}
	}
}
