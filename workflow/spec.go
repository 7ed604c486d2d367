package workflow

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/flowrun/flow/internal/base/ident"

	"go.yaml.in/yaml/v3"
)

// Workflow is one parsed, validated workflow definition.
type Workflow struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	MaxEpochs   int      `json:"max_epochs"`
	Timeout     Duration `json:"timeout,omitempty"`
	Concurrency int      `json:"concurrency,omitempty"` // runs of this workflow at once; 0: no limit
	// Priority is its runs' default priority (-100 to 100, higher first; run start
	// --priority overrides it): the leader admits queued runs by priority, each waiting
	// run's rising with its age.
	Priority int `json:"priority,omitempty"`
	// ConcurrencyKeys are `concurrency: {key, limit}`: runs per rendered key at once
	// (concurrency.go).
	ConcurrencyKeys []KeyLimit `json:"concurrency_keys,omitempty"`
	// Deadline is when a run should have succeeded: "HH:MM", the first such time of day
	// at or after the run's tick (or start) in the schedule's timezone, or a duration
	// after it (interval.go's DeadlineFor).
	Deadline string  `json:"deadline,omitempty"`
	Inputs   []Input `json:"inputs,omitempty"`
	// Handles, on the spec of the on_deadline handler run of a tick that never ran (the
	// leader starts it: engine/internal/leader TickHandler), is the tick it handles and
	// why it never ran, which its templates read as run.id and run.error.
	Handles  *HandledTick `json:"handles,omitempty"`
	Schedule *Schedule    `json:"schedule,omitempty"`
	// On are the workflow's triggers: runs started (or signalled) by messages on NATS
	// subjects (triggers.go).
	On []Trigger `json:"on,omitempty"`
	// RunsOn are the worker labels a node needs to run this workflow's runs (labels.go;
	// Labels adds its steps').
	RunsOn []string `json:"runs_on,omitempty"`
	Steps  []*Step  `json:"steps"`
	// Outputs are the run's outputs: templates over its steps' outputs and inputs,
	// rendered when it succeeds (a parent's workflow step gets them as its output).
	Outputs map[string]string `json:"outputs,omitempty"`
	// Handlers are the steps run once per event of a run (on_failure, on_dead_letter,
	// on_deadline): each event starts a handler run of them (handlers.go).
	Handlers  map[string][]*Step `json:"handlers,omitempty"`
	Source    string             `json:"source"` // the YAML as applied
	Version   int                `json:"version,omitempty"`
	Digest    string             `json:"digest,omitempty"` // sha256 of Source: same digest, same version
	byName    map[string]*Step
	outputsAt map[string][2]int // line, column of each output's template
}

// Input is a typed input with an optional default.
type Input struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Default     any    `json:"default,omitempty"`
	HasDefault  bool   `json:"has_default,omitempty"`
	Description string `json:"description,omitempty"`
	// Secret: its value is masked (***) in what steps print and in their outputs, and
	// in the run's inputs as flowctl and the UI show them.
	Secret bool `json:"secret,omitempty"`
}

// Schedule is a cron trigger.
type Schedule struct {
	Cron     string `json:"cron"`
	Timezone string `json:"timezone"`
	Overlap  string `json:"overlap"`
	Catchup  string `json:"catchup"`
}

// Step is one node of the DAG.
type Step struct {
	Name        string         `json:"name"`
	Uses        string         `json:"uses"`
	With        map[string]any `json:"with,omitempty"`
	Needs       []string       `json:"needs,omitempty"`
	Foreach     string         `json:"foreach,omitempty"`
	Parallelism int            `json:"parallelism,omitempty"`
	Retry       Retry          `json:"retry"`
	Timeout     Duration       `json:"timeout,omitempty"`
	If          string         `json:"if,omitempty"`
	// RunsOn are the worker labels this step needs; its run needs them all
	// (Workflow.Labels).
	RunsOn []string `json:"runs_on,omitempty"`
	// RateLimit paces the step's attempts across the cluster (nil: unpaced).
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// Concurrency are the step's keys (`concurrency: {key, limit}`): it runs only while
	// its run holds a slot of each (concurrency.go, checkpoint/slots.go).
	Concurrency     []KeyLimit `json:"concurrency,omitempty"`
	concurrencyNode *yaml.Node
	Line            int      `json:"line"`
	templates       []tmplAt // every templated string of the step, with its place
	usesNode        *yaml.Node
	withNode        *yaml.Node // nil when the step has no with
	needsNodes      []*yaml.Node
}

// tmplAt is a templated string and where it is in the file.
type tmplAt struct {
	where     string // "with.body.driver", "foreach", "if"
	src       string
	line, col int
}

// Retry is a step's retry policy. MaxAttempts counts the first attempt.
type Retry struct {
	MaxAttempts     int      `json:"max_attempts"`
	InitialInterval Duration `json:"initial_interval"`
	MaxInterval     Duration `json:"max_interval"`
	Multiplier      float64  `json:"multiplier"`
}

// Duration is a time.Duration that reads and writes as "1m30s".
type Duration time.Duration

// MarshalJSON writes the duration as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "1m30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Defaults.
const (
	DefaultMaxEpochs   = 5
	DefaultParallelism = 8
	DefaultMaxAttempts = 1
)

// Input types.
var inputTypes = []string{"string", "int", "number", "bool", "list", "object"}

// KindChecker reports whether a step kind exists (steps.Registry.Has).
type KindChecker func(kind string) bool

// WithChecker judges a step's `with` (as written, templates unrendered) for its kind
// (steps.Registry.CheckWith). A *steps.WithError points the error at one key.
type WithChecker func(kind string, with map[string]any) error

// Options are what Load checks a workflow against that only its caller knows: the
// step kinds of the node (or of flowctl, offline) and what each accepts.
//
// They are functions rather than a *steps.Registry so that a caller can judge kinds
// it does not run (flowctl apply leaves kinds to the server). The workflow package
// imports steps only for steps.WithError, never the other way: steps is the leaf that
// both the loader and the engine build on.
type Options struct {
	Kinds KindChecker // nil: every kind exists
	With  WithChecker // nil: with is not checked
}

// MaxSteps is the most steps one workflow may have. A run's checkpoints, its record and
// history, and the UI's DAG all grow with the steps, so a bound keeps one workflow from
// costing a node seconds per run; 1,000 is an order of magnitude above hand-written
// DAGs. Many items of one kind of work are one step with foreach, not many steps.
const MaxSteps = 1000

// validName is the one rule for workflow, step and input names (the log's).
var validName = ident.ValidName

// CronParser is the one cron dialect of flow: 5 fields (minute first), 6 fields
// (seconds first), and descriptors such as @daily.
var CronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Step returns the step named name.
func (w *Workflow) Step(name string) *Step { return w.byName[name] }

// Load parses and validates a workflow. file names it in errors. Every problem found
// is reported, each with file:line:column and a hint. It is LoadWith without a check
// of with.
func Load(file string, data []byte, kinds KindChecker) (*Workflow, error) {
	return LoadWith(file, data, Options{Kinds: kinds})
}

// LoadWith is Load with the checks of opts. Its time is linear in the file's size for
// every workflow under the MaxSteps cap (see validate for the one bounded exception).
func LoadWith(file string, data []byte, opts Options) (*Workflow, error) {
	return (&loader{file: file, maxSteps: MaxSteps}).load(data, opts)
}

func (l *loader) load(data []byte, opts Options) (*Workflow, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, l.yamlError(err)
	}
	if len(doc.Content) == 0 {
		return nil, Errors{l.errAt(1, 1, "the file is empty", "a workflow needs at least a name and steps")}
	}
	w := &Workflow{Source: string(data), MaxEpochs: DefaultMaxEpochs}
	l.workflow(doc.Content[0], w)
	l.checkTriggers(w)
	// The whole-graph checks run whenever the steps themselves were read without error,
	// so that one bad field (a deadline, a timeout) does not hide the errors they find.
	if !l.stepsBroken && len(w.Steps) > 0 {
		l.validate(w, opts)
		for _, event := range HandlerEvents {
			if hw := w.HandlerWorkflow(event); hw != nil {
				l.validate(hw, opts)
			}
		}
	}
	if len(l.errs) > 0 {
		return nil, l.errs
	}
	sum := sha256.Sum256(data)
	w.Digest = hex.EncodeToString(sum[:])
	return w, nil
}
