package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flow/internal/base/backoff"
)

// ErrSilent is why the supervisor stopped a part that did not call alive for its Silence.
var ErrSilent = errors.New("supervise: silent")

// ErrRecoveryOff is a part's state once it stopped in a build whose recovery is switched
// off (the negative control of the silent-partition tests).
var ErrRecoveryOff = errors.New("supervise: stopped and not restarted (recovery switched off in this build)")

// noRecovery, when set at link time (-ldflags "-X .../supervise.noRecovery=1"), makes a
// supervisor leave a stopped part stopped: the negative control of every test that
// shows a part coming back. Empty in every other build.
var noRecovery string

// Fatal marks an error after which a part must not be started again (the state it
// serves is no longer trustworthy: the log's applier stopped on a corrupt entry). The
// part is then reported unhealthy with err until its context ends.
func Fatal(err error) error { return &fatalError{err} }

type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }
func (f *fatalError) Unwrap() error { return f.err }

// Part is one long-lived interaction with NATS.
type Part struct {
	// Name says which part it is in logs, metrics and /readyz.
	Name string
	// Run does the part's work until ctx ends (return nil or ctx's error) or it fails
	// (return why). It calls alive whenever it has seen its NATS interaction work.
	Run func(ctx context.Context, alive func()) error
	// Silence is how long Run may go without calling alive before the part is presumed
	// dead and restarted. Zero: only a Run that returns is restarted.
	Silence time.Duration
}

// Option configures a Supervisor.
type Option func(*Supervisor)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Supervisor) { s.log = l } }

// WithBackoff sets the wait between restarts (default 100ms growing to 2s, jittered).
func WithBackoff(p backoff.Policy) Option { return func(s *Supervisor) { s.backoff = p } }

// WithoutRecovery makes stopped parts stay stopped (tests' negative controls).
func WithoutRecovery() Option { return func(s *Supervisor) { s.noRecovery = true } }

// Supervisor runs parts and restarts them. Its goroutines are owned by the contexts
// given to Go and are waited for by Wait.
type Supervisor struct {
	log        *slog.Logger
	backoff    backoff.Policy
	noRecovery bool

	restarts atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	parts    map[*state]struct{}
}

// New returns a Supervisor.
func New(opts ...Option) *Supervisor {
	s := &Supervisor{log: slog.Default(), backoff: backoff.Policy{Base: 100 * time.Millisecond, Cap: 2 * time.Second},
		parts: map[*state]struct{}{}, noRecovery: noRecovery != ""}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Status is one part's health.
type Status struct {
	Name     string
	Healthy  bool
	Problem  string // why not healthy
	Restarts int64
}

type state struct {
	part     Part
	started  atomic.Int64 // unix nanos of the current Run's start
	lastSeen atomic.Int64 // unix nanos of the last alive of the current Run (0: none yet)
	restarts atomic.Int64
	mu       sync.Mutex
	running  bool
	problem  error
}

func (st *state) alive() { st.lastSeen.Store(time.Now().UnixNano()) }

// silentFor is how long the current Run has gone without alive (since its start if it
// has not called it yet).
func (st *state) silentFor(now time.Time) time.Duration {
	seen := st.lastSeen.Load()
	if seen == 0 {
		return now.Sub(time.Unix(0, st.started.Load()))
	}
	return now.Sub(time.Unix(0, seen))
}

// Go starts p and keeps it running until ctx ends. Its goroutine is owned by ctx; the
// channel returned is closed when it has ended, and Wait waits for it too.
func (s *Supervisor) Go(ctx context.Context, p Part) <-chan struct{} {
	st := &state{part: p}
	done := make(chan struct{})
	s.mu.Lock()
	s.parts[st] = struct{}{}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		defer func() {
			s.mu.Lock()
			delete(s.parts, st)
			s.mu.Unlock()
		}()
		s.keep(ctx, st)
	}()
	return done
}

// Wait waits for every part's goroutine (after their contexts ended).
func (s *Supervisor) Wait() { s.wg.Wait() }

// Restarts is how many times any part was started again.
func (s *Supervisor) Restarts() int64 { return s.restarts.Load() }

// Status reports every running part, by name.
func (s *Supervisor) Status() []Status {
	now := time.Now()
	s.mu.Lock()
	out := make([]Status, 0, len(s.parts))
	for st := range s.parts {
		out = append(out, st.status(now))
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Problems lists what is wrong with the parts (empty: all healthy).
func (s *Supervisor) Problems() []string {
	var out []string
	for _, st := range s.Status() {
		if !st.Healthy {
			out = append(out, st.Name+": "+st.Problem)
		}
	}
	return out
}

func (st *state) status(now time.Time) Status {
	out := Status{Name: st.part.Name, Restarts: st.restarts.Load(), Healthy: true}
	st.mu.Lock()
	running, problem := st.running, st.problem
	st.mu.Unlock()
	switch {
	case !running && problem != nil:
		out.Healthy, out.Problem = false, problem.Error()
	case !running:
		out.Healthy, out.Problem = false, "not running"
	case st.part.Silence > 0 && st.silentFor(now) > st.part.Silence:
		out.Healthy, out.Problem = false, fmt.Sprintf("nothing heard for %s", st.silentFor(now).Round(100*time.Millisecond))
	case st.part.Silence > 0 && st.lastSeen.Load() == 0:
		out.Healthy, out.Problem = false, "starting"
	}
	return out
}

func (st *state) setRunning(running bool, problem error) {
	st.mu.Lock()
	st.running, st.problem = running, problem
	st.mu.Unlock()
}

// keep runs the part, and again after each stop, until ctx ends.
func (s *Supervisor) keep(ctx context.Context, st *state) {
	name := st.part.Name
	attempt := 0
	for ctx.Err() == nil {
		st.started.Store(time.Now().UnixNano())
		st.lastSeen.Store(0)
		st.setRunning(true, nil)
		err := s.runOnce(ctx, st)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("ended")
		}
		var fatal *fatalError
		if errors.As(err, &fatal) {
			s.log.Error("part stopped for good", "part", name, "err", err)
			st.setRunning(false, err)
			<-ctx.Done()
			return
		}
		healthyRun := st.lastSeen.Load() != 0 && time.Since(time.Unix(0, st.started.Load())) > s.backoff.Ceiling(attempt)*2
		if healthyRun {
			attempt = 0 // it had worked: start again soon
		}
		if s.noRecovery {
			s.log.Error("part stopped; recovery is switched off", "part", name, "err", err)
			st.setRunning(false, fmt.Errorf("%w: %w", ErrRecoveryOff, err))
			<-ctx.Done()
			return
		}
		st.setRunning(false, err)
		delay := s.backoff.Delay(attempt)
		s.log.Warn("part stopped; restarting", "part", name, "err", err, "in", delay.Round(time.Millisecond))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		attempt = min(attempt+1, 16)
		st.restarts.Add(1)
		s.restarts.Add(1)
	}
}

// runOnce runs the part until it returns or falls silent, and says why it stopped.
func (s *Supervisor) runOnce(ctx context.Context, st *state) error {
	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan error, 1)
	recovering := st.restarts.Load() > 0
	alive := st.alive
	if recovering {
		var once sync.Once
		alive = func() {
			st.alive()
			once.Do(func() {
				s.log.Info("part recovered", "part", st.part.Name, "restarts", st.restarts.Load())
			})
		}
	}
	go func() { done <- st.part.Run(pctx, alive) }()
	var tick <-chan time.Time
	if st.part.Silence > 0 {
		t := time.NewTicker(max(st.part.Silence/4, 10*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case err := <-done:
			return err
		case <-tick:
			if silent := st.silentFor(time.Now()); silent > st.part.Silence {
				err := fmt.Errorf("%w for %s", ErrSilent, silent.Round(100*time.Millisecond))
				cancel(err)
				<-done
				return err
			}
		}
	}
}
