package clustertest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/otlptest"
)

// One trace for a run across a leader failover and an owner SIGKILL (issue 29): three
// flowd export to a real OTLP/HTTP receiver; a run started with a caller's traceparent
// is SIGKILLed away from its owner, and its leader is SIGKILLed too (one process when
// the owner leads). Every span the nodes sent for the run is in the caller's trace, the
// submit span's parent is the caller's span, every epoch of the run is named by a span
// (the epoch's own, or the assign that began it: a killed owner sends nothing more), and
// each step has a span that succeeded, under an epoch span.
//
// A SIGKILL loses the spans a process had not exported yet (OTEL_BSP_SCHEDULE_DELAY):
// that is the kill's nature, not a defect. So the kills come at a point where nothing
// the test asks for can be in flight: s1 has succeeded and every span naming it and
// the epochs so far has arrived, s2 runs for seconds, and the leader and the owner are
// killed together (a new leader's election would otherwise give the owner time to end
// s2 and hold its span as it dies; seen once on a loaded CI run).
func TestOneTraceAcrossAFailoverAndAnOwnerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills flowd processes")
	}
	t.Parallel()
	rec := otlptest.Start(t)
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	names := []string{"node-a", "node-b", "node-c"}
	nodes := map[string]*Proc{}
	for _, n := range names {
		env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rec.URL(), "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=flowd-" + n}
		nodes[n] = StartFlowdEnv(t, c, n, env, "--lease-ttl", "1s")
	}
	logsOnFailure(t, names, nodes)
	cl := dial(t, c)
	status := func() client.ClusterStatus { return statusOf(t, cl) }
	WaitFor(t, 30*time.Second, "three nodes, a leader, cluster version 3", func() bool {
		st := status()
		return st.Leader != "" && len(st.Nodes) == 3 && st.ClusterVersion == 3
	})
	yaml := "name: traced\nsteps:\n"
	for i := 1; i <= 4; i++ {
		d := map[bool]string{true: "4s", false: "700ms"}[i == 2]
		yaml += fmt.Sprintf("  - {name: s%d, uses: sleep, with: {duration: %s}%s}\n", i, d, map[bool]string{true: "", false: fmt.Sprintf(", needs: [s%d]", i-1)}[i == 1])
	}
	if err := call(t, cl, "workflow.apply", client.Request{File: "traced.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	const traceID, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := cl.StartRun(ctx, "traced", client.StartOptions{Traceparent: "00-" + traceID + "-" + callerSpan + "-01"})
	if err != nil {
		t.Fatal(err)
	}
	var r client.Run
	stepDone := func(name string) bool {
		for _, s := range r.Steps {
			if s.Name == name {
				return s.Status == "succeeded"
			}
		}
		return false
	}
	WaitFor(t, 30*time.Second, "the run running s2 on an owner", func() bool {
		return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && r.Status == "running" && r.Owner != "" && stepDone("s1")
	})
	WaitFor(t, 30*time.Second, "the submit span, s1's and the epochs' so far", func() bool {
		var s1, submit bool
		named := map[string]bool{}
		for _, s := range rec.Spans(traceID) {
			s1 = s1 || s.Name == "flow.step s1" && s.Attrs["flow.step.outcome"] == "succeeded"
			submit = submit || s.Name == "flow.run.submit"
			named[s.Attrs["flow.epoch"]] = named[s.Attrs["flow.epoch"]] || s.Attrs["flow.run.id"] == id
		}
		for _, ep := range r.Epochs {
			if !named[fmt.Sprint(ep.Epoch)] {
				return false
			}
		}
		return s1 && submit
	})
	owner, leader := r.Owner, status().Leader
	if leader != owner {
		nodes[leader].Kill()
	}
	nodes[owner].Kill()
	if leader != owner {
		WaitFor(t, 30*time.Second, "a new leader", func() bool { l := status().Leader; return l != "" && l != leader && l != owner })
	}
	WaitFor(t, 60*time.Second, "the run to succeed elsewhere", func() bool {
		return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && r.Status == "succeeded"
	})
	if len(r.Epochs) < 2 {
		t.Fatalf("run %s had epochs %+v; want a new one after its owner's kill", id, r.Epochs)
	}
	named := func(spans []otlptest.Span) map[string]bool {
		out := map[string]bool{}
		for _, s := range spans {
			if e := s.Attrs["flow.epoch"]; e != "" && s.Attrs["flow.run.id"] == id {
				out[e] = true
			}
		}
		return out
	}
	var spans []otlptest.Span
	WaitFor(t, 30*time.Second, "spans naming every epoch, and each step's", func() bool {
		spans = rec.Spans(traceID)
		got := named(spans)
		for _, ep := range r.Epochs {
			if !got[fmt.Sprint(ep.Epoch)] {
				return false
			}
		}
		steps := map[string]bool{}
		for _, s := range spans {
			if strings.HasPrefix(s.Name, "flow.step ") && s.Attrs["flow.step.outcome"] == "succeeded" {
				steps[s.Attrs["flow.step"]] = true
			}
		}
		return len(steps) == 4
	})
	byID := map[string]otlptest.Span{}
	services := map[string]bool{}
	var names2 []string
	for _, s := range spans {
		byID[s.SpanID] = s
		services[s.Service] = true
		names2 = append(names2, s.Name+"@"+s.Service)
	}
	sort.Strings(names2)
	submitted := false
	for _, s := range spans {
		if s.Name == "flow.run.submit" && s.ParentID == callerSpan && s.Attrs["flow.run.id"] == id {
			submitted = true
		}
		// (The killed owner's epoch span never ended, so it was never sent: its step
		// spans that were sent have no parent here.)
		if strings.HasPrefix(s.Name, "flow.step ") && s.Service != "flowd-"+owner {
			if p, ok := byID[s.ParentID]; !ok || p.Name != "flow.run.epoch" {
				t.Fatalf("step span %s (%s) is not under an epoch span: parent %q", s.Name, s.Service, s.ParentID)
			}
		}
	}
	if !submitted {
		t.Fatalf("no submit span under the caller's span %s: %v", callerSpan, names2)
	}
	if len(services) < 2 {
		t.Fatalf("the trace's spans come from %v; want the nodes that took part", services)
	}
	logged := false
	for _, n := range names {
		logged = logged || strings.Contains(LogOf(nodes[n]), `"trace_id":"`+traceID+`"`)
	}
	if !logged {
		t.Fatal("no node's log line of the run carries its trace ID")
	}
	t.Logf("run %s: epochs %v, %d spans in one trace from %v", id, r.Epochs, len(spans), services)
}
