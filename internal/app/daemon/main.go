package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/flowrun/flow/internal/base/tracing/otlp"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steps"
)

// Main is the flowd command: it loads the configuration from args (and the FLOWD_*
// environment), starts the daemon, and drains on SIGTERM or SIGINT. reg, if not nil,
// holds the step kinds (a program that embeds flowd with kinds of its own, such as
// examples/payout's nodes: the public package flowd). It returns the exit code: 0
// after a drain, 1 if the daemon could not start or cannot continue from the log it
// finds, 2 for bad configuration.
func Main(args []string, reg *steps.Registry) int {
	return Run(args, Embedding{Registry: reg})
}

// Embedding is what a program that runs flowd inside itself adds to its flags.
type Embedding struct {
	// Registry holds the step kinds (nil: the built-ins).
	Registry *steps.Registry
	// Now is the clock of manual runs' {{ now }}, {{ today }} and {{ yesterday }}
	// defaults (nil: the real one).
	Now func() time.Time
	// Stderr receives the logs and configuration errors (nil: os.Stderr).
	Stderr io.Writer
}

// Run is Main with what an embedding program adds.
func Run(args []string, emb Embedding) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, logger, code := Open(ctx, args, emb)
	if d == nil {
		return code
	}
	select {
	case <-ctx.Done():
	case <-d.Engine().ApplierFailed():
		if err := d.Engine().Health(context.Background()).ApplierErr; errors.Is(err, logstream.ErrWrongLog) {
			// Serving the state of another log would be serving fiction: stop, and say
			// why and how to recover (the error does).
			logger.Error("flowd cannot continue from the log; stopping", "err", err)
			d.Stop()
			return 1
		}
		<-ctx.Done() // other applier failures: stay up, and /readyz says why
	}
	logger.Info("draining: handing running runs back")
	d.Stop()
	logger.Info("flowd stopped")
	return 0
}

// Open loads the configuration from args, does what flowd does before it serves (not
// dumpable, a private umask and data dir, the exec user's reach), and starts the
// daemon. On failure the daemon is nil and code is the exit code (0 for --help).
func Open(ctx context.Context, args []string, emb Embedding) (d *Daemon, logger *slog.Logger, code int) {
	stderr := emb.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	cfg, err := Load(args, nil)
	if errors.Is(err, pflag.ErrHelp) {
		return nil, nil, 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, nil, 2
	}
	if emb.Registry != nil {
		cfg.Registry = emb.Registry
	}
	cfg.Now = emb.Now
	logger = NewLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	// Before anything secret is in memory that a step could read through /proc.
	if ok, err := notDumpable(); err != nil {
		logger.Warn("flowd could not make itself not dumpable: processes of its user may read its memory and environment", "err", err)
	} else if ok {
		logger.Debug("flowd is not dumpable: its environment and memory are closed to other processes of its user")
	}
	// What flowd writes (the state, the embedded server's store, the log's copies of
	// step outputs) is for this user only: files 0600, directories 0700. Step commands
	// inherit the mask (docs/security.md).
	syscall.Umask(0o077)
	if err := privateDataDir(cfg.DataDir, logger); err != nil {
		logger.Error("flowd could not start", "err", err)
		return nil, logger, 1
	}
	if err := checkExecUserReach(cfg); err != nil {
		logger.Error("flowd could not start", "err", err)
		return nil, logger, 2
	}
	if cfg.NATSPassword != "" && flagGiven(args, "nats-password") {
		logger.Warn("--nats-password is readable in /proc/PID/cmdline by every process on this machine, exec steps included: give it as FLOWD_NATS_PASSWORD or in the config file (mode 0600)")
	}
	// Traces, if the OTEL_* variables ask for them (internal/base/tracing).
	flush, err := otlp.Setup(ctx, "flowd", nil, logger)
	if err != nil {
		logger.Error("flowd could not start", "err", err)
		return nil, logger, 2
	}
	d, err = Start(ctx, cfg, logger)
	if err != nil {
		if flush != nil {
			_ = flush(context.Background())
		}
		logger.Error("flowd could not start", "err", err)
		return nil, logger, 1
	}
	d.flushTraces = flush
	return d, logger, 0
}

// flagGiven reports whether args name --name (as --name V or --name=V).
func flagGiven(args []string, name string) bool {
	for _, a := range args {
		if a == "--"+name || strings.HasPrefix(a, "--"+name+"=") {
			return true
		}
	}
	return false
}

// privateDataDir makes the data dir, or makes an existing one readable by this user
// only (0700; older flowds made it 0755).
func privateDataDir(dir string, logger *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("flowd: data dir %s: %w (give --data-dir a directory this user can create)", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("flowd: data dir %s: %w", dir, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("flowd: data dir %s is readable by others and cannot be made private: %w (chmod 700 it)", dir, err)
		}
		logger.Warn("the data dir was readable by other users: made private (0700)", "data_dir", dir, "was", st.Mode().Perm().String())
	}
	return nil
}
