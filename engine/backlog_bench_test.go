package engine

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// BenchmarkBacklog is issue 12's load test (a benchmark, not CI): FLOW_BACKLOG_RUNS
// (default 1,000,000) runs of one no-op step queued at once on one node with 64
// workers, drained to the end. It reports the process's peak RSS (flowd's embedded
// NATS, Pebble and the engine are all in this process, with the submitting client),
// the leases lost and renewals failed, the peak JetStream memory, and W2 beside it:
//
//   - W2 idle: 200 runs x 10 no-op steps one at a time on the idle node (docs/perf.md),
//     end to end, and the same runs from their first step's start to their end
//     ("exec"): the part a running run lives through.
//   - W2 during a backlog: 200 W2 runs submitted among the backlog's runs (one every
//     N/200), each measured from its first step's start to its end, and its step p50.
//     Under admission a run submitted behind N runs waits for them (oldest first), so
//     its end-to-end time is the backlog's drain; what the issue asks is that the
//     backlog does not starve the runs that are running.
//   - the same with a backlog of 10,000, to separate what the queue's size costs from
//     what 64 busy workers cost.
//
// FLOW_BENCH_NO_ADMISSION=1 switches admission off: the code before issue 12, where
// every pending run got an epoch and a task at once (keep the backlog small: ~500k runs
// then fill the memory budget the leases need).
//
// Run: FLOW_BACKLOG_RUNS=1000000 go test -run '^$' -bench Backlog -benchtime 1x -timeout 2h -v ./engine
func BenchmarkBacklog(b *testing.B) {
	n := 1000000
	if v := os.Getenv("FLOW_BACKLOG_RUNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 200 {
			b.Fatalf("FLOW_BACKLOG_RUNS=%q: use a whole number of at least 200", v)
		}
	}
	for i := 0; i < b.N; i++ {
		e := benchEngine(b, 64)
		apply(b, e, workflow.ChainYAML("w2", 10))
		apply(b, e, workflow.ChainYAML("one", 1))
		ctx := ctxT(b, 2*time.Hour)
		idle := w2Runs(b, e, ctx, 200)
		b.Logf("W2 idle: run p50 %.2f ms, exec p50 %.2f ms, step p50 %.2f ms", ms(idle.runP50), ms(idle.execP50), ms(idle.stepP50))
		small := backlog(b, e, ctx, 10000)
		b.Logf("backlog 10,000: %s", small)
		big := backlog(b, e, ctx, n)
		b.Logf("backlog %d: %s", n, big)
		b.ReportMetric(ms(idle.runP50), "w2-idle-run-p50-ms")
		b.ReportMetric(ms(idle.execP50), "w2-idle-exec-p50-ms")
		b.ReportMetric(ms(small.w2.execP50), "w2-10k-exec-p50-ms")
		b.ReportMetric(ms(big.w2.execP50), "w2-backlog-exec-p50-ms")
		b.ReportMetric(ms(big.w2.stepP50), "w2-backlog-step-p50-ms")
		b.ReportMetric(float64(peakRSS())/(1<<20), "peak-RSS-MiB")
		b.ReportMetric(float64(e.leases.Config().Counters.LeasesLost.Load()), "leases-lost")
		b.ReportMetric(float64(e.leases.Config().Counters.RenewalsFailed.Load()), "renewals-failed")
		b.ReportMetric(big.runsPerS, "drain-runs/s")
	}
}

type w2Result struct{ runP50, execP50, stepP50 time.Duration }

type backlogResult struct {
	n                  int
	submit, drain      time.Duration
	runsPerS           float64
	w2                 w2Result
	peakHeld, peakJSMB int64
	peakRSSMB          int64
	lost, renewFail    int64
	epochChanges       int
}

func (r backlogResult) String() string {
	return fmt.Sprintf("submitted in %s, drained in %s (%.0f runs/s); W2 exec p50 %.2f ms, step p50 %.2f ms; peak runs holding an epoch %d, "+
		"peak JetStream memory %d MiB, peak RSS %d MiB; leases lost %d, renewals failed %d, runs with an epoch change %d",
		r.submit.Round(time.Second), r.drain.Round(time.Second), r.runsPerS, ms(r.w2.execP50), ms(r.w2.stepP50), r.peakHeld,
		r.peakJSMB, r.peakRSSMB, r.lost, r.renewFail, r.epochChanges)
}

// w2Runs runs W2 (n runs of w2, one at a time).
func w2Runs(b *testing.B, e *Engine, ctx context.Context, n int) w2Result {
	var total []time.Duration
	var ids []string
	for r := 0; r < n; r++ {
		start := time.Now()
		id, err := e.StartRun(ctx, "w2", nil, RunOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusSucceeded {
			b.Fatalf("run %s: %v %v", id, err, r)
		}
		total = append(total, time.Since(start))
		ids = append(ids, id)
	}
	res := execTimes(b, e, ids)
	slices.Sort(total)
	res.runP50 = total[len(total)/2]
	return res
}

// execTimes: each run's first step start to its last event, and the gaps between
// accepted commits, by the log's times.
func execTimes(b *testing.B, e *Engine, ids []string) w2Result {
	var exec, steps []time.Duration
	for _, id := range ids {
		v, err := e.Run(id)
		if err != nil {
			b.Fatal(err)
		}
		var first, prev, last time.Time
		for _, ev := range v.Events {
			if ev.Kind == checkpoint.KindStart && first.IsZero() {
				first = ev.At
			}
			if ev.Kind == checkpoint.KindCommit && ev.Outcome == "accepted" {
				if !prev.IsZero() {
					steps = append(steps, ev.At.Sub(prev))
				}
				prev = ev.At
			}
			last = ev.At
		}
		exec = append(exec, last.Sub(first))
	}
	slices.Sort(exec)
	slices.Sort(steps)
	return w2Result{execP50: exec[len(exec)/2], stepP50: steps[len(steps)/2]}
}

// backlog submits n runs of one (64 submitters) with 200 W2 runs among them, waits
// until all have ended, and samples the node once a second meanwhile.
func backlog(b *testing.B, e *Engine, ctx context.Context, n int) backlogResult {
	res := backlogResult{n: n}
	lost0, fail0 := e.leases.Config().Counters.LeasesLost.Load(), e.leases.Config().Counters.RenewalsFailed.Load()
	stop := make(chan struct{})
	sampled := make(chan struct{})
	var peakHeld, peakJS atomic.Int64
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for k := 0; ; k++ {
			a, r := e.store.Held()
			peakHeld.Store(max(peakHeld.Load(), int64(a+r)))
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if info, err := e.js.AccountInfo(sctx); err == nil {
				peakJS.Store(max(peakJS.Load(), int64(info.Memory)))
			}
			cancel()
			if k%10 == 0 {
				fmt.Fprintf(os.Stderr, "backlog %d: %s queued %d, held %d, rss peak %d MiB, leases lost %d\n", n,
					time.Now().Format("15:04:05"), e.store.QueuedRuns(), a+r, peakRSS()>>20, e.leases.Config().Counters.LeasesLost.Load()-lost0)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	every := n / 200
	var w2ids []string
	var mu sync.Mutex
	start := time.Now()
	submitConcurrently(ctx, n, func(k int) error {
		name := "one"
		if k%every == 0 {
			name = "w2"
		}
		id, err := e.StartRun(ctx, name, nil, RunOptions{})
		if err != nil {
			b.Error(err)
			return err
		}
		if name == "w2" {
			mu.Lock()
			w2ids = append(w2ids, id)
			mu.Unlock()
		}
		return nil
	})
	res.submit = time.Since(start)
	if err := e.waitFor(ctx, func() bool {
		a, r := e.store.Held()
		return e.store.QueuedRuns() == 0 && a+r == 0
	}); err != nil {
		b.Fatal(err)
	}
	res.drain = time.Since(start)
	close(stop)
	<-sampled
	res.runsPerS = float64(n) / res.drain.Seconds()
	for _, id := range w2ids {
		if r, err := e.store.Run(id); err != nil || r.Status != checkpoint.StatusSucceeded {
			b.Fatalf("W2 run %s: %v %v", id, err, r)
		}
	}
	res.w2 = execTimes(b, e, w2ids)
	res.peakHeld, res.peakJSMB, res.peakRSSMB = peakHeld.Load(), peakJS.Load()>>20, peakRSS()>>20
	res.lost, res.renewFail = e.leases.Config().Counters.LeasesLost.Load()-lost0, e.leases.Config().Counters.RenewalsFailed.Load()-fail0
	_ = e.store.EachRun(checkpoint.ListOptions{Status: checkpoint.StatusSucceeded}, func(r *checkpoint.Run) bool {
		if r.EpochChanges > 0 {
			res.epochChanges++
		}
		return true
	})
	return res
}

// BenchmarkBacklogLimited is the other half of issue 12's point 7: a backlog that waits
// rather than runs. FLOW_BACKLOG_RUNS (default 1,000,000) runs of a workflow with
// `concurrency: 16` whose step sleeps for an hour are queued on one node with 64
// workers: 16 run (and sleep) for the whole benchmark, the rest wait for the limit. W2
// (200 runs x 10 no-op steps, one at a time, end to end) is measured on the idle node,
// then with the backlog waiting. The queue must cost the scheduler nothing per waiting
// run: a workflow at its limit is passed over in one read (checkpoint.EachQueued).
//
// Run: FLOW_BACKLOG_RUNS=1000000 go test -run '^$' -bench BacklogLimited -benchtime 1x -timeout 2h -v ./engine
func BenchmarkBacklogLimited(b *testing.B) {
	n := 1000000
	if v := os.Getenv("FLOW_BACKLOG_RUNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 200 {
			b.Fatalf("FLOW_BACKLOG_RUNS=%q: use a whole number of at least 200", v)
		}
	}
	const limit = 16
	for i := 0; i < b.N; i++ {
		e := benchEngine(b, 64)
		apply(b, e, workflow.ChainYAML("w2", 10))
		apply(b, e, fmt.Sprintf("name: limited\nconcurrency: %d\nsteps:\n  - name: wait\n    uses: sleep\n    with: {duration: 1h}\n", limit))
		ctx := ctxT(b, 2*time.Hour)
		idle := w2Runs(b, e, ctx, 200)
		b.Logf("W2 idle: run p50 %.2f ms, exec p50 %.2f ms, step p50 %.2f ms", ms(idle.runP50), ms(idle.execP50), ms(idle.stepP50))

		start := time.Now()
		submitConcurrently(ctx, n, func(int) error {
			_, err := e.StartRun(ctx, "limited", nil, RunOptions{})
			if err != nil {
				b.Error(err)
			}
			return err
		})
		submit := time.Since(start)
		if err := e.waitFor(ctx, func() bool {
			_, running := e.store.Held()
			return running == limit && e.store.QueuedRuns() == n-limit
		}); err != nil {
			a, r := e.store.Held()
			b.Fatalf("the backlog did not settle at %d running, %d waiting: %d assigned, %d running, %d waiting: %v",
				limit, n-limit, a, r, e.store.QueuedRuns(), err)
		}
		b.Logf("backlog of %d limited runs submitted in %s; %d running, %d waiting; peak RSS %d MiB",
			n, submit.Round(time.Second), limit, e.store.QueuedRuns(), peakRSS()>>20)
		// Three rounds: the first follows the million writes of the submission, which
		// Pebble is still compacting; the later ones see the backlog at rest.
		var during w2Result
		for round := 1; round <= 3; round++ {
			during = w2Runs(b, e, ctx, 200)
			b.Logf("W2 beside the waiting backlog, round %d: run p50 %.2f ms, exec p50 %.2f ms, step p50 %.2f ms (%+.0f%% run p50 against idle)",
				round, ms(during.runP50), ms(during.execP50), ms(during.stepP50), 100*(ms(during.runP50)/ms(idle.runP50)-1))
		}
		b.ReportMetric(ms(idle.runP50), "w2-idle-run-p50-ms")
		b.ReportMetric(ms(during.runP50), "w2-backlog-run-p50-ms")
		b.ReportMetric(float64(peakRSS())/(1<<20), "peak-RSS-MiB")
		b.ReportMetric(float64(e.leases.Config().Counters.LeasesLost.Load()), "leases-lost")
	}
}

// submitConcurrently calls submit for k = 0..n-1 from 64 goroutines (each stops at its
// first error) and returns when they have all stopped.
func submitConcurrently(ctx context.Context, n int, submit func(k int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := next.Add(1) - 1; k < int64(n) && ctx.Err() == nil; k = next.Add(1) - 1 {
				if submit(int(k)) != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
}
