package checkpointtest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// A run's entries at each stage of its life, as RandomLog's generator writes them: pending,
// running (steps, items, waits, children), waiting, ended, retried, and the entries
// written from outside it (cancels, signals, decisions, purges) or that must be refused.

// outside is an entry from outside the run's own life, which may come in any status: a
// person's signal (some with an ID used before: applied once) or decision (the
// starter's, a second approval by one person, an anonymous one), or the leader's mark
// of a missed deadline.
func (g *generator) outside(id string, r *run) entry {
	rng := g.rng
	switch rng.IntN(5) {
	case 0, 1:
		s := &signal{Name: []string{"go", "go", "other"}[rng.IntN(3)], Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, rng.IntN(100)))}
		if rng.IntN(2) == 0 {
			s.ID = fmt.Sprintf("sig-%d", rng.IntN(3))
		}
		e := entry{Kind: "signal", Run: id, Actor: "bob", Signal: s}
		if r.terminal() || s.ID != "" && r.signalIDs[s.ID] {
			return e
		}
		if s.ID != "" {
			r.signalIDs[s.ID] = true
		}
		if s.Name == "go" {
			r.inbox = append(r.inbox, g.seq)
			if r.status == "waiting" && r.waitKind == "signal" {
				g.wake(r)
			}
		}
		return e
	case 2, 3:
		step := r.steps[rng.IntN(len(r.steps))]
		if r.status == "waiting" && r.waitKind == "approval" {
			step = r.parkStep
		}
		actor := people[rng.IntN(len(people))]
		if rng.IntN(8) == 0 {
			actor = "" // anonymous: never counts
		}
		d := &decision{Approve: rng.IntN(5) > 0, Comment: "looks right"}
		if r.status == "waiting" && r.waitKind == "approval" && step == r.parkStep && (!d.Approve || actor != "" && actor != r.starter) {
			g.wake(r) // roughly: the state counts the approvers
		}
		return entry{Kind: "decide", Run: id, Actor: actor, Step: step, Item: itemWhole, Decision: d}
	}
	e := entry{Kind: "deadline-missed", Run: id, Term: g.term, Owner: "leader"}
	if r.deadline && r.status != "succeeded" {
		r.deadline = false // marked once
		g.accepted = max(g.accepted, g.term)
		g.handler(id, r, "on_deadline")
	}
	return e
}

// wake makes a parked run pending for a resumed epoch.
func (g *generator) wake(r *run) {
	r.status, r.owner, r.claimed = "pending", "", true
	if r.waitKind == "signal" {
		r.consume = r.parkStep
	}
}

// handler starts r's handler run of event in the model, if r has handlers.
func (g *generator) handler(id string, r *run, event string) {
	if !r.handlers {
		return
	}
	hid := fmt.Sprintf("%s.on-%s.%d", id, strings.ReplaceAll(event[3:], "_", "-"), r.handled[event])
	r.handled[event]++
	if g.runs[hid] == nil && len(hid) <= 128 {
		g.runs[hid] = newRun(r.workflow, "h")
		g.extra = append(g.extra, hid)
	}
}

// ended is the model of a run's end: its handler runs start, its parent counts it.
func (g *generator) ended(id string, r *run, status string) {
	r.status, r.owner = status, ""
	switch status {
	case "failed":
		g.handler(id, r, "on_failure")
	case "dead_lettered":
		g.handler(id, r, "on_dead_letter")
	}
}

// cancel cancels r and, in the model, its children that have not ended, and theirs.
func (g *generator) cancel(id string, r *run) entry {
	g.cascade(r)
	return entry{Kind: "cancel", Run: id, Actor: "bob", Reason: "operator"}
}

func (g *generator) cascade(r *run) {
	r.status, r.owner = "cancelled", ""
	for _, c := range r.children {
		if cr := g.runs[c]; cr != nil && !cr.terminal() {
			g.cascade(cr)
		}
	}
}

func (g *generator) pending(id string, r *run) []entry {
	rng := g.rng
	switch {
	case rng.IntN(14) == 0:
		return []entry{g.cancel(id, r)}
	case rng.IntN(14) == 0:
		return g.endOfLife(id, r)
	case r.epoch == 0 || r.handedBack || r.retried || r.claimed || rng.IntN(5) == 0:
		return []entry{g.assign(id, r)}
	}
	owner := fmt.Sprintf("w%d", rng.IntN(3))
	r.status, r.owner, r.claimed = "running", owner, true
	return []entry{{Kind: "claim", Run: id, Epoch: r.epoch, Owner: owner}}
}

// waiting is what comes to a parked run: its timer's wake (some with the wrong park
// sequence, or twice), what it waits for (outside), a cancel.
func (g *generator) waiting(id string, r *run) []entry {
	rng := g.rng
	switch rng.IntN(8) {
	case 0:
		return []entry{g.cancel(id, r)}
	case 1, 2, 3, 5, 6:
		if r.waitKind != "timer" && r.waitKind != "concurrency" && rng.IntN(12) > 0 {
			return []entry{g.outside(id, r)}
		}
		e := entry{Kind: "wake", Run: id, Term: g.term, Owner: "leader", Step: r.parkStep, Item: itemWhole, ParkSeq: r.parkSeq}
		switch {
		case rng.IntN(6) == 0:
			e.ParkSeq++ // a park that is not the one the run waits on
		case r.waitKind == "timer" || r.waitKind == "concurrency": // a due timer; a grant of the step's slots
			g.accepted = max(g.accepted, g.term)
			g.wake(r)
		}
		return []entry{e}
	case 4:
		return []entry{g.assign(id, r)} // a parked run gets no epoch
	}
	return []entry{g.outside(id, r)}
}

// assign gives r a new epoch, this message's sequence: taken over from its owner
// (counted toward max_epochs, so it may dead-letter the run), reconciled, released or
// retried; sometimes to the leader's own worker at once.
func (g *generator) assign(id string, r *run) entry {
	e := entry{Kind: "assign", Run: id, Epoch: r.epoch, Term: g.term, Reason: []string{"lease-expired", "reconciled"}[g.rng.IntN(2)]}
	if g.assigned[id] || r.status == "waiting" {
		return e // a second assign of the run in one message, or of a parked run: refused
	}
	g.assigned[id] = true
	g.accepted = max(g.accepted, g.term)
	counted := r.epoch != 0 && !r.retried && !r.handedBack && r.owner != ""
	if counted && r.changes+1 > maxEpochs {
		g.ended(id, r, "dead_lettered")
		return e
	}
	if counted {
		r.changes++
	}
	r.epoch = g.seq
	r.epochs = append(r.epochs, g.seq)
	r.status, r.owner, r.claimed, r.handedBack, r.retried = "pending", "", false, false, false
	if g.rng.IntN(3) == 0 {
		e.Worker = fmt.Sprintf("w%d", g.rng.IntN(3))
		r.status, r.owner, r.claimed = "running", e.Worker, true
	}
	return e
}

// running is the next write of the run's owner: its steps in order (the foreach step's
// items, then the step), failures, parks, children started, a hand-back, the
// completion; or the leader taking the run over.
func (g *generator) running(id string, r *run) []entry {
	rng := g.rng
	w := func(kind string) entry { return entry{Kind: kind, Run: id, Epoch: r.epoch, Owner: r.owner} }
	next := ""
	for _, s := range r.steps {
		if !r.done[s] {
			next = s
			break
		}
	}
	switch rng.IntN(24) {
	case 0, 1:
		return []entry{g.assign(id, r)} // its lease lapsed
	case 2:
		e := w("requeue")
		r.status, r.owner, r.handedBack = "pending", "", true
		return []entry{e}
	case 3:
		return g.endOfLife(id, r)
	case 4, 5, 6:
		if next != "" && next != "b" && len(r.failed) == 0 {
			return []entry{g.park(id, r, next, "")}
		}
	case 7, 8:
		if next != "" && len(r.failed) == 0 {
			e, started := g.child(id, r, next)
			if started && next != "b" && rng.IntN(2) == 0 {
				return []entry{e, g.park(id, r, next, "child")} // and waits for it, as a workflow step does
			}
			return []entry{e}
		}
	case 9:
		if rng.IntN(3) == 0 {
			return []entry{g.cancel(id, r)}
		}
	}
	if next == "" || len(r.failed) > 0 {
		e := w("complete")
		e.Status = "succeeded"
		if len(r.failed) > 0 {
			e.Status, e.Step, e.Error = "failed", next, "step "+next+" failed"
		}
		g.ended(id, r, e.Status)
		return []entry{e}
	}
	item := itemWhole
	if next == "b" && len(r.itemsDone) < items && rng.IntN(4) > 0 {
		for item = rng.IntN(items); r.itemsDone[item]; item = (item + 1) % items {
		}
	}
	switch rng.IntN(10) {
	case 0, 1:
		e := w("start")
		e.Step, e.Item, e.Attempt = next, itemWhole, 1+rng.IntN(3)
		if next == "b" {
			e.Items = items
		}
		return []entry{e}
	case 2:
		e := w("fail")
		e.Step, e.Item, e.Error, e.Attempt = next, item, "exit status 1", 1+rng.IntN(3)
		if rng.IntN(3) == 0 {
			e.Final = true
			r.failed[next] = true
		}
		return []entry{e}
	}
	e := w("commit")
	e.Step, e.Item, e.Output = next, item, json.RawMessage(fmt.Sprintf(`{"n":%d}`, rng.IntN(1000)))
	if item == itemWhole {
		r.done[next] = true
		if len(r.inbox) > 0 && (r.consume == next || rng.IntN(3) == 0) {
			// the step that woke from a signal wait takes the signal, or a signal step
			// finds its signal there before it parks; sometimes one that is not in the
			// inbox: refused
			e.Consume = r.inbox[0]
			switch rng.IntN(8) {
			case 0:
				e.Consume = g.seq + 1000
			default:
				r.inbox = r.inbox[1:]
			}
			r.consume = ""
		}
	} else {
		r.itemsDone[item] = true
	}
	return []entry{e}
}

// park ends the owner's epoch to wait at step: for a signal, approvals (some not the
// starter's), a timer, the run's children, or the step's concurrency slots (some with
// a bad limit: refused); sometimes with an epoch it no longer holds (fenced).
func (g *generator) park(id string, r *run, step, kind string) entry {
	rng := g.rng
	if kind == "" {
		kind = []string{"signal", "approval", "timer", "child", "concurrency"}[rng.IntN(5)]
	}
	wt := &wait{Kind: kind}
	switch wt.Kind {
	case "signal":
		wt.Name = "go"
	case "approval":
		wt.Need = 1 + rng.IntN(2)
		if rng.IntN(2) == 0 {
			wt.NotTheStarter, wt.Exclude = true, r.starter
		}
	case "timer":
		wt.Until = Epoch.Add(time.Duration(1+rng.IntN(60)) * time.Minute)
	case "child":
		for _, c := range r.children {
			if g.runs[c] != nil {
				wt.Children = append(wt.Children, c) // not those retired: not found
			}
		}
		if len(wt.Children) == 0 || rng.IntN(8) == 0 {
			wt.Children = []string{id + ".nobody"} // not its child: refused
		}
	case "concurrency":
		wt.Keys = []slotKey{{Key: fmt.Sprintf("acct-%d", rng.IntN(3)), Limit: 1 + rng.IntN(2)}}
		if rng.IntN(3) == 0 {
			wt.Keys = append(wt.Keys, slotKey{Key: "bank", Limit: 2})
		}
		if rng.IntN(10) == 0 {
			wt.Keys[0].Limit = 0 // refused: invalid
			return entry{Kind: "park", Run: id, Epoch: r.epoch, Owner: r.owner, Step: step, Item: itemWhole, Wait: wt}
		}
	}
	e := entry{Kind: "park", Run: id, Epoch: r.epoch, Owner: r.owner, Step: step, Item: itemWhole, Wait: wt}
	if rng.IntN(8) == 0 && len(r.epochs) > 1 {
		e.Epoch, e.Owner = r.epochs[0], "zombie"
		return e
	}
	r.status, r.owner, r.claimed = "waiting", "", true
	r.parkSeq, r.parkStep, r.waitKind = g.seq, step, wt.Kind
	if wt.Kind == "signal" && len(r.inbox) > 0 {
		g.wake(r) // its signal came before it parked: it resumes at once
	}
	return e
}

// child starts a child of r at step, written with r's epoch; some the state refuses:
// a zombie's, one of the parent's own workflow (a loop), one past its tree's bound, one
// whose ID was started before. started says whether the model takes it as accepted.
func (g *generator) child(id string, r *run, step string) (entry, bool) {
	rng := g.rng
	cid := id + "." + step
	wf := r.workflow + "-c"
	sub := &submit{Workflow: wf, Version: 1, Trigger: "child", MaxEpochs: maxEpochs, Steps: specs([]string{"a", "b", "c"}),
		Parent: &parentRef{Run: id, Step: step, Item: itemWhole}}
	e := entry{Kind: "submit", Run: cid, Epoch: r.epoch, Owner: r.owner, Submit: sub}
	switch rng.IntN(8) {
	case 0:
		sub.Workflow = r.workflow // a loop of workflows
		return e, false
	case 1:
		if len(r.epochs) > 1 {
			e.Epoch = r.epochs[0] // a zombie of the parent
			return e, false
		}
	case 2:
		sub.MaxTree = 1 // the tree would pass its bound
		return e, false
	}
	if len(cid) > 128 || len(wf) > 64 || g.runs[cid] != nil {
		return e, false // too deep, or started before: refused
	}
	c := newRun(wf, "a", "b", "c")
	g.runs[cid] = c
	g.extra = append(g.extra, cid)
	r.children = append(r.children, cid)
	return e, true
}

// endOfLife ends a run that has not ended in one message: dead-lettered by the leader,
// then sometimes purged and retired (each entry sees the ones before it).
func (g *generator) endOfLife(id string, r *run) []entry {
	g.accepted = max(g.accepted, g.term)
	g.ended(id, r, "dead_lettered")
	es := []entry{{Kind: "dead_letter", Run: id, Term: g.term, Reason: "poison"}}
	if g.rng.IntN(2) == 0 {
		es = append(es, entry{Kind: "purge", Run: id})
		r.status = "cancelled"
		if g.rng.IntN(2) == 0 {
			es = append(es, entry{Kind: "retire", Run: id, Term: g.term})
			delete(g.runs, id)
		}
	}
	return es
}

// retry retries an ended run: its failed steps, or from a step (retry --from: the
// steps from there on reset, some with changed inputs; a succeeded run too; a step the
// run does not have is refused).
func (g *generator) retry(id string, r *run) entry {
	rng := g.rng
	e := entry{Kind: "retry", Run: id, Actor: "bob", Reason: "operator"}
	if rng.IntN(2) == 0 || r.status == "succeeded" {
		from := rng.IntN(len(r.steps))
		e.Steps = r.steps[from:]
		if rng.IntN(3) == 0 {
			e.Actor, e.Output = "carol", json.RawMessage(`{"x":2}`)
		}
		if rng.IntN(8) == 0 {
			e.Steps = []string{"zz"}
			return e
		}
		for _, s := range e.Steps {
			delete(r.done, s)
			if s == "b" {
				r.itemsDone = map[int]bool{}
			}
		}
	}
	r.status, r.owner, r.changes, r.retried, r.handedBack = "pending", "", 0, true, false
	r.failed = map[string]bool{}
	return e
}

// refused is an entry the state must refuse: a zombie's write with an epoch it no
// longer holds, a deposed leader's, a second checkpoint of a step, a step or run that
// does not exist, a fire time already recorded, an entry the run's status does not
// allow. The model is left as it was.
func (g *generator) refused(id string, r *run) entry {
	rng := g.rng
	stale := int64(1) // never assigned, or older than every epoch the run had
	if len(r.epochs) > 1 {
		stale = r.epochs[rng.IntN(len(r.epochs)-1)]
	}
	if stale == r.epoch {
		stale = r.epoch + 1_000_000 // an epoch never given: unknown
	}
	switch rng.IntN(10) {
	case 0: // a zombie's commit, fail, claim, complete or park
		kind := []string{"commit", "fail", "claim", "complete", "park"}[rng.IntN(5)]
		e := entry{Kind: kind, Run: id, Epoch: stale, Owner: "zombie", Step: "a", Item: itemWhole}
		switch kind {
		case "complete":
			e.Step, e.Item, e.Status = "", 0, "succeeded"
		case "claim":
			e.Step, e.Item = "", 0
		case "park":
			e.Wait = &wait{Kind: "signal", Name: "go"}
		}
		return e
	case 1: // a deposed leader
		if g.accepted > 1 {
			kind := []string{"assign", "dead_letter", "retire", "wake", "deadline-missed", "cluster_version"}[rng.IntN(6)]
			e := entry{Kind: kind, Run: id, Epoch: r.epoch, Term: g.accepted - 1, Reason: "lease-expired"}
			switch kind {
			case "wake":
				e.Epoch, e.Reason, e.Step, e.Item, e.ParkSeq = 0, "", "a", itemWhole, max(r.parkSeq, 1)
			case "deadline-missed":
				e.Epoch, e.Reason = 0, ""
			case "cluster_version":
				e = entry{Kind: kind, Term: g.accepted - 1, Cluster: 2}
			}
			return e
		}
		return entry{Kind: "assign", Run: id, Epoch: r.epoch + 7, Term: g.term} // a stale view of the epoch
	case 2: // a checkpoint written again
		for _, s := range r.steps {
			if r.done[s] && r.status == "running" {
				return entry{Kind: "commit", Run: id, Epoch: r.epoch, Owner: r.owner, Step: s, Item: itemWhole, Output: json.RawMessage(`{"again":true}`)}
			}
		}
		return entry{Kind: "commit", Run: id, Epoch: r.epoch, Owner: "w", Step: "d", Item: itemWhole}
	case 3: // a step the run does not have, an item out of range, a workflow without its digest
		switch rng.IntN(3) {
		case 0:
			return entry{Kind: "workflow", Owner: "api", Workflow: &workflowDef{Name: r.workflow, Spec: json.RawMessage(`{}`)}}
		case 1:
			return entry{Kind: "start", Run: id, Epoch: max(r.epoch, 1), Owner: "w", Step: "zz", Item: itemWhole}
		}
		return entry{Kind: "commit", Run: id, Epoch: max(r.epoch, 1), Owner: "w", Step: "a", Item: 3}
	case 4: // a run that does not exist
		kind := []string{"cancel", "signal", "decide", "deadline-missed", "cron_pause"}[rng.IntN(5)]
		e := entry{Kind: kind, Run: "ghost-" + id, Reason: "operator", Actor: "bob"}
		switch kind {
		case "cron_pause": // a workflow never applied
			e = entry{Kind: kind, Actor: "bob", Schedule: &schedule{Workflow: "ghost"}}
		case "signal":
			e.Reason, e.Signal = "", &signal{Name: "go"}
		case "decide":
			e.Reason, e.Step, e.Item, e.Decision = "", "a", itemWhole, &decision{Approve: true}
		case "deadline-missed":
			e.Reason, e.Actor, e.Term = "", "", g.term
		}
		return e
	case 5: // a fire time already recorded
		wf := workflows[rng.IntN(len(workflows))]
		if g.ticks[wf] == 0 {
			return entry{Kind: "submit", Run: id, Submit: &submit{Workflow: wf, Trigger: "manual", Steps: []stepSpec{{Name: "a"}}}} // it exists
		}
		at := Epoch.Add(time.Duration(1+rng.Int64N(g.ticks[wf])) * time.Minute)
		return entry{Kind: "cron_tick", Term: g.term, Owner: "leader", Tick: &tick{Workflow: wf, At: at, Outcome: "missed"}}
	case 6: // what the status does not allow
		if r.terminal() {
			return entry{Kind: []string{"cancel", "signal"}[rng.IntN(2)], Run: id, Reason: "again", Signal: &signal{Name: "late"}}
		}
		e := entry{Kind: []string{"purge", "retire", "retry", "wake"}[rng.IntN(4)], Run: id, Term: g.term}
		if e.Kind == "retry" && rng.IntN(2) == 0 {
			e.Steps = []string{"b", "c"} // from a step: only an ended run
		}
		if e.Kind == "wake" {
			e.Step, e.Item, e.ParkSeq = "a", itemWhole, g.seq // no park at this sequence
		}
		if e.Kind == "retry" || e.Kind == "purge" {
			e.Term = 0
		}
		return e
	case 7: // a submit of a run that exists, or a child of a parent that has ended
		if r.terminal() {
			return entry{Kind: "submit", Run: id + ".late", Epoch: max(r.epoch, 1), Owner: "w", Submit: &submit{Workflow: r.workflow + "-c", Trigger: "child",
				Steps: []stepSpec{{Name: "a"}}, Parent: &parentRef{Run: id, Step: r.steps[0], Item: itemWhole}}}
		}
		return entry{Kind: "submit", Run: id, Submit: &submit{Workflow: "wf0", Trigger: "manual", MaxEpochs: 1, Steps: []stepSpec{{Name: "a"}}}}
	case 8: // a decision that changes nothing: the starter's, or one approver's again, or about a step that ended
		step := r.steps[0]
		if r.status == "waiting" && r.waitKind == "approval" {
			step = r.parkStep
		}
		actor := r.starter
		if actor == "" {
			actor = "bob"
		}
		return entry{Kind: "decide", Run: id, Actor: actor, Step: step, Item: itemWhole, Decision: &decision{Approve: true}}
	default: // a worker's write to a run that does not run
		if r.status == "running" {
			return entry{Kind: "requeue", Run: id, Epoch: stale, Owner: "zombie"}
		}
		return entry{Kind: []string{"start", "commit", "fail"}[rng.IntN(3)], Run: id, Epoch: max(r.epoch, 1), Owner: "w", Step: "c", Item: itemWhole}
	}
}
