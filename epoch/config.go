package epoch

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/supervise"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Defaults.
const (
	DefaultTTL        = 10 * time.Second
	minProductionTTL  = time.Second
	DefaultExitCode   = 75 // exit status of a poison pill (EX_TEMPFAIL)
	LeaderBucket      = port.LeaderBucket
	LeaseBucket       = port.LeaseBucket
	leaderKey         = "leader"
	minRenewalTimeout = 50 * time.Millisecond
)

// defaultBackoff is Config.Backoff's default: 50ms doubling to 2s, full jitter.
var defaultBackoff = backoff.Policy{Base: 50 * time.Millisecond, Cap: 2 * time.Second}

// Config of leases and elections. A zero field takes its default: [Config.WithDefaults]
// fills them in, and every constructor (NewLeases, NewElector) applies it to its own
// copy and then validates, so the zero value is a valid configuration.
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
	// outlive the process goes here. The engine kills its exec steps, with every process
	// they started (steps.KillProcessGroups): their inits would do it as they see the
	// process gone; this makes them dead before the exit, whatever the inits' state.
	BeforeExit func()
	// Backoff paces election retries and lease re-acquire (default 50ms doubling to 2s,
	// full jitter).
	Backoff backoff.Policy
	// Clock is where holders, electors and the lease watcher read the time and set
	// their timers (default the real clock, clockwork.NewRealClock). The real clock's
	// readings carry Go's monotonic clock, which is what every lease duration is
	// measured on; tests pass a clockwork.FakeClock and move it themselves. Network
	// calls still take real time, and each keeps a real-time backstop timeout.
	Clock clockwork.Clock
	// Counters, if set, count renewals, terms and lost leases (default: a new one per
	// constructor; set it to share one between an Elector and Leases).
	Counters *Counters
	// Logger, if set, receives ownership changes (default: discard).
	Logger *slog.Logger
	// Supervisor keeps the lease watcher's KV watch alive (internal/base/supervise); default:
	// one of the watcher's own.
	Supervisor *supervise.Supervisor
	// Hooks are tests' switches (internal/base/testhooks: NoRenew, NoKillSwitch); nil in
	// production, and for elections.
	Hooks *testhooks.Hooks
}

// DefaultConfig is the configuration every zero field of a Config stands for:
// Config{}.WithDefaults().
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns a copy of c with each zero field set to its default. It does not
// validate: call Validate on the result, as the constructors do. A RenewInterval left
// zero becomes a third of the TTL (of the default TTL if that is zero too). Counters is
// a new value each time it is filled in, so call WithDefaults once and pass the result
// to every constructor that should count into the same Counters.
func (c Config) WithDefaults() Config {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.Exit == nil {
		c.Exit = os.Exit
	}
	if c.Backoff == (backoff.Policy{}) {
		c.Backoff = defaultBackoff
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	if c.Counters == nil {
		c.Counters = &Counters{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports whether the constructors would accept c: it checks c with its
// defaults (c.WithDefaults()) and changes nothing. Errors wrap ErrInvalidConfig and
// name the field and the fix.
func (c Config) Validate() error {
	d := c.WithDefaults()
	switch {
	case c.TTL < 0:
		return fmt.Errorf("%w: TTL %s is negative: set a positive lease TTL (10s is the default; 0 means the default)", ErrInvalidConfig, c.TTL)
	case c.RenewInterval < 0:
		return fmt.Errorf("%w: RenewInterval %s is negative: set a positive renew interval (TTL/3 is the default; 0 means the default)", ErrInvalidConfig, c.RenewInterval)
	case d.TTL < minProductionTTL && !d.AllowShortTTL:
		return fmt.Errorf("%w: lease TTL %s is under 1s: a GC pause or a slow disk would expire leases of healthy workers; use 1s or more (10s is the default)", ErrInvalidConfig, d.TTL)
	case d.RenewInterval >= d.TTL:
		return fmt.Errorf("%w: RenewInterval %s must be shorter than the lease TTL %s: use TTL/3, the default (leave it 0)", ErrInvalidConfig, d.RenewInterval, d.TTL)
	case d.RenewInterval >= d.leaseClock().TrustWindow():
		return fmt.Errorf("%w: RenewInterval %s must be shorter than 2/3 of the lease TTL (%s), when a holder stops trusting its lease: use TTL/3, the default (leave it 0)", ErrInvalidConfig, d.RenewInterval, d.leaseClock().TrustWindow())
	}
	return nil
}

// ready is what every constructor does with its config: its own copy, with defaults,
// validated.
func (c Config) ready() (Config, error) {
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LeaseClock is the timing policy of c's holders (c with its defaults): see [LeaseClock].
func (c Config) LeaseClock() LeaseClock { return c.WithDefaults().leaseClock() }

func (c Config) leaseClock() LeaseClock {
	return LeaseClock{ttl: c.TTL, renewInterval: c.RenewInterval}
}

func (c *Config) noRenew() bool      { return c.Hooks != nil && c.Hooks.NoRenew }
func (c *Config) noKillSwitch() bool { return c.Hooks != nil && c.Hooks.NoKillSwitch }
