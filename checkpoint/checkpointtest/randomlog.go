package checkpointtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// Epoch is the time of the first entry RandomLog writes; each later message is a
// millisecond after the one before.
var Epoch = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

// entry is the log's wire form of an entry (docs/checkpoint.md), written here from the
// document rather than from checkpoint.Entry: the state machine's own tests import this
// package, and a second writer of the format checks that the format is what it says.
type entry struct {
	Kind     string          `json:"k"`
	Run      string          `json:"run,omitempty"`
	Epoch    int64           `json:"epoch,omitempty"`
	Term     int64           `json:"term,omitempty"`
	Owner    string          `json:"owner,omitempty"`
	Step     string          `json:"step,omitempty"`
	Item     int             `json:"item,omitempty"`
	Worker   string          `json:"worker,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	Output   json.RawMessage `json:"output,omitempty"`
	Error    string          `json:"error,omitempty"`
	Final    bool            `json:"final,omitempty"`
	Attempt  int             `json:"attempt,omitempty"`
	Items    int             `json:"items,omitempty"`
	Status   string          `json:"status,omitempty"`
	Submit   *submit         `json:"submit,omitempty"`
	Tick     *tick           `json:"tick,omitempty"`
	Workflow *workflowDef    `json:"workflow,omitempty"`
	At       time.Time       `json:"at"`
}

type submit struct {
	Workflow    string     `json:"workflow"`
	Version     int        `json:"version"`
	Trigger     string     `json:"trigger"`
	ScheduledAt time.Time  `json:"scheduled_at,omitzero"`
	MaxEpochs   int        `json:"max_epochs"`
	Steps       []stepSpec `json:"steps"`
}

type stepSpec struct {
	Name    string `json:"name"`
	Foreach bool   `json:"foreach,omitempty"`
}

// tick is a cron_tick's fire time and outcome.
type tick struct {
	Workflow string    `json:"workflow"`
	At       time.Time `json:"at"`
	Outcome  string    `json:"outcome"` // fired | skipped-overlap | missed | caught-up
	RunID    string    `json:"run_id,omitempty"`
}

// workflowDef is a workflow entry's definition.
type workflowDef struct {
	Name   string          `json:"name"`
	Digest string          `json:"digest"`
	Spec   json.RawMessage `json:"spec"`
}

const itemWhole = -1

// Kinds are the entry kinds of the log's format (docs/checkpoint.md), every one of
// which RandomLog writes.
var Kinds = []string{"submit", "assign", "claim", "start", "commit", "fail", "complete", "cancel",
	"dead_letter", "requeue", "retry", "cron_tick", "retire", "workflow", "purge"}

var workflows = []string{"wf0", "wf1", "wf2"}

const (
	runs      = 40 // run IDs run-0 .. run-39
	maxEpochs = 3
	items     = 5 // the foreach step b's item count
)

// RandomLog makes a deterministic log of n messages over 40 runs of three workflows,
// with every kind of entry (Kinds): submits and fired cron ticks, assigns (some to a
// leader's own worker) and claims, starts, commits of steps and foreach items, failures
// final and not, completions succeeded and failed, requeues, retries, cancels, dead
// letters (by an assign past max_epochs too), purges, retires (after which the run's ID
// is submitted again), cron ticks that did not fire, and workflow versions. Zombies'
// stale epochs, deposed leaders' stale terms, duplicate commits and fire times, unknown
// runs and steps are mixed in, so that many kinds of verdict are applied. Message i is
// meant for sequence i+1: an assign's new epoch is its message's sequence. A message
// holding a retire is written in format version 2, the others in version 1.
//
// It writes most entries from a rough model of each run (what a writer that saw its
// entries accepted would believe) so that runs live whole lives; the state machine
// alone decides what is accepted, and tests read its verdicts, never the model's.
func RandomLog(seed uint64, n int) [][]byte {
	g := &generator{rng: rand.New(rand.NewPCG(seed, seed)), runs: map[string]*run{}, term: 1, ticks: map[string]int64{}}
	var msgs [][]byte
	for seq := int64(1); len(msgs) < n; seq++ {
		if g.rng.IntN(60) == 0 {
			g.term++ // a new leader
		}
		g.seq, g.assigned = seq, map[string]bool{}
		k := 1 + g.rng.IntN(6)
		var entries []entry
		for len(entries) < k {
			entries = append(entries, g.next()...)
		}
		version := 1
		at := Epoch.Add(time.Duration(seq) * time.Millisecond)
		for i := range entries {
			entries[i].At = at
			if entries[i].Kind == "retire" {
				version = 2
			}
		}
		data, err := json.Marshal(struct {
			V       int     `json:"v"`
			Node    string  `json:"node"`
			Entries []entry `json:"entries"`
		}{version, "gen", entries})
		if err != nil {
			panic(err) // only strings, numbers and times: cannot fail
		}
		msgs = append(msgs, data)
	}
	return msgs
}

// generator writes the log. It does not run the state machine: it keeps a model of
// each run as its entries would leave it if accepted.
type generator struct {
	rng      *rand.Rand
	runs     map[string]*run  // the runs submitted and not retired, as the model has them
	nth      int              // runs submitted so far, for their workflows
	term     int64            // the newest leader's term
	accepted int64            // the highest term of an entry the model accepted
	ticks    map[string]int64 // per workflow, the last fire time written (minutes after Epoch)
	seq      int64            // the message being written
	assigned map[string]bool  // runs assigned by this message (a second assign is refused)
}

// run is the model of one run.
type run struct {
	status     string // pending, running, succeeded, failed, cancelled, dead_lettered
	epoch      int64
	epochs     []int64 // every epoch it was given, for zombies
	owner      string
	claimed    bool // the current epoch has had an owner
	handedBack bool
	retried    bool
	changes    int             // epoch changes counted toward max_epochs
	done       map[string]bool // steps checkpointed
	failed     map[string]bool // steps failed for good
	itemsDone  map[int]bool    // b's items checkpointed
}

func (r *run) terminal() bool {
	return r.status == "succeeded" || r.status == "failed" || r.status == "cancelled" || r.status == "dead_lettered"
}

// next draws the next entries of the message: mostly what a run's life calls for next,
// sometimes one the state must refuse.
func (g *generator) next() []entry {
	rng := g.rng
	id := fmt.Sprintf("run-%d", rng.IntN(runs))
	r := g.runs[id]
	switch {
	case r == nil:
		return g.submit(id)
	case rng.IntN(6) == 0:
		return []entry{g.refused(id, r)}
	case rng.IntN(12) == 0:
		return []entry{g.scheduleOnly()}
	}
	switch r.status {
	case "pending":
		return g.pending(id, r)
	case "running":
		return g.running(id, r)
	case "dead_lettered":
		switch rng.IntN(3) {
		case 0:
			return []entry{g.retry(id, r)}
		default:
			r.status = "cancelled" // purged
			return []entry{{Kind: "purge", Run: id}}
		}
	default: // succeeded, failed, cancelled
		if r.status != "succeeded" && rng.IntN(3) == 0 {
			return []entry{g.retry(id, r)}
		}
		delete(g.runs, id) // retired: its ID is submitted again
		g.accepted = max(g.accepted, g.term)
		return []entry{{Kind: "retire", Run: id, Term: g.term}}
	}
}

func newRun() *run {
	return &run{status: "pending", done: map[string]bool{}, failed: map[string]bool{}, itemsDone: map[int]bool{}}
}

// submit creates run id: submitted by the API, or fired by the cron planner.
func (g *generator) submit(id string) []entry {
	wf := workflows[g.nth%len(workflows)] // three workflows, for the admission queue's lines
	g.nth++
	g.runs[id] = newRun()
	sub := &submit{Workflow: wf, Version: 1, Trigger: "manual", MaxEpochs: maxEpochs,
		Steps: []stepSpec{{Name: "a"}, {Name: "b", Foreach: true}, {Name: "c"}}}
	if g.rng.IntN(4) > 0 {
		return []entry{{Kind: "submit", Run: id, Submit: sub}}
	}
	g.ticks[wf]++ // a new fire time: a fired tick of a time already recorded submits nothing
	at := Epoch.Add(time.Duration(g.ticks[wf]) * time.Minute)
	sub.Trigger, sub.ScheduledAt = "cron", at
	g.accepted = max(g.accepted, g.term)
	return []entry{{Kind: "cron_tick", Run: id, Term: g.term, Owner: "leader", Submit: sub,
		Tick: &tick{Workflow: wf, At: at, Outcome: []string{"fired", "caught-up"}[g.rng.IntN(2)], RunID: id}}}
}

// scheduleOnly is an entry about no run: a tick that fired nothing, or a workflow
// version (often the latest's digest again: unchanged).
func (g *generator) scheduleOnly() entry {
	wf := workflows[g.rng.IntN(len(workflows))]
	if g.rng.IntN(2) == 0 {
		g.ticks[wf]++
		g.accepted = max(g.accepted, g.term)
		return entry{Kind: "cron_tick", Term: g.term, Owner: "leader", Tick: &tick{Workflow: wf,
			At: Epoch.Add(time.Duration(g.ticks[wf]) * time.Minute), Outcome: []string{"skipped-overlap", "missed"}[g.rng.IntN(2)]}}
	}
	digest := fmt.Sprintf("sha256:%s-%d", wf, g.rng.IntN(3))
	spec := fmt.Sprintf(`{"name":%q,"digest":%q,"steps":[{"name":"a"},{"name":"b","foreach":"x"},{"name":"c"}]}`, wf, digest)
	return entry{Kind: "workflow", Owner: "api", Workflow: &workflowDef{Name: wf, Digest: digest, Spec: json.RawMessage(spec)}}
}

func (g *generator) pending(id string, r *run) []entry {
	rng := g.rng
	switch {
	case rng.IntN(14) == 0:
		r.status, r.owner = "cancelled", ""
		return []entry{{Kind: "cancel", Run: id, Reason: "operator"}}
	case rng.IntN(14) == 0:
		return g.endOfLife(id, r)
	case r.epoch == 0 || r.handedBack || r.retried || r.claimed || rng.IntN(5) == 0:
		return []entry{g.assign(id, r)}
	}
	owner := fmt.Sprintf("w%d", rng.IntN(3))
	r.status, r.owner, r.claimed = "running", owner, true
	return []entry{{Kind: "claim", Run: id, Epoch: r.epoch, Owner: owner}}
}

// assign gives r a new epoch, this message's sequence: taken over from its owner
// (counted toward max_epochs, so it may dead-letter the run), reconciled, released or
// retried; sometimes to the leader's own worker at once.
func (g *generator) assign(id string, r *run) entry {
	e := entry{Kind: "assign", Run: id, Epoch: r.epoch, Term: g.term, Reason: []string{"lease-expired", "reconciled"}[g.rng.IntN(2)]}
	if g.assigned[id] {
		return e // a second assign of the run in one message: refused
	}
	g.assigned[id] = true
	g.accepted = max(g.accepted, g.term)
	counted := r.epoch != 0 && !r.retried && !r.handedBack && r.owner != ""
	if counted && r.changes+1 > maxEpochs {
		r.status, r.owner = "dead_lettered", ""
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
// items, then the step), failures, a hand-back, the completion; or the leader taking
// the run over.
func (g *generator) running(id string, r *run) []entry {
	rng := g.rng
	w := func(kind string) entry { return entry{Kind: kind, Run: id, Epoch: r.epoch, Owner: r.owner} }
	switch rng.IntN(20) {
	case 0, 1:
		return []entry{g.assign(id, r)} // its lease lapsed
	case 2:
		e := w("requeue")
		r.status, r.owner, r.handedBack = "pending", "", true
		return []entry{e}
	case 3:
		return g.endOfLife(id, r)
	}
	next := ""
	for _, s := range []string{"a", "b", "c"} {
		if !r.done[s] {
			next = s
			break
		}
	}
	if next == "" || len(r.failed) > 0 {
		e := w("complete")
		e.Status = "succeeded"
		if len(r.failed) > 0 {
			e.Status, e.Step, e.Error = "failed", next, "step "+next+" failed"
		}
		r.status = e.Status
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
	} else {
		r.itemsDone[item] = true
	}
	return []entry{e}
}

// endOfLife ends a run that has not ended in one message: dead-lettered by the leader,
// then sometimes purged and retired (each entry sees the ones before it).
func (g *generator) endOfLife(id string, r *run) []entry {
	g.accepted = max(g.accepted, g.term)
	r.status, r.owner = "dead_lettered", ""
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

func (g *generator) retry(id string, r *run) entry {
	r.status, r.owner, r.changes, r.retried, r.handedBack = "pending", "", 0, true, false
	r.failed = map[string]bool{}
	return entry{Kind: "retry", Run: id, Reason: "operator"}
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
	switch rng.IntN(9) {
	case 0: // a zombie's commit, fail or claim
		kind := []string{"commit", "fail", "claim", "complete"}[rng.IntN(4)]
		e := entry{Kind: kind, Run: id, Epoch: stale, Owner: "zombie", Step: "a", Item: itemWhole}
		if kind == "complete" {
			e.Step, e.Item, e.Status = "", 0, "succeeded"
		}
		if kind == "claim" {
			e.Step, e.Item = "", 0
		}
		return e
	case 1: // a deposed leader
		if g.accepted > 1 {
			return entry{Kind: []string{"assign", "dead_letter", "retire"}[rng.IntN(3)], Run: id, Epoch: r.epoch, Term: g.accepted - 1, Reason: "lease-expired"}
		}
		return entry{Kind: "assign", Run: id, Epoch: r.epoch + 7, Term: g.term} // a stale view of the epoch
	case 2: // a checkpoint written again
		for _, s := range []string{"a", "b", "c"} {
			if r.done[s] && r.status == "running" {
				return entry{Kind: "commit", Run: id, Epoch: r.epoch, Owner: r.owner, Step: s, Item: itemWhole, Output: json.RawMessage(`{"again":true}`)}
			}
		}
		return entry{Kind: "commit", Run: id, Epoch: r.epoch, Owner: "w", Step: "d", Item: itemWhole}
	case 3: // a step the run does not have, or an item out of range
		if rng.IntN(2) == 0 {
			return entry{Kind: "start", Run: id, Epoch: max(r.epoch, 1), Owner: "w", Step: "zz", Item: itemWhole}
		}
		return entry{Kind: "commit", Run: id, Epoch: max(r.epoch, 1), Owner: "w", Step: "a", Item: 3}
	case 4: // a run that does not exist
		return entry{Kind: "cancel", Run: "ghost-" + id, Reason: "operator"}
	case 5: // a fire time already recorded
		wf := workflows[rng.IntN(len(workflows))]
		if g.ticks[wf] == 0 {
			return entry{Kind: "submit", Run: id, Submit: &submit{Workflow: wf, Trigger: "manual", Steps: []stepSpec{{Name: "a"}}}} // it exists
		}
		at := Epoch.Add(time.Duration(1+rng.Int64N(g.ticks[wf])) * time.Minute)
		return entry{Kind: "cron_tick", Term: g.term, Owner: "leader", Tick: &tick{Workflow: wf, At: at, Outcome: "missed"}}
	case 6: // what the status does not allow
		if r.terminal() {
			return entry{Kind: "cancel", Run: id, Reason: "again"}
		}
		return entry{Kind: []string{"purge", "retire", "retry"}[rng.IntN(3)], Run: id, Term: g.term}
	case 7: // a submit of a run that exists
		return entry{Kind: "submit", Run: id, Submit: &submit{Workflow: "wf0", Trigger: "manual", MaxEpochs: 1, Steps: []stepSpec{{Name: "a"}}}}
	default: // a worker's write to a run that does not run
		if r.status == "running" {
			return entry{Kind: "requeue", Run: id, Epoch: stale, Owner: "zombie"}
		}
		return entry{Kind: []string{"start", "commit", "fail"}[rng.IntN(3)], Run: id, Epoch: max(r.epoch, 1), Owner: "w", Step: "c", Item: itemWhole}
	}
}
