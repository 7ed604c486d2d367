package sim

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flowrun/flow/internal/base/port/porttest"
)

// conformTTL is the lease TTL of the conformance runs (the KV's TTL, the ack wait).
const conformTTL = 2 * time.Second

// conformEnv runs the simulation's server for one node's ports in the caller's bubble
// until the test ends: no workload, no faults, the loop answering the calls.
func conformEnv(t *testing.T, forgetMarkers bool) porttest.Env {
	s := New(1, Switches{})
	s.cfg.TTL, s.cfg.Loss, s.cfg.SlowP, s.cfg.DupP, s.cfg.RedeliverP = conformTTL, 0, 0, 0, 0
	s.faultOn = false
	s.in.kick = make(chan struct{}, 1)
	s.now = time.Now()
	s.srv = newServer(s)
	s.srv.forgetMarkers = forgetMarkers
	n := newNode(s, 0)
	n.inc, n.alive, n.up = 1, true, true
	s.nodes = append(s.nodes, n)
	p := nodePorts{n, 1}.ports()
	done, served := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(served)
		s.serve(done)
	}()
	t.Cleanup(func() {
		close(done)
		<-served
	})
	return porttest.Env{KV: p.Leases, TTL: conformTTL, Log: p.Log, Tasks: p.Tasks, AckWait: s.srv.tasks.ackWait}
}

// TestServerConforms runs the ports' conformance suite on the simulation's server, each
// case in a bubble of its own on the simulated clock: what the simulation assumes of
// JetStream is what internal/base/jsport's TestJetStreamConforms finds of it.
func TestServerConforms(t *testing.T) {
	for _, c := range porttest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c.Run(t, conformEnv(t, false))
			})
		})
	}
}

// TestServerConformsControl: a server whose lapsed keys leave no marker (a bucket made
// without LimitMarkerTTL) fails the suite, in the case the lapse is about and no other.
func TestServerConformsControl(t *testing.T) {
	var failed []string
	for _, c := range porttest.Cases {
		synctest.Test(t, func(t *testing.T) {
			env := conformEnv(t, true)
			r := &recorder{}
			done := make(chan struct{})
			go func() {
				defer close(done)
				defer r.cleanup()
				c.Run(r, env)
			}()
			<-done
			if r.failure != "" {
				failed = append(failed, c.Name)
				t.Logf("%s: %s", c.Name, r.failure)
			}
		})
	}
	if strings.Join(failed, ",") != "KVLapseLeavesAMarker" {
		t.Fatalf("with lapse markers forgotten, the failing cases were %v; want only KVLapseLeavesAMarker", failed)
	}
}

// recorder is a porttest.T that notes the first failure and ends the case's goroutine.
type recorder struct {
	failure  string
	cleanups []func()
}

func (r *recorder) Helper()                        {}
func (r *recorder) Cleanup(f func())               { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Fatal(args ...any)              { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, a ...any) { r.fail(fmt.Sprintf(format, a...)) }

func (r *recorder) fail(msg string) {
	r.failure = msg
	runtime.Goexit()
}

func (r *recorder) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}
