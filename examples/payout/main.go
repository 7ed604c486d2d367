// Command payout is the demo of flow: it starts a flow node on the embedded defaults and
// the wallet service, applies examples/payout/payout.yaml, runs a payout for one date,
// shows its progress, and prints the summary: drivers paid, total, epoch changes and
// fenced attempts. `go run ./examples/payout --help`.
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/examples/payout/wallet"
	"github.com/flowrun/flow/steps"
)

//go:embed payout.yaml
var workflowYAML []byte

type options struct {
	date, dataDir, walletAddr string
	drivers                   int
	out                       io.Writer
}

func main() {
	var o options
	flag.StringVar(&o.date, "date", time.Now().AddDate(0, 0, -1).Format("2006-01-02"), "the day to pay")
	flag.StringVar(&o.dataDir, "data-dir", "", "where flow and the wallet keep their data (default: a new temporary directory)")
	flag.StringVar(&o.walletAddr, "wallet", "127.0.0.1:9090", "the wallet's listen address")
	flag.IntVar(&o.drivers, "drivers", 1000, "drivers in the generated data set")
	flag.Parse()
	o.out = os.Stdout
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "payout:", err)
		os.Exit(1)
	}
}

// summary is what the demo prints.
type summary struct {
	Run           string
	Status        string
	Drivers       int
	TotalCents    int64
	EpochChanges  int
	FencedCommits int
	WalletStale   int
	Duplicates    int
}

func run(ctx context.Context, o options) error {
	if o.dataDir == "" {
		d, err := os.MkdirTemp("", "flow-payout-demo")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.dataDir = d
	}
	w, err := wallet.Open(filepath.Join(o.dataDir, "wallet"))
	if err != nil {
		return err
	}
	defer w.Close()
	ln, err := net.Listen("tcp", o.walletAddr)
	if err != nil {
		return fmt.Errorf("wallet: listen on %s: %w (use --wallet HOST:PORT)", o.walletAddr, err)
	}
	hs := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	reg := steps.NewRegistry(0)
	if err := registerSteps(reg, o.drivers); err != nil {
		return err
	}
	e, err := engine.New(engine.Config{NodeID: "payout-demo", DataDir: filepath.Join(o.dataDir, "flow"), NATSListen: "-",
		Workers: 4, Registry: reg, Lease: epoch.Config{TTL: 2 * time.Second}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	if err := e.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(sctx)
	}()
	wf, err := e.ApplyWorkflow(ctx, "examples/payout/payout.yaml", workflowYAML)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "flow node up (embedded NATS), wallet on http://%s; workflow %s v%d applied\n", ln.Addr(), wf.Name, wf.Version)
	id, err := e.StartRun(ctx, wf.Name, map[string]any{"date": o.date, "wallet": "http://" + ln.Addr().String()}, engine.RunOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "payout for %s: run %s\n", o.date, id)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.WaitRun(wctx, id)
	}()
	tick := time.NewTicker(500 * time.Millisecond) // progress display
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-tick.C:
			if v, err := e.Run(id); err == nil {
				fmt.Fprintln(o.out, "  "+progress(v))
			}
		}
	}
	v, err := e.Run(id)
	if err != nil {
		return err
	}
	l, err := w.Totals(o.date)
	if err != nil {
		return err
	}
	s := summary{Run: id, Status: string(v.Run.Status), Drivers: l.Drivers, TotalCents: l.TotalCents,
		EpochChanges: v.Run.EpochChanges, FencedCommits: len(v.Fenced), WalletStale: l.Rejected, Duplicates: l.Duplicates}
	fmt.Fprintf(o.out, "\nrun %s: %s\n", s.Run, s.Status)
	fmt.Fprintf(o.out, "drivers paid:      %d\n", s.Drivers)
	fmt.Fprintf(o.out, "total paid:        %d.%02d\n", s.TotalCents/100, s.TotalCents%100)
	fmt.Fprintf(o.out, "epoch changes:     %d\n", s.EpochChanges)
	fmt.Fprintf(o.out, "fenced commits:    %d\n", s.FencedCommits)
	fmt.Fprintf(o.out, "wallet: stale credits refused %d, repeated credits applied once %d\n", s.WalletStale, s.Duplicates)
	if v.Run.Status != checkpoint.StatusSucceeded {
		return fmt.Errorf("the payout run %s: %s", v.Run.Status, v.Run.Error)
	}
	return nil
}

func progress(v *checkpoint.RunView) string {
	s := fmt.Sprintf("%s epoch %d", v.Run.Status, v.Run.Epoch)
	for _, st := range v.Steps {
		s += " " + st.Name + ":" + string(st.Status)
		if st.Items > 0 {
			s += fmt.Sprintf("(%d/%d)", st.ItemsDone, st.Items)
		}
	}
	return s
}
