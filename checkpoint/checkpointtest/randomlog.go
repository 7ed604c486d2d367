package checkpointtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/fxamacker/cbor/v2"
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
	Keys          []slotKey `json:"keys,omitempty"`
}

// slotKey is a concurrency wait's key (checkpoint.SlotKey).
type slotKey struct {
	Key   string `json:"key"`
	Limit int    `json:"limit"`
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
	// KeyScheme 2: the run's http keys cover their requests (revision 5, format 3).
	KeyScheme int `json:"key_scheme,omitempty"`
	// Priority orders its admission (revision 5, format 3).
	Priority int `json:"priority,omitempty"`
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
		if version > 4 {
			msgs = append(msgs, format3(entries))
			continue
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
	if e.Submit != nil && (e.Submit.Trigger == "event" || e.Submit.KeyScheme != 0 || e.Submit.Priority != 0) {
		return 5
	}
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
		if g.nth%7 == 3 {
			// Started by a message (trigger event, revision 5): its message is written
			// in log format 3. Chosen by the count, not the RNG, so that the rest of the
			// log is what it was before format 3.
			sub.Trigger, sub.KeyScheme = "event", 2
			// And of a priority, by the count too: some above the rest, some below.
			sub.Priority = []int{5, -5, 0, 10}[(g.nth/7)%4]
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

// format3 writes entries as a log format 3 message, as docs/checkpoint.md has it: the
// CBOR array [3, 5, node, entries], each entry a map keyed by the JSON names, whole
// numbers as integers, times as RFC 3339 text, and the fields that hold JSON (a
// commit's output, a signal's data, a workflow's spec, a submit's inputs) as byte
// strings of that JSON.
func format3(entries []entry) []byte {
	raws := make([]any, len(entries))
	for i := range entries {
		data, err := json.Marshal(&entries[i])
		if err != nil {
			panic(err)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			panic(err)
		}
		raws[i] = cborValue("", v)
	}
	out, err := cbor.Marshal([]any{3, 5, "gen", raws})
	if err != nil {
		panic(err)
	}
	return out
}

// cborValue is a JSON value as format 3 holds it under key.
func cborValue(key string, v any) any {
	switch key {
	case "output", "data", "spec", "inputs":
		b, _ := json.Marshal(v)
		return b
	}
	switch x := v.(type) {
	case map[string]any:
		for k, y := range x {
			x[k] = cborValue(k, y)
		}
		return x
	case []any:
		for i, y := range x {
			x[i] = cborValue("", y)
		}
		return x
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	}
	return v
}
