package workflow

import (
	"strings"
	"testing"
)

const triggerSteps = "inputs:\n  date: {type: string}\n  n: {type: int, default: 1}\nsteps:\n  - {name: closed, uses: wait, with: {signal: closed}}\n"

func TestTriggersLoadAndRender(t *testing.T) {
	src := "name: payout\non:\n  - {subject: \"ledger.closed.>\", id: \"ledger-{{ msg.header.Nats-Msg-Id }}\", inputs: {date: \"{{ msg.data.date }}\", n: \"{{ msg.data.n }}\"}}\n" +
		"  - {subject: ledger.reopened, stream: LEDGER, signal: closed, inputs: {date: \"{{ msg.subject }}\"}}\n" + triggerSteps
	w, err := Load("t.yaml", []byte(src), withWait)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.On) != 2 || w.On[1].Stream != "LEDGER" || w.On[1].Signal != "closed" {
		t.Fatalf("triggers: %+v", w.On)
	}
	m := TriggerMessage{ID: "abc-1", Subject: "ledger.closed.eu", Stream: "FLOW_EVENTS", Seq: 7,
		Data: []byte(`{"date":"2026-12-05","n":3}`), Header: map[string][]string{"Nats-Msg-Id": {"abc-1"}}}
	id, inputs, err := w.On[0].Render(w.Name, m)
	if err != nil || id != "ledger-abc-1" || inputs["date"] != "2026-12-05" || inputs["n"] != float64(3) {
		t.Fatalf("render: %q %v %v", id, inputs, err)
	}
	id, inputs, err = w.On[1].Render(w.Name, m)
	if err != nil || id != "payout-abc-1" || inputs["date"] != "ledger.closed.eu" {
		t.Fatalf("render with the default id: %q %v %v", id, inputs, err)
	}
	// Data that is not JSON is its text; a path into it does not render.
	if _, _, err := w.On[0].Render(w.Name, TriggerMessage{ID: "x", Data: []byte("closed")}); err == nil {
		t.Fatal("a path into text data rendered")
	}
	if got := (TriggerMessage{Data: []byte("closed")}).DataJSON(); string(got) != `"closed"` {
		t.Fatalf("text data as JSON: %s", got)
	}
}

func TestTriggersRefuseWhatCannotBeMeant(t *testing.T) {
	cases := []struct{ name, on, want string }{
		{"everything", `{subject: ">"}`, "first token must be literal"},
		{"wildcard root", `{subject: "*.closed"}`, "first token must be literal"},
		{"flow's log", `{subject: "flow.log.x"}`, "flow's or the NATS server's"},
		{"JetStream API", `{subject: "$JS.API.>"}`, "flow's or the NATS server's"},
		{"inboxes", `{subject: "_INBOX.>"}`, "flow's or the NATS server's"},
		{"empty token", `{subject: "a..b"}`, "empty token"},
		{"gt not last", `{subject: "a.>.b"}`, "must be the last token"},
		{"partial wildcard", `{subject: "a.b*"}`, "stand alone"},
		{"no subject", `{id: "{{ msg.id }}"}`, "needs a subject"},
		{"flow's stream", `{subject: a.b, stream: FLOW_LOG}`, "flow's or a bucket's"},
		{"bucket stream", `{subject: a.b, stream: KV_FLOW_LEADER}`, "flow's or a bucket's"},
		{"id reads inputs", `{subject: a.b, id: "{{ inputs.date }}"}`, "read only the message"},
		{"unknown input", `{subject: a.b, inputs: {date: x, other: y}}`, `does not take`},
		{"required input missing", `{subject: a.b}`, `input "date" has no default`},
		{"signal nobody waits for", `{subject: a.b, signal: opened, inputs: {date: x}}`, `signal "opened"`},
		{"unknown key", `{subject: a.b, queue: q}`, `unknown key "queue"`},
		{"twice", "[{subject: a.b, inputs: {date: x}}, {subject: a.b, inputs: {date: y}}]", "given twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("t.yaml", []byte("name: x\non: "+tc.on+"\n"+triggerSteps), withWait)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("on: %s: %v; want an error with %q", tc.on, err, tc.want)
			}
		})
	}
}

var withWait = func(k string) bool { return k == "wait" || builtins(k) }
