package workflow

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Trigger is one `on:` entry of a workflow: each message on Subject starts a run of the
// workflow whose ID is ID rendered over the message (docs/workflow-spec.md, "Runs
// started by messages"), or, with Signal, sends that signal to the run ID names,
// starting it if it does not exist. A message whose ID was seen before starts nothing:
// the run ID is the de-duplication key, judged by the log, across failover.
type Trigger struct {
	Subject string `json:"subject"`
	// Stream is an operator's JetStream stream the messages are read from; "": flow's
	// own stream FLOW_EVENTS, which flow keeps capturing every such subject.
	Stream string `json:"stream,omitempty"`
	// ID is a template over msg; "": DefaultTriggerID.
	ID string `json:"id,omitempty"`
	// Inputs are the run's inputs, each a template over msg.
	Inputs map[string]string `json:"inputs,omitempty"`
	// Signal, when set, makes the trigger signal the run (signal-with-start) instead of
	// only starting it.
	Signal string `json:"signal,omitempty"`
}

// DefaultTriggerID is a trigger's run ID when it names none: the workflow's name and
// the message's ID, so that two workflows started by one message do not share an ID.
func DefaultTriggerID(workflow string) string { return workflow + "-{{ msg.id }}" }

// MaxTriggers is how many `on:` entries one workflow may have.
const MaxTriggers = 8

// maxSubject bounds a trigger's subject (NATS allows longer ones; no one needs them).
const maxSubject = 256

// TriggerMessage is what a trigger's templates read of a message (msg.*).
type TriggerMessage struct {
	// ID is the message's Nats-Msg-Id header or, without one, "<stream>-<sequence>".
	ID      string
	Subject string
	Stream  string
	Seq     uint64
	Data    []byte
	Header  map[string][]string
}

// scope is the template scope of m: msg.id, msg.subject, msg.stream, msg.seq,
// msg.data (the JSON value the data holds, or its text when it is not JSON) and
// msg.header.NAME (the header's first value).
func (m TriggerMessage) scope() map[string]any {
	var data any
	if err := json.Unmarshal(m.Data, &data); err != nil || len(m.Data) == 0 {
		data = string(m.Data)
	}
	header := map[string]any{}
	for k, v := range m.Header {
		if len(v) > 0 {
			header[k] = v[0]
		}
	}
	return map[string]any{"msg": map[string]any{"id": m.ID, "subject": m.Subject, "stream": m.Stream,
		"seq": m.Seq, "data": data, "header": header}}
}

// DataJSON is the message's data as JSON: itself when it is JSON, else the text as a
// JSON string (a signal's data).
func (m TriggerMessage) DataJSON() json.RawMessage {
	if len(m.Data) == 0 {
		return nil
	}
	if json.Valid(m.Data) {
		return json.RawMessage(m.Data)
	}
	b, _ := json.Marshal(string(m.Data))
	return b
}

// Render is what trigger t of workflow wf makes of message m: the run ID and the run's
// inputs (not yet resolved against the workflow's types). An error names the template
// that did not render.
func (t Trigger) Render(wf string, m TriggerMessage) (id string, inputs map[string]any, err error) {
	scope := m.scope()
	src := t.ID
	if src == "" {
		src = DefaultTriggerID(wf)
	}
	tpl, err := ParseTemplate(src)
	if err != nil {
		return "", nil, err
	}
	v, err := tpl.Render(scope)
	if err != nil {
		return "", nil, fmt.Errorf("id %q: %w", src, err)
	}
	id = toText(v)
	inputs = map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(t.Inputs)) {
		tpl, err := ParseTemplate(t.Inputs[name])
		if err != nil {
			return "", nil, err
		}
		v, err := tpl.Render(scope)
		if err != nil {
			return "", nil, fmt.Errorf("input %s %q: %w", name, t.Inputs[name], err)
		}
		inputs[name] = v
	}
	return id, inputs, nil
}

// triggers reads `on:`: a {subject, ...} mapping or a list of them. What the inputs and
// the signal name must match (the workflow's inputs, its wait steps) is checked once
// the whole workflow is read (checkTriggers).
func (l *loader) triggers(n *yaml.Node, w *Workflow) {
	nodes := []*yaml.Node{n}
	switch n.Kind {
	case yaml.MappingNode:
	case yaml.SequenceNode:
		if len(n.Content) == 0 || len(n.Content) > MaxTriggers {
			l.fail(n, fmt.Sprintf("1 to %d {subject, id, inputs} mappings", MaxTriggers), "on lists %d triggers", len(n.Content))
			return
		}
		nodes = n.Content
	default:
		l.fail(n, `e.g. on: [{subject: "ledger.closed.>", id: "{{ msg.id }}", inputs: {date: "{{ msg.data.date }}"}}]`, "on must be a mapping or a list of them, not %s", kindName(n))
		return
	}
	for _, x := range nodes {
		t := Trigger{}
		var subjectNode *yaml.Node
		l.mapping(x, "a trigger (on:)", []string{"subject", "stream", "id", "inputs", "signal"}, func(key string, _, v *yaml.Node) {
			switch key {
			case "subject":
				t.Subject, subjectNode = l.str(v, "the trigger's subject"), v
				if err := CheckTriggerSubject(t.Subject); err != nil && t.Subject != "" {
					l.fail(v, `a NATS subject of your own, e.g. "ledger.closed.>"`, "trigger subject %q: %v", t.Subject, err)
				}
			case "stream":
				t.Stream = l.str(v, "the trigger's stream")
				if err := CheckTriggerStream(t.Stream); err != nil && t.Stream != "" {
					l.fail(v, "the name of a JetStream stream you made that captures the subject, or leave it out (flow's FLOW_EVENTS)", "trigger stream %q: %v", t.Stream, err)
				}
			case "id":
				t.ID = l.str(v, "the trigger's id")
				if err := checkMsgTemplate(t.ID); err != nil {
					l.fail(v, `a template over the message, e.g. "ledger-{{ msg.id }}" or "{{ msg.data.ledger }}"`, "trigger id %q: %v", t.ID, err)
				}
			case "inputs":
				if v.Kind != yaml.MappingNode {
					l.fail(v, `e.g. inputs: {date: "{{ msg.data.date }}"}`, "the trigger's inputs must be a mapping of input names to templates")
					return
				}
				t.Inputs = map[string]string{}
				for i := 0; i+1 < len(v.Content); i += 2 {
					k, tv := v.Content[i], v.Content[i+1]
					src := l.str(tv, "trigger input "+k.Value)
					if err := checkMsgTemplate(src); err != nil {
						l.fail(tv, `a template over the message, e.g. "{{ msg.data.date }}"`, "trigger input %s %q: %v", k.Value, src, err)
					}
					t.Inputs[k.Value] = src
				}
			case "signal":
				t.Signal = l.str(v, "the trigger's signal")
			}
		})
		if x.Kind != yaml.MappingNode {
			continue
		}
		if subjectNode == nil {
			l.fail(x, `add subject: "ledger.closed.>"`, "a trigger needs a subject")
			continue
		}
		for _, have := range w.On {
			if have.Subject == t.Subject && have.Stream == t.Stream {
				l.fail(subjectNode, "give each subject once", "trigger subject %q is given twice", t.Subject)
			}
		}
		w.On = append(w.On, t)
		l.onNodes = append(l.onNodes, x)
	}
}

// checkTriggers holds the triggers to the rest of the workflow: every input they give
// is one the workflow takes, every input without a default is given, and a signal is
// one a wait step of the workflow waits for.
func (l *loader) checkTriggers(w *Workflow) {
	for i, t := range w.On {
		n := l.onNodes[i]
		for _, name := range slices.Sorted(maps.Keys(t.Inputs)) {
			if !slices.ContainsFunc(w.Inputs, func(in Input) bool { return in.Name == name }) {
				l.fail(n, "give only the workflow's inputs (inputs:)", "on[%d]: the trigger gives input %q, which the workflow does not take", i, name)
			}
		}
		for _, in := range w.Inputs {
			if _, given := t.Inputs[in.Name]; !given && !in.HasDefault {
				l.fail(n, fmt.Sprintf(`add inputs: {%s: "{{ msg.data.%s }}"} to the trigger, or a default to the input`, in.Name, in.Name), "on[%d]: input %q has no default and the trigger does not give it", i, in.Name)
			}
		}
		if t.Signal != "" && !w.WaitsFor(t.Signal) {
			l.fail(n, "name a signal a wait step of this workflow waits for", "on[%d]: no wait step of the workflow waits for signal %q", i, t.Signal)
		}
	}
}

// WaitsFor says whether a wait step of w may take signal name (a step whose signal is
// a template may take any).
func (w *Workflow) WaitsFor(name string) bool {
	for _, st := range w.Steps {
		if st.Uses != "wait" {
			continue
		}
		s, isText := st.With["signal"].(string)
		if !isText {
			continue
		}
		if s == name || strings.Contains(s, "{{") {
			return true
		}
	}
	return false
}

// checkMsgTemplate accepts a template that reads only the message (msg.*).
func checkMsgTemplate(src string) error {
	if len(src) > 1024 {
		return fmt.Errorf("is longer than 1024 bytes")
	}
	t, err := ParseTemplate(src)
	if err != nil {
		return err
	}
	for _, p := range t.Paths() {
		if len(p) < 2 || p[0] != "msg" {
			return fmt.Errorf("reads %s; a trigger's templates read only the message (msg.id, msg.subject, msg.data..., msg.header.NAME)", strings.Join(p, "."))
		}
	}
	return nil
}

// reservedSubjectRoots are the first tokens of subjects that are flow's or the NATS
// server's: a trigger on them would capture flow's own log, tasks or API, or the
// JetStream API, into a stream.
var reservedSubjectRoots = []string{"flow", "FLOW", "$JS", "$KV", "$O", "$SYS", "$NRG", "$G", "_INBOX", "_R_"}

// CheckTriggerSubject accepts a NATS subject a trigger may capture: tokens of printable
// characters without spaces, '*' and '>' only as whole tokens ('>' last), a first token
// that is literal and not flow's or the server's.
func CheckTriggerSubject(s string) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	if len(s) > maxSubject {
		return fmt.Errorf("is longer than %d bytes", maxSubject)
	}
	tokens := strings.Split(s, ".")
	for i, tok := range tokens {
		switch {
		case tok == "":
			return fmt.Errorf("has an empty token (two dots, or a dot at an end)")
		case tok == ">" && i != len(tokens)-1:
			return fmt.Errorf("'>' must be the last token")
		case tok == "*" || tok == ">":
			if i == 0 {
				return fmt.Errorf("its first token must be literal: a wildcard there would capture other applications' subjects, flow's and the server's")
			}
		case strings.ContainsAny(tok, "*> \t\r\n"):
			return fmt.Errorf("token %q: '*' and '>' stand alone as tokens, and subjects hold no spaces", tok)
		}
		for _, c := range tok {
			if c < 0x21 || c == 0x7f {
				return fmt.Errorf("token %q holds a control character", tok)
			}
		}
	}
	for _, root := range reservedSubjectRoots {
		if strings.HasPrefix(tokens[0], root) {
			return fmt.Errorf("subjects under %s are flow's or the NATS server's", root)
		}
	}
	return nil
}

// CheckTriggerStream accepts the name of an operator's stream: a JetStream stream name,
// none of flow's.
func CheckTriggerStream(s string) error {
	if len(s) == 0 || len(s) > 128 {
		return fmt.Errorf("must be 1-128 characters")
	}
	if strings.ContainsAny(s, ".*> \t\r\n/\\") {
		return fmt.Errorf("a stream name holds no '.', '*', '>', slashes or spaces")
	}
	for _, p := range []string{"FLOW_", "KV_", "OBJ_"} {
		if strings.HasPrefix(strings.ToUpper(s), p) {
			return fmt.Errorf("streams named %s... are flow's or a bucket's: name your own stream", p)
		}
	}
	return nil
}
