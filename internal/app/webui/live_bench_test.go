package webui

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/base/audit"
)

const shortWorkflow = "name: short\nsteps:\n  - {name: a, uses: noop}\n  - {name: b, needs: [a], uses: noop}\n  - {name: c, needs: [b], uses: noop}\n"

// BenchmarkOtherUsersRunBesideLiveStreams (issue 36): another user's short run (three
// noop steps), from its start to succeeded, on a node where the viewer vera has made
// 3,000 live stream attempts on 16 parked runs, and holds what the UI let her hold.
// "alone" is the same node without her streams; "no-bounds" holds all 3,000 (shared
// readers, no cap); "as-before-issue-36" holds all 3,000, each reading its run caught up
// with the log at each change. docs/security.md ("Resource exhaustion"). Not run in CI:
//
//	go test -run '^$' -bench OtherUsersRunBesideLiveStreams -benchtime 40x ./internal/app/webui
func BenchmarkOtherUsersRunBesideLiveStreams(b *testing.B) {
	const attempts, parked = 3000, 16
	for _, mode := range []string{"alone", "bounded", "no-bounds", "as-before-issue-36"} {
		b.Run(mode, func(b *testing.B) {
			n, _ := startLiveNode(b, true)
			switch mode {
			case "no-bounds":
				n.ui.live = newLiveStreams(0, 0)
			case "as-before-issue-36":
				n.ui.live = newLiveStreams(0, 0)
				n.ui.hooks.perStreamReads = true
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel() // ends vera's streams
			for _, wf := range []string{gateWorkflow, shortWorkflow} {
				if _, err := n.e.ApplyWorkflow(ctx, "wf.yaml", []byte(wf)); err != nil {
					b.Fatal(err)
				}
			}
			for i := range parked {
				startParked(b, n, ctx, fmt.Sprintf("p%d", i))
			}
			var held, refused atomic.Int64
			if mode != "alone" {
				vera := streamClient(b)
				signInStream(b, vera, n.srv.URL, "vera", "v-pw")
				var wg sync.WaitGroup
				next := make(chan int)
				for range 32 {
					wg.Go(func() {
						for i := range next {
							s, code, body, err := openStream(ctx, vera, fmt.Sprintf("%s/ui/runs/p%d/events", n.srv.URL, i%parked))
							switch {
							case err != nil:
								b.Errorf("attempt %d: %v", i, err)
							case code == http.StatusTooManyRequests:
								refused.Add(1)
							case code != http.StatusOK:
								b.Errorf("attempt %d: %d %s", i, code, body)
							default:
								held.Add(1)
								if ev := s.next(); ev != "change" { // its first read is done
									b.Errorf("attempt %d: first event %q", i, ev)
								}
								go func() { s.rest(); s.close() }() // held until ctx ends
							}
						}
					})
				}
				for i := range attempts {
					next <- i
				}
				close(next)
				wg.Wait()
			}
			otto := audit.WithActor(ctx, "otto")
			i, failed := 0, 0
			cpu := processCPU()
			for b.Loop() {
				i++
				id := fmt.Sprintf("short-%d", i)
				if _, err := n.e.StartRun(otto, "short", nil, engine.RunOptions{ID: id}); err != nil {
					b.Fatal(err)
				}
				r, err := n.e.WaitRun(ctx, id)
				if err != nil {
					b.Fatalf("run %s: %v", id, err)
				}
				if r.Status != "succeeded" {
					if mode != "as-before-issue-36" {
						b.Fatalf("run %s ended %s: %s", id, r.Status, r.Error)
					}
					failed++ // as before issue 36: the node too busy to renew its leases
				}
			}
			b.ReportMetric(float64(failed), "not-succeeded")
			b.ReportMetric(float64(processCPU()-cpu)/float64(time.Millisecond)/float64(i), "cpu-ms/op")
			b.ReportMetric(float64(held.Load()), "streams-held")
			b.ReportMetric(float64(refused.Load()), "refused")
		})
	}
}

// BenchmarkOtherUsersRunBesideSignalFlood (issue 36): another user's short run, from its
// start to succeeded, while an operator sends one parked run signals of 900 KB, four at a
// time, for as long as the measure lasts (at least 1,000 of them; at most floodBudget). A
// run's inbox holds at most checkpoint.MaxInbox signals and MaxInboxBytes of data, and one
// person may send a node 1 MiB of signal data a second (engine/signalrate.go): the
// signals past them are refused, before the log, and the benchmark says how many were
// accepted and refused. "alone" is the same node
// without the flood. docs/security.md ("Resource exhaustion"). Not run in CI:
//
//	go test -run '^$' -bench OtherUsersRunBesideSignalFlood -benchtime 40x ./internal/app/webui
func BenchmarkOtherUsersRunBesideSignalFlood(b *testing.B) {
	const signals, size, senders = 1000, 900 << 10, 4
	const floodBudget = 2 * time.Minute
	data, _ := json.Marshal(strings.Repeat("x", size-2)) // 900 KB of JSON
	for _, mode := range []string{"alone", "flood"} {
		b.Run(mode, func(b *testing.B) {
			n, _ := startLiveNode(b, false)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The sink parks on go; a later step waits for the junk it is flooded with (a
			// signal no step waits for is refused before the log).
			for _, wf := range []string{gateWorkflow + "  - {name: j, needs: [b], uses: wait, with: {signal: junk}}\n", shortWorkflow} {
				if _, err := n.e.ApplyWorkflow(ctx, "wf.yaml", []byte(wf)); err != nil {
					b.Fatal(err)
				}
			}
			startParked(b, n, ctx, "sink")
			var sent, accepted, refused, failed atomic.Int64
			var wg sync.WaitGroup
			flood, stop := context.WithTimeout(audit.WithActor(ctx, "mallory"), floodBudget)
			defer stop()
			began := time.Now()
			var lasted atomic.Int64
			if mode != "alone" {
				// At least 1,000 signals, and as many more as the measure lasts, sent as a
				// client sends them (the API over NATS; no --auth, so the flooder is
				// anonymous): the flood goes on until the last run.
				// The request is encoded once, as a flooder on another machine would have it
				// ready: what this process spends on the flood is then the node's.
				body, _ := json.Marshal(client.Request{V: client.Version, ID: "sink", Name: "junk", Data: data})
				nc, _, _ := n.e.API().Hosting()
				for range senders {
					wg.Go(func() {
						defer func() { lasted.Store(int64(time.Since(began))) }()
						for {
							if flood.Err() != nil {
								return
							}
							sent.Add(1)
							reply, err := nc.RequestWithContext(flood, client.Subject+".run.signal", body)
							code := ""
							if err == nil {
								code = reply.Header.Get("Nats-Service-Error-Code")
							}
							switch {
							case err == nil && code == "":
								accepted.Add(1)
							case err == nil:
								refused.Add(1) // conflict (the inbox's bounds) or too_many_requests (the rates)
							case flood.Err() == nil:
								failed.Add(1)
							}
						}
					})
				}
			}
			ann := audit.WithActor(ctx, "ann")
			i := 0
			cpu := processCPU()
			for b.Loop() {
				i++
				id := fmt.Sprintf("short-%d", i)
				if _, err := n.e.StartRun(ann, "short", nil, engine.RunOptions{ID: id}); err != nil {
					b.Fatal(err)
				}
				r, err := n.e.WaitRun(ctx, id)
				if err != nil || r.Status != "succeeded" {
					b.Fatalf("run %s: %v %v", id, r, err)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu)/float64(time.Millisecond)/float64(i), "cpu-ms/op")
			if mode != "alone" {
				floodOn := flood.Err() == nil // still flooding when the loop ended
				if sent.Load() < signals {
					b.Logf("only %d signals were sent during the measure: raise -benchtime", sent.Load())
				}
				stop()
				wg.Wait()
				b.ReportMetric(float64(sent.Load()), "signals-sent")
				b.ReportMetric(float64(accepted.Load()), "accepted")
				b.ReportMetric(float64(refused.Load()), "refused")
				b.ReportMetric(float64(failed.Load()), "failed")
				b.ReportMetric(time.Duration(lasted.Load()).Seconds(), "flood-s")
				if !floodOn {
					b.Logf("the flood ended before the last run: some runs were measured after it")
				}
			}
		})
	}
}
