package gate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/testkit/testnats"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)

// The roster's decision as transcripts (testdata/*.txt): the version the leader may
// promise (Roster.Next) as members come, go, hold and are forgotten. Commands:
//
//	member ID formats=1,2 [hold] [inferred]   records (or replaces) a member
//	forget ID                                 removes one
//	hold [by=NAME] | unhold                   the operator's hold
//	next applied=N                            what the leader may promise; "promise"
//	                                          also records it as the roster's version
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		r := Roster{Members: map[string]Member{}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "member":
				m := Member{Since: t0}
				for _, a := range d.CmdArgs[1:] {
					switch a.Key {
					case "formats":
						for _, v := range strings.Split(strings.Join(a.Vals, ","), ",") {
							n, err := strconv.Atoi(v)
							if err != nil {
								d.Fatalf(t, "formats: %v", err)
							}
							m.Formats = append(m.Formats, n)
						}
					case "hold":
						m.Hold = true
					case "inferred":
						m.Inferred = true
					default:
						d.Fatalf(t, "unknown argument %q", a.Key)
					}
				}
				r.Members[d.CmdArgs[0].Key] = m
				return fmt.Sprintf("%d members, reading up to %d together\n", len(r.Members), r.Readable())
			case "forget":
				delete(r.Members, d.CmdArgs[0].Key)
				return fmt.Sprintf("%d members, reading up to %d together\n", len(r.Members), r.Readable())
			case "hold":
				h := &Hold{At: t0}
				if d.HasArg("by") {
					d.ScanArgs(t, "by", &h.By)
				}
				r.Hold = h
				return "held: " + r.Holders() + "\n"
			case "unhold":
				r.Hold = nil
				return "held: " + orNone(r.Holders()) + "\n"
			case "next", "promise":
				var applied int
				d.ScanArgs(t, "applied", &applied)
				next, why := r.Next(applied)
				if next == 0 && why == "" {
					return "stays: nothing newer to move to\n"
				}
				if next == 0 {
					return "stays: " + why + "\n"
				}
				if d.Cmd == "promise" {
					r.Version = next
				}
				return fmt.Sprintf("may promise %d\n", next)
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

func open(t *testing.T) (*Gate, *Gate) {
	t.Helper()
	srv := testnats.Server(t, &server.Options{JetStream: true, StoreDir: t.TempDir()})
	gates := make([]*Gate, 2)
	for i := range gates {
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		kv, err := jsport.OpenKV(ctx, js, jsport.ClusterConfig(1), nil)
		if err != nil {
			t.Fatal(err)
		}
		gates[i] = New(kv)
	}
	return gates[0], gates[1]
}

var (
	newBinary = Member{Binary: "flowd new", Formats: []int{1, 2}, Since: t0}
	oldBinary = Member{Binary: "flowd old", Formats: []int{1}, Since: t0}
)

// A node too old for the promised version is refused at start, and its roster entry
// is not written; one that fits is recorded; the version then waits for it.
func TestRegisterRefusesANodeTooOldForThePromise(t *testing.T) {
	ctx := context.Background()
	leader, node := open(t)
	if _, err := leader.Register(ctx, "node-a", newBinary, 1); err != nil {
		t.Fatal(err)
	}
	if _, promised, err := leader.Promise(ctx, 1); err != nil || promised != 2 {
		t.Fatalf("promise with one new member: %d %v; want 2", promised, err)
	}
	_, err := node.Register(ctx, "node-b", oldBinary, 1)
	if !errors.Is(err, ErrTooOld) || !strings.Contains(err.Error(), "cluster version is 2") || !strings.Contains(err.Error(), "reads log formats up to 1") {
		t.Fatalf("an old node after the promise: %v; want ErrTooOld naming version 2", err)
	}
	r, _ := node.Roster(ctx)
	if _, ok := r.Members["node-b"]; ok {
		t.Fatal("the refused node is a member")
	}
	// A node whose own state applied a version it cannot read (started again on an
	// older binary) is refused too.
	if _, err := node.Register(ctx, "node-c", oldBinary, 2); !errors.Is(err, ErrTooOld) {
		t.Fatalf("an old binary on a state at version 2: %v; want ErrTooOld", err)
	}
}

// The roster's compare-and-set: a registration of an old node between the leader's read
// and its write of a promise makes the write fail, and the promise, read again, is not
// made. Control (blind writes): the promise is written over the registration: the old
// node started, and the roster says every member reads format 2 — the next entry in
// format 2 would stop it.
func TestAPromiseNeverPassesARegistration(t *testing.T) {
	for _, blind := range []bool{false, true} {
		t.Run(map[bool]string{false: "compare-and-set", true: "control-blind-writes"}[blind], func(t *testing.T) {
			ctx := context.Background()
			leader, node := open(t)
			if _, err := leader.Register(ctx, "node-a", newBinary, 1); err != nil {
				t.Fatal(err)
			}
			var registerErr error
			once := false
			leader.blind = blind
			leader.afterRead = func() { // the old node registers between the promise's read and write
				if !once {
					once = true
					_, registerErr = node.Register(ctx, "node-old", oldBinary, 1)
				}
			}
			_, promised, err := leader.Promise(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			r, _ := node.Roster(ctx)
			_, member := r.Members["node-old"]
			damaged := registerErr == nil && promised == 2
			if blind {
				if !damaged || member {
					t.Fatalf("control: register %v, promised %d, old node a member %v; want the promise written over the registration", registerErr, promised, member)
				}
				return
			}
			if damaged || registerErr != nil || !member || r.Version != 0 {
				t.Fatalf("register %v, promised %d, member %v, roster version %d; want the old node a member and nothing promised", registerErr, promised, member, r.Version)
			}
		})
	}
}

// Forget: a live node is refused; a gone one is removed, and the version may move.
func TestForgetAndHold(t *testing.T) {
	ctx := context.Background()
	g, _ := open(t)
	for id, m := range map[string]Member{"node-a": newBinary, "node-b": newBinary, "node-c": oldBinary} {
		if _, err := g.Register(ctx, id, m, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Forget(ctx, "node-c", true); !errors.Is(err, ErrLive) {
		t.Fatalf("forget a live node: %v; want ErrLive", err)
	}
	if _, err := g.Forget(ctx, "node-x", false); !errors.Is(err, ErrUnknown) {
		t.Fatalf("forget a stranger: %v; want ErrUnknown", err)
	}
	if _, promised, _ := g.Promise(ctx, 1); promised != 0 {
		t.Fatalf("promised %d with node-c reading format 1", promised)
	}
	if _, err := g.SetHold(ctx, &Hold{By: "olga", At: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Forget(ctx, "node-c", false); err != nil {
		t.Fatal(err)
	}
	if r, promised, _ := g.Promise(ctx, 1); promised != 0 || !strings.Contains(func() string { _, why := r.Next(1); return why }(), "olga") {
		t.Fatalf("promised %d under a hold", promised)
	}
	if _, err := g.SetHold(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, promised, _ := g.Promise(ctx, 1); promised != 2 {
		t.Fatalf("promised %d after the hold was released; want 2", promised)
	}
}

// Infer: a live node that never registered counts as reading format 1 only.
func TestInferAReleaseBeforeTheGate(t *testing.T) {
	ctx := context.Background()
	g, _ := open(t)
	if _, err := g.Register(ctx, "node-a", newBinary, 1); err != nil {
		t.Fatal(err)
	}
	r, err := g.Infer(ctx, map[string]Seen{"node-a": {Binary: "flowd new", Formats: []int{1, 2}}, "node-old": {}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if m := r.Members["node-old"]; !m.Inferred || m.Reads() != 1 {
		t.Fatalf("node-old: %+v; want inferred, reading format 1", m)
	}
	if next, why := r.Next(1); next != 0 || !strings.Contains(why, "node-old") {
		t.Fatalf("next %d (%s); want none, naming node-old", next, why)
	}
}
