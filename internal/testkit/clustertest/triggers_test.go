package clustertest

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
)

const ledgerTrigger = `name: ledger
inputs:
  date: {type: string}
on:
  - {subject: "ledger.closed.>", id: "ledger-{{ msg.data.ledger }}", inputs: {date: "{{ msg.data.date }}"}}
steps:
  - {name: close, uses: sleep, with: {duration: 300ms}}
`

// Messages on a trigger's subject start one run per message ID, across a SIGKILL of
// the leader: 20 ledgers, each published twice under different Nats-Msg-Ids (so
// JetStream's own de-duplication keeps both), the first copies of half of them before
// the SIGKILL and everything else while the cluster elects a new leader and after (and
// one first copy again, under its own Nats-Msg-Id, which JetStream drops). Each
// ledger's run exists once, with trigger event, and succeeds.
//
// The control is a flowd linked with engine.triggerIDPerDelivery: the run ID also names
// the message's sequence, and a ledger published twice gets two runs.
func TestTriggerStartsOneRunPerMessageAcrossFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs a flowd process")
	}
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "guard", true: "control-id-per-delivery"}[control], func(t *testing.T) {
			bin := filepath.Join(Binaries(t), "flowd")
			if control {
				bin = FlowdLinkedWith(t, "github.com/flowrun/flow/engine.triggerIDPerDelivery=1")
			}
			nodes, cl, url := threeFlowdOnOneServer(t, bin)
			if err := call(t, cl, "workflow.apply", client.Request{File: "ledger.yaml", YAML: ledgerTrigger}, nil); err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(url)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			WaitFor(t, 30*time.Second, "FLOW_EVENTS to capture ledger.closed.>", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s, err := js.Stream(ctx, "FLOW_EVENTS")
				return err == nil && slices.Contains(s.CachedInfo().Config.Subjects, "ledger.closed.>")
			})
			// Published until JetStream takes it: while the cluster has no leader the
			// external server still stores messages, but a publish can time out.
			publish := func(ledger int, copy string) {
				m := nats.NewMsg(fmt.Sprintf("ledger.closed.l%02d", ledger))
				m.Data = fmt.Appendf(nil, `{"ledger":"l%02d","date":"2026-12-%02d"}`, ledger, 1+ledger%28)
				m.Header.Set("Nats-Msg-Id", fmt.Sprintf("%s-%d", copy, ledger))
				WaitFor(t, 30*time.Second, "a publish of ledger "+fmt.Sprint(ledger), func() bool {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_, err := js.PublishMsg(ctx, m)
					return err == nil
				})
			}
			const ledgers = 20
			for i := 0; i < ledgers/2; i++ {
				publish(i, "a")
			}
			leader := statusOf(t, cl).Leader
			WaitFor(t, 30*time.Second, "a first run started by a message", func() bool {
				var runs []client.Run
				return call(t, cl, "run.list", client.Request{Workflow: "ledger", Limit: 100}, &runs) == nil && len(runs) > 0
			})
			nodes[leader].Kill()
			t.Logf("leader %s SIGKILLed", leader)
			publish(0, "a") // the same Nats-Msg-Id again: JetStream's window drops it
			for i := 0; i < ledgers; i++ {
				publish(i, "b")
				if i >= ledgers/2 {
					publish(i, "a")
				}
			}
			nodes[leader].Restart(t)
			if control {
				WaitFor(t, 90*time.Second, "a ledger with two runs", func() bool {
					var runs []client.Run
					if call(t, cl, "run.list", client.Request{Workflow: "ledger", Limit: 1000}, &runs) != nil {
						return false
					}
					return len(runs) > ledgers
				})
				t.Logf("control: one message's two deliveries started two runs")
				return
			}
			var runs []client.Run
			WaitFor(t, 120*time.Second, "a run per ledger, each ended", func() bool {
				runs = nil
				if call(t, cl, "run.list", client.Request{Workflow: "ledger", Limit: 1000}, &runs) != nil || len(runs) < ledgers {
					return false
				}
				for _, r := range runs {
					if r.Status != "succeeded" && r.Status != "failed" {
						return false
					}
				}
				return true
			})
			seen := map[string]bool{}
			for _, r := range runs {
				if r.Trigger != "event" || r.Status != "succeeded" || seen[r.ID] {
					t.Errorf("run %s: trigger %s, status %s, seen before %v", r.ID, r.Trigger, r.Status, seen[r.ID])
				}
				seen[r.ID] = true
			}
			if len(runs) != ledgers {
				t.Fatalf("%d runs for %d ledgers", len(runs), ledgers)
			}
			// Every copy was handled (its second delivery seen): nothing left in the consumer.
			WaitFor(t, 60*time.Second, "every message settled", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s, err := js.Stream(ctx, "FLOW_EVENTS")
				if err != nil {
					return false
				}
				for name := range s.ConsumerNames(ctx).Name() {
					c, err := s.Consumer(ctx, name)
					if err != nil {
						return false
					}
					info := c.CachedInfo()
					if info.NumPending != 0 || info.NumAckPending != 0 {
						return false
					}
				}
				return true
			})
		})
	}
}
