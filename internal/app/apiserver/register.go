package apiserver

// The service's registration on NATS: made, probed through the server, and stopped
// only in a way that leaves no subscription behind that nobody answers.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// register adds the service's endpoints and the node subscription.
func (s *Server) register(stopWait context.Context) error {
	nc := s.nc
	svc, err := micro.AddService(nc, micro.Config{Name: "flow", Version: "1.0.0",
		Description: "flow workflow engine API"})
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	for op, h := range s.handlers() {
		name := strings.ReplaceAll(op, ".", "-")
		slots, wait := s.slots, op == "run.wait"
		if wait {
			slots = s.waiting
		}
		if err := svc.AddEndpoint(name, s.async(s.wrap(h), slots, wait), micro.WithEndpointSubject(client.Subject+"."+op),
			micro.WithEndpointQueueGroup("flow-api")); err != nil {
			s.stopRegistration(stopWait, svc, nil)
			return fmt.Errorf("api: endpoint %s: %w", op, err)
		}
	}
	node, err := nc.Subscribe(nodeSubject, func(m *nats.Msg) {
		b, _ := json.Marshal(s.nodeInfo())
		_ = m.Respond(b)
	})
	if err != nil {
		s.stopRegistration(stopWait, svc, nil)
		return err
	}
	// A round trip: the server has every subscription before a client can ask.
	if err := nc.Flush(); err != nil {
		s.stopRegistration(stopWait, svc, node)
		return fmt.Errorf("api: %w", err)
	}
	s.mu.Lock()
	s.svc, s.node = svc, node
	s.mu.Unlock()
	s.stops.registrations.Add(1)
	return nil
}

func (s *Server) unregister() {
	s.mu.Lock()
	svc, node := s.svc, s.node
	s.svc, s.node = nil, nil
	s.mu.Unlock()
	if svc != nil {
		s.stopRegistration(s.closing, svc, node)
	}
}

// stopRegistration stops a registration once the connection is up. A micro service
// stops by draining its subscriptions, and nats.go keeps a draining subscription
// through a reconnect, sends its SUB to the new server, then drops it on the client
// without an UNSUB: the server goes on handing it a share of the queue group's
// requests and nobody answers (measured: 9 of 20 cluster.status requests lost after a
// healed partition; a CI run's probe start and run.wait lost after one). Draining while
// connected leaves no such subscription, so the stop waits for the connection for as
// long as it takes: the part is down meanwhile, and it could only register again once
// connected anyway. Only wait's end ends it: Stop (the node's connection closes after
// it, and every subscription of a closed connection is gone from the server), or a
// failed first registration's bound (the node then fails to start and closes it).
func (s *Server) stopRegistration(wait context.Context, svc micro.Service, node *nats.Subscription) {
	s.stops.begun.Add(1)
	defer s.stops.done.Add(1)
	ctx, cancel := context.WithCancel(wait)
	defer cancel()
	if drainWaitLimit > 0 { // the control: the bounded wait of before
		ctx, cancel = context.WithTimeout(ctx, drainWaitLimit)
		defer cancel()
	}
	_ = waitConnected(ctx, s.nc)
	if node != nil {
		_ = node.Unsubscribe() // not a drain: nothing of it is sent again after a reconnect
	}
	_ = svc.Stop()
	// A round trip: once it is back, the server has taken the unsubscriptions, and a
	// request sent after Stop goes to another node (or to none), not to this one.
	_ = s.nc.FlushTimeout(2 * time.Second)
}

// drainWaitLimit, when set, bounds how long a registration's stop waits for the
// connection, after which it drains while disconnected: the negative control of
// TestNoRequestIsLostAfterAReconnect (the bound was 10 s before a CI run's partition
// outlasted it). Zero in every build.
var drainWaitLimit time.Duration

// waitConnected returns once nc is connected, or closed (nothing then to wait for),
// or ctx ends.
func waitConnected(ctx context.Context, nc *nats.Conn) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !nc.IsConnected() && !nc.IsClosed() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// probe pings this node's own service through the server until ctx ends: an answer
// shows the server still delivers its requests to it.
func (s *Server) probe(ctx context.Context, alive func()) error {
	s.mu.Lock()
	subject, err := micro.ControlSubject(micro.PingVerb, s.svc.Info().Name, s.svc.Info().ID)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	every := max(s.silence/4, 10*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		if _, err := s.nc.RequestWithContext(pctx, subject, nil); err == nil {
			alive()
		}
		cancel()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
