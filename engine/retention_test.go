package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// Retention: the leader retires, through the log, the runs that ended longer ago than
// the retention, so every node removes the same runs (here the leader and a follower);
// a run still running stays, and so does the workflow. Control: with a retention of an
// hour, the same ended runs stay.
func TestRetentionRetiresEndedRuns(t *testing.T) {
	for _, retention := range []time.Duration{time.Second, time.Hour} {
		t.Run(retention.String(), func(t *testing.T) {
			a := startEngine(t, func(c *Config) {
				c.NATSListen = "127.0.0.1:0"
				c.Retention = retention
			})
			b := startEngine(t, func(c *Config) {
				c.NodeID = "node-b"
				c.NATSURL = a.ClientURL()
				c.DisableScheduler = true
				c.Workers = 1
			})
			apply(t, a, oneStepWorkflow)
			apply(t, a, "name: hold\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
			ctx := ctxT(t, 60*time.Second)
			held, err := a.StartRun(ctx, "hold", nil, RunOptions{ID: "held"})
			if err != nil {
				t.Fatal(err)
			}
			var ended []string
			for range 3 {
				ended = append(ended, runToEnd(t, a, "one", nil).Run.ID)
			}
			gone := func(s *checkpoint.Store) bool {
				for _, id := range ended {
					if _, err := s.Run(id); !errors.Is(err, checkpoint.ErrNotFound) {
						return false
					}
				}
				return true
			}
			deadline := time.Now().Add(5 * time.Second)
			for !(gone(a.store) && gone(b.store)) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // polling the nodes' states, with a deadline
			}
			if retention == time.Hour {
				if gone(a.store) || gone(b.store) {
					t.Fatal("control: runs within their retention were removed")
				}
				return
			}
			if !gone(a.store) || !gone(b.store) {
				t.Fatalf("ended runs outlived a retention of %s (leader %v, follower %v)", retention, gone(a.store), gone(b.store))
			}
			for _, s := range []*checkpoint.Store{a.store, b.store} {
				if r, err := s.Run(held); err != nil || r.Status.Terminal() {
					t.Fatalf("the running run: %+v %v", r, err)
				}
			}
			if _, err := b.Workflow("one", 0); err != nil {
				t.Fatalf("the workflow went with its runs: %v", err)
			}
		})
	}
}
