package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"time"
)

// RunStatus is a run's status. The strings are public contract.
type RunStatus string

// Run statuses.
const (
	StatusPending      RunStatus = "pending"
	StatusRunning      RunStatus = "running"
	StatusSucceeded    RunStatus = "succeeded"
	StatusFailed       RunStatus = "failed"
	StatusCancelled    RunStatus = "cancelled"
	StatusDeadLettered RunStatus = "dead_lettered"
	// StatusWaiting: parked on a wait (a signal, approvals, a timer): no epoch runs, no
	// lease or worker is held (wait.go).
	StatusWaiting RunStatus = "waiting"
)

// Terminal reports whether no worker acts on a run in this status.
func (s RunStatus) Terminal() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusCancelled || s == StatusDeadLettered
}

// ValidRunStatus reports whether s names a run status.
func ValidRunStatus(s RunStatus) bool {
	switch s {
	case StatusPending, StatusRunning, StatusSucceeded, StatusFailed, StatusCancelled, StatusDeadLettered, StatusWaiting:
		return true
	}
	return false
}

// StepStatus is a step's status.
type StepStatus string

// Step statuses.
const (
	StepPending   StepStatus = "pending"
	StepRunning   StepStatus = "running"
	StepSucceeded StepStatus = "succeeded"
	StepFailed    StepStatus = "failed"
	StepSkipped   StepStatus = "skipped"
)

// Triggers of a run.
const (
	TriggerManual   = "manual"
	TriggerCron     = "cron"
	TriggerRetry    = "retry"
	TriggerChild    = "child"    // started by a parent run's workflow step
	TriggerBackfill = "backfill" // an operator's backfill of a tick (operations.go)
)

// Why an epoch began (public contract).
const (
	ReasonAssigned     = "assigned"
	ReasonLeaseExpired = "lease-expired"
	ReasonReleased     = "released"
	ReasonRetried      = "retried"
	ReasonReconciled   = "reconciled"
	ReasonResumed      = "resumed" // a parked run woke: not counted toward max_epochs
)

// Run is the state of one run.
type Run struct {
	ID           string          `json:"id"`
	Workflow     string          `json:"workflow"`
	Version      int             `json:"version"`
	Status       RunStatus       `json:"status"`
	Trigger      string          `json:"trigger"`
	ScheduledAt  time.Time       `json:"scheduled_at,omitzero"`
	Inputs       json.RawMessage `json:"inputs,omitempty"`
	Spec         json.RawMessage `json:"spec,omitempty"`
	Epoch        int64           `json:"epoch"`
	EpochChanges int             `json:"epoch_changes"`
	MaxEpochs    int             `json:"max_epochs"`
	Owner        string          `json:"owner,omitempty"` // holder of the current epoch, once claimed
	Steps        []string        `json:"step_order"`
	Epochs       []EpochRecord   `json:"epochs"`
	Error        string          `json:"error,omitempty"`
	FailedStep   string          `json:"failed_step,omitempty"`
	DeadLetter   string          `json:"dead_letter_reason,omitempty"`
	Fenced       int             `json:"fenced_count"`

	// HandedBack: the last owner released the run cleanly; the next epoch is not counted.
	HandedBack bool `json:"handed_back,omitempty"`
	// RetryRequested: an operator retried the run; the next epoch is not counted.
	RetryRequested bool `json:"retry_requested,omitempty"`

	// StartedBy is the person who started the run (the submit's actor): an approval
	// step with not_the_starter does not count them.
	StartedBy string `json:"started_by,omitempty"`
	// Trace is the run's trace context (Submit.Trace), a W3C traceparent; a handler run
	// has the run's that started it.
	Trace string `json:"trace,omitempty"`
	// KeyScheme is its steps' idempotency key scheme (Submit.KeyScheme); a handler run
	// has the run's that started it.
	KeyScheme int `json:"key_scheme,omitempty"`
	// Priority is its admission priority (Submit.Priority): higher first, rising with
	// the time it waits (queue.go).
	Priority int `json:"priority,omitempty"`
	// Waiting is what a parked run waits for (status waiting); nil otherwise.
	Waiting *Waiting `json:"waiting,omitempty"`
	// Slots are the step slots the run holds (slots.go): granted by the leader's wake,
	// given back by its owner's entries. Draining are slots given back by someone else
	// (a cancel, a retry) while an owner may still run: counted until the next claim.
	Slots    []StepSlot `json:"slots,omitempty"`
	Draining []StepSlot `json:"draining,omitempty"`
	// Resume: the run woke from a park; its next epoch is not counted.
	Resume bool `json:"resume,omitempty"`
	// Inbox holds the run's signals in log order, consumed or not (wait.go).
	Inbox []SignalRecord `json:"inbox,omitempty"`
	// Decisions are the approvals and rejections given to its approval steps.
	Decisions []DecisionRecord `json:"decisions,omitempty"`
	// Timers are the deadlines of its waits, by step: set by the step's first park and
	// kept by later ones, marked fired by the scheduler's wake.
	Timers map[string]*Timer `json:"timers,omitempty"`
	// Parent is the run whose workflow step started this one (nil for a run started
	// otherwise); Depth counts its ancestors; Children are the runs it started, in order.
	Parent   *ParentRef `json:"parent,omitempty"`
	Depth    int        `json:"depth,omitempty"`
	Children []string   `json:"children,omitempty"`
	// TreeSize, on a run no parent started, counts its descendants (children, theirs,
	// ...): a child's submit is refused when the tree would outgrow its bound.
	TreeSize int `json:"tree_size,omitempty"`
	// InputsBy are the people who changed the run's inputs (retry --input), in order: an
	// approval with not_the_starter counts them no more than the starter (wait.go).
	InputsBy []string `json:"inputs_by,omitempty"`
	// Outputs are the run's outputs (the workflow's outputs: rendered at its success).
	Outputs json.RawMessage `json:"outputs,omitempty"`
	// Deadline is when the run should have succeeded (its workflow's deadline: from its
	// submit); DeadlineMissed, that the leader recorded it had not (operations.go).
	Deadline       time.Time `json:"deadline,omitzero"`
	DeadlineMissed bool      `json:"deadline_missed,omitempty"`
	// Handlers are its workflow's handler steps by event (on_failure, on_dead_letter,
	// on_deadline); HandlerRuns the handler runs its events started; Handler, on a
	// handler run, the run and event it handles (operations.go).
	Handlers    map[string][]StepSpec `json:"handlers,omitempty"`
	HandlerRuns []string              `json:"handler_runs,omitempty"`
	Handler     *HandlerRef           `json:"handler,omitempty"`

	CreatedSeq uint64    `json:"created_seq"`
	UpdatedSeq uint64    `json:"updated_seq"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	// StartedAt is when its first epoch was claimed (zero: it never ran); EndedAt when it
	// last ended (succeeded, failed, cancelled or dead-lettered; zero while it has not,
	// and again after a retry). Times of the entries that did it, the writers' clocks.
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
}

// NeedsAssign reports a pending run without a usable epoch: never assigned, handed back
// by its last owner, or retried by an operator. The scheduler gives these a new epoch.
func (r *Run) NeedsAssign() bool {
	return r.Status == StatusPending && (r.Epoch == 0 || r.HandedBack || r.RetryRequested || r.Resume)
}

// EpochRecord is one epoch of a run.
type EpochRecord struct {
	Epoch  int64     `json:"epoch"`
	Owner  string    `json:"owner"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Term   int64     `json:"term,omitempty"`
}

// Step is the state of one step of a run.
type Step struct {
	Name      string          `json:"name"`
	Foreach   bool            `json:"foreach,omitempty"`
	Status    StepStatus      `json:"status"`
	Attempts  int             `json:"attempts"`
	Epoch     int64           `json:"epoch"` // the epoch that checkpointed it (or last touched it)
	Items     int             `json:"items"`
	ItemsDone int             `json:"items_done"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     string          `json:"error,omitempty"`
	Seq       uint64          `json:"seq,omitempty"` // the commit's sequence
	// StartedAt is its first accepted start (of every attempt and epoch since it was last
	// reset); EndedAt its checkpoint or its final failure (zero until then). Epoch above
	// is the epoch that ended it.
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
}

// Item is the checkpoint of one foreach item.
type Item struct {
	Index  int             `json:"item"`
	Epoch  int64           `json:"epoch"`
	Owner  string          `json:"owner"`
	Output json.RawMessage `json:"output,omitempty"`
	Seq    uint64          `json:"seq"`
	Entry  int             `json:"entry"` // position in its log message
	At     time.Time       `json:"at"`
}

// Fenced is a rejected commit (or fail/complete), recorded durably.
type Fenced struct {
	Step         string    `json:"step"`
	Item         int       `json:"item"`
	Epoch        int64     `json:"epoch"`
	CurrentEpoch int64     `json:"current_epoch"`
	Owner        string    `json:"owner"`
	Kind         Kind      `json:"kind"`
	Reason       string    `json:"reason"`
	Seq          uint64    `json:"seq"`
	At           time.Time `json:"at"`
}

// StaleTerm is a scheduler entry rejected for its term.
type StaleTerm struct {
	Kind        Kind      `json:"kind"`
	Run         string    `json:"run,omitempty"`
	Term        int64     `json:"term"`
	HighestTerm int64     `json:"highest_term"`
	Seq         uint64    `json:"seq"`
	At          time.Time `json:"at"`
}

// Event is one applied entry of a run, in log order: the run's history.
type Event struct {
	Seq     uint64 `json:"seq"`
	Index   int    `json:"index"` // position in its log message
	Kind    Kind   `json:"kind"`
	Epoch   int64  `json:"epoch,omitempty"`
	Term    int64  `json:"term,omitempty"`
	Owner   string `json:"owner,omitempty"`
	Actor   string `json:"actor,omitempty"` // the user who asked for it (Entry.Actor)
	Step    string `json:"step,omitempty"`
	Item    int    `json:"item,omitempty"`
	Outcome string `json:"outcome"` // accepted, or why it was rejected
	Detail  string `json:"detail,omitempty"`
	// Steps, on a retry from a step: the steps it reset (their earlier commits stay
	// here, before it).
	Steps []string  `json:"steps,omitempty"`
	At    time.Time `json:"at"`
}

// RejectedMessage is a log message that could not be decoded: rejected at its sequence,
// the same way on every node, without any effect on runs.
type RejectedMessage struct {
	Seq    uint64 `json:"seq"`
	Detail string `json:"detail"`
}

// Tick is a recorded cron fire time.
type Tick struct {
	CronTick
	// Scheduled, on a backfilled tick: the schedule had recorded it before (missed,
	// paused, skipped) and the backfill ran it; the schedule's walk carries on after it.
	Scheduled bool `json:"scheduled,omitempty"`
	// DeadlineMissed: it never ran by its deadline (operations.go).
	DeadlineMissed bool      `json:"deadline_missed,omitempty"`
	Owner          string    `json:"owner,omitempty"` // the leader node that recorded it
	Term           int64     `json:"term"`
	Seq            uint64    `json:"seq"`
	Rec            time.Time `json:"recorded_at"`
}

// WorkflowVersion is one version of a workflow.
type WorkflowVersion struct {
	Name    string          `json:"name"`
	Version int             `json:"version"`
	Digest  string          `json:"digest"`
	Spec    json.RawMessage `json:"spec"`
	Seq     uint64          `json:"seq"`
	At      time.Time       `json:"at"`
}

// Pebble key layout. Every key starts with a one-letter table and '/'; run IDs, step and
// workflow names cannot contain '/', so prefixes never overlap.
//
//	m/applied                     applied log sequence (8 bytes, big endian)
//	m/term                        highest leader term applied
//	r/<run>                       Run
//	s/<run>/<step>                Step
//	i/<run>/<step>/<item:8>       Item
//	f/<run>/<seq:8><idx:4>        Fenced
//	e/<run>/<seq:8><idx:4>        Event
//	t/<seq:8><idx:4>              StaleTerm
//	c/<workflow>/<unixnano:8>     Tick
//	v/<workflow>/<version:8>      WorkflowVersion
//	x/<status>/<run>              index: runs by status
//	w/<workflow>/<status>/<run>   index: runs by workflow and status
//	m/index-newest-2              applied sequence the b/ d/ g/ indexes are current at
//	b/<at:8><seq:8><run>          index: runs by creation time (CreatedAt, then CreatedSeq)
//	d/<at:8><seq:8><run>          index: the same, top-level runs only
//	g/<workflow>/<at:8><seq:8><run>  index: the same, by workflow
//	a/<unixnano:8><run>           index: parked runs by the time their timer is due (wait.go)
//	l/<unixnano:8><run>           index: runs by deadline, until they succeed or miss it (operations.go)
//	k/<workflow>                  ScheduleState: a schedule's pause (operations.go)
//
// (The b/ d/ g/ indexes serve QueryRuns: newest.go and listing.go say why and how.)
var (
	keyApplied = []byte("m/applied")
	keyTerm    = []byte("m/term")
)

func keyRun(run string) []byte        { return []byte("r/" + run) }
func keyStep(run, step string) []byte { return []byte("s/" + run + "/" + step) }
func keyItem(run, step string, item int) []byte {
	return binary.BigEndian.AppendUint64([]byte("i/"+run+"/"+step+"/"), uint64(item))
}
func prefixItems(run, step string) []byte { return []byte("i/" + run + "/" + step + "/") }
func keyFenced(run string, seq uint64, idx int) []byte {
	return seqIdx([]byte("f/"+run+"/"), seq, idx)
}
func prefixFenced(run string) []byte { return []byte("f/" + run + "/") }
func keyEvent(run string, seq uint64, idx int) []byte {
	return seqIdx([]byte("e/"+run+"/"), seq, idx)
}
func prefixEvents(run string) []byte          { return []byte("e/" + run + "/") }
func keyStaleTerm(seq uint64, idx int) []byte { return seqIdx([]byte("t/"), seq, idx) }
func keyTick(workflow string, at time.Time) []byte {
	return binary.BigEndian.AppendUint64([]byte("c/"+workflow+"/"), uint64(at.UnixNano()))
}
func prefixTicks(workflow string) []byte { return []byte("c/" + workflow + "/") }
func keyWorkflow(name string, version int) []byte {
	return binary.BigEndian.AppendUint64([]byte("v/"+name+"/"), uint64(version))
}
func keyRejected(seq uint64) []byte { return seqIdx(prefixRejected, seq, 0) }

var prefixRejected = []byte("j/")

func prefixWorkflow(name string) []byte { return []byte("v/" + name + "/") }

func keyByStatus(status RunStatus, run string) []byte {
	return []byte("x/" + string(status) + "/" + run)
}
func keyByWorkflow(workflow string, status RunStatus, run string) []byte {
	return []byte("w/" + workflow + "/" + string(status) + "/" + run)
}

func seqIdx(prefix []byte, seq uint64, idx int) []byte {
	b := binary.BigEndian.AppendUint64(prefix, seq)
	return binary.BigEndian.AppendUint32(b, uint32(idx))
}

// prefixEnd is the smallest key after every key with the prefix.
func prefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
