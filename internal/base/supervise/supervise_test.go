package supervise

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/testkit/within"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet() Option { return WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))) }

func fast() Option {
	return WithBackoff(backoff.Policy{Base: time.Millisecond, Cap: 5 * time.Millisecond})
}

// waitUntil polls cond with a deadline (the supervisor's state is read, not signalled).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAPartThatEndsIsStartedAgain(t *testing.T) {
	s := New(quiet(), fast())
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	var runs atomic.Int32
	s.Go(ctx, Part{Name: "flaky", Run: func(ctx context.Context, alive func()) error {
		if runs.Add(1) < 3 {
			return errors.New("subscription closed")
		}
		alive()
		<-ctx.Done()
		return nil
	}})
	waitUntil(t, "the third run", func() bool { return runs.Load() == 3 })
	waitUntil(t, "healthy", func() bool { return len(s.Problems()) == 0 })
	if st := s.Status(); len(st) != 1 || st[0].Restarts != 2 {
		t.Fatalf("status %+v, want one part restarted twice", st)
	}
}

// A part that stops calling alive (it hears nothing, and no error tells it) is
// cancelled and started again; while it is silent the supervisor reports it unhealthy.
// The silence allowed is a second, and the part that keeps hearing hears every 5 ms: a
// goroutine paused for a second on a loaded machine, not 50 ms, would be silent.
func TestASilentPartIsCancelledAndStartedAgain(t *testing.T) {
	const silence = time.Second
	s := New(quiet(), fast())
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	var runs atomic.Int32
	hear := make(chan struct{})
	var causes []error
	causeCh := make(chan error, 8)
	s.Go(ctx, Part{Name: "watch", Silence: silence, Run: func(ctx context.Context, alive func()) error {
		n := runs.Add(1)
		alive()
		if n == 1 {
			<-ctx.Done() // falls silent: only the supervisor can end this
			causeCh <- context.Cause(ctx)
			return ctx.Err()
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hear:
				alive()
			}
		}
	}})
	waitUntil(t, "a second run", func() bool { return runs.Load() >= 2 })
	select {
	case c := <-causeCh:
		causes = append(causes, c)
	case <-time.After(5 * time.Second):
		t.Fatal("the first run's end was not reported")
	}
	if !errors.Is(causes[0], ErrSilent) {
		t.Fatalf("first run ended by %v, want ErrSilent", causes[0])
	}
	// The second run hears something every few ms: it stays up and healthy.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case hear <- struct{}{}:
			case <-ctx.Done():
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	waitUntil(t, "healthy", func() bool { return len(s.Problems()) == 0 })
	time.Sleep(2 * silence) // two Silences: a part that keeps hearing is not restarted
	if n := runs.Load(); n != 2 {
		t.Fatalf("runs = %d, want 2: a part that keeps calling alive was restarted", n)
	}
}

func TestSilentPartIsReportedUnhealthy(t *testing.T) {
	s := New(quiet(), WithBackoff(backoff.Policy{Base: time.Hour, Cap: time.Hour, NoJitter: true}))
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	s.Go(ctx, Part{Name: "deaf", Silence: 30 * time.Millisecond, Run: func(ctx context.Context, alive func()) error {
		<-ctx.Done()
		return nil
	}})
	waitUntil(t, "a problem", func() bool {
		p := s.Problems()
		return len(p) == 1 && strings.HasPrefix(p[0], "deaf: ")
	})
}

// The negative control's switch: a stopped part stays stopped and says so.
func TestWithoutRecoveryAStoppedPartStaysStopped(t *testing.T) {
	s := New(quiet(), fast(), WithoutRecovery())
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	var runs atomic.Int32
	s.Go(ctx, Part{Name: "once", Run: func(ctx context.Context, alive func()) error {
		runs.Add(1)
		return errors.New("watch closed")
	}})
	waitUntil(t, "the part reported stopped", func() bool {
		p := s.Problems()
		return len(p) == 1 && strings.Contains(p[0], "recovery switched off")
	})
	time.Sleep(50 * time.Millisecond) // ten backoff ceilings: no second run may come
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs = %d, want 1 with recovery off", n)
	}
}

func TestAPartEndsWithItsContext(t *testing.T) {
	s := New(quiet(), fast())
	ctx, cancel := context.WithCancel(context.Background())
	s.Go(ctx, Part{Name: "p", Silence: time.Second, Run: func(ctx context.Context, alive func()) error {
		alive()
		<-ctx.Done()
		return ctx.Err()
	}})
	waitUntil(t, "listed", func() bool { return len(s.Status()) == 1 })
	cancel()
	within.Do(t, 10*time.Second, s.Wait, "the part to end with its context")
	if st := s.Status(); len(st) != 0 {
		t.Fatalf("status after the context ended: %+v", st)
	}
}

func TestAFatalErrorIsNotRestarted(t *testing.T) {
	s := New(quiet(), fast())
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); within.Do(t, 10*time.Second, s.Wait, "the parts to end") }()
	var runs atomic.Int32
	s.Go(ctx, Part{Name: "applier", Run: func(ctx context.Context, alive func()) error {
		runs.Add(1)
		return Fatal(errors.New("corrupt entry at 7"))
	}})
	waitUntil(t, "the part reported stopped", func() bool {
		p := s.Problems()
		return len(p) == 1 && strings.Contains(p[0], "corrupt entry at 7")
	})
	time.Sleep(50 * time.Millisecond) // ten backoff ceilings: no second run may come
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs = %d, want 1 after a fatal error", n)
	}
}
