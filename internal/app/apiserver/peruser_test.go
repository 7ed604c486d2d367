package apiserver

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/testkit/testnode"
)

// One user's many waits do not starve another user's: a viewer who sends more run.wait
// requests than the node's wait slots gets her share (2 here) and a prompt refusal for
// the rest (too_many_requests, saying why), and another viewer's wait is answered.
// Negative control: without the per-user share, her waits fill every wait slot and the
// other viewer's wait is not answered within its time (issue 24: 1,100 waits of one
// viewer made another user's wait time out).
func TestOneUsersWaitsDoNotStarveAnothers(t *testing.T) {
	for _, share := range []int{2, 0} {
		t.Run(map[int]string{2: "per-user-share", 0: "control-no-share"}[share], func(t *testing.T) {
			e := testnode.Engine(t, func(c *engine.Config) {
				c.DisableScheduler, c.NATSAuth = true, true
				c.NATSUsers = []engine.NATSUser{{Name: "vera", Password: "v-secret", Role: "viewer"}, {Name: "otto", Password: "o-secret", Role: "viewer"}}
			})
			waiting := make(chan struct{}, 4)
			s, err := serveWith(configFor(e), make(chan struct{}, 8), waiting, perUserLimits{requests: share, waits: share})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Stop)
			ctx := ctxT(t, 60*time.Second)
			if _, err := e.ApplyWorkflow(ctx, "w.yaml", []byte("name: w\nsteps:\n  - name: a\n    uses: noop\n")); err != nil {
				t.Fatal(err)
			}
			// No scheduler: the run stays pending and a wait on it lasts its time.
			if _, err := e.StartRun(ctx, "w", nil, engine.RunOptions{ID: "held"}); err != nil {
				t.Fatal(err)
			}
			vera, err := nats.Connect(e.ClientURL(), nats.UserInfo("vera", "v-secret"), nats.CustomInboxPrefix(client.InboxPrefix("vera")))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(vera.Close)
			answers, err := vera.SubscribeSync(client.InboxPrefix("vera") + ".waits")
			if err != nil {
				t.Fatal(err)
			}
			wait, _ := json.Marshal(client.Request{V: client.Version, ID: "held", Wait: "30s"})
			const sent = 6 // more than the node's 4 wait slots
			for range sent {
				if err := vera.PublishRequest(client.Subject+".run.wait", client.InboxPrefix("vera")+".waits", wait); err != nil {
					t.Fatal(err)
				}
			}
			if err := vera.Flush(); err != nil {
				t.Fatal(err)
			}
			held := min(cap(waiting), sent)
			if share > 0 {
				held = share
				// The rest are refused at once, each saying why.
				for i := 0; i < sent-share; i++ {
					m, err := answers.NextMsg(10 * time.Second)
					if err != nil {
						t.Fatalf("refusal %d of %d: %v", i+1, sent-share, err)
					}
					if code := m.Header.Get(micro.ErrorCodeHeader); code != client.CodeTooManyRequests ||
						!strings.Contains(m.Header.Get(micro.ErrorHeader), "vera already has 2 run.wait requests at once on this node") {
						t.Fatalf("refusal %d: %q %q", i+1, code, m.Header.Get(micro.ErrorHeader))
					}
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for len(waiting) < held {
				if time.Now().After(deadline) {
					t.Fatalf("vera's waits hold %d wait slots, want %d", len(waiting), held)
				}
				time.Sleep(5 * time.Millisecond) // polling the server's slots, with a deadline
			}
			otto, err := client.Dial(e.ClientURL(), client.WithNATSOptions(nats.UserInfo("otto", "o-secret")), client.WithTimeout(3*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(otto.Close)
			r, err := otto.WaitRun(ctx, "held", time.Second)
			switch {
			case share > 0 && (err != nil || r.ID != "held"):
				t.Fatalf("otto's wait beside vera's %d: %+v %v", sent, r, err)
			case share == 0 && err == nil:
				t.Fatal("control: without a per-user share otto's wait was answered anyway: the test shows nothing")
			case share == 0 && !errors.Is(err, client.ErrUnreachable):
				t.Fatalf("control: otto's wait failed otherwise: %v", err)
			case share == 0:
				t.Logf("control: otto's wait: %v", err)
			}
			if share > 0 {
				// flowctl says the same (exit 1, the server's reason on one line).
				var ce *client.Error
				_, err := client.New(vera, client.WithTimeout(5*time.Second)).WaitRun(ctx, "held", time.Second)
				if !errors.As(err, &ce) || ce.Code != client.CodeTooManyRequests {
					t.Fatalf("vera's next wait through the client: %v", err)
				}
				t.Logf("what flowctl prints: %s", ce.Message)
			}
		})
	}
}
