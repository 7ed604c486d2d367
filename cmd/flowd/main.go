// Command flowd is the flow daemon: see docs/operations.md and flowd --help.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/flowrun/flow/internal/flowd"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := flowd.Load(args, nil)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logger := flowd.NewLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := flowd.Start(ctx, cfg, logger)
	if err != nil {
		logger.Error("flowd could not start", "err", err)
		return 1
	}
	<-ctx.Done()
	logger.Info("draining: handing running runs back")
	d.Stop()
	logger.Info("flowd stopped")
	return 0
}
