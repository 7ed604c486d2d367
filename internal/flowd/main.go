package flowd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steps"
)

// Main is the flowd command: it loads the configuration from args (and the FLOWD_*
// environment), starts the daemon, and drains on SIGTERM or SIGINT. reg, if not nil,
// holds the step kinds (a program that embeds flowd with kinds of its own, such as
// examples/payout's nodes). It returns the exit code: 0 after a drain, 1 if the daemon
// could not start or cannot continue from the log it finds, 2 for bad configuration.
func Main(args []string, reg *steps.Registry) int {
	cfg, err := Load(args, nil)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if reg != nil {
		cfg.Registry = reg
	}
	logger := NewLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := Start(ctx, cfg, logger)
	if err != nil {
		logger.Error("flowd could not start", "err", err)
		return 1
	}
	select {
	case <-ctx.Done():
	case <-d.Engine().Log().Failed():
		if err := d.Engine().Log().Err(); errors.Is(err, logstream.ErrWrongLog) {
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
