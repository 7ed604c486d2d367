package checkpointtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
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
	Actor    string          `json:"actor,omitempty"`
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
	Signal   *signal         `json:"signal,omitempty"`
	Decision *decision       `json:"decision,omitempty"`
	Wait     *wait           `json:"wait,omitempty"`
	Consume  int64           `json:"consume,omitempty"`
	ParkSeq  int64           `json:"park_seq,omitempty"`
	Schedule *schedule       `json:"schedule,omitempty"`
	Steps    []string        `json:"steps,omitempty"`
	Cluster  int             `json:"cluster_version,omitempty"`
	At       time.Time       `json:"at"`
}

// signal, decision and wait are a signal's, a decide's and a park's content.
type signal struct {
	Name string          `json:"name"`
	ID   string          `json:"id,omitempty"`
	Data json.RawMessage `json:"data,omitempty"`
}

type decision struct {
	Approve bool   `json:"approve"`
	Comment string `json:"comment,omitempty"`
}

type wait struct {
	Kind          string    `json:"kind"`
	Name          string    `json:"name,omitempty"`
	Until         time.Time `json:"until,omitzero"`
	Need          int       `json:"need,omitempty"`
	Exclude       string    `json:"exclude,omitempty"`
	NotTheStarter bool      `json:"not_the_starter,omitempty"`
	Children      []string  `json:"children,omitempty"`
}

// schedule is a cron_pause's or cron_resume's content.
type schedule struct {
	Workflow string `json:"workflow"`
	Reason   string `json:"reason,omitempty"`
}

type parentRef struct {
	Run  string `json:"run"`
	Step string `json:"step"`
	Item int    `json:"item"`
}

type submit struct {
	Workflow    string     `json:"workflow"`
	Version     int        `json:"version"`
	Trigger     string     `json:"trigger"`
	ScheduledAt time.Time  `json:"scheduled_at,omitzero"`
	MaxEpochs   int        `json:"max_epochs"`
	Steps       []stepSpec `json:"steps"`
	Parent      *parentRef `json:"parent,omitempty"`
	MaxTree     int        `json:"max_tree,omitempty"`
	Deadline    time.Time  `json:"deadline,omitzero"`
	// Handlers are the handler steps by event: on_failure, on_dead_letter, on_deadline.
	Handlers map[string][]stepSpec `json:"handlers,omitempty"`
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
	Deadline time.Time `json:"deadline,omitzero"`
}

// workflowDef is a workflow entry's definition.
type workflowDef struct {
	Name   string          `json:"name"`
	Digest string          `json:"digest"`
	Spec   json.RawMessage `json:"spec"`
}

const itemWhole = -1

var workflows = []string{"wf0", "wf1", "wf2"}

const (
	runs      = 40 // run IDs run-0 .. run-39
	maxEpochs = 3
	items     = 5 // the foreach step b's item count
)

// people who write entries for a person: alice starts runs (the starter an approval
// with not_the_starter excludes), carol changes their inputs on a retry.
var people = []string{"alice", "bob", "carol", "dave"}

// handlers are the handler steps a run may carry, for each event.
var handlers = map[string][]stepSpec{"on_failure": {{Name: "h"}}, "on_dead_letter": {{Name: "h"}}, "on_deadline": {{Name: "h"}}}

// RandomLog makes a deterministic log of n messages over 40 runs of three workflows,
// their children and their handler runs, with every kind of entry the state machine
// accepts (checkpoint.Kinds; TestRandomLogCoversEveryKind counts them): submits (by a
// person, with a deadline, with handlers, a child's by its parent's epoch) and fired,
// caught-up and backfilled cron ticks, assigns (some to a leader's own worker) and
// claims, starts, commits of steps and foreach items (some consuming a signal),
// failures final and not, completions succeeded and failed, requeues, retries (some
// from a step, some with changed inputs), cancels (cascading to children), dead letters
// (by an assign past max_epochs too), purges, retires (after which the run's ID is
// submitted again), parks on a signal, approvals, a timer or children, signals (some
// with an ID given before), decisions (the starter's, one approver's twice, anonymous
// ones), wakes, missed deadlines of runs and of ticks, cron pauses and resumes, cron
// ticks that did not fire (some with a deadline, some paused), workflow versions (some
// with a schedule) and cluster versions. Zombies' stale epochs, deposed leaders' stale
// terms, duplicate commits, fire times, run IDs, signal IDs and approvers, unknown
// runs and steps, and wrong park sequences are mixed in, so that many kinds of verdict
// are applied. Message i is meant for sequence i+1: an assign's new epoch, a park's
// sequence and a signal's are its message's sequence. A message is written at the
// format revision its entries need (a retire 2, the waits and the nightly operations
// 3, a cluster version 4).
//
// It writes most entries from a rough model of each run (what a writer that saw its
// entries accepted would believe) so that runs live whole lives; the state machine
// alone decides what is accepted, and tests read its verdicts, never the model's.
func RandomLog(seed uint64, n int) [][]byte {
	g := &generator{rng: rand.New(rand.NewPCG(seed, seed)), runs: map[string]*run{}, term: 1, ticks: map[string]int64{},
		scheduled: map[string]bool{}, paused: map[string]bool{}}
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
			version = max(version, revision(&entries[i]))
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

// revision is the format revision that holds e (docs/checkpoint.md, "Log format").
func revision(e *entry) int {
	switch e.Kind {
	case "cluster_version":
		return 4
	case "signal", "decide", "park", "wake", "cron_pause", "cron_resume", "deadline-missed":
		return 3
	}
	sub := e.Submit != nil && (e.Submit.Parent != nil || !e.Submit.Deadline.IsZero() || len(e.Submit.Handlers) > 0)
	tick := e.Tick != nil && (e.Tick.Outcome == "paused" || e.Tick.Outcome == "backfilled" || !e.Tick.Deadline.IsZero())
	if e.Consume > 0 || sub || tick || len(e.Steps) > 0 {
		return 3
	}
	if e.Kind == "retire" {
		return 2
	}
	return 1
}

// generator writes the log. It does not run the state machine: it keeps a model of
// each run as its entries would leave it if accepted.
type generator struct {
	rng       *rand.Rand
	runs      map[string]*run  // the runs submitted and not retired, as the model has them
	extra     []string         // the IDs of children and handler runs ever started
	nth       int              // runs submitted so far, for their workflows
	term      int64            // the newest leader's term
	accepted  int64            // the highest term of an entry the model accepted
	ticks     map[string]int64 // per workflow, the last fire time written (minutes after Epoch)
	deadlined []tick           // ticks written without a run and with a deadline
	scheduled map[string]bool  // workflows whose latest version has a schedule
	paused    map[string]bool  // schedules paused
	seq       int64            // the message being written
	assigned  map[string]bool  // runs assigned by this message (a second assign is refused)
}

// run is the model of one run.
type run struct {
	workflow   string
	status     string // pending, running, waiting, succeeded, failed, cancelled, dead_lettered
	steps      []string
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
	starter    string          // who submitted it ("" for the scheduler)
	handlers   bool            // its submit carried handlers
	handled    map[string]int  // handler runs started, by event
	deadline   bool            // its submit carried a deadline
	children   []string
	parkSeq    int64  // the park it waits on (waiting)
	parkStep   string // the step it parked on
	waitKind   string // what it waits for
	consume    string // a step whose commit takes a signal (it woke from a signal wait)
	inbox      []int64
	signalIDs  map[string]bool
}

func (r *run) terminal() bool {
	return r.status == "succeeded" || r.status == "failed" || r.status == "cancelled" || r.status == "dead_lettered"
}

// next draws the next entries of the message: mostly what a run's life calls for next,
// sometimes one the state must refuse.
func (g *generator) next() []entry {
	rng := g.rng
	id := fmt.Sprintf("run-%d", rng.IntN(runs))
	if len(g.extra) > 0 && rng.IntN(5) == 0 {
		id = g.extra[rng.IntN(len(g.extra))]
	}
	r := g.runs[id]
	switch {
	case r == nil && strings.Contains(id, "."):
		// a child or handler run retired since: people still write to it
		return []entry{{Kind: "signal", Run: id, Actor: "bob", Signal: &signal{Name: "go"}}}
	case r == nil:
		return g.submit(id)
	case rng.IntN(6) == 0:
		return []entry{g.refused(id, r)}
	case rng.IntN(12) == 0:
		return g.scheduleOnly()
	case rng.IntN(8) == 0:
		return []entry{g.outside(id, r)}
	}
	switch r.status {
	case "pending":
		return g.pending(id, r)
	case "running":
		return g.running(id, r)
	case "waiting":
		return g.waiting(id, r)
	case "dead_lettered":
		switch rng.IntN(3) {
		case 0:
			return []entry{g.retry(id, r)}
		default:
			r.status = "cancelled" // purged
			return []entry{{Kind: "purge", Run: id, Actor: "bob"}}
		}
	default: // succeeded, failed, cancelled
		if (r.status != "succeeded" || rng.IntN(2) == 0) && rng.IntN(3) == 0 {
			return []entry{g.retry(id, r)}
		}
		delete(g.runs, id) // retired: its ID is submitted again
		g.accepted = max(g.accepted, g.term)
		return []entry{{Kind: "retire", Run: id, Term: g.term}}
	}
}

func newRun(workflow string, steps ...string) *run {
	return &run{workflow: workflow, status: "pending", steps: steps, done: map[string]bool{}, failed: map[string]bool{},
		itemsDone: map[int]bool{}, handled: map[string]int{}, signalIDs: map[string]bool{}}
}

func specs(steps []string) []stepSpec {
	var out []stepSpec
	for _, s := range steps {
		out = append(out, stepSpec{Name: s, Foreach: s == "b"})
	}
	return out
}

// submit creates run id: submitted by the API (by a person, or by no one), or fired by
// the cron planner, caught up or backfilled; some with a deadline, some with handlers.
func (g *generator) submit(id string) []entry {
	rng := g.rng
	wf := workflows[g.nth%len(workflows)] // three workflows, for the admission queue's lines
	g.nth++
	r := newRun(wf, "a", "b", "c")
	g.runs[id] = r
	sub := &submit{Workflow: wf, Version: 1, Trigger: "manual", MaxEpochs: maxEpochs, Steps: specs(r.steps)}
	if rng.IntN(3) == 0 {
		sub.Deadline, r.deadline = Epoch.Add(time.Hour), true
	}
	if rng.IntN(3) == 0 {
		sub.Handlers, r.handlers = handlers, true
	}
	if rng.IntN(4) > 0 {
		e := entry{Kind: "submit", Run: id, Submit: sub}
		if rng.IntN(2) == 0 {
			e.Actor, r.starter = "alice", "alice"
		}
		return []entry{e}
	}
	g.ticks[wf]++ // a new fire time: a fired tick of a time already recorded submits nothing
	at := Epoch.Add(time.Duration(g.ticks[wf]) * time.Minute)
	sub.Trigger, sub.ScheduledAt = "cron", at
	e := entry{Kind: "cron_tick", Run: id, Term: g.term, Owner: "leader", Submit: sub,
		Tick: &tick{Workflow: wf, At: at, Outcome: []string{"fired", "caught-up", "fired"}[rng.IntN(3)], RunID: id}}
	if rng.IntN(4) == 0 && len(g.deadlined) > 0 {
		// an operator's backfill of a tick recorded without a run: no term
		t := g.deadlined[rng.IntN(len(g.deadlined))]
		sub.Workflow, sub.Trigger, sub.ScheduledAt = t.Workflow, "backfill", t.At
		e.Term, e.Owner, e.Actor = 0, "", "bob"
		e.Tick = &tick{Workflow: t.Workflow, At: t.At, Outcome: "backfilled", RunID: id}
		return []entry{e}
	}
	g.accepted = max(g.accepted, g.term)
	return []entry{e}
}

// scheduleOnly is an entry about no run: a tick that fired nothing (some with a
// deadline, which a later deadline-missed marks), a workflow version (often the
// latest's digest again: unchanged; some with a schedule, which cron_pause needs), a
// schedule's pause or resume, a tick's missed deadline, or a cluster version.
func (g *generator) scheduleOnly() []entry {
	rng := g.rng
	wf := workflows[rng.IntN(len(workflows))]
	switch rng.IntN(8) {
	case 0, 1, 2:
		g.ticks[wf]++
		g.accepted = max(g.accepted, g.term)
		t := &tick{Workflow: wf, At: Epoch.Add(time.Duration(g.ticks[wf]) * time.Minute),
			Outcome: []string{"skipped-overlap", "missed", "paused"}[rng.IntN(3)]}
		if rng.IntN(2) == 0 {
			t.Deadline = t.At.Add(time.Hour)
			g.deadlined = append(g.deadlined, *t)
		}
		return []entry{{Kind: "cron_tick", Term: g.term, Owner: "leader", Tick: t}}
	case 3:
		if len(g.deadlined) == 0 {
			break
		}
		t := g.deadlined[rng.IntN(len(g.deadlined))] // some twice, some backfilled: refused
		return []entry{{Kind: "deadline-missed", Term: g.term, Owner: "leader", Tick: &tick{Workflow: t.Workflow, At: t.At}}}
	case 4, 5:
		// A pause of a paused schedule is accepted (a new reason), a resume of one that
		// is not paused is refused, and so is either of a workflow without a schedule.
		kind := "cron_pause"
		if g.paused[wf] != (rng.IntN(4) == 0) {
			kind = "cron_resume"
		}
		e := entry{Kind: kind, Actor: "bob", Schedule: &schedule{Workflow: wf, Reason: "maintenance"}}
		if !g.scheduled[wf] && rng.IntN(2) == 0 {
			return append(g.version(wf, fmt.Sprintf("sha256:%s-%d", wf, 1+rng.IntN(2))), e)
		}
		if g.scheduled[wf] {
			g.paused[wf] = kind == "cron_pause"
		}
		return []entry{e}
	case 6:
		// The cluster version: 2 is accepted once, 1 and a repeated 2 are refused (a
		// version this binary does not read would stop the applier: never written).
		return []entry{{Kind: "cluster_version", Term: g.term, Owner: "leader", Cluster: 1 + rng.IntN(2)}}
	}
	return g.version(wf, fmt.Sprintf("sha256:%s-%d", wf, rng.IntN(3)))
}

// version applies a version of workflow wf: one with a schedule unless its digest ends
// in 0.
func (g *generator) version(wf, digest string) []entry {
	sched := ""
	g.scheduled[wf] = digest[len(digest)-1] != '0'
	if g.scheduled[wf] {
		sched = `,"schedule":"*/5 * * * *"`
	}
	spec := fmt.Sprintf(`{"name":%q,"digest":%q%s,"steps":[{"name":"a"},{"name":"b","foreach":"x"},{"name":"c"}]}`, wf, digest, sched)
	return []entry{{Kind: "workflow", Owner: "api", Actor: "bob", Workflow: &workflowDef{Name: wf, Digest: digest, Spec: json.RawMessage(spec)}}}
}

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
		if r.waitKind != "timer" && rng.IntN(12) > 0 {
			return []entry{g.outside(id, r)}
		}
		e := entry{Kind: "wake", Run: id, Term: g.term, Owner: "leader", Step: r.parkStep, Item: itemWhole, ParkSeq: r.parkSeq}
		switch {
		case rng.IntN(6) == 0:
			e.ParkSeq++ // a park that is not the one the run waits on
		case r.waitKind == "timer":
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
// starter's), a timer, or the run's children; sometimes with an epoch it no longer
// holds (fenced).
func (g *generator) park(id string, r *run, step, kind string) entry {
	rng := g.rng
	if kind == "" {
		kind = []string{"signal", "approval", "timer", "child"}[rng.IntN(4)]
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
