package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/workflow"
)

// The workloads of docs/perf.md, run against a live flowd through the API:
//
//	W1: 1,000 runs x 5 no-op steps, at most 64 runs in flight: steps/s, runs/s.
//	W2: 200 runs x 10 no-op steps, one run at a time: run latency p50/p99, step p50.
//
// Run latency is seen by the client: from sending run.start to the answer of run.wait.
// Step latency is the time between two consecutive accepted commits of a run, from its
// history.
type benchOptions struct {
	workloads        []string
	w1Runs, w1Flight int
	w2Runs           int
	waits            waitOptions
}

// waitOptions say how a bench run waits for its end.
type waitOptions struct {
	// wait is asked of run.wait (the server's default is 30s, its limit 1m); grace is
	// how much longer the client waits for the answer, which can sit behind other
	// requests (the API serves 256 at once: W1 with 150,000 runs in flight queues
	// the rest).
	wait, grace time.Duration
	// deadline bounds one run's wait, all waits again included (--run-timeout).
	deadline time.Duration
	// noRewait counts a wait that timed out as a failure: the negative control of the
	// rewait (without it, 95,404 runs "did not succeed" that all succeeded later).
	noRewait bool
}

var defaultWaits = waitOptions{wait: 30 * time.Second, grace: time.Minute}

// BenchResult is one workload's line (-o json prints a list of them).
type BenchResult struct {
	Workload  string  `json:"workload"`
	Runs      int     `json:"runs"`
	Steps     int     `json:"steps_per_run"`
	InFlight  int     `json:"in_flight"`
	Seconds   float64 `json:"seconds"`
	StepsPerS float64 `json:"steps_per_s"`
	RunsPerS  float64 `json:"runs_per_s"`
	RunP50ms  float64 `json:"run_p50_ms"`
	RunP99ms  float64 `json:"run_p99_ms"`
	StepP50ms float64 `json:"step_p50_ms,omitempty"`
	Failed    int     `json:"failed"`
}

func (a *app) benchCommand() *cobra.Command {
	o := benchOptions{}
	var runTimeout time.Duration
	cmd := &cobra.Command{Use: "bench [w1|w2]...", Short: "Run the W1 and W2 workloads against the server; one line per workload",
		Long: `Applies the workflows bench-w1 (5 no-op steps) and bench-w2 (10 no-op steps) and runs
W1 (many runs at once: throughput) and W2 (one run at a time: latency) through the API,
every step checkpointed through the log as in production. Give flowd enough workers for
W1's in-flight runs (flowd --workers 64) or W1 measures the worker slots.`,
		Args: func(_ *cobra.Command, args []string) error {
			for _, w := range args {
				if w != "w1" && w != "w2" {
					return usage("workload %q: use w1, w2 or both", w)
				}
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			if runTimeout <= 0 {
				return usage("--run-timeout %s: use a positive duration such as 1h", runTimeout)
			}
			o.workloads = args
			o.waits = defaultWaits
			o.waits.deadline = runTimeout
			if len(args) == 0 {
				o.workloads = []string{"w1", "w2"}
			}
			return a.bench(o)
		}}
	cmd.Flags().IntVar(&o.w1Runs, "w1-runs", 1000, "W1: runs")
	cmd.Flags().IntVar(&o.w1Flight, "w1-in-flight", 64, "W1: runs started and not yet ended at most")
	cmd.Flags().IntVar(&o.w2Runs, "w2-runs", 200, "W2: runs")
	cmd.Flags().DurationVar(&runTimeout, "run-timeout", time.Hour, "how long one run may take to end, its wait for a worker included, before it counts as failed")
	return cmd
}

func (a *app) bench(o benchOptions) error {
	for _, n := range []struct {
		name string
		v    int
	}{{"--w1-runs", o.w1Runs}, {"--w1-in-flight", o.w1Flight}, {"--w2-runs", o.w2Runs}} {
		if n.v < 1 || n.v > 1000000 {
			return usage("%s %d: use 1 to 1000000", n.name, n.v)
		}
	}
	var results []BenchResult
	for _, w := range o.workloads {
		var r BenchResult
		var err error
		if w == "w1" {
			r, err = a.benchRuns("bench-w1", 5, o.w1Runs, o.w1Flight, false, o.waits)
		} else {
			r, err = a.benchRuns("bench-w2", 10, o.w2Runs, 1, true, o.waits)
		}
		if err != nil {
			return err
		}
		r.Workload = strings.ToUpper(w)
		results = append(results, r)
		if a.output == "table" {
			printBench(a.out, r)
		}
	}
	if a.output != "table" {
		if err := a.print(results, nil); err != nil {
			return err
		}
	}
	for _, r := range results {
		if r.Failed > 0 {
			return failed("%s: %d of %d runs did not succeed", r.Workload, r.Failed, r.Runs)
		}
	}
	return nil
}

func printBench(w io.Writer, r BenchResult) {
	line := fmt.Sprintf("%s  %d runs x %d no-op steps, %d in flight: %.0f steps/s, %.1f runs/s, run p50 %.2f ms, p99 %.2f ms",
		r.Workload, r.Runs, r.Steps, r.InFlight, r.StepsPerS, r.RunsPerS, r.RunP50ms, r.RunP99ms)
	if r.StepP50ms > 0 {
		line += fmt.Sprintf(", step p50 %.2f ms", r.StepP50ms)
	}
	if r.Failed > 0 {
		line += fmt.Sprintf(", %d FAILED", r.Failed)
	}
	fmt.Fprintln(w, line)
}

// benchRuns applies the workflow and runs `runs` runs of it, at most inFlight at once.
func (a *app) benchRuns(name string, steps, runs, inFlight int, stepLatency bool, w waitOptions) (BenchResult, error) {
	res := BenchResult{Runs: runs, Steps: steps, InFlight: inFlight}
	if _, err := ask(a, func(c *client.Client, ctx context.Context) (client.Workflow, error) {
		return c.ApplyWorkflow(ctx, name+".yaml", []byte(workflow.ChainYAML(name, steps)))
	}); err != nil {
		return res, err
	}
	var (
		mu      sync.Mutex
		lat     []time.Duration
		ids     []string
		firstEr error
	)
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < runs; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			r, err := a.runToEnd(name, w)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				res.Failed++
				if firstEr == nil {
					firstEr = err
				}
			case r.Status != "succeeded":
				res.Failed++
			default:
				lat = append(lat, d)
				ids = append(ids, r.ID)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstEr != nil && len(lat) == 0 {
		return res, firstEr
	}
	res.Seconds = elapsed.Seconds()
	res.StepsPerS = float64(len(lat)*steps) / elapsed.Seconds()
	res.RunsPerS = float64(len(lat)) / elapsed.Seconds()
	slices.Sort(lat)
	res.RunP50ms, res.RunP99ms = msOf(quantile(lat, 0.50)), msOf(quantile(lat, 0.99))
	if stepLatency {
		var gaps []time.Duration
		for _, id := range ids {
			g, err := a.commitGaps(id)
			if err != nil {
				return res, err
			}
			gaps = append(gaps, g...)
		}
		slices.Sort(gaps)
		res.StepP50ms = msOf(quantile(gaps, 0.50))
	}
	return res, nil
}

// runToEnd starts a run and waits for its end. Only an answer about the run decides: a
// wait that ends first waits again, whether the server answered at its wait limit with
// the run still going, or the answer did not come in time because the request waited
// behind others (the call's context ended; flowd down fails at once with no responders).
func (a *app) runToEnd(workflow string, w waitOptions) (client.Run, error) {
	id, err := ask(a, func(c *client.Client, ctx context.Context) (string, error) {
		return c.StartRun(ctx, workflow, client.StartOptions{})
	})
	if err != nil {
		return client.Run{}, err
	}
	end := time.Now().Add(w.deadline)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), w.wait+w.grace)
		r, err := a.client.WaitRun(ctx, id, w.wait)
		timedOut := ctx.Err() != nil
		cancel()
		switch {
		case err != nil && timedOut && !w.noRewait && time.Now().Before(end):
			continue
		case err != nil:
			return r, err
		}
		if r.Terminal() {
			return r, nil
		}
		if !time.Now().Before(end) {
			return r, fmt.Errorf("run %s still %s after %s", id, r.Status, w.deadline)
		}
	}
}

// commitGaps is the time between consecutive accepted commits of a run.
func (a *app) commitGaps(id string) ([]time.Duration, error) {
	events, err := ask(a, func(c *client.Client, ctx context.Context) ([]client.Event, error) { return c.History(ctx, id) })
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	var prev time.Time
	for _, e := range events {
		if e.Kind != "commit" || e.Outcome != "accepted" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, e.At)
		if err != nil {
			return nil, fmt.Errorf("run %s: event time %q: %w", id, e.At, err)
		}
		if !prev.IsZero() {
			out = append(out, at.Sub(prev))
		}
		prev = at
	}
	return out, nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*q))]
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
