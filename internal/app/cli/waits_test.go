package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// waitFor reads the run each time the node applies more of the log until ok says it is
// as the test wants.
func (e *env) waitFor(id string, ok func(client.Run) bool) client.Run {
	e.t.Helper()
	eng := e.d.Engine()
	timeout := time.After(30 * time.Second)
	for {
		changed := eng.Changed()
		r, err := eng.API().Run(id)
		if err == nil && ok(r) {
			return r
		}
		select {
		case <-changed:
		case <-timeout:
			e.t.Fatalf("run %s never got there: %+v (%v)", id, r, err)
		}
	}
}

// run signal wakes a waiting run (data from a file, a key); data that is not JSON is
// bad usage and writes nothing; signalling a run that has ended exits 1 saying so. run
// get shows what the run waits for, and until when (-o json: the waiting block); run
// list --status waiting lists it; run history shows the park and the signal with their
// detail. Without --auth the node names nobody, and an approval exits 4 saying why.
func TestSignalApproveCommands(t *testing.T) {
	e := startFlowd(t)
	wf := e.file("gate.yaml", "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: go, timeout: 1h}}\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	if code, _, errOut := e.flowctl("run", "start", "gate", "--id", "gate-1"); code != 0 {
		t.Fatalf("start: %d %s", code, errOut)
	}
	e.waitFor("gate-1", func(r client.Run) bool { return r.Status == "waiting" })

	code, out, errOut := e.flowctl("run", "list", "--status", "waiting")
	if code != 0 || !strings.Contains(out, "gate-1") {
		t.Fatalf("run list --status waiting: %d %q %q", code, out, errOut)
	}
	code, out, _ = e.flowctl("run", "get", "gate-1")
	if code != 0 || !strings.Contains(out, "WAITING") || !regexp.MustCompile(`WAITING +signal go \(step w\) since 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC\nUNTIL +20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC\n`).MatchString(out) {
		t.Fatalf("run get: %d\n%s", code, out)
	}
	code, out, _ = e.flowctl("run", "get", "gate-1", "-o", "json")
	var got map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("run get -o json: %d %s", code, out)
	}
	w, _ := got["waiting"].(map[string]any)
	if w["kind"] != "signal" || w["step"] != "w" || w["signal"] != "go" || w["until"] == nil {
		t.Fatalf("waiting: %v", got["waiting"])
	}
	for _, k := range []string{"started_by", "inbox", "decisions"} {
		if _, ok := got[k]; !ok {
			t.Errorf("run get -o json has no %q", k)
		}
	}
	if _, ok := got["parent"]; ok {
		t.Errorf("run get -o json has a parent")
	}

	for _, data := range []string{"{nope", "@" + e.file("bad.json", "not json")} {
		code, _, errOut = e.flowctl("run", "signal", "gate-1", "go", "--data", data)
		if code != ExitUsage || !strings.Contains(errOut, "is not valid JSON") {
			t.Fatalf("--data %s: %d %q; want exit 2 saying it is not JSON", data, code, errOut)
		}
	}
	if r, _ := e.d.Engine().API().Run("gate-1"); len(r.Inbox) != 0 || r.Status != "waiting" {
		t.Fatalf("bad data wrote %+v (%s)", r.Inbox, r.Status)
	}
	// Issue 38: a name no wait step waits for is refused, nothing sent.
	code, _, errOut = e.flowctl("run", "signal", "gate-1", "og")
	if code != ExitUsage || !strings.Contains(errOut, `no step of workflow gate waits for signal "og"`) || !strings.Contains(errOut, "wait for go") {
		t.Fatalf("a signal no step waits for: %d %q; want exit 2 naming the signal and the names waited for", code, errOut)
	}
	if r, _ := e.d.Engine().API().Run("gate-1"); len(r.Inbox) != 0 || r.Status != "waiting" {
		t.Fatalf("a refused signal wrote %+v (%s)", r.Inbox, r.Status)
	}
	code, out, errOut = e.flowctl("run", "signal", "gate-1", "go", "--data", "@"+e.file("data.json", `{"ledger": "closed"}`+"\n"), "--id", "k1", "-o", "json")
	var sig client.Signalled
	if code != 0 || json.Unmarshal([]byte(out), &sig) != nil || sig != (client.Signalled{ID: "gate-1", Signal: "go", SignalID: "k1"}) {
		t.Fatalf("signal: %d %q %q", code, out, errOut)
	}
	r := e.waitFor("gate-1", client.Run.Terminal)
	if r.Status != "succeeded" || len(r.Inbox) != 1 || string(r.Inbox[0].Data) != `{"ledger":"closed"}` || r.Inbox[0].ConsumedBy != "w" {
		t.Fatalf("after the signal: %s, inbox %+v", r.Status, r.Inbox)
	}

	code, _, errOut = e.flowctl("run", "signal", "gate-1", "go")
	if code != ExitFailed || !strings.Contains(errOut, "has ended") {
		t.Fatalf("signalling an ended run: %d %q; want exit 1 saying it has ended", code, errOut)
	}
	code, _, errOut = e.flowctl("run", "approve", "gate-1", "--comment", "fine")
	if code != ExitNotAuthorized || !strings.Contains(errOut, "--auth") {
		t.Fatalf("approve without --auth: %d %q; want exit 4 saying approvals need --auth", code, errOut)
	}
	code, _, _ = e.flowctl("run", "reject")
	if code != ExitUsage {
		t.Fatalf("reject without RUN: %d", code)
	}

	code, out, _ = e.flowctl("run", "history", "gate-1")
	if code != 0 || !strings.Contains(out, "waits for signal") || !strings.Contains(out, "signal go") {
		t.Fatalf("history: %d\n%s", code, out)
	}
}

// run signal --start: a run that does not exist is started (with --input) and
// signalled, saying so; the same command again signals the run that now exists (its
// inputs unchanged); --input without --start is bad usage; a run ID that is a run of
// another workflow exits 1 saying so, nothing sent.
func TestSignalWithStartCommand(t *testing.T) {
	e := startFlowd(t)
	wf := e.file("ledger.yaml", "name: ledger\ninputs:\n  date: {type: string}\nsteps:\n  - {name: closed, uses: wait, with: {signal: ledger-closed}}\n  - {name: again, needs: [closed], uses: wait, with: {signal: ledger-closed}}\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	code, out, errOut := e.flowctl("run", "signal", "close-1204", "ledger-closed", "--start", "ledger", "--input", "date=2026-12-04")
	if code != 0 || out != "close-1204 started (ledger) and signalled ledger-closed\n" {
		t.Fatalf("signal --start of a new run: %d %q %q", code, out, errOut)
	}
	e.waitFor("close-1204", func(r client.Run) bool { return r.Status == "waiting" && r.Waiting != nil && r.Waiting.Step == "again" })
	code, out, errOut = e.flowctl("run", "signal", "close-1204", "ledger-closed", "--start", "ledger", "--input", "date=1999-01-01", "-o", "json")
	var sig client.Signalled
	if code != 0 || json.Unmarshal([]byte(out), &sig) != nil || sig != (client.Signalled{ID: "close-1204", Signal: "ledger-closed"}) {
		t.Fatalf("signal --start of a run that exists: %d %q %q; want it signalled, started absent", code, out, errOut)
	}
	r := e.waitFor("close-1204", client.Run.Terminal)
	if r.Status != "succeeded" || string(r.Inputs) != `{"date":"2026-12-04"}` {
		t.Fatalf("the run: %s %s", r.Status, r.Inputs)
	}
	code, _, errOut = e.flowctl("run", "signal", "close-1205", "ledger-closed", "--input", "date=2026-12-05")
	if code != ExitUsage || !strings.Contains(errOut, "--start") {
		t.Fatalf("--input without --start: %d %q; want exit 2 naming --start", code, errOut)
	}
	gate := e.file("gate.yaml", "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: ledger-closed}}\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", gate); code != 0 {
		t.Fatalf("apply: %d %s", code, errOut)
	}
	if code, _, errOut := e.flowctl("run", "start", "gate", "--id", "gate-1"); code != 0 {
		t.Fatalf("start: %d %s", code, errOut)
	}
	code, _, errOut = e.flowctl("run", "signal", "gate-1", "ledger-closed", "--start", "ledger", "--input", "date=2026-12-05")
	if code != ExitFailed || !strings.Contains(errOut, "is a run of workflow gate") {
		t.Fatalf("signal --start of another workflow's run: %d %q; want exit 1 naming its workflow", code, errOut)
	}
	if r, _ := e.d.Engine().API().Run("gate-1"); len(r.Inbox) != 0 {
		t.Fatalf("a refused signal-with-start wrote %+v", r.Inbox)
	}
}
