package clustertest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// Backfill across a leader kill (issue 27): three flowd on one NATS server; two
// backfills of the same 48 hourly ticks run at once through the API while the leader is
// SIGKILLed; a call that loses its node is made again. Every tick of the range has one
// run (its tick's run ID). The control gives each backfilled run a new ID (flowd linked
// with engine.backfillRandomIDs): ticks run more than once.
func TestBackfillsAcrossALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a flowd process")
	}
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "tick-ids", true: "control-random-ids"}[control], func(t *testing.T) {
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			extra := []string{"--lease-ttl", "1s"}
			nodes := map[string]*Proc{}
			for _, n := range []string{"node-a", "node-b", "node-c"} {
				if control {
					bin := FlowdLinkedWith(t, "github.com/flowrun/flow/engine.backfillRandomIDs=1")
					nodes[n] = startFlowdBin(t, c, n, bin, extra...)
				} else {
					nodes[n] = StartFlowd(t, c, n, extra...)
				}
			}
			cl := dial(t, c)
			leader := func() string {
				var st client.ClusterStatus
				if call(t, cl, "cluster.status", client.Request{}, &st) != nil {
					return ""
				}
				return st.Leader
			}
			WaitFor(t, 30*time.Second, "a leader", func() bool { return leader() != "" })
			yaml := "name: hourly\nschedule: {cron: \"0 * * * *\", catchup: none}\nsteps:\n  - {name: a, uses: noop}\n"
			WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
				return call(t, cl, "workflow.apply", client.Request{File: "h.yaml", YAML: yaml}, nil) == nil
			})
			to := time.Now().Add(-2 * time.Hour).Truncate(time.Hour)
			from := to.Add(-47 * time.Hour)
			req := client.Request{Workflow: "hourly", From: from.Format(time.RFC3339), To: to.Format(time.RFC3339)}
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					bc := dial(t, c)
					deadline := time.Now().Add(60 * time.Second)
					for time.Now().Before(deadline) { // a call that lost its node is made again
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						err := callCtx(ctx, bc, "cron.backfill", req, nil)
						cancel()
						if err == nil {
							return
						}
					}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					t.Errorf("the backfill never completed: %v", callCtx(ctx, bc, "cron.backfill", req, nil))
					cancel()
				}()
			}
			name := leader()
			nodes[name].Kill()
			wg.Wait()
			var runs []client.Run
			WaitFor(t, 30*time.Second, "the runs listed", func() bool {
				return call(t, cl, "run.list", client.Request{Workflow: "hourly", Limit: 1000}, &runs) == nil && len(runs) >= 48
			})
			perTick := map[string]int{}
			for _, r := range runs {
				perTick[r.ScheduledAt]++
			}
			doubled := 0
			for _, n := range perTick {
				if n > 1 {
					doubled++
				}
			}
			t.Logf("leader %s killed during two backfills of 48 ticks: %d runs, %d ticks, %d with more than one", name, len(runs), len(perTick), doubled)
			if control {
				if doubled == 0 {
					t.Fatal("the control ran no tick twice")
				}
				return
			}
			if len(perTick) != 48 || len(runs) != 48 {
				t.Fatalf("%d runs over %d ticks: want one run for each of 48", len(runs), len(perTick))
			}
		})
	}
}

// startFlowdBin is StartFlowd with another flowd binary (a linked control's).
func startFlowdBin(t *testing.T, c *Cluster, name, bin string, extra ...string) *Proc {
	return startFlowdExe(t, c, name, bin, nil, extra...)
}
