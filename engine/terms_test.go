package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// waitLeading waits until e leads with a term above min.
func waitLeading(t *testing.T, e *Engine, above int64, d time.Duration) *epoch.Term {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if term := e.leading(); term != nil && term.Term() > above {
			return term
		}
		if time.Now().After(deadline) {
			t.Fatalf("no term above %d within %s (leading %v, problem %q)", above, d, e.leading(), e.leadershipProblem())
		}
		time.Sleep(10 * time.Millisecond) // polling the engine's election, with a deadline
	}
}

// forgeTerm writes an entry the state machine accepts with the given term: a cron tick
// of a workflow, as anything that reaches NATS could publish before the trust boundary.
func forgeTerm(t *testing.T, e *Engine, term int64) {
	t.Helper()
	at := time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC).Add(time.Duration(term % 1000))
	ctx := ctxT(t, 10*time.Second)
	if err := e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCronTick, Term: term, Owner: "forger",
		Tick: &checkpoint.CronTick{Workflow: "one", At: at, Outcome: checkpoint.TickSkippedOverlap}}).Await(ctx); err != nil {
		t.Fatal(err)
	}
	if e.store.HighestTerm() != term {
		t.Fatalf("the forged term was not applied: highest %d", e.store.HighestTerm())
	}
}

const oneStepWorkflow = "name: one\nsteps:\n  - name: a\n    uses: noop\n"

// An accepted entry with a term far above the leader's (the leader bucket reset, or a
// forged entry) would make every entry of the leader stale for good, and its scheduler
// spin on its own rejections. The leader steps down, raises the bucket's terms above the
// applied one, wins a term above it and schedules again: a run started after succeeds.
// Negative control (Hooks.NoTermRaise): the node keeps winning terms below the applied
// one and says so in leadershipProblem; a run started then is never scheduled: after
// three more such terms it is still pending, with no epoch and no assign in its history
// (not even a rejected one: no term led), and a wait for it ends only at its deadline.
func TestLeaderOutgrowsAHigherAppliedTerm(t *testing.T) {
	for _, raise := range []bool{true, false} {
		t.Run(map[bool]string{true: "raise", false: "no-raise"}[raise], func(t *testing.T) {
			h := new(testhooks.Hooks)
			h.NoTermRaise.Store(!raise)
			e := startEngineWith(t, h, nil)
			apply(t, e, oneStepWorkflow)
			waitLeading(t, e, 0, 20*time.Second)
			// The leader's raise of the cluster version is a scheduler entry too: one
			// written after the forged term would be a stale-term rejection of its own.
			if err := e.Ops().WaitClusterVersion(ctxT(t, 20*time.Second), checkpoint.LogFormatBinary); err != nil {
				t.Fatal(err)
			}
			const forged = 1 << 40
			forgeTerm(t, e, forged)
			if raise {
				term := waitLeading(t, e, forged, 30*time.Second)
				if v := runToEnd(t, e, "one", nil); v.Run.Status != checkpoint.StatusSucceeded || v.Run.Epochs[0].Term != term.Term() {
					t.Fatalf("run after the raise: %+v", v.Run)
				}
				if p := e.leadershipProblem(); p != "" {
					t.Fatalf("a problem is still reported: %q", p)
				}
				return
			}
			before := waitStaleTerm(t, e, 0)
			id, err := e.StartRun(ctxT(t, 10*time.Second), "one", nil, RunOptions{ID: "stuck"})
			if err != nil {
				t.Fatal(err)
			}
			// Three terms won after the run was submitted, each below the applied term.
			won := before
			for range 3 {
				won = waitStaleTerm(t, e, won)
			}
			v, err := e.Run(id)
			if err != nil {
				t.Fatal(err)
			}
			if v.Run.Status != checkpoint.StatusPending || v.Run.Epoch != 0 || len(v.Run.Epochs) != 0 || len(v.Events) != 1 || v.Events[0].Kind != checkpoint.KindSubmit {
				t.Fatalf("control: after terms %d to %d below the applied one the run is %s, epoch %d, epochs %+v, events %+v; want it pending and never assigned: the control shows nothing",
					before, won, v.Run.Status, v.Run.Epoch, v.Run.Epochs, v.Events)
			}
			if stale, err := e.store.StaleTerms(); err != nil || len(stale) != 0 {
				t.Fatalf("control: stale-term rejections %+v %v; want none (no term below the applied one leads)", stale, err)
			}
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := e.WaitRun(wctx, id); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("control: a wait for the unscheduled run ended with %v; want its deadline", err)
			}
			t.Logf("control: terms %d to %d won below the applied term; the run is pending, never assigned (%q)", before, won, e.leadershipProblem())
			// The admin's repair raises the terms when the leader does not (a node
			// credential may not purge the leader bucket: issue 36); the run is scheduled.
			found, err := e.Ops().RepairStreams(ctxT(t, 10*time.Second), false)
			raised := false
			for _, f := range found {
				raised = raised || f.Stream == "KV_FLOW_LEADER" && f.Done
			}
			if err != nil || !raised {
				t.Fatalf("the repair: %+v %v; want the leader bucket's terms raised", found, err)
			}
			waitLeading(t, e, forged, 30*time.Second)
			if end, err := e.WaitRun(ctxT(t, 30*time.Second), id); err != nil || end.Status != checkpoint.StatusSucceeded {
				t.Fatalf("the run after the repair: %v %+v", err, end)
			}
		})
	}
}

// waitStaleTerm waits until e reports, in leadershipProblem, a term it won below the
// applied term that is above after, and returns it.
func waitStaleTerm(t *testing.T, e *Engine, after int64) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var won, applied int64
		if _, err := fmt.Sscanf(e.leadershipProblem(), "won term %d, below the applied term %d", &won, &applied); err == nil && won > after {
			return won
		}
		if time.Now().After(deadline) {
			t.Fatalf("no term above %d won below the applied term within 20s (problem %q, leading %v, applied term %d): a node leading above the applied term raised it",
				after, e.leadershipProblem(), e.leading(), e.store.HighestTerm())
		}
		time.Sleep(10 * time.Millisecond) // polling the engine's election, with a deadline
	}
}

// countingHandler counts log records whose message contains a string.
type countingHandler struct {
	slog.Handler
	match string
	n     *atomic.Int64
}

func (c countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, c.match) {
		c.n.Add(1)
	}
	return nil
}

// A term no leader bucket revision can reach (above epoch.MaxTerm: only a forged entry
// holds one) cannot be outgrown: the node says why in leadershipProblem, and backs off
// between campaigns instead of spinning (before: ~3,300 log messages/s and a core busy
// while /readyz said ready).
func TestTermOutOfReachBacksOff(t *testing.T) {
	var campaigns atomic.Int64
	e := startEngine(t, func(c *Config) {
		c.Logger = slog.New(countingHandler{Handler: slog.DiscardHandler, match: "leader term below the applied term", n: &campaigns})
	})
	apply(t, e, oneStepWorkflow)
	waitLeading(t, e, 0, 20*time.Second)
	forgeTerm(t, e, epoch.MaxTerm+5)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(e.leadershipProblem(), "cannot raise") {
		if time.Now().After(deadline) {
			t.Fatalf("no problem reported: %q", e.leadershipProblem())
		}
		time.Sleep(10 * time.Millisecond) // polling the engine's election, with a deadline
	}
	from, logFrom := campaigns.Load(), e.store.Applied()
	time.Sleep(3 * time.Second) // a window in which to count campaigns and log writes, not a synchronisation
	if n := campaigns.Load() - from; n > 60 {
		t.Fatalf("%d stale campaigns in 3s: the election spins", n)
	}
	if n := e.store.Applied() - logFrom; n > 5 {
		t.Fatalf("%d log messages in 3s with no term able to schedule: something spins", n)
	}
}
