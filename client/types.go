package client

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Subject is the prefix of every operation's subject: flow.v1.<op>.
const Subject = "flow.v1"

// Version of the request format.
const Version = 1

// Error codes.
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeConflict   = "conflict"
	CodeInternal   = "internal"
	// CodeTooManyRequests: this user already holds as many requests of this kind on the
	// node as one user may (the node's other users keep theirs); ask again when some end.
	CodeTooManyRequests = "too_many_requests"
	// CodeForbidden: the node refused this person what they asked (an approval from
	// someone below the step's approvers role, or whom the node cannot name). It is
	// ErrNotAuthorized (errors.Is), with the node's message; flowctl exits 4.
	CodeForbidden = "forbidden"
)

// Request is every request on the wire: the version and the fields its operation
// reads. The methods of Client fill it; it is exported for servers and for clients in
// other languages that want the same shape.
type Request struct {
	V        int               `json:"v"`
	ID       string            `json:"id,omitempty"`
	Name     string            `json:"name,omitempty"`
	File     string            `json:"file,omitempty"`
	YAML     string            `json:"yaml,omitempty"`
	Workflow string            `json:"workflow,omitempty"`
	Status   string            `json:"status,omitempty"`
	Limit    int               `json:"limit,omitempty"`
	After    string            `json:"after,omitempty"`
	Inputs   map[string]string `json:"inputs,omitempty"`
	// Wait bounds run.wait (a Go duration, default 30s, at most 1m).
	Wait string `json:"wait,omitempty"`
	// Data is run.signal's data (JSON); SignalID its de-duplication key (a signal with
	// an ID applied before is applied once).
	Data     json.RawMessage `json:"data,omitempty"`
	SignalID string          `json:"signal_id,omitempty"`
	// Step and Comment are run.approve's and run.reject's (Step "": the approval step
	// the run waits on, or its only one).
	Step    string `json:"step,omitempty"`
	Comment string `json:"comment,omitempty"`
	// Item and Attempt narrow run.logs (with Step; After is its cursor).
	Item    *int `json:"item,omitempty"`
	Attempt int  `json:"attempt,omitempty"`
	// Reason is cron.pause's. N is cron.next's count (default 5, at most 1000).
	Reason string `json:"reason,omitempty"`
	N      int    `json:"n,omitempty"`
	// From is run.retry's step (it and every step that depends on it run again; Inputs
	// are then the inputs changed), or cron.backfill's first time; To is cron.backfill's
	// last. A backfill's times are RFC 3339 or a date (2026-11-01: midnight in the
	// schedule's timezone), both ends included.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// OnlyMissed, MaxParallel, Order (oldest or newest) and DryRun are cron.backfill's.
	OnlyMissed bool `json:"only_missed,omitempty"`
	// IncludeFailed is cron.backfill's: a tick whose run failed is retried.
	IncludeFailed bool   `json:"include_failed,omitempty"`
	MaxParallel   int    `json:"max_parallel,omitempty"`
	Order         string `json:"order,omitempty"`
	DryRun        bool   `json:"dry_run,omitempty"`
	// Traceparent is run.start's caller's trace context (W3C traceparent).
	Traceparent string `json:"traceparent,omitempty"`
	// Priority is run.start's and cron.backfill's priority for the runs they start
	// (nil: the workflow's).
	Priority *int `json:"priority,omitempty"`
	// run.list's filters (ListOptions): Since and Until (RFC 3339) bound the creation
	// time, Statuses add to Status, Inputs are input values the runs must have, Parent
	// lists one run's children and handler runs, TopLevel none of those. Oldest lists
	// oldest first; Paged asks for {"runs", "next"} instead of the bare array (After, the
	// cursor, implies it).
	Since    string   `json:"since,omitempty"`
	Until    string   `json:"until,omitempty"`
	Trigger  string   `json:"trigger,omitempty"`
	Statuses []string `json:"statuses,omitempty"`
	Parent   string   `json:"parent,omitempty"`
	TopLevel bool     `json:"top_level,omitempty"`
	Oldest   bool     `json:"oldest,omitempty"`
	Paged    bool     `json:"paged,omitempty"`
}

// RunPage is a page of run.list: the runs and, when more may follow, the cursor to
// pass as ListOptions.After for the next page. A page may hold fewer runs than asked
// for and still have a next one (the server bounds the runs it looks at per request).
type RunPage struct {
	Runs []Run  `json:"runs"`
	Next string `json:"next,omitempty"`
}

// The range of a run's priority (StartOptions.Priority, `priority:`): higher first.
const (
	MinPriority = -100
	MaxPriority = 100
)

// Run is the contract's JSON shape of a run.
type Run struct {
	ID           string `json:"id"`
	Workflow     string `json:"workflow"`
	Version      int    `json:"version"`
	Status       string `json:"status"`
	Trigger      string `json:"trigger"`
	ScheduledAt  string `json:"scheduled_at,omitempty"`
	Epoch        int64  `json:"epoch"`
	EpochChanges int    `json:"epoch_changes"`
	MaxEpochs    int    `json:"max_epochs"`
	// Priority orders its admission among queued runs (higher first; issue 39).
	Priority   int             `json:"priority"`
	Owner      string          `json:"owner,omitempty"`
	Error      string          `json:"error,omitempty"`
	FailedStep string          `json:"failed_step,omitempty"`
	DeadLetter string          `json:"dead_letter_reason,omitempty"`
	CreatedAt  string          `json:"created_at"`
	UpdatedAt  string          `json:"updated_at"`
	Inputs     json.RawMessage `json:"inputs,omitempty"`
	Steps      []Step          `json:"steps,omitempty"`
	Epochs     []Epoch         `json:"epochs"`
	Fenced     []Fenced        `json:"fenced"`
	// StartedBy is the person who started the run ("" without auth, or a schedule's).
	StartedBy string `json:"started_by"`
	// Waiting is what the run waits for, while its status is waiting.
	Waiting *Waiting `json:"waiting,omitempty"`
	// Inbox are the signals sent to the run, in log order, consumed or not; Decisions
	// the approvals and rejections of its approval steps.
	Inbox     []Signal   `json:"inbox"`
	Decisions []Decision `json:"decisions"`
	// Parent is the run whose workflow step started this one; Children the runs this
	// one's workflow steps started, in order; Outputs the run's outputs (its workflow's
	// outputs:, once it succeeded).
	Parent   *Parent         `json:"parent,omitempty"`
	Children []string        `json:"children,omitempty"`
	Outputs  json.RawMessage `json:"outputs,omitempty"`
	// StartedAt is when its first epoch was claimed, EndedAt when it last ended (RFC
	// 3339; null: not yet, or not since a retry).
	StartedAt *string `json:"started_at"`
	EndedAt   *string `json:"ended_at"`
	// Deadline is its workflow's deadline for it (null: none); Handlers the handler runs
	// its failures, dead letter and missed deadline started.
	Deadline *Deadline `json:"deadline"`
	Handlers []string  `json:"handlers"`
}

// Parent names what started a child run: the parent run, its step and foreach item (-1:
// the whole step).
type Parent struct {
	Run  string `json:"run"`
	Step string `json:"step"`
	Item int    `json:"item"`
}

// Wait kinds (Waiting.Kind).
const (
	WaitSignal   = "signal"
	WaitApproval = "approval"
	WaitTimer    = "timer"
	WaitChild    = "child"
	// WaitConcurrency: a queued run one of whose concurrency keys is full (Key, Limit,
	// Holders); its status is shown as waiting, its state's is pending. Or a run parked
	// for its step's keys (Step set too; its state's status is waiting): the leader
	// grants them when they have room.
	WaitConcurrency = "concurrency"
	// WaitLabel: a run no live node can take, for it needs worker labels (runs_on) none
	// has (Label the first, Labels all of them); its status is shown as waiting, its
	// state's is pending, and it starts when a node with them reports.
	WaitLabel = "label"
	// WaitRate: a running run one of whose steps waits on its worker for a rate limit's
	// moment (Key, Step), as its node last reported (within a few seconds); its state's
	// status is running.
	WaitRate = "rate"
)

// Waiting is what a waiting run waits for: a signal (Signal names it), people's
// approvals of a step (Need of them, of Role or above) or a timer; Until is when its
// timer is due (RFC 3339; null: no timer).
type Waiting struct {
	Kind   string  `json:"kind"`
	Step   string  `json:"step"`
	Until  *string `json:"until"`
	Signal string  `json:"signal,omitempty"`
	Need   int     `json:"need,omitempty"`
	// ApprovedBy, for an approval wait: the people whose approvals count toward Need, in
	// order (not the starter's or an input changer's with not_the_starter, not a repeat).
	ApprovedBy []string `json:"approved_by,omitempty"`
	Role       string   `json:"role,omitempty"`
	Since      string   `json:"since,omitempty"`
	// Children, for a child wait: the child runs it waits for.
	Children []string `json:"children,omitempty"`
	// Key, Limit and Holders, for a concurrency wait: the full key, its limit and the
	// runs holding its slots.
	Key     string   `json:"key,omitempty"`
	Limit   int      `json:"limit,omitempty"`
	Holders []string `json:"holders,omitempty"`
	// Label and Labels, for a label wait: the worker labels no live node has.
	Label  string   `json:"label,omitempty"`
	Labels []string `json:"labels,omitempty"`
}

// Limits is `flowctl limits`: the concurrency keys in use. Complete is false when more
// runs were queued than were read to count the waiting.
type Limits struct {
	Keys     []KeyUse `json:"keys"`
	Complete bool     `json:"complete"`
	// Rates are the rate limits' keys (rate_limit on a step) the cluster has paced.
	Rates []RateUse `json:"rates"`
}

// RateUse is one rate limit's key: the rate its last start declared (Limit per Per, a
// duration such as "1s"), the starts reserved and not yet due, when a start reserved
// now would go (RFC 3339), the steps waiting for their moment as the live nodes last
// reported them, and the workflows applied that use it.
type RateUse struct {
	Key       string       `json:"key"`
	Limit     int          `json:"limit"`
	Per       string       `json:"per"`
	Reserved  int          `json:"reserved"`
	Next      string       `json:"next"`
	Waiting   []RateWaiter `json:"waiting"`
	Workflows []string     `json:"workflows"`
}

// RateWaiter is a step waiting for a rate's moment on a node.
type RateWaiter struct {
	Run   string `json:"run"`
	Step  string `json:"step"`
	Item  int    `json:"item"`
	Node  string `json:"node"`
	Since string `json:"since"`
}

// KeyUse is one concurrency key: its limit, the runs holding its slots (holding an epoch
// or parked), how many queued runs wait for it, and the workflows whose runs use it.
type KeyUse struct {
	Key       string   `json:"key"`
	Limit     int      `json:"limit"`
	Holders   []string `json:"holders"`
	Waiting   int      `json:"waiting"`
	Workflows []string `json:"workflows"`
}

// Signal is one signal in a run's inbox: ConsumedBy is the step that took it ("" while
// it waits for one).
type Signal struct {
	Seq        uint64          `json:"seq"`
	Name       string          `json:"name"`
	ID         string          `json:"id,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	Sender     string          `json:"sender,omitempty"`
	At         string          `json:"at"`
	ConsumedBy string          `json:"consumed_by,omitempty"`
}

// Decision is one approval (Approve) or rejection of an approval step.
type Decision struct {
	Seq     uint64 `json:"seq"`
	Step    string `json:"step"`
	Actor   string `json:"actor"`
	Approve bool   `json:"approve"`
	Comment string `json:"comment,omitempty"`
	At      string `json:"at"`
}

// Step is one step of a run.
type Step struct {
	Name      string          `json:"name"`
	Status    string          `json:"status"`
	Attempts  int             `json:"attempts"`
	Epoch     int64           `json:"epoch"`
	Items     int             `json:"items"`
	ItemsDone int             `json:"items_done"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     string          `json:"error,omitempty"`
	// StartedAt is its first start since it was last reset, EndedAt its checkpoint or
	// final failure (RFC 3339; null until then).
	StartedAt *string `json:"started_at"`
	EndedAt   *string `json:"ended_at"`
}

// Deadline is when a run should have succeeded, and whether it was recorded as missed.
type Deadline struct {
	At     string `json:"at"`
	Missed bool   `json:"missed"`
}

// Epoch is one epoch of a run.
type Epoch struct {
	Epoch  int64  `json:"epoch"`
	Owner  string `json:"owner"`
	Reason string `json:"reason"`
	At     string `json:"at"`
}

// Fenced is one rejected commit.
type Fenced struct {
	Step         string `json:"step"`
	Item         int    `json:"item"`
	Epoch        int64  `json:"epoch"`
	CurrentEpoch int64  `json:"current_epoch"`
	Owner        string `json:"owner"`
	Reason       string `json:"reason"`
	At           string `json:"at"`
}

// Event is one line of a run's history.
type Event struct {
	Seq     uint64 `json:"seq"`
	Kind    string `json:"kind"`
	Epoch   int64  `json:"epoch,omitempty"`
	Term    int64  `json:"term,omitempty"`
	Owner   string `json:"owner,omitempty"`
	Actor   string `json:"actor,omitempty"` // the user who asked for it (with auth)
	Step    string `json:"step,omitempty"`
	Item    int    `json:"item,omitempty"`
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
	At      string `json:"at"`
}

// Verification is the result of run verify.
type Verification struct {
	ID         string   `json:"id"`
	OK         bool     `json:"ok"`
	Checked    []string `json:"checked"`
	Violations []string `json:"violations"`
}

// Workflow is a workflow version.
type Workflow struct {
	Name        string `json:"name"`
	Version     int    `json:"version"`
	Description string `json:"description,omitempty"`
	Steps       int    `json:"steps"`
	Schedule    string `json:"schedule,omitempty"`
	Source      string `json:"source,omitempty"`
	AppliedAt   string `json:"applied_at,omitempty"`
}

// ClusterStatus is the contract's cluster status.
type ClusterStatus struct {
	Leader string `json:"leader"`
	Term   int64  `json:"term"`
	Nodes  []Node `json:"nodes"`
	// FirstSeq and LastSeq bound the log as it is (compaction moves FirstSeq up);
	// SnapshotSeq is the newest snapshot's sequence (0: none yet).
	FirstSeq    uint64 `json:"first_seq"`
	LastSeq     uint64 `json:"last_seq"`
	SnapshotSeq uint64 `json:"snapshot_seq"`
	// ClusterVersion is the log format writers use (docs/operations.md, "Upgrading");
	// PromisedVersion the one the leader promised and writes next, if above it.
	// VersionNote says why the version does not move ("" when it may).
	ClusterVersion  int    `json:"cluster_version"`
	PromisedVersion int    `json:"promised_version,omitempty"`
	VersionNote     string `json:"version_note,omitempty"`
	// Hold is an operator's hold on the cluster version (cluster hold).
	Hold *ClusterHold `json:"hold,omitempty"`
	// Members are every node of the cluster the version waits for, live or not, until
	// one is forgotten (cluster forget).
	Members []ClusterMember `json:"members"`
}

// ClusterMember is one node of the cluster as the cluster version counts it.
type ClusterMember struct {
	ID      string `json:"id"`
	Binary  string `json:"binary,omitempty"`
	Formats []int  `json:"formats"`
	// Hold: started with --hold-cluster-version. Inferred: a release before the
	// cluster version, which said nothing of its formats (counted as reading format 1).
	Hold     bool   `json:"hold,omitempty"`
	Inferred bool   `json:"inferred,omitempty"`
	Since    string `json:"since,omitempty"`
	// Live: it answered this cluster status.
	Live bool `json:"live"`
}

// ClusterHold is an operator's hold on the cluster version.
type ClusterHold struct {
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
	At     string `json:"at"`
}

// LogMessage is one message of the log, decoded whatever its format (log.dump).
type LogMessage struct {
	Seq      uint64            `json:"seq"`
	Format   int               `json:"format,omitempty"`
	Revision int               `json:"revision,omitempty"`
	Node     string            `json:"node,omitempty"`
	Entries  []json.RawMessage `json:"entries,omitempty"`
	// Error says why the message does not decode here (and nothing else is set).
	Error string `json:"error,omitempty"`
}

// LogPage is a page of log.dump: the messages read, and the sequence to ask from for
// the next page (0: the log's end was reached).
type LogPage struct {
	Messages []LogMessage `json:"messages"`
	Next     uint64       `json:"next,omitempty"`
	// FirstSeq is the log's first sequence (the messages before it were compacted).
	FirstSeq uint64 `json:"first_seq"`
}

// Snapshot is a snapshot of the state written to the cluster's snapshot bucket.
type Snapshot struct {
	Name  string `json:"name"`
	Seq   uint64 `json:"seq"`
	Bytes uint64 `json:"bytes"`
}

// Node is one flowd node.
type Node struct {
	ID      string `json:"id"`
	Applied uint64 `json:"applied"`
	Leader  bool   `json:"leader"`
	Running int    `json:"running"`
	// LeasesDegraded: a lease this node holds goes unrenewed (it takes no new task).
	LeasesDegraded bool `json:"leases_degraded,omitempty"`
	// Binary is the flowd build it runs; Formats the log formats it reads.
	Binary  string `json:"binary,omitempty"`
	Formats []int  `json:"formats,omitempty"`
	// Labels are its worker labels (flowd --labels): it takes runs whose runs_on it has.
	Labels []string `json:"labels,omitempty"`
	// Problems are the node's parts that fell silent (as /readyz says them).
	Problems []string `json:"problems,omitempty"`
}

// CronEntry is one scheduled workflow.
type CronEntry struct {
	Workflow string   `json:"workflow"`
	Cron     string   `json:"cron"`
	Timezone string   `json:"timezone"`
	Overlap  string   `json:"overlap"`
	Catchup  string   `json:"catchup"`
	Next     []string `json:"next"`
	Last     []Tick   `json:"last_ticks"`
	// Paused says the schedule fires nothing until it is resumed; PausedReason,
	// PausedBy (the person, "" without auth) and PausedSince (RFC 3339) say why, who
	// and since when.
	Paused       bool   `json:"paused"`
	PausedReason string `json:"paused_reason,omitempty"`
	PausedBy     string `json:"paused_by,omitempty"`
	PausedSince  string `json:"paused_since,omitempty"`
}

// ScheduleChanged is the answer to cron.pause and cron.resume: the schedule's workflow,
// whether it is now paused, the reason given and who changed it ("" without auth).
type ScheduleChanged struct {
	Workflow string `json:"workflow"`
	Paused   bool   `json:"paused"`
	Reason   string `json:"reason,omitempty"`
	By       string `json:"by,omitempty"`
}

// NextTick is one coming fire time of a schedule (cron.next): in the schedule's
// timezone and in UTC (RFC 3339), and on a daylight-saving day what the change does to
// its local times ("" on other days).
type NextTick struct {
	Local string `json:"local"`
	UTC   string `json:"utc"`
	DST   string `json:"dst,omitempty"`
}

// Tick outcomes of a backfill (cron.backfill): a run started with the tick's run ID
// (backfilled), what a dry run would start (would-run), a tick that already has its
// run (ran: fired, caught up or backfilled before), and, with only_missed, a tick the
// schedule never recorded (not-missed); with include_failed, a tick whose run failed
// (or was dead-lettered) is retried, keeping its run ID (retried; a dry run's
// would-retry).
const (
	BackfillBackfilled = "backfilled"
	BackfillWouldRun   = "would-run"
	BackfillRan        = "ran"
	BackfillNotMissed  = "not-missed"
	BackfillRetried    = "retried"
	BackfillWouldRetry = "would-retry"
)

// BackfillTick is one tick of a backfill's range and what became of it.
type BackfillTick struct {
	At      string `json:"at"` // RFC 3339, in the schedule's timezone
	RunID   string `json:"run_id"`
	Outcome string `json:"outcome"`
}

// Tick is a recorded fire time.
type Tick struct {
	At      string `json:"at"`
	Outcome string `json:"outcome"`
	RunID   string `json:"run_id,omitempty"`
	Term    int64  `json:"term,omitempty"`  // the leader term that recorded it
	Owner   string `json:"owner,omitempty"` // the leader node that recorded it
}

// Drill is the evidence of a zombie drill: the drill's run and its verification.
type Drill struct {
	Run    Run          `json:"run"`
	Verify Verification `json:"verify"`
}

// Change is the answer to a retry, cancel or purge: the run and its new status.
type Change struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// Signalled is the answer to a signal: the run and the signal's name (and key).
type Signalled struct {
	ID       string `json:"id"`
	Signal   string `json:"signal"`
	SignalID string `json:"signal_id,omitempty"`
	// Started: signal-with-start (--start) started the run with this signal; false when
	// it signalled a run that was there.
	Started bool `json:"started,omitempty"`
}

// Decided is the answer to an approval or a rejection: the run, the step decided and
// the decision (approve or reject).
type Decided struct {
	ID       string `json:"id"`
	Step     string `json:"step"`
	Decision string `json:"decision"`
}

// Terminal reports whether the run has ended: succeeded, failed, cancelled or
// dead-lettered. (A failed, cancelled or dead-lettered run may be retried.)
func (r Run) Terminal() bool {
	switch r.Status {
	case "succeeded", "failed", "cancelled", "dead_lettered":
		return true
	}
	return false
}

// Progress is one line on the run's progress: status, epoch and each step's status
// (with foreach items done of total), as flowctl run watch prints it.
func (r Run) Progress() string {
	var parts []string
	for _, s := range r.Steps {
		p := s.Name + ":" + s.Status
		if s.Items > 0 {
			p += fmt.Sprintf("(%d/%d)", s.ItemsDone, s.Items)
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("%s epoch %d (changes %d) %s", r.Status, r.Epoch, r.EpochChanges, strings.Join(parts, " "))
}

// Repair is cluster.repair's answer: the node that did it, and every stream of flow's
// that differed from what flow wants.
type Repair struct {
	Node    string         `json:"node"`
	DryRun  bool           `json:"dry_run"`
	Streams []StreamRepair `json:"streams"`
}

// StreamRepair is one stream that differed: how, and what the repair did about it.
// Action is "update" (its settings set back), "recreate" (deleted and made anew, what
// it held lost and rebuilt by flow) or "refuse" (Note says why); Done says whether it
// was done (never on a dry run), Error why it failed.
type StreamRepair struct {
	Stream   string   `json:"stream"`
	Problems []string `json:"problems"`
	Sealed   bool     `json:"sealed,omitempty"`
	Action   string   `json:"action"`
	Done     bool     `json:"done,omitempty"`
	Note     string   `json:"note,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// LogLine is one line a step wrote (`run logs -o json`): its step, item (null for a
// whole step), attempt and epoch, the stream it came on (stdout, stderr, log for a Go
// step's logger, http for an http step's response, flow for flow's own marks), the line
// and when the node read it (RFC 3339).
type LogLine struct {
	Step    string `json:"step"`
	Item    *int   `json:"item"`
	Attempt int    `json:"attempt"`
	Epoch   int64  `json:"epoch"`
	Stream  string `json:"stream"`
	Line    string `json:"line"`
	At      string `json:"at"`
}

// StepLogPage is one answer of run.logs: the lines after the cursor asked with, the cursor
// to ask with next, and whether the run has ended (then no more lines come once a page
// is empty).
type StepLogPage struct {
	Lines []LogLine `json:"lines"`
	Next  string    `json:"next"`
	Ended bool      `json:"ended"`
}
