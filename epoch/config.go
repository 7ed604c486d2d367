package epoch

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/flowrun/flow/internal/backoff"
	"github.com/flowrun/flow/internal/supervise"
	"github.com/flowrun/flow/internal/testhooks"
)

// Defaults.
const (
	DefaultTTL        = 10 * time.Second
	minProductionTTL  = time.Second
	trustFraction     = 2.0 / 3.0 // the holder trusts itself this long after a renewal was sent
	poisonFraction    = 0.7       // past this without a renewal, a fast-fail holder exits
	DefaultExitCode   = 75        // exit status of a poison pill (EX_TEMPFAIL)
	LeaderBucket      = "FLOW_LEADER"
	LeaseBucket       = "FLOW_LEASES"
	leaderKey         = "leader"
	defaultMarkerTTL  = time.Second // how long a lapse marker stays (watchers need to see it)
	minRenewalTimeout = 50 * time.Millisecond
)

// Config of leases and elections. The zero value is valid: every field has a default.
type Config struct {
	// TTL is how long a lease or term lives on the server without renewal (default 10s).
	// It is the bucket's, so cluster-wide: every node should use the same.
	TTL time.Duration
	// RenewInterval is the time between renewals (default TTL/3). It must be under
	// 2/3 TTL, the holder's trust window.
	RenewInterval time.Duration
	// AllowShortTTL permits a TTL under 1s (tests only).
	AllowShortTTL bool
	// FastFail makes a lease holder exit the process (Exit(DefaultExitCode)) when no
	// renewal succeeded by 70% of the TTL: the poison pill, for workers whose steps may
	// not stop when their context is cancelled.
	FastFail bool
	// Exit is called by the poison pill; default os.Exit.
	Exit func(code int)
	// BeforeExit, if set, is called by the poison pill just before Exit: what must not
	// outlive the process goes here. The engine kills its exec steps' process groups
	// (steps.KillProcessGroups): the kernel kills a step's own process when flowd dies,
	// but not the children that process started.
	BeforeExit func()
	// Backoff paces election retries and lease re-acquire (default 50ms doubling to 2s,
	// full jitter).
	Backoff backoff.Policy
	// Counters, if set, count renewals, terms and lost leases.
	Counters *Counters
	// Logger, if set, receives ownership changes.
	Logger *slog.Logger
	// Supervisor keeps the lease watcher's KV watch alive (internal/supervise); default:
	// one of the watcher's own.
	Supervisor *supervise.Supervisor
	// Hooks are tests' switches (internal/testhooks: NoRenew, NoKillSwitch); nil in
	// production, and for elections.
	Hooks *testhooks.Hooks
}

func (c *Config) noRenew() bool      { return c.Hooks != nil && c.Hooks.NoRenew }
func (c *Config) noKillSwitch() bool { return c.Hooks != nil && c.Hooks.NoKillSwitch }

// Validate checks c and fills in defaults. The error names the field and the fix.
func (c *Config) Validate() error {
	if c.TTL < 0 || c.RenewInterval < 0 {
		return fmt.Errorf("%w: lease TTL %s and renew interval %s must not be negative", ErrInvalidConfig, c.TTL, c.RenewInterval)
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTL < minProductionTTL && !c.AllowShortTTL {
		return fmt.Errorf("%w: lease TTL %s is under 1s: a GC pause or a slow disk would expire leases of healthy workers; use 1s or more (10s is the default)", ErrInvalidConfig, c.TTL)
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.RenewInterval >= c.TTL {
		return fmt.Errorf("%w: renew interval %s must be shorter than the lease TTL %s (TTL/3 is the default)", ErrInvalidConfig, c.RenewInterval, c.TTL)
	}
	if c.RenewInterval >= c.trust() {
		return fmt.Errorf("%w: renew interval %s must be shorter than 2/3 of the lease TTL (%s), when a holder stops trusting its lease; TTL/3 is the default", ErrInvalidConfig, c.RenewInterval, c.trust())
	}
	if c.Exit == nil {
		c.Exit = os.Exit
	}
	if c.Backoff == (backoff.Policy{}) {
		c.Backoff = backoff.Policy{Base: 50 * time.Millisecond, Cap: 2 * time.Second}
	}
	if c.Counters == nil {
		c.Counters = &Counters{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func (c *Config) trust() time.Duration  { return time.Duration(float64(c.TTL) * trustFraction) }
func (c *Config) poison() time.Duration { return time.Duration(float64(c.TTL) * poisonFraction) }

// renewalTimeout bounds one renewal attempt: no answer within it makes a lease
// degraded (the worker takes no new work) and the renewal is retried at once. Half the
// renew interval (TTL/6 by default) leaves several retries before the trust window
// ends at 2/3 TTL.
func (c *Config) renewalTimeout() time.Duration { return max(c.RenewInterval/2, minRenewalTimeout) }
