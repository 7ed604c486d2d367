package api

import (
	"encoding/json"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// Version of the request format.
const Version = 1

// Error codes.
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeConflict   = "conflict"
	CodeInternal   = "internal"
)

// Req is every request: the version and the fields its operation reads.
type Req struct {
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
}

// Run is the contract's JSON shape of a run.
type Run struct {
	ID           string          `json:"id"`
	Workflow     string          `json:"workflow"`
	Version      int             `json:"version"`
	Status       string          `json:"status"`
	Trigger      string          `json:"trigger"`
	ScheduledAt  string          `json:"scheduled_at,omitempty"`
	Epoch        int64           `json:"epoch"`
	EpochChanges int             `json:"epoch_changes"`
	MaxEpochs    int             `json:"max_epochs"`
	Owner        string          `json:"owner,omitempty"`
	Error        string          `json:"error,omitempty"`
	FailedStep   string          `json:"failed_step,omitempty"`
	DeadLetter   string          `json:"dead_letter_reason,omitempty"`
	CreatedAt    string          `json:"created_at"`
	UpdatedAt    string          `json:"updated_at"`
	Inputs       json.RawMessage `json:"inputs,omitempty"`
	Steps        []Step          `json:"steps,omitempty"`
	Epochs       []Epoch         `json:"epochs"`
	Fenced       []Fenced        `json:"fenced"`
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
}

// Node is one flowd node.
type Node struct {
	ID      string `json:"id"`
	Applied uint64 `json:"applied"`
	Leader  bool   `json:"leader"`
	Running int    `json:"running"`
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
}

// Tick is a recorded fire time.
type Tick struct {
	At      string `json:"at"`
	Outcome string `json:"outcome"`
	RunID   string `json:"run_id,omitempty"`
}

// tsNano is ts with the fraction of the second (history events: steps take less than one).
func tsNano(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func ts(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// FromRun builds the JSON shape of a run (steps and fenced commits when v has them).
func FromRun(r *checkpoint.Run, v *checkpoint.RunView) Run {
	out := Run{ID: r.ID, Workflow: r.Workflow, Version: r.Version, Status: string(r.Status), Trigger: r.Trigger,
		ScheduledAt: ts(r.ScheduledAt), Epoch: r.Epoch, EpochChanges: r.EpochChanges, MaxEpochs: r.MaxEpochs,
		Owner: r.Owner, Error: r.Error, FailedStep: r.FailedStep, DeadLetter: r.DeadLetter,
		CreatedAt: ts(r.CreatedAt), UpdatedAt: ts(r.UpdatedAt), Epochs: []Epoch{}, Fenced: []Fenced{}}
	if len(r.Inputs) > 0 && json.Valid(r.Inputs) {
		out.Inputs = r.Inputs // as stored: decoding into any would round an int64 through float64
	}
	for _, e := range r.Epochs {
		out.Epochs = append(out.Epochs, Epoch{Epoch: e.Epoch, Owner: e.Owner, Reason: e.Reason, At: ts(e.At)})
	}
	if v != nil {
		out.Steps = []Step{}
		for _, s := range v.Steps {
			out.Steps = append(out.Steps, Step{Name: s.Name, Status: string(s.Status), Attempts: s.Attempts, Epoch: s.Epoch,
				Items: s.Items, ItemsDone: s.ItemsDone, Output: s.Output, Error: s.Error})
		}
		for _, f := range v.Fenced {
			out.Fenced = append(out.Fenced, Fenced{Step: f.Step, Item: f.Item, Epoch: f.Epoch, CurrentEpoch: f.CurrentEpoch,
				Owner: f.Owner, Reason: f.Reason, At: ts(f.At)})
		}
	}
	return out
}
