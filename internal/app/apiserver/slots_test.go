package apiserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/forge"
)

// run.wait requests hold slots of their own: however many waits a node holds (each up
// to a minute), its other requests are still answered. Negative control: with the waits
// sharing the request slots, a node full of waits answers nothing else.
func TestWaitsDoNotTakeTheSlotsOfOtherRequests(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			e := startEngine(t)
			slots, waiting := make(chan struct{}, 2), make(chan struct{}, 2)
			if shared {
				waiting = slots
			}
			s, err := serveWith(configFor(e), slots, waiting, perUserLimits{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Stop)
			cl := dial(t, e)
			ctx := ctxT(t, 30*time.Second)
			if _, err := cl.ApplyWorkflow(ctx, "w.yaml", []byte("name: w\nsteps:\n  - name: a\n    uses: noop\n")); err != nil {
				t.Fatal(err)
			}
			// The engine runs no scheduler: the run stays pending and a wait on it lasts.
			if _, err := cl.StartRun(ctx, "w", client.StartOptions{ID: "held"}); err != nil {
				t.Fatal(err)
			}
			nc := connect(t, e)
			wait, _ := json.Marshal(client.Request{V: client.Version, ID: "held", Wait: "20s"})
			for i := 0; i < 2; i++ {
				if err := nc.PublishRequest(client.Subject+".run.wait", nats.NewInbox(), wait); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(waiting) < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("the two waits hold %d slots", len(waiting))
				}
				time.Sleep(5 * time.Millisecond) // polling the server's slots, with a deadline
			}
			get, _ := json.Marshal(client.Request{V: client.Version, ID: "held"})
			_, err = nc.Request(client.Subject+".run.get", get, 2*time.Second)
			switch {
			case !shared && err != nil:
				t.Fatalf("run.get while two waits hold their slots: %v", err)
			case shared && err == nil:
				t.Fatal("control: with the waits in the request slots, run.get was answered anyway: the test shows nothing")
			case shared && !errors.Is(err, nats.ErrTimeout) && !strings.Contains(err.Error(), "timeout"):
				t.Fatalf("control: run.get failed otherwise: %v", err)
			}
			// A third wait waits for a slot: it is not answered while the two hold theirs.
			if _, err := nc.Request(client.Subject+".run.wait", wait, time.Second); err == nil {
				t.Fatal("a third wait was answered while two held the only wait slots")
			}
		})
	}
}

// A node that cannot catch up with the log (its applier stopped: here on a message of
// a newer format) refuses to answer from its stale state, and says why.
func TestRequestsFailWhenTheNodeCannotCatchUp(t *testing.T) {
	e := startEngine(t)
	serve(t, e)
	cl := dial(t, e)
	ctx := ctxT(t, 30*time.Second)
	if _, err := cl.Runs(ctx, client.ListOptions{}); err != nil {
		t.Fatalf("before: %v", err)
	}
	if _, err := forge.Open(t, e.ClientURL()).Publish(ctx, []byte(`{"v":999,"node":"future","entries":[]}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.ApplierFailed():
	case <-ctx.Done():
		t.Fatal("the applier did not stop on a message of a newer format")
	}
	_, err := cl.Runs(ctx, client.ListOptions{})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != client.CodeInternal || !strings.Contains(apiErr.Message, "cannot catch up with the log") {
		t.Fatalf("run.list after the applier stopped: %v; want an internal error saying the node cannot catch up", err)
	}
}
