package apiserver

import (
	"encoding/json"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/testkit/testnats"
)

// A registration stopped while the node is cut off from NATS leaves nothing behind that
// swallows requests once the node is back: every request after the reconnect is
// answered. The API part falls silent when the server goes away, is stopped, and
// registers again after the reconnect; the old registration's stop drains its
// subscriptions only once connected. The control ("drain while down") stops it after a
// bounded wait, as before a CI run whose partition outlasted the 10 s bound: the drained
// subscriptions' SUBs are sent again on the reconnect and dropped by the client, and
// the server hands them a share of the queue group's requests that nobody answers.
func TestNoRequestIsLostAfterAReconnect(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit time.Duration
	}{{"guard", 0}, {"control-drain-while-down", 50 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			defer func(was time.Duration) { drainWaitLimit = was }(drainWaitLimit)
			drainWaitLimit = c.limit
			lost := lostAfterReconnect(t, c.limit > 0)
			switch {
			case c.limit == 0 && lost > 0:
				t.Fatalf("%d of %d requests unanswered after the reconnect", lost, reconnectProbes)
			case c.limit > 0 && lost == 0:
				t.Fatalf("control: all %d requests answered after a drain while disconnected: the test cannot see the damage", reconnectProbes)
			}
			t.Logf("%d of %d requests unanswered after the reconnect", lost, reconnectProbes)
		})
	}
}

// reconnectProbes is how many requests are sent after the reconnect. With a stale
// subscription in the queue group each goes unanswered with even odds.
const reconnectProbes = 40

// lostAfterReconnect serves an engine's API on a connection to a NATS server of its own,
// shuts that server down until the API part's registration is being stopped (stopped,
// when drainedDown), starts it again on the same port, and counts the requests that go
// unanswered once the API has registered again.
func lostAfterReconnect(t *testing.T, drainedDown bool) int {
	e := startEngine(t)
	ns := testnats.Server(t, &server.Options{})
	addr := ns.ClientURL()
	nc, err := nats.Connect(addr, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sup := supervise.New()
	s, err := Serve(Config{Node: e.API(), Conn: nc, Supervisor: sup, Silence: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if lost := probeRequests(t, addr, 5); lost != 0 {
		t.Fatalf("%d of 5 requests unanswered before any cut", lost)
	}

	port := ns.Addr().(*net.TCPAddr).Port
	ns.Shutdown()
	ns.WaitForShutdown()
	waitCond(t, 20*time.Second, "the API part's registration being stopped", func() bool {
		if drainedDown {
			return s.stops.done.Load() >= 1
		}
		return s.stops.begun.Load() >= 1
	})
	if nc.IsConnected() {
		t.Fatal("connected while the server is down")
	}
	again, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	again.Start()
	t.Cleanup(func() { again.Shutdown(); again.WaitForShutdown() })
	if !again.ReadyForConnections(10 * time.Second) {
		t.Fatal("the NATS server did not come back")
	}
	waitCond(t, 30*time.Second, "the API registered again and the old registration stopped", func() bool {
		return s.stops.registrations.Load() >= 2 && s.stops.done.Load() >= 1
	})
	return probeRequests(t, addr, reconnectProbes)
}

// probeRequests sends n workflow.list requests at once on a connection of their own,
// each waiting up to two seconds, and counts those unanswered.
func probeRequests(t *testing.T, url string, n int) int {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	data, _ := json.Marshal(client.Request{V: client.Version})
	var lost atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if _, err := nc.Request(client.Subject+".workflow.list", data, 2*time.Second); err != nil {
				lost.Add(1)
			}
		})
	}
	wg.Wait()
	return int(lost.Load())
}

// waitCond polls cond until it holds or d passes.
func waitCond(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}
