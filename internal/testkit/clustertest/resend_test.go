package clustertest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// Starts and waits sent while one of two flowd processes is SIGKILLed: NATS may hand a
// request to the dying node's subscription, and nothing answers it (clustertest's
// unexplained failures of issue 30: a run.start and a run.wait that waited out their
// 30 s). The client sends starts and waits again (internal/base/resend): every start
// gets its run's ID within its 30 s, the runs are exactly the starts (none lost, none
// started twice), and every wait answers. The deterministic half, a node that dies with
// the request in hand having carried it out or not, is client/TestUnansweredTriesAreSentAgain.
func TestStartsAcrossAKilledNode(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	_, cl, nodes := logLife(t, nil, "node-a", "node-b")
	const n = 40
	var ids []string
	for i := range n {
		if i == n/2 {
			nodes[1].Kill()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		id, err := cl.StartRun(ctx, "one", client.StartOptions{})
		if i%2 == 0 && err == nil {
			_, err = cl.WaitRun(ctx, id, time.Second) // a wait's answer, whatever the run's status
		}
		cancel()
		if err != nil {
			t.Fatalf("start %d (node-b killed before start %d): %v", i, n/2, err)
		}
		ids = append(ids, id)
	}
	WaitFor(t, 90*time.Second, "every run to succeed", func() bool {
		runs, err := cl.Runs(context.Background(), client.ListOptions{Workflow: "one", Status: "succeeded"})
		return err == nil && len(runs) == n
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runs, err := cl.Runs(ctx, client.ListOptions{Workflow: "one"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range runs {
		got = append(got, r.ID)
	}
	slices.Sort(got)
	slices.Sort(ids)
	if !slices.Equal(got, ids) {
		t.Fatalf("runs %v; want exactly the %d started %v", got, n, ids)
	}
}
