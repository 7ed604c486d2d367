package steps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Input is what a step runs with.
type Input struct {
	Run            string
	Workflow       string
	Step           string
	Item           int // foreach index, or -1
	Epoch          int64
	Attempt        int // 1 for the first attempt
	IdempotencyKey string
	With           map[string]any // rendered
	Logger         *slog.Logger
	// StopGrace, if set, is the most time a step may take to stop once its context is
	// cancelled: the engine sets it under the lease TTL so that a step whose lease was
	// lost is dead before the run can move to another node. Exec's kill grace is cut to it.
	StopGrace time.Duration
	// TrustUntil, if set, says when the step's right to act ends unless it is extended:
	// the engine gives the lease's trust deadline (2/3 of the TTL after the last renewal
	// was sent), which each renewal moves on. An exec step's processes are stopped when
	// it passes, by their init, even if this process is frozen (SIGSTOP, a VM paused)
	// and cannot cancel them: they are dead before the lease can lapse and another
	// epoch begin. A zero time is no deadline.
	TrustUntil func() time.Time
	// Stdout and Stderr, if set, get a copy of what the step prints (an exec step's
	// streams, an http step's response status and first bytes): the run's step log.
	Stdout, Stderr io.Writer
}

// Step is one kind of step. Run must return when ctx is cancelled.
type Step interface {
	Run(ctx context.Context, in Input) (json.RawMessage, error)
}

// Func adapts a function to Step.
type Func func(ctx context.Context, in Input) (json.RawMessage, error)

// Run calls f.
func (f Func) Run(ctx context.Context, in Input) (json.RawMessage, error) { return f(ctx, in) }

// ErrTrustDeadline marks a step whose processes its containment init stopped because the
// lease's trust deadline (Input.TrustUntil) passed without a renewal reaching the init.
// The step did not fail: its right to act lapsed, as far as the init knew. The worker
// asks its lease whether it really did (a renewal may have landed after the init's copy
// of the deadline): if so the epoch is over; if not the attempt runs again, uncounted.
var ErrTrustDeadline = errors.New("stopped by its init: its lease's trust deadline passed without a renewal")

// ErrPermanent marks an error that retrying cannot fix. Test with errors.Is or
// IsPermanent.
var ErrPermanent = errors.New("permanent")

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() []error      { return []error{e.err, ErrPermanent} }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent wraps err so that the step is not retried.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// Permanentf is fmt.Errorf, permanent.
func Permanentf(format string, args ...any) error { return Permanent(fmt.Errorf(format, args...)) }

// IsPermanent reports whether retrying err is pointless.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// IdempotencyKey is the key of (run, step, item): the same in every epoch.
func IdempotencyKey(run, step string, item int) string {
	sum := sha256.Sum256([]byte(run + "\x00" + step + "\x00" + strconv.Itoa(item)))
	return "flow-" + hex.EncodeToString(sum[:16])
}

// RequestKey is the idempotency key of an http step's request in a run of key scheme 2
// (checkpoint.KeySchemeRequest): run, step and item, and what the request means, its
// method, URL and body as rendered (JSON, map keys sorted). The same request in any
// epoch or retry has one key; one that `retry --input` changed has another. Headers are
// left out: a rotated token is the same request.
func RequestKey(run, step string, item int, with map[string]any) string {
	method, _ := with["method"].(string)
	req, err := json.Marshal([]any{strings.ToUpper(method), with["url"], with["body"]})
	if err != nil { // rendered templates are JSON values: cannot fail
		req = []byte(fmt.Sprint(with["method"], with["url"], with["body"]))
	}
	sum := sha256.Sum256([]byte(run + "\x00" + step + "\x00" + strconv.Itoa(item) + "\x00request\x00" + string(req)))
	return "flow-" + hex.EncodeToString(sum[:16])
}

// Registry maps step kinds to steps. Safe for concurrent use.
type Registry struct {
	mu    sync.RWMutex
	kinds map[string]Step
}

// RegistryOption configures the built-in kinds of NewRegistry.
type RegistryOption func(*Exec)

// WithExecEnv names variables of this process's environment that exec commands also get
// (flowd --exec-env): by default they get only BaseEnv of it.
func WithExecEnv(names ...string) RegistryOption {
	return func(x *Exec) { x.PassEnv = append(x.PassEnv, names...) }
}

// WithExecUser makes exec commands run as u (flowd --exec-user); nil is this
// process's own user. The caller checks u.CheckSwitch first.
func WithExecUser(u *User) RegistryOption {
	return func(x *Exec) { x.User = u }
}

// ConfigureExec applies opts to the registry's exec kind, e.g. flowd's --exec-user
// and --exec-env on a registry an embedding program made.
func (r *Registry) ConfigureExec(opts ...RegistryOption) {
	r.mu.Lock()
	defer r.mu.Unlock()
	x, ok := r.kinds["exec"].(Exec)
	if !ok {
		return
	}
	x.PassEnv = slices.Clone(x.PassEnv)
	for _, o := range opts {
		o(&x)
	}
	r.kinds["exec"] = x
}

// NewRegistry returns a registry holding the built-in kinds. maxOutput bounds what
// exec and http read as output (0: 1 MiB).
func NewRegistry(maxOutput int, opts ...RegistryOption) *Registry {
	if maxOutput <= 0 {
		maxOutput = 1 << 20
	}
	x := Exec{MaxOutput: maxOutput}
	for _, o := range opts {
		o(&x)
	}
	r := &Registry{kinds: map[string]Step{}}
	r.kinds["exec"] = x
	r.kinds[KindHTTP] = HTTP{MaxOutput: maxOutput}
	r.kinds["sleep"] = WithCheck(Func(sleep), checkSleep) // a Func cannot have CheckWith
	r.kinds["noop"] = Func(noop)
	r.kinds[KindWait] = WithCheck(Func(engineOnly), checkWait)
	r.kinds[KindApproval] = WithCheck(Func(engineOnly), checkApproval)
	r.kinds[KindWorkflow] = WithCheck(Func(engineOnly), checkChild)
	return r
}

// Register adds a kind. Names are 1-64 of a-z, 0-9, '_' and '-'; a kind cannot be
// registered twice. A step that implements [WithChecker] (or is wrapped by [WithCheck])
// has its `with` checked when a workflow using it is validated or applied.
func (r *Registry) Register(kind string, s Step) error {
	if !validKind(kind) || s == nil {
		return fmt.Errorf("steps: register %q: use 1-64 of a-z, 0-9, '_' and '-', and a non-nil step", kind)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.kinds[kind]; ok {
		return fmt.Errorf("steps: kind %q is already registered", kind)
	}
	r.kinds[kind] = s
	return nil
}

// Get returns the step of a kind.
func (r *Registry) Get(kind string) (Step, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s, ok := r.kinds[kind]
	return s, ok
}

// Has reports whether a kind is registered (workflow.KindChecker).
func (r *Registry) Has(kind string) bool {
	_, ok := r.Get(kind)
	return ok
}

// Kinds lists the registered kinds.
func (r *Registry) Kinds() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for k := range r.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func validKind(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}

// noop returns its `with` as its output.
func noop(_ context.Context, in Input) (json.RawMessage, error) {
	if len(in.With) == 0 {
		return json.RawMessage(`{}`), nil
	}
	b, err := json.Marshal(in.With)
	if err != nil {
		return nil, Permanentf("noop: %v", err)
	}
	return b, nil
}
