package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flowrun/flow/internal/base/ident"
)

// Kind names an entry type. The strings are part of the log format: never rename one.
type Kind string

// The entry kinds. Scheduler entries (assign, dead_letter, cron_tick) must carry the
// leader term.
const (
	KindSubmit     Kind = "submit"      // create a run (pending)
	KindAssign     Kind = "assign"      // new epoch = this entry's sequence (scheduler)
	KindClaim      Kind = "claim"       // a worker holding the lease takes the epoch
	KindStart      Kind = "start"       // a step attempt begins
	KindCommit     Kind = "commit"      // a step's or foreach item's checkpoint
	KindFail       Kind = "fail"        // a step attempt failed
	KindComplete   Kind = "complete"    // the run finished: succeeded or failed
	KindCancel     Kind = "cancel"      // operator or scheduler cancels
	KindDeadLetter Kind = "dead_letter" // scheduler moves a run to the DLQ
	KindRequeue    Kind = "requeue"     // clean hand-back (drain): pending, not counted
	KindRetry      Kind = "retry"       // operator retry of a failed/dead-lettered run
	KindCronTick   Kind = "cron_tick"   // a cron fire time and its outcome (scheduler)
	KindWorkflow   Kind = "workflow"    // apply a workflow: a new version if its source changed
	KindPurge      Kind = "purge"       // take a dead-lettered run out of the DLQ for good (cancelled)
	KindRetire     Kind = "retire"      // remove a run that ended longer ago than the retention (scheduler; format 2)
	KindSignal     Kind = "signal"      // a person's signal to a run: kept in its inbox until a wait consumes it (format 3)
	KindDecide     Kind = "decide"      // a person's approval or rejection of an approval step (format 3)
	KindPark       Kind = "park"        // the owner ends its epoch cleanly to wait (a signal, approvals, a timer) (format 3)
	KindWake       Kind = "wake"        // the scheduler wakes a parked run whose timer is due (format 3)
	// KindClusterVersion raises the cluster version: writers use its log format from
	// the entry on (scheduler; revision 4; logformat.go).
	KindClusterVersion Kind = "cluster_version"
)

// Revision is the newest revision of the entries this code reads and writes (the "v"
// of a format-1 message, the second field of a format-2 one; logformat.go). Revision 2
// adds the retire entry, 3 the waits (signal, decide, park, wake, and a commit's
// consumption of a signal) and the nightly operations, 4 the cluster version entry, 5
// (log format 3 only: MaxRevision) a run started by a message (trigger event); a
// format-1 message is written at the lowest revision that holds its entries
// (RevisionOf). A message of a newer revision stops the applier (it was written by
// newer code): "upgrade flowd".
const Revision = 5

// ItemWhole is the Item of an entry about a whole step rather than one foreach item.
const ItemWhole = -1

// Entry is one change to run state. Fields not used by a kind are left zero.
type Entry struct {
	Kind  Kind   `json:"k"`
	Run   string `json:"run,omitempty"`
	Epoch int64  `json:"epoch,omitempty"` // the writer's epoch (claim, start, commit, fail, complete, requeue); assign: the epoch it replaces
	Term  int64  `json:"term,omitempty"`  // leader term, on scheduler entries
	Owner string `json:"owner,omitempty"` // worker or node that wrote it
	// Actor is who asked for it, on entries the API writes for a person (run start,
	// cancel, retry, DLQ retry and purge, workflow apply): the NATS user the server
	// vouched for. Recorded in the history; never used to decide anything.
	Actor string `json:"actor,omitempty"`
	Step  string `json:"step,omitempty"`
	Item  int    `json:"item,omitempty"` // foreach index, or ItemWhole

	// Worker, on an assign, is the worker that takes the new epoch in the same entry:
	// the leader's own, which then runs the epoch without a task or a claim of its own
	// (docs/decisions.md). Empty: the epoch waits for a claim.
	Worker string `json:"worker,omitempty"`

	Reason  string          `json:"reason,omitempty"`  // assign: lease-expired | reconciled; cancel, dead_letter: free text
	Output  json.RawMessage `json:"output,omitempty"`  // commit
	Error   string          `json:"error,omitempty"`   // fail, complete(failed)
	Final   bool            `json:"final,omitempty"`   // fail: no more attempts
	Attempt int             `json:"attempt,omitempty"` // start, fail
	Items   int             `json:"items,omitempty"`   // start of a foreach step: the item count
	Skipped bool            `json:"skipped,omitempty"` // commit: the step's `if` was false
	Status  RunStatus       `json:"status,omitempty"`  // complete: succeeded | failed

	Submit *Submit   `json:"submit,omitempty"` // submit, and cron_tick that fires
	Tick   *CronTick `json:"tick,omitempty"`   // cron_tick
	// Workflow is the definition applied by a workflow entry.
	Workflow *WorkflowDef `json:"workflow,omitempty"`

	// The waits (wait.go). Signal: a signal entry's name, data and de-duplication key.
	// Decision: a decide entry's verdict. Wait: what a park entry waits for. Consume, on
	// a commit: the sequence of the inbox signal the step takes (once, fenced with the
	// commit). ParkSeq, on a wake: the park it ends.
	Signal   *Signal   `json:"signal,omitempty"`
	Decision *Decision `json:"decision,omitempty"`
	Wait     *Wait     `json:"wait,omitempty"`
	Consume  uint64    `json:"consume,omitempty"`
	ParkSeq  uint64    `json:"park_seq,omitempty"`

	// Schedule is a cron_pause or cron_resume entry's schedule (operations.go). Steps, on a
	// retry: the steps it resets (retry --from; format 3), with the changed inputs, if
	// any, as a JSON object in Output.
	Schedule *ScheduleChange `json:"schedule,omitempty"`
	Steps    []string        `json:"steps,omitempty"`

	// ClusterVersion is a cluster_version entry's new version (logformat.go).
	ClusterVersion int `json:"cluster_version,omitempty"`

	// At is the writer's wall clock. It is recorded for people to read and never
	// used to decide anything.
	At time.Time `json:"at"`
}

// Submit describes a new run.
type Submit struct {
	Workflow    string          `json:"workflow"`
	Version     int             `json:"version"`
	Trigger     string          `json:"trigger"` // manual | cron | retry | child | backfill | handler | event (format 3)
	ScheduledAt time.Time       `json:"scheduled_at,omitzero"`
	MaxEpochs   int             `json:"max_epochs"`
	Inputs      json.RawMessage `json:"inputs,omitempty"`
	Steps       []StepSpec      `json:"steps"`
	Spec        json.RawMessage `json:"spec,omitempty"` // the workflow version, for people and the engine
	// Parent, on a child run's submit: the run, step and foreach item that started it
	// (format 3; wait.go).
	Parent *ParentRef `json:"parent,omitempty"`
	// MaxTree, on a child's submit: the most runs its whole tree (its root and every
	// descendant) may hold with it, the starting node's --max-run-tree (0: no bound).
	MaxTree int `json:"max_tree,omitempty"`
	// Deadline is when the run should have succeeded (format 3; operations.go).
	Deadline time.Time `json:"deadline,omitzero"`
	// Handlers are the workflow's handler steps by event (format 3; operations.go).
	Handlers map[string][]StepSpec `json:"handlers,omitempty"`
	// Trace is the W3C traceparent of the run's submit span: every span of the run, on
	// any node and in any epoch, is in its trace (revision 4; written only at cluster
	// version 2 and up; internal/base/tracing).
	Trace string `json:"trace,omitempty"`
	// KeyScheme is how the run's steps' idempotency keys are made (revision 5, format 3
	// only): 0, the run, step and item; KeySchemeRequest, an http step's key also covers
	// its request (steps.RequestKey). Fixed per run at its submit, so that an attempt on
	// an older node and its retry on a newer one send one key.
	KeyScheme int `json:"key_scheme,omitempty"`
	// Priority orders the run's admission among the queued runs: higher first, each
	// waiting run's rising with its age (queue.go; revision 5, format 3 only; 0 the
	// default, MinPriority to MaxPriority).
	Priority int `json:"priority,omitempty"`
}

// The range of a run's priority (Submit.Priority; client.MinPriority and MaxPriority,
// the same numbers, for programs that do not link the store).
const (
	MinPriority = -100
	MaxPriority = 100
)

// KeySchemeRequest: an http step's idempotency key covers its run, step, item and the
// request it sends (method, URL and body), so `retry --input` that changes the request
// changes the key (issue 39).
const KeySchemeRequest = 2

// KeySchemeFor is the key scheme of a run submitted at cluster version v: the request's
// from version 3 (LogFormatFlowControl) on, which every node reads.
func KeySchemeFor(v int) int {
	if v >= LogFormatFlowControl {
		return KeySchemeRequest
	}
	return 0
}

// WorkflowDef is one applied workflow definition.
type WorkflowDef struct {
	Name   string          `json:"name"`
	Digest string          `json:"digest"` // of the source: the same digest is the same version
	Spec   json.RawMessage `json:"spec"`   // the parsed workflow, for the engine
}

// StepSpec is what the state machine needs to know of a step.
type StepSpec struct {
	Name    string `json:"name"`
	Foreach bool   `json:"foreach,omitempty"`
}

// CronTick is one fire time of a workflow's schedule.
type CronTick struct {
	Workflow string    `json:"workflow"`
	At       time.Time `json:"at"`               // the scheduled fire time
	Outcome  string    `json:"outcome"`          // fired | skipped-overlap | missed | caught-up
	RunID    string    `json:"run_id,omitempty"` // the run fired for it, if any
	// Deadline, on a tick recorded without a run (missed, paused, skipped): when its run
	// should have succeeded; the leader counts it as a missed deadline then, unless a
	// backfill ran it (operations.go; format 3).
	Deadline time.Time `json:"deadline,omitzero"`
}

// Tick outcomes.
const (
	TickFired          = "fired"
	TickSkippedOverlap = "skipped-overlap"
	TickMissed         = "missed"
	TickCaughtUp       = "caught-up"
)

// Validate checks the shape of an entry (not its effect on state). Writers call it
// before publishing; the applier calls it again and rejects, changing nothing, an entry
// that fails it.
func (e *Entry) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s entry: %s", ErrInvalidEntry, e.Kind, fmt.Sprintf(format, args...))
	}
	tickDeadline := e.Kind == KindDeadlineMissed && e.Run == "" && e.Tick != nil // a tick that never ran (operations.go)
	if e.Kind != KindCronTick && e.Kind != KindWorkflow && e.Kind != KindCronPause && e.Kind != KindCronResume && e.Kind != KindClusterVersion && !tickDeadline && !ident.ValidID(e.Run) {
		return bad("run ID %q: %s", e.Run, ident.IDRule)
	}
	if e.Owner != "" && !ident.ValidID(e.Owner) {
		return bad("owner %q: %s", e.Owner, ident.IDRule)
	}
	if e.Worker != "" && e.Kind != KindAssign {
		return bad("only an assign names a worker")
	}
	if e.Term < 0 || e.Epoch < 0 {
		return bad("negative term or epoch")
	}
	needsStep := func() error {
		if !ident.ValidName(e.Step) {
			return bad("step %q must be 1-64 of a-z, 0-9, '_' or '-'", e.Step)
		}
		if e.Item < ItemWhole {
			return bad("item %d: use a foreach index >= 0 or ItemWhole (-1)", e.Item)
		}
		return nil
	}
	needsEpoch := func() error {
		if e.Epoch <= 0 {
			return bad("epoch is required")
		}
		if !ident.ValidID(e.Owner) {
			return bad("owner is required")
		}
		return nil
	}
	switch e.Kind {
	case KindSubmit:
		return e.Submit.validate(bad)
	case KindAssign:
		if e.Term <= 0 {
			return bad("term is required on a scheduler entry")
		}
		if e.Worker != "" && !ident.ValidID(e.Worker) {
			return bad("worker %q: %s", e.Worker, ident.IDRule)
		}
		switch e.Reason {
		case "", ReasonLeaseExpired, ReasonReconciled:
		default:
			return bad("reason %q: use %q or %q (the others are derived from state)", e.Reason, ReasonLeaseExpired, ReasonReconciled)
		}
	case KindClaim, KindRequeue:
		return needsEpoch()
	case KindStart, KindCommit, KindFail:
		if err := needsEpoch(); err != nil {
			return err
		}
		if err := needsStep(); err != nil {
			return err
		}
		if e.Kind == KindCommit && len(e.Output) > 0 && !json.Valid(e.Output) {
			return bad("output is not valid JSON")
		}
		if e.Consume > 0 && (e.Kind != KindCommit || e.Item != ItemWhole) {
			return bad("only a whole step's commit consumes a signal")
		}
		if e.Items < 0 || e.Attempt < 0 {
			return bad("negative items or attempt")
		}
	case KindComplete:
		if err := needsEpoch(); err != nil {
			return err
		}
		if e.Status != StatusSucceeded && e.Status != StatusFailed {
			return bad("status %q: use succeeded or failed", e.Status)
		}
		if len(e.Output) > 0 && !json.Valid(e.Output) {
			return bad("outputs are not valid JSON")
		}
	case KindCancel, KindPurge:
	case KindRetry:
		for _, st := range e.Steps {
			if !ident.ValidName(st) {
				return bad("step %q must be 1-64 of a-z, 0-9, '_' or '-'", st)
			}
		}
		if len(e.Output) > 0 && (!json.Valid(e.Output) || e.Output[0] != '{') {
			return bad("changed inputs must be a JSON object")
		}
	case KindCronPause, KindCronResume:
		return e.validateSchedule(bad)
	case KindSignal, KindDecide, KindPark, KindWake:
		return e.validateWait(bad, needsEpoch, needsStep)
	case KindWorkflow:
		if e.Workflow == nil || !ident.ValidName(e.Workflow.Name) || e.Workflow.Digest == "" || !json.Valid(e.Workflow.Spec) {
			return bad("a workflow entry needs a valid name, a digest and a JSON spec")
		}
		return nil
	case KindDeadlineMissed:
		if e.Term <= 0 {
			return bad("term is required on a scheduler entry")
		}
		if e.Run == "" && (e.Tick == nil || !ident.ValidName(e.Tick.Workflow) || e.Tick.At.IsZero()) {
			return bad("a missed deadline names its run, or its tick (workflow and fire time)")
		}
	case KindDeadLetter, KindRetire:
		if e.Term <= 0 {
			return bad("term is required on a scheduler entry")
		}
	case KindClusterVersion:
		if e.Term <= 0 {
			return bad("term is required on a scheduler entry")
		}
		if e.ClusterVersion < 1 {
			return bad("cluster version %d: versions start at 1", e.ClusterVersion)
		}
	case KindCronTick:
		if e.Tick == nil || !ident.ValidName(e.Tick.Workflow) || e.Tick.At.IsZero() {
			return bad("tick needs a workflow name and a fire time")
		}
		if e.Term <= 0 && e.Tick.Outcome != TickBackfilled { // a backfill is an operator's, not the scheduler's
			return bad("term is required on a scheduler entry")
		}
		switch e.Tick.Outcome {
		case TickFired, TickCaughtUp, TickBackfilled:
			if e.Submit == nil || !ident.ValidID(e.Run) || e.Tick.RunID != e.Run {
				return bad("a fired tick needs the run ID and its submit")
			}
			return e.Submit.validate(bad)
		case TickSkippedOverlap, TickMissed, TickPaused:
		default:
			return bad("tick outcome %q: use fired, skipped-overlap, missed, caught-up, paused or backfilled", e.Tick.Outcome)
		}
	default:
		return bad("unknown kind (written by newer code?)")
	}
	return nil
}

func (s *Submit) validate(bad func(string, ...any) error) error {
	if s == nil {
		return bad("submit details are missing")
	}
	if !ident.ValidName(s.Workflow) {
		return bad("workflow name %q must be 1-64 of a-z, 0-9, '_' or '-'", s.Workflow)
	}
	if s.MaxEpochs < 0 || s.Version < 0 || s.MaxTree < 0 {
		return bad("negative max_epochs, version or max_tree")
	}
	switch s.Trigger {
	case TriggerManual, TriggerCron, TriggerRetry, TriggerChild, TriggerBackfill, TriggerHandler, TriggerEvent:
	default:
		return bad("trigger %q: use manual, cron, retry, child, backfill, handler or event", s.Trigger)
	}
	if len(s.Inputs) > 0 && !json.Valid(s.Inputs) {
		return bad("inputs are not valid JSON")
	}
	if s.KeyScheme != 0 && s.KeyScheme != KeySchemeRequest {
		return bad("key_scheme %d: use 2 or leave it out", s.KeyScheme)
	}
	if s.Priority < MinPriority || s.Priority > MaxPriority {
		return bad("priority %d: use %d to %d", s.Priority, MinPriority, MaxPriority)
	}
	if len(s.Trace) > 128 {
		return bad("trace: %d bytes, a traceparent is 55", len(s.Trace))
	}
	// In sorted order: a map's order is random, and every node must give the same
	// refusal for the same entry (FuzzOwnMessage compares the writer's with a peer's).
	for _, event := range slices.Sorted(maps.Keys(s.Handlers)) {
		steps := s.Handlers[event]
		if event != OnFailureEvent && event != OnDeadLetterEvent && event != OnDeadlineEvent {
			return bad("handler event %q: use on_failure, on_dead_letter or on_deadline", event)
		}
		for _, st := range steps {
			if !ident.ValidName(st.Name) {
				return bad("handler step name %q must be 1-64 of a-z, 0-9, '_' or '-'", st.Name)
			}
		}
	}
	if p := s.Parent; p != nil && (!ident.ValidID(p.Run) || !ident.ValidName(p.Step) || p.Item < ItemWhole) {
		return bad("parent: a run ID, a step name and an item (or %d)", ItemWhole)
	}
	seen := make(map[string]bool, len(s.Steps))
	for _, st := range s.Steps {
		if !ident.ValidName(st.Name) {
			return bad("step name %q must be 1-64 of a-z, 0-9, '_' or '-'", st.Name)
		}
		if seen[st.Name] {
			return bad("step %q appears twice", st.Name)
		}
		seen[st.Name] = true
	}
	return nil
}

// kindRevisions is every entry kind this code reads, with the format revision that
// brought it. The decoder (knownKind), RevisionFor and Kinds all read it: a kind is
// added here or it is corruption to the decoder, and tests that must cover every kind
// (the random log's) take their list from Kinds, so neither can drift from the other.
var kindRevisions = map[Kind]int{
	KindSubmit: 1, KindAssign: 1, KindClaim: 1, KindStart: 1, KindCommit: 1, KindFail: 1,
	KindComplete: 1, KindCancel: 1, KindDeadLetter: 1, KindRequeue: 1, KindRetry: 1,
	KindCronTick: 1, KindWorkflow: 1, KindPurge: 1,
	KindRetire: 2,
	KindSignal: 3, KindDecide: 3, KindPark: 3, KindWake: 3, KindCronPause: 3, KindCronResume: 3,
	KindDeadlineMissed: 3,
	KindClusterVersion: 4,
}

// Kinds are the entry kinds the decoder accepts (at the newest revision), by revision
// and then name.
func Kinds() []Kind {
	kinds := make([]Kind, 0, len(kindRevisions))
	for k := range kindRevisions {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b Kind) int {
		if c := cmp.Compare(kindRevisions[a], kindRevisions[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return kinds
}

// RevisionFor is the lowest format version whose readers know kind: a message is written
// at the highest of its entries', so that a node that does not know a kind stops with
// "upgrade" instead of rejecting the message that others apply.
func RevisionFor(kind Kind) int {
	if r, ok := kindRevisions[kind]; ok {
		return r
	}
	return 1
}

// RevisionOf is the format an entry needs: its kind's, or 3 for a commit that consumes a
// signal (a reader of format 2 would drop the consumption and let the signal be taken
// twice).
func RevisionOf(e *Entry) int {
	if e.Submit != nil && (e.Submit.Trigger == TriggerEvent || e.Submit.KeyScheme != 0 || e.Submit.Priority != 0) {
		return 5
	}
	if e.Submit != nil && e.Submit.Trace != "" {
		return 4
	}
	if e.Consume > 0 || e.Submit != nil && (e.Submit.Parent != nil || !e.Submit.Deadline.IsZero() || len(e.Submit.Handlers) > 0) || len(e.Steps) > 0 || e.Tick != nil && (e.Tick.Outcome == TickPaused || e.Tick.Outcome == TickBackfilled || !e.Tick.Deadline.IsZero()) {
		return 3
	}
	return RevisionFor(e.Kind)
}

// EncodeMessage encodes entries as one format-1 log message, at the lowest revision
// that holds them all (RevisionOf); EncodeMessageIn encodes in any format.
func EncodeMessage(node string, entries ...Entry) ([]byte, error) {
	version := 1
	datas := make([][]byte, len(entries))
	for i := range entries {
		raw, err := json.Marshal(&entries[i])
		if err != nil {
			return nil, fmt.Errorf("%w: encode: %v", ErrInvalidEntry, err)
		}
		datas[i] = raw
		version = max(version, RevisionOf(&entries[i]))
	}
	return EncodeJSONEnvelope(node, version, datas), nil
}

// EncodeEnvelope joins already-encoded entries into one format-1 message of revision 1
// without re-encoding.
func EncodeEnvelope(node string, entries [][]byte) []byte {
	return EncodeJSONEnvelope(node, 1, entries)
}

// EncodeJSONEnvelope is EncodeEnvelope at a format version (RevisionFor).
func EncodeJSONEnvelope(node string, version int, entries [][]byte) []byte {
	n := 32 + len(node)
	for _, e := range entries {
		n += len(e) + 1
	}
	var b bytes.Buffer
	b.Grow(n)
	fmt.Fprintf(&b, `{"v":%d,"node":%q,"entries":[`, version, node)
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// decodeJSON decodes a format-1 message strictly: unknown fields or kinds are
// corruption (*CorruptError), since they mean a writer this code does not understand;
// a newer revision is ErrNewerFormat.
func (rd reader) decodeJSON(seq uint64, data []byte) (Message, error) {
	var head struct {
		V int `json:"v"`
	}
	if json.Unmarshal(data, &head) == nil && head.V > rd.revision {
		return Message{}, fmt.Errorf("%w: the message at sequence %d has log format 1 revision %d, this flowd reads revisions up to %d", ErrNewerFormat, seq, head.V, rd.revision)
	}
	var env struct {
		V       int     `json:"v"`
		Node    string  `json:"node,omitempty"`
		Entries []Entry `json:"entries"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return Message{}, &CorruptError{Seq: seq, Detail: "decode: " + err.Error()}
	}
	if dec.More() {
		return Message{}, &CorruptError{Seq: seq, Detail: "trailing data after the envelope"}
	}
	if env.V < 1 || env.V > rd.revision {
		return Message{}, &CorruptError{Seq: seq, Detail: fmt.Sprintf("revision %d, this code reads revisions 1 to %d", env.V, rd.revision)}
	}
	m := Message{Format: LogFormatJSON, Revision: env.V, Node: env.Node, Entries: env.Entries}
	if err := m.check(seq); err != nil {
		return Message{}, err
	}
	return m, nil
}

// check holds a decoded message's entries to its revision.
func (m Message) check(seq uint64) error {
	if len(m.Entries) == 0 {
		return &CorruptError{Seq: seq, Detail: "no entries"}
	}
	if m.Revision > MaxRevision(m.Format) {
		return &CorruptError{Seq: seq, Detail: fmt.Sprintf("revision %d in a format-%d message, which holds revisions up to %d", m.Revision, m.Format, MaxRevision(m.Format))}
	}
	for i := range m.Entries {
		if !knownKind(m.Entries[i].Kind, m.Revision) {
			return &CorruptError{Seq: seq, Detail: fmt.Sprintf("entry %d: unknown kind %q", i, m.Entries[i].Kind)}
		}
		if RevisionOf(&m.Entries[i]) > m.Revision {
			return &CorruptError{Seq: seq, Detail: fmt.Sprintf("entry %d needs revision %d, the message says %d", i, RevisionOf(&m.Entries[i]), m.Revision)}
		}
	}
	return nil
}

func knownKind(k Kind, version int) bool {
	r, ok := kindRevisions[k]
	return ok && version >= r
}
