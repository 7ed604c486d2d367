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

	"github.com/jonboulle/clockwork"

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

// DefaultBackoff is the wait before each restart of a part that stopped again soon
// after its last restart: 100ms, doubling, capped at 2s, full jitter. The cap bounds how
// long a node waits, once a silent partition heals, before each part tries again (the
// part that stopped during the cut is by then at the cap): ready within about 2s of the
// heal. It does not need to be longer to keep a slow machine out of a restart loop: a
// part that makes progress calls alive and is not restarted at all, and a part restarted
// for silence has already spent its Silence (seconds) before each restart.
var DefaultBackoff = backoff.Policy{Base: 100 * time.Millisecond, Cap: 2 * time.Second}

// WithBackoff sets the wait between restarts (default DefaultBackoff).
func WithBackoff(p backoff.Policy) Option { return func(s *Supervisor) { s.backoff = p } }

// WithClock sets the clock that measures silence and backoff (default the real one;
// tests move a fake one).
func WithClock(c clockwork.Clock) Option { return func(s *Supervisor) { s.clock = c } }

// WithoutRecovery makes stopped parts stay stopped (tests' negative controls).
func WithoutRecovery() Option { return func(s *Supervisor) { s.noRecovery = true } }

// Supervisor runs parts and restarts them. Its goroutines are owned by the contexts
// given to Go and are waited for by Wait.
type Supervisor struct {
	log        *slog.Logger
	backoff    backoff.Policy
	clock      clockwork.Clock
	noRecovery bool

	restarts atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	parts    map[*state]struct{}
	byName   map[string]int64 // restarts by part name, over every part of that name
}

// New returns a Supervisor.
func New(opts ...Option) *Supervisor {
	s := &Supervisor{log: slog.Default(), backoff: DefaultBackoff, clock: clockwork.NewRealClock(),
		parts: map[*state]struct{}{}, byName: map[string]int64{}, noRecovery: noRecovery != ""}
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
	// InARow counts the restarts since the part last ran healthy for a while (its alive
	// calls spanning ResetAfter): the backoff's attempt. 0 once the current run has.
	InARow int
	// LastReason is why the part last stopped ("" if it never did).
	LastReason string
	// RestartAt is when a stopped part is started again (zero while it runs).
	RestartAt time.Time
}

type state struct {
	part       Part
	clock      clockwork.Clock
	resetAfter time.Duration
	started    atomic.Int64 // unix nanos of the current Run's start
	lastSeen   atomic.Int64 // unix nanos of the last alive of the current Run (0: none yet)
	restarts   atomic.Int64
	mu         sync.Mutex
	running    bool
	problem    error
	inARow     int
	reason     string
	restart    time.Time
}

func (st *state) alive() { st.lastSeen.Store(st.clock.Now().UnixNano()) }

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
	st := &state{part: p, clock: s.clock, resetAfter: s.ResetAfter(p)}
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

// RestartsByPart is how many times each part was started again, by name, since the
// supervisor was made: a part that ended with its context and was started anew under
// the same name (the lease watcher of each term) adds to the same count.
func (s *Supervisor) RestartsByPart() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.byName))
	for name, n := range s.byName {
		out[name] = n
	}
	return out
}

// ResetAfter is how long a part's alive calls must span in one run for its backoff to
// start again from the base: twice its Silence, and twice the backoff's cap. A part
// that hears something and then falls silent for its Silence (the restart loop of a
// slow part that does not report its progress) has not run healthy, and waits longer
// before each restart, up to the cap.
func (s *Supervisor) ResetAfter(p Part) time.Duration {
	return max(2*p.Silence, 2*s.backoff.Ceiling(64))
}

// Status reports every running part, by name.
func (s *Supervisor) Status() []Status {
	now := s.clock.Now()
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
	out.InARow, out.LastReason, out.RestartAt = st.inARow, st.reason, st.restart
	st.mu.Unlock()
	if running && st.healthySpan() >= st.resetAfter {
		out.InARow = 0 // it has run healthy since: its next stop starts the backoff again
	}
	switch {
	case !running && problem != nil && !out.RestartAt.IsZero():
		// Waiting to be started again: say why it stopped, how often in a row, and when.
		out.Healthy, out.Problem = false, fmt.Sprintf("stopped (%s); restart %d in a row in %s",
			problem, out.InARow, max(out.RestartAt.Sub(now), 0).Round(100*time.Millisecond))
	case !running && problem != nil:
		out.Healthy, out.Problem = false, problem.Error()
	case !running:
		out.Healthy, out.Problem = false, "not running"
	case st.part.Silence > 0 && st.silentFor(now) > st.part.Silence:
		out.Healthy, out.Problem = false, fmt.Sprintf("nothing heard for %s", st.silentFor(now).Round(100*time.Millisecond))
	case st.part.Silence > 0 && st.lastSeen.Load() == 0:
		out.Healthy, out.Problem = false, "starting"
	}
	if !out.Healthy && running && out.InARow > 0 {
		out.Problem += fmt.Sprintf(" (restarted %d times in a row; last stopped: %s)", out.InARow, out.LastReason)
	}
	return out
}

func (st *state) setRunning(running bool, problem error) {
	st.mu.Lock()
	st.running, st.problem, st.restart = running, problem, time.Time{}
	st.mu.Unlock()
}

// stopped records that the run ended with err and is started again at restart (the
// restart counted in a row unless the run was healthy, when the count starts again).
func (st *state) stopped(err error, healthy bool, restart time.Time) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	if healthy {
		st.inARow = 0
	}
	st.inARow++
	st.running, st.problem, st.reason, st.restart = false, err, err.Error(), restart
	return st.inARow
}

// healthySpan is how long the current run's alive calls spanned (0 if it made none).
func (st *state) healthySpan() time.Duration {
	seen := st.lastSeen.Load()
	if seen == 0 {
		return 0
	}
	return time.Duration(seen - st.started.Load())
}

// keep runs the part, and again after each stop, until ctx ends.
func (s *Supervisor) keep(ctx context.Context, st *state) {
	name := st.part.Name
	attempt := 0
	for ctx.Err() == nil {
		st.started.Store(s.clock.Now().UnixNano())
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
		// Only a run that worked for a while (its alive calls spanning ResetAfter) starts
		// the backoff again from its base. A run that heard something and then fell
		// silent, or failed soon after it started, waits longer than the last.
		healthy := st.healthySpan() >= s.ResetAfter(st.part)
		if healthy {
			attempt = 0
		}
		if s.noRecovery {
			s.log.Error("part stopped; recovery is switched off", "part", name, "err", err)
			st.setRunning(false, fmt.Errorf("%w: %w", ErrRecoveryOff, err))
			<-ctx.Done()
			return
		}
		delay := s.backoff.Delay(attempt)
		inARow := st.stopped(err, healthy, s.clock.Now().Add(delay))
		s.log.Warn("part stopped; restarting", "part", name, "err", err, "in", delay.Round(time.Millisecond), "in_a_row", inARow)
		t := s.clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
		attempt = min(attempt+1, 16)
		st.restarts.Add(1)
		s.restarts.Add(1)
		s.mu.Lock()
		s.byName[name]++
		s.mu.Unlock()
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
		t := s.clock.NewTicker(max(st.part.Silence/4, 10*time.Millisecond))
		defer t.Stop()
		tick = t.Chan()
	}
	for {
		select {
		case err := <-done:
			return err
		case <-tick:
			if silent := st.silentFor(s.clock.Now()); silent > st.part.Silence {
				err := fmt.Errorf("%w for %s", ErrSilent, silent.Round(100*time.Millisecond))
				cancel(err)
				<-done
				return err
			}
		}
	}
}
