package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The text form of entries and verdicts that transcripts are written in: this
// package's (testdata/*.txt), the leader's and the workers' decisions', and the
// simulation's. It is for people to read and write; the log never carries it.
//
// An entry is "<kind> key=value...": run, epoch, term, owner, step, item (default -1,
// the whole step), worker, reason, actor, out (JSON, as written), error, attempt,
// items, status; bare flags final and skipped; and for submit: steps=a,b* ('*' marks a
// foreach step), max_epochs (default 0: DefaultMaxEpochs), workflow (default wf),
// version (default 1), trigger (default manual), max_tree, inputs=K:V,... (text values), handlers=EVENT:STEP,...; a child's submit (parent=RUN
// parent_step=S parent_item=N) runs workflow wf-S unless workflow= says otherwise. A value with spaces is written in
// double quotes. The waits' keys (wait.go): signal=NAME id=KEY data=JSON (signal);
// approve, reject, comment=TEXT (decide); wait=signal|approval|timer|child|concurrency
// name=SIGNAL until=RFC3339 need=N exclude=USER not_the_starter keys=KEY:LIMIT,... (park);
// consume=SEQ (commit); park=SEQ (wake).
// epoch=@R is run R's current epoch; an assign without epoch= carries
// the run's current epoch (what a scheduler reading the state writes).

// ParseEntryText reads one entry in the text form. at is its At; epochOf gives a run's
// current epoch (for epoch=@R and an assign without epoch=).
func ParseEntryText(line string, at time.Time, epochOf func(run string) (int64, bool)) (Entry, error) {
	toks, err := tokenizeEntry(line)
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Kind: Kind(toks[0].key), Item: ItemWhole, At: at}
	if toks[0].val != "" {
		return Entry{}, fmt.Errorf("an entry starts with its kind")
	}
	if e.Kind == KindSubmit || e.Kind == KindCronTick {
		e.Submit = &Submit{Workflow: "wf", Version: 1, Trigger: TriggerManual}
	}
	epochSet, workflowSet := false, false
	for _, tok := range toks[1:] {
		k, v := tok.key, tok.val
		num := func() (int64, error) { return strconv.ParseInt(v, 10, 64) }
		var n int64
		if e.Kind == KindWorkflow && (k == "name" || k == "spec") { // workflow name=W spec=JSON
			if e.Workflow == nil {
				e.Workflow = &WorkflowDef{Digest: "transcript"}
			}
			if k == "name" {
				e.Workflow.Name = v
			} else {
				e.Workflow.Spec = json.RawMessage(tok.raw)
				e.Workflow.Digest = tok.raw
			}
			continue
		}
		switch k {
		case "run":
			e.Run = v
		case "owner":
			e.Owner = v
		case "actor":
			e.Actor = v
		case "step":
			e.Step = v
		case "worker":
			e.Worker = v
		case "reason":
			e.Reason = v
		case "error":
			e.Error = v
		case "status":
			e.Status = RunStatus(v)
		case "signal", "id", "data", "data_size":
			if e.Signal == nil {
				e.Signal = &Signal{}
			}
			switch k {
			case "signal":
				e.Signal.Name = v
			case "id":
				e.Signal.ID = v
			case "data":
				e.Signal.Data = json.RawMessage(tok.raw)
			case "data_size": // a JSON string of that many bytes, quotes included
				n, err = num()
				if err == nil && n >= 2 {
					e.Signal.Data = json.RawMessage(`"` + strings.Repeat("x", int(n)-2) + `"`)
				}
			}
		case "approve", "reject", "comment":
			if e.Decision == nil {
				e.Decision = &Decision{}
			}
			switch k {
			case "approve":
				e.Decision.Approve = true
			case "comment":
				e.Decision.Comment = v
			}
		case "wait", "name", "until", "need", "exclude", "not_the_starter", "keys":
			if e.Wait == nil {
				e.Wait = &Wait{}
			}
			switch k {
			case "wait":
				e.Wait.Kind = v
			case "name":
				e.Wait.Name = v
			case "until":
				e.Wait.Until, err = time.Parse(time.RFC3339, v)
			case "need":
				n, err = num()
				e.Wait.Need = int(n)
			case "exclude":
				e.Wait.Exclude = v
			case "keys": // KEY:LIMIT,...
				for kv := range strings.SplitSeq(v, ",") {
					key, limit, ok := strings.Cut(kv, ":")
					if !ok {
						return Entry{}, fmt.Errorf("keys=%s: want KEY:LIMIT pairs, comma-separated", v)
					}
					n, err = strconv.ParseInt(limit, 10, 64)
					e.Wait.Keys = append(e.Wait.Keys, SlotKey{Key: key, Limit: int(n)})
				}
			case "not_the_starter":
				e.Wait.NotTheStarter, err = flagValue(v)
			}
		case "children":
			if e.Wait == nil {
				e.Wait = &Wait{}
			}
			e.Wait.Children = strings.Split(v, ",")
		case "parent", "parent_step", "parent_item":
			if e.Submit == nil {
				return Entry{}, fmt.Errorf("%s= belongs to a submit", k)
			}
			if e.Submit.Parent == nil {
				e.Submit.Parent = &ParentRef{Item: ItemWhole}
				e.Submit.Trigger = TriggerChild
			}
			switch k {
			case "parent":
				e.Submit.Parent.Run = v
			case "parent_step":
				e.Submit.Parent.Step = v
			case "parent_item":
				n, err = num()
				e.Submit.Parent.Item = int(n)
			}
		case "tick", "outcome", "tick_deadline": // cron_tick (and a tick's deadline-missed): of workflow wf
			if e.Tick == nil {
				e.Tick = &CronTick{Workflow: "wf"}
			}
			switch k {
			case "tick":
				e.Tick.At, err = time.Parse(time.RFC3339, v)
			case "outcome":
				e.Tick.Outcome = v
			case "tick_deadline":
				e.Tick.Deadline, err = time.Parse(time.RFC3339, v)
			}
		case "schedule":
			e.Schedule = &ScheduleChange{Workflow: v}
		case "deadline":
			if e.Submit == nil {
				return Entry{}, fmt.Errorf("deadline= belongs to a submit")
			}
			e.Submit.Deadline, err = time.Parse(time.RFC3339, v)
		case "handlers": // a submit's handler steps: EVENT:STEP,... (on_failure:tell)
			if e.Submit == nil {
				return Entry{}, fmt.Errorf("handlers= belongs to a submit")
			}
			e.Submit.Handlers = map[string][]StepSpec{}
			for h := range strings.SplitSeq(v, ",") {
				ev, step, ok := strings.Cut(h, ":")
				if !ok {
					return Entry{}, fmt.Errorf("handlers=%s: want EVENT:STEP pairs, comma-separated", v)
				}
				e.Submit.Handlers[ev] = append(e.Submit.Handlers[ev], StepSpec{Name: step})
			}
		case "from":
			e.Steps = strings.Split(v, ",")
		case "consume":
			n, err = num()
			e.Consume = uint64(n)
		case "park":
			n, err = num()
			e.ParkSeq = uint64(n)
		case "out": // JSON, as written: out="text" is a JSON string
			e.Output = json.RawMessage(tok.raw)
		case "final":
			e.Final, err = flagValue(v)
		case "skipped":
			e.Skipped, err = flagValue(v)
		case "epoch":
			epochSet = true
			if run, ok := strings.CutPrefix(v, "@"); ok {
				ep, found := epochOf(run)
				if !found {
					return Entry{}, fmt.Errorf("epoch=%s: no run %s", v, run)
				}
				e.Epoch = ep
			} else {
				e.Epoch, err = num()
			}
		case "term":
			e.Term, err = num()
		case "to": // cluster_version
			n, err = num()
			e.ClusterVersion = int(n)
		case "item":
			n, err = num()
			e.Item = int(n)
		case "attempt":
			n, err = num()
			e.Attempt = int(n)
		case "items":
			n, err = num()
			e.Items = int(n)
		case "steps", "max_epochs", "workflow", "version", "trigger", "max_tree", "inputs", "priority":
			if e.Submit == nil {
				return Entry{}, fmt.Errorf("%s= belongs to a submit", k)
			}
			switch k {
			case "steps":
				for name := range strings.SplitSeq(v, ",") {
					base, foreach := strings.CutSuffix(name, "*")
					e.Submit.Steps = append(e.Submit.Steps, StepSpec{Name: base, Foreach: foreach})
				}
			case "max_epochs":
				n, err = num()
				e.Submit.MaxEpochs = int(n)
			case "workflow":
				e.Submit.Workflow = v
				workflowSet = true
			case "max_tree":
				n, err = num()
				e.Submit.MaxTree = int(n)
			case "version":
				n, err = num()
				e.Submit.Version = int(n)
			case "trigger":
				e.Submit.Trigger = v
			case "priority":
				n, err = num()
				e.Submit.Priority = int(n)
			case "inputs": // k:v,k:v, each value text
				in := map[string]string{}
				for kv := range strings.SplitSeq(v, ",") {
					k, val, ok := strings.Cut(kv, ":")
					if !ok {
						return Entry{}, fmt.Errorf("inputs=%s: want k:v,k:v", v)
					}
					in[k] = val
				}
				e.Submit.Inputs, _ = json.Marshal(in)
			}
		default:
			return Entry{}, fmt.Errorf("unknown key %q", k)
		}
		if err != nil {
			return Entry{}, fmt.Errorf("%s=%s: %w", k, v, err)
		}
	}
	if e.Submit != nil && e.Submit.Parent != nil && !workflowSet {
		// A child runs another workflow than its parent's (a run of its ancestor's
		// workflow closes a loop, which the log refuses): wf-<its parent's step>.
		e.Submit.Workflow = "wf-" + e.Submit.Parent.Step
	}
	if e.Kind == KindCronTick && e.Tick != nil {
		if TickRan(e.Tick.Outcome) { // a tick that runs: its run ID, and the submit's trigger
			e.Run, e.Tick.RunID = TickRunIDText(e.Tick), TickRunIDText(e.Tick)
			e.Submit.Trigger = TriggerCron
			if e.Tick.Outcome == TickBackfilled {
				e.Submit.Trigger = TriggerBackfill
			}
			e.Submit.ScheduledAt = e.Tick.At
		} else {
			e.Submit = nil
		}
	}
	if e.Schedule != nil && e.Reason != "" {
		e.Schedule.Reason, e.Reason = e.Reason, ""
	}
	if e.Kind == KindAssign && !epochSet {
		if ep, ok := epochOf(e.Run); ok {
			e.Epoch = ep
		}
	}
	return e, nil
}

// VerdictText prints an entry's outcome, as the store at seq gave it, in a stable form:
// ok (an accepted assign adds the epoch it began and why), fenced: <reason> (epoch E,
// run's C), rejected: stale term ..., conflict: ..., invalid: ..., dead-lettered: ...,
// not found: ..., run exists: ..., tick exists: ....
func VerdictText(s *Store, seq uint64, e Entry, err error) string {
	var fe *FencedError
	var st *StaleTermError
	switch {
	case err == nil:
		if e.Kind == KindAssign {
			if r, rerr := s.Run(e.Run); rerr == nil {
				for _, ep := range r.Epochs {
					if ep.Epoch == int64(seq) {
						s := fmt.Sprintf("ok, epoch %d (%s)", ep.Epoch, ep.Reason)
						if e.Worker != "" {
							s += ", claimed by " + e.Worker
						}
						return s
					}
				}
			}
		}
		return "ok"
	case errors.As(err, &fe):
		return fmt.Sprintf("fenced: %s (epoch %d, run's %d)", fe.Reason, fe.Epoch, fe.CurrentEpoch)
	case errors.As(err, &st):
		return fmt.Sprintf("rejected: stale term (term %d < highest %d)", st.Term, st.HighestTerm)
	}
	for _, s := range []struct {
		label    string
		sentinel error
	}{
		{"dead-lettered", ErrDeadLettered},
		{"conflict", ErrConflict},
		{"invalid", ErrInvalidEntry},
		{"not found", ErrNotFound},
		{"run exists", ErrRunExists},
		{"tick exists", ErrTickExists},
	} {
		if errors.Is(err, s.sentinel) {
			return s.label + ": " + strings.TrimPrefix(err.Error(), s.sentinel.Error()+": ")
		}
	}
	return "error: " + err.Error()
}

func flagValue(v string) (bool, error) {
	if v == "" {
		return true, nil
	}
	return strconv.ParseBool(v)
}

// entryToken is key=val; raw is the value as written (a JSON output keeps its quotes).
type entryToken struct{ key, val, raw string }

// tokenizeEntry splits "kind k=v k2="a b" k3={"x": 1} flag" into tokens. A value is a
// quoted Go string, a JSON object or array (up to its closing bracket), or runs to the
// next space.
func tokenizeEntry(line string) ([]entryToken, error) {
	var toks []entryToken
	i := 0
	for {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		if i == len(line) {
			break
		}
		start := i
		for i < len(line) && line[i] != ' ' && line[i] != '=' {
			i++
		}
		tok := entryToken{key: line[start:i]}
		if i < len(line) && line[i] == '=' {
			i++
			n, err := valueLen(line[i:])
			if err != nil {
				return nil, fmt.Errorf("%s=: %w", tok.key, err)
			}
			tok.val = line[i : i+n]
			tok.raw = tok.val
			if strings.HasPrefix(tok.val, `"`) {
				if tok.val, err = strconv.Unquote(tok.val); err != nil {
					return nil, fmt.Errorf("%s=: %w", tok.key, err)
				}
			}
			i += n
		}
		toks = append(toks, tok)
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("empty entry")
	}
	return toks, nil
}

func valueLen(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	switch s[0] {
	case '"':
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '"':
				return i + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string")
	case '{', '[':
		depth, inStr := 0, false
		for i := 0; i < len(s); i++ {
			c := s[i]
			switch {
			case inStr && c == '\\':
				i++
			case c == '"':
				inStr = !inStr
			case inStr:
			case c == '{' || c == '[':
				depth++
			case c == '}' || c == ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unbalanced JSON value")
	}
	if n := strings.IndexByte(s, ' '); n >= 0 {
		return n, nil
	}
	return len(s), nil
}

// TickRunIDText is a tick's run ID as workflow.TickRunID makes it.
func TickRunIDText(t *CronTick) string {
	return t.Workflow + "-" + t.At.UTC().Format("20060102T150405Z")
}
