package epoch

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"pgregory.net/rapid"
)

// Trust transcripts: the files in testdata/*.txt drive the holder's clock (trust.go)
// decision by decision and print what it decides, one file per rule, in the manner of
// checkpoint/testdata. Each is meant to be read as the specification of its rule; `go
// test ./epoch -run TestTrustTranscripts -rewrite` rewrites the expected output, which
// must then be read and checked by hand. The keeper carries these decisions out
// (keeper_test.go checks that it does, on a fake clock).
//
// Every time is an offset from the holder's start (t0), written and printed as a Go
// duration.
//
// Commands:
//
//	policy ttl=D [renew=D] [short]
//	    The LeaseClock of Config{TTL, RenewInterval, AllowShortTTL}, with its
//	    defaults, or the error Validate gives. Prints the derived durations, the
//	    lease watcher's (LapseAfter) included.
//	begin sent=T
//	    A holder whose create was sent at T. Prints its state.
//	renewed sent=T | unanswered at=T | ended at=T
//	    A renewal sent at T succeeded; an attempt failed unanswered at T; the
//	    ownership ended at T (a renewal refused, a term's failed renewal, a release).
//	    Each prints the state after it.
//	state
//	    Sent, trust deadline, next renewal, poison pill, degraded.
//	open T...
//	    Whether the trust window is open at each T (what Check says).
//	attempt start=T
//	    When an attempt sent at T is given up unanswered.
//	retry start=T failed=T
//	    When to try again after the attempt sent at start failed unanswered at failed.
//	timeline
//	    What happens when, from the state, if nothing else succeeds.

func TestTrustTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.HasSuffix(path, ".txt") {
			t.Skipf("%s is not a transcript", path)
		}
		tr := &trustTranscript{p: Config{}.LeaseClock()}
		datadriven.RunTest(t, path, tr.handle)
	})
}

type trustTranscript struct {
	p  LeaseClock
	tr Trust
}

func (x *trustTranscript) handle(t *testing.T, d *datadriven.TestData) string {
	dur := func(key string) time.Duration {
		var s string
		d.ScanArgs(t, key, &s)
		v, err := time.ParseDuration(s)
		if err != nil {
			d.Fatalf(t, "%s=%s: %v", key, s, err)
		}
		return v
	}
	at := func(key string) time.Time { return t0.Add(dur(key)) }
	switch d.Cmd {
	case "policy":
		cfg := Config{TTL: dur("ttl"), AllowShortTTL: d.HasArg("short")}
		if d.HasArg("renew") {
			cfg.RenewInterval = dur("renew")
		}
		if err := cfg.Validate(); err != nil {
			return "invalid: " + strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": ")
		}
		x.p = cfg.LeaseClock()
		p := x.p
		return fmt.Sprintf("TTL %s: renew every %s, trust window %s, renewal timeout %s, poison pill after %s; the watcher reports a lapse after %s unrenewed",
			p.TTL(), p.RenewInterval(), p.TrustWindow(), p.RenewalTimeout(), p.PoisonAfter(), p.LapseAfter())
	case "begin":
		x.tr = x.p.Begin(at("sent"))
		return x.state()
	case "renewed":
		x.tr = x.tr.Renewed(at("sent"))
		return x.state()
	case "unanswered":
		x.tr = x.tr.Unanswered(at("at"))
		return x.state()
	case "ended":
		x.tr = x.tr.Ended(at("at"))
		return x.state()
	case "state":
		return x.state()
	case "open":
		var b strings.Builder
		for _, a := range d.CmdArgs {
			v, err := time.ParseDuration(a.Key)
			if err != nil {
				d.Fatalf(t, "open %s: %v", a.Key, err)
			}
			verdict := "closed"
			if x.tr.Open(t0.Add(v)) {
				verdict = "open"
			}
			fmt.Fprintf(&b, "%s: %s\n", v, verdict)
		}
		return b.String()
	case "attempt":
		return fmt.Sprintf("given up at %s", off(x.tr.AttemptDeadline(at("start"))))
	case "retry":
		return fmt.Sprintf("retry at %s", off(x.tr.RetryAt(at("start"), at("failed"))))
	case "timeline":
		return x.timeline()
	}
	d.Fatalf(t, "unknown command %q (policy, begin, renewed, unanswered, ended, state, open, attempt, retry, timeline)", d.Cmd)
	return ""
}

func off(at time.Time) time.Duration { return at.Sub(t0) }

func (x *trustTranscript) state() string {
	tr := x.tr
	s := fmt.Sprintf("sent %s; trust until %s; renew at %s; poison pill at %s", off(tr.Sent()), off(tr.Deadline()), off(tr.RenewAt()), off(tr.PoisonAt()))
	if tr.Degraded() {
		s += fmt.Sprintf("; degraded since %s", off(tr.DegradedSince()))
	}
	return s
}

func (x *trustTranscript) timeline() string {
	tr := x.tr
	type ev struct {
		at   time.Duration
		what string
	}
	evs := []ev{
		{off(tr.Sent()), "last successful renewal sent"},
		{off(tr.PoisonAt()), "poison pill, with FastFail, if the lease was not released"},
		{off(tr.Sent().Add(tr.LeaseClock().TTL())), "earliest lapse on the server: TTL after that send"},
	}
	if tr.Open(tr.RenewAt()) {
		evs = append(evs, ev{off(tr.RenewAt()), "next renewal due"})
	}
	if tr.Deadline().Equal(tr.Sent().Add(tr.LeaseClock().TrustWindow())) {
		evs = append(evs, ev{off(tr.Deadline()), "kill switch: the trust window closes"})
	} else {
		evs = append(evs, ev{off(tr.Deadline()), "kill switch: the ownership ended"})
	}
	slices.SortStableFunc(evs, func(a, b ev) int { return int(a.at - b.at) })
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%-13s %s\n", e.at, e.what)
	}
	return b.String()
}

// The order the safety argument needs, for every valid configuration: the next renewal
// is due before the trust window closes; an attempt is given up no later than that; the
// kill switch fires before the poison pill, and the poison pill before the server can
// let anyone else in (TTL after the send, at the earliest). And a renewal moves the
// deadline only forward, never past TrustWindow after the send it is told of.
func TestLeaseClockOrderProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ttl := time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(time.Hour)).Draw(t, "ttl"))
		cfg := Config{TTL: ttl, AllowShortTTL: true}
		if rapid.Bool().Draw(t, "customRenew") {
			cfg.RenewInterval = time.Duration(rapid.Int64Range(1, int64(ttl)).Draw(t, "renew"))
		}
		if cfg.Validate() != nil {
			t.Skip("invalid config")
		}
		p := cfg.LeaseClock()
		sent := t0.Add(time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "sent")))
		tr := p.Begin(sent)
		start := sent.Add(time.Duration(rapid.Int64Range(0, int64(2*ttl)).Draw(t, "start")))
		switch {
		case !tr.RenewAt().Before(tr.Deadline()):
			t.Fatalf("renewal due at %s, not before the trust deadline %s", tr.RenewAt().Sub(sent), tr.Deadline().Sub(sent))
		case tr.AttemptDeadline(start).After(tr.Deadline()):
			t.Fatalf("an attempt at %s is given up at %s, after the trust deadline", start.Sub(sent), tr.AttemptDeadline(start).Sub(sent))
		case !tr.Deadline().Before(tr.PoisonAt()):
			t.Fatalf("kill switch at %s, not before the poison pill at %s", tr.Deadline().Sub(sent), tr.PoisonAt().Sub(sent))
		case !tr.PoisonAt().Before(sent.Add(ttl)):
			t.Fatalf("poison pill at %s, not before the TTL %s", tr.PoisonAt().Sub(sent), ttl)
		}
		next := tr.Renewed(start)
		if next.Deadline().Before(tr.Deadline()) || next.Deadline().After(start.Add(p.TrustWindow())) {
			t.Fatalf("a renewal sent at %s moved the deadline from %s to %s", start.Sub(sent), tr.Deadline().Sub(sent), next.Deadline().Sub(sent))
		}
		if !tr.Open(start) && !next.Deadline().Equal(tr.Deadline()) {
			t.Fatalf("a renewal sent at %s, after the window closed, reopened it", start.Sub(sent))
		}
	})
}
