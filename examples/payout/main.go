// Command payout is the demo of flow: it starts a flow node on the embedded defaults and
// the wallet service, applies examples/payout/payout.yaml, runs a payout for one date,
// shows its progress, and prints the summary: drivers paid, total, epoch changes and
// fenced attempts. With --chaos it runs three nodes instead (child processes of this
// program on one NATS server) and, during the transfer, pauses the run's owner past its
// lease TTL and kills another node, then prints the same summary with the evidence.
//
//	go run ./examples/payout [--date 2026-11-28] [--drivers 1000]
//	go run ./examples/payout --chaos [--rounds 3]
//
// `payout node <flowd flags>` is one node of the chaos mode: flowd with the payout's step
// kinds registered.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/examples/payout/wallet"
	"github.com/flowrun/flow/flowd"
	"github.com/flowrun/flow/steps"
)

//go:embed payout.yaml
var workflowYAML []byte

type options struct {
	date, dataDir, walletAddr string
	drivers                   int
	out                       io.Writer
	chaos                     bool
	rounds                    int
	leaseTTL                  time.Duration
	walletLatency             time.Duration
	// nodeBin is the program the chaos nodes run, with "node" as its first argument
	// (default: this program). Tests set it to a binary they built.
	nodeBin string
	// walletOptions are extra wallet options (tests: wallet.WithoutGuards).
	walletOptions []wallet.Option
	// traceparent, if set, is the caller's trace context the payout run joins
	// (--traceparent).
	traceparent string
	// now is the single node's clock for the workflow's {{ yesterday }} default (default
	// time.Now; tests pin it so that no test depends on today's date).
	now func() time.Time
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "node" {
		os.Exit(runNode(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "wallet" {
		os.Exit(runWallet(os.Args[2:]))
	}
	o := options{out: os.Stdout}
	flag.StringVar(&o.date, "date", "", "the day to pay, YYYY-MM-DD (default: the workflow's, yesterday in the schedule's timezone, Asia/Jakarta)")
	flag.StringVar(&o.dataDir, "data-dir", "", "where flow and the wallet keep their data (default: a new temporary directory, removed at the end)")
	flag.StringVar(&o.walletAddr, "wallet", "127.0.0.1:9090", "the wallet's listen address")
	flag.IntVar(&o.drivers, "drivers", 1000, "drivers in the generated data set")
	flag.StringVar(&o.traceparent, "traceparent", "", "a W3C traceparent the payout run joins (with OTEL_* set, flowd's spans join it too)")
	flag.BoolVar(&o.chaos, "chaos", false, "run three nodes and, during the transfer, pause the run's owner past its lease TTL and kill another node")
	flag.IntVar(&o.rounds, "rounds", 1, "payouts to run, one date each (going back a day per round); with --chaos each is disrupted")
	flag.DurationVar(&o.leaseTTL, "lease-ttl", 2*time.Second, "run lease and leader term TTL")
	flag.DurationVar(&o.walletLatency, "wallet-latency", -1, "how long each credit takes at the wallet, as a bank's API would (default: 0, or 40ms with --chaos so that the transfer lasts long enough to be disrupted)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "payout: unexpected argument %q (flags only; see --help)\n", flag.Arg(0))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "payout:", err)
		os.Exit(1)
	}
}

// runWallet serves the wallet (and /alerts) on its own, for a cluster started apart (the
// compose cluster of deploy/compose.yaml): payout wallet [--listen ADDR] [--data DIR].
func runWallet(args []string) int {
	fs := flag.NewFlagSet("payout wallet", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9090", "the wallet's listen address")
	data := fs.String("data", "./wallet-data", "the wallet's ledger directory")
	latency := fs.Duration("latency", 0, "how long each credit takes, as a bank's API would")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	w, err := wallet.Open(*data, wallet.WithLatency(*latency))
	if err != nil {
		fmt.Fprintln(os.Stderr, "payout wallet:", err)
		return 1
	}
	defer w.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "payout wallet: listen on %s: %v (use --listen HOST:PORT)\n", *listen, err)
		return 1
	}
	alerts := &alertBox{}
	mux := http.NewServeMux()
	mux.Handle("/", w.Handler())
	mux.HandleFunc("POST /alerts", alerts.post)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); _ = hs.Close() }()
	fmt.Fprintf(os.Stderr, "payout wallet: serving on %s (POST /credit, GET /ledger?date=)\n", ln.Addr())
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "payout wallet:", err)
		return 1
	}
	return 0
}

// runNode is one chaos node: flowd, configured by its own flags, with the payout's step
// kinds. It drains on SIGTERM like flowd.
func runNode(args []string) int {
	reg := steps.NewRegistry(0)
	if err := registerSteps(reg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return flowd.Main(args, flowd.WithSteps(reg))
}

func (o *options) validate() error {
	if o.date != "" {
		if _, err := time.Parse("2006-01-02", o.date); err != nil {
			return fmt.Errorf("--date %q: use YYYY-MM-DD", o.date)
		}
	}
	if o.drivers < 1 || o.drivers > 100000 {
		return fmt.Errorf("--drivers %d: use 1 to 100000", o.drivers)
	}
	if o.rounds < 1 || o.rounds > 100 {
		return fmt.Errorf("--rounds %d: use 1 to 100", o.rounds)
	}
	if o.leaseTTL < 500*time.Millisecond || o.leaseTTL > time.Minute {
		return fmt.Errorf("--lease-ttl %s: use 500ms to 1m", o.leaseTTL)
	}
	if o.walletLatency < 0 {
		o.walletLatency = 0
		if o.chaos {
			o.walletLatency = 40 * time.Millisecond
		}
	}
	if o.out == nil {
		o.out = io.Discard
	}
	return nil
}

// round is one payout and what was seen of it.
type round struct {
	Run        client.Run
	Date       string
	Ledger     wallet.Ledger
	Expected   wallet.Ledger // from the data set itself, independent of the run
	Disruption string        // with --chaos: what was done to the nodes
	LockStolen int           // with --chaos: lock-stolen-mid-run lines in the nodes' logs
	approved   bool          // the demo's finance people approved the run
}

// approve has the demo's two finance operators approve the run's total, as two people
// would with `flowctl run approve RUN` after checking it.
func approve(ctx context.Context, out io.Writer, approvers []*client.Client, v client.Run) error {
	if len(approvers) == 0 {
		return fmt.Errorf("run %s waits for approvals and this mode has no approvers", v.ID)
	}
	fmt.Fprintf(out, "  waiting for %d approvals (step %s): the run is parked, no worker holds it\n", v.Waiting.Need, v.Waiting.Step)
	for _, a := range approvers {
		if _, err := a.Approve(ctx, v.ID, client.DecideOptions{Comment: "total checked against the trips"}); err != nil {
			return fmt.Errorf("approve run %s: %w", v.ID, err)
		}
	}
	fmt.Fprintf(out, "  approved by finance-1 and finance-2\n")
	return nil
}

// ok reports whether the round paid every driver exactly once.
func (r round) ok() bool {
	return r.Run.Status == "succeeded" && r.Ledger.Drivers == r.Expected.Drivers && r.Ledger.TotalCents == r.Expected.TotalCents
}

func run(ctx context.Context, o options) ([]round, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.dataDir == "" {
		d, err := os.MkdirTemp("", "flow-payout-demo")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		o.dataDir = d
	}
	w, err := wallet.Open(filepath.Join(o.dataDir, "wallet"), append([]wallet.Option{wallet.WithLatency(o.walletLatency)}, o.walletOptions...)...)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	ln, err := net.Listen("tcp", o.walletAddr)
	if err != nil {
		return nil, fmt.Errorf("wallet: listen on %s: %w (use --wallet HOST:PORT)", o.walletAddr, err)
	}
	// The wallet, and /alerts: the demo's stand-in for a chat webhook, which the
	// workflow's on_failure handler posts to.
	alerts := &alertBox{}
	mux := http.NewServeMux()
	mux.Handle("/", w.Handler())
	mux.HandleFunc("POST /alerts", alerts.post)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	walletURL := "http://" + ln.Addr().String()

	var cl *client.Client
	var approvers []*client.Client // finance-1 and finance-2 (single node)
	var c *chaosCluster
	if o.chaos {
		if c, err = startChaosCluster(ctx, o); err != nil {
			return nil, err
		}
		defer c.stop()
		cl = c.client
		fmt.Fprintf(o.out, "3 flow nodes up (NATS on %s, logs in %s), wallet on %s (each credit takes %s)\n", c.natsURL, c.dir, walletURL, o.walletLatency)
	} else {
		stopNode, people, err := startSingleNode(ctx, o)
		if err != nil {
			return nil, err
		}
		defer stopNode()
		cl = people["payout-starter"]
		approvers = []*client.Client{people["finance-1"], people["finance-2"]}
		fmt.Fprintf(o.out, "flow node up (embedded NATS with --auth: payout-starter, finance-1, finance-2), wallet on %s\n", walletURL)
	}
	wf, err := cl.ApplyWorkflow(ctx, "examples/payout/payout.yaml", workflowYAML)
	if err != nil {
		return nil, fmt.Errorf("apply the workflow: %w", err)
	}
	fmt.Fprintf(o.out, "workflow %s v%d applied\n", wf.Name, wf.Version)

	var rounds []round
	date := o.date
	for i := 0; i < o.rounds; i++ {
		if i > 0 {
			d, _ := time.Parse("2006-01-02", date)
			date = d.AddDate(0, 0, -1).Format("2006-01-02")
		}
		r, err := payOnce(ctx, o, cl, approvers, c, w, walletURL, date)
		if r != nil {
			rounds = append(rounds, *r)
			date = r.Date
		}
		if err != nil {
			return rounds, err
		}
	}
	for _, a := range alerts.all() {
		fmt.Fprintf(o.out, "alert received: %s\n", a)
	}
	if len(rounds) > 1 {
		var drivers int
		var cents int64
		for _, r := range rounds {
			drivers += r.Ledger.Drivers
			cents += r.Ledger.TotalCents
		}
		fmt.Fprintf(o.out, "\n%d payouts, each paid exactly once: %d credits, %s in total\n", len(rounds), drivers, money(cents))
	}
	return rounds, nil
}

// The demo's people (flowd --auth): the operator who starts the payouts, and the two
// finance operators whose approvals a large total waits for (the workflow's approve
// step: two operators other than the starter). Their passwords are made per run.
var demoPeople = []string{"payout-starter", "finance-1", "finance-2"}

// startSingleNode starts one flow node in this process (as flowd would, with the
// payout's step kinds), its NATS embedded on a free loopback port with --auth, and
// returns a client for each of demoPeople.
func startSingleNode(ctx context.Context, o options) (func(), map[string]*client.Client, error) {
	reg := steps.NewRegistry(0)
	if err := registerSteps(reg); err != nil {
		return nil, nil, err
	}
	passwords := map[string]string{}
	var users strings.Builder
	users.WriteString("users:\n")
	for _, name := range demoPeople {
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			return nil, nil, err
		}
		passwords[name] = hex.EncodeToString(b)
		fmt.Fprintf(&users, "  - {user: %s, password: %q, role: operator}\n", name, passwords[name])
	}
	usersFile := filepath.Join(o.dataDir, "users.yaml")
	if err := os.WriteFile(usersFile, []byte(users.String()), 0o600); err != nil {
		return nil, nil, err
	}
	var logs bytes.Buffer // shown only if the node does not start
	node, err := flowd.Start(ctx, []string{"--node-id", "payout-demo", "--data-dir", filepath.Join(o.dataDir, "flow"),
		"--nats-listen", "127.0.0.1:0", "--auth", usersFile, "--http", "off", "--workers", "4", "--lease-ttl", o.leaseTTL.String(),
		"--log-level", "error", "--log-format", "text"},
		flowd.WithSteps(reg), flowd.WithNow(o.now), flowd.WithLogOutput(&logs))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(logs.String()))
	}
	people := map[string]*client.Client{}
	stop := func() {
		for _, c := range people {
			c.Close()
		}
		node.Stop()
	}
	for _, name := range demoPeople {
		c, err := client.Dial(node.ClientURL(), client.WithNATSOptions(nats.UserInfo(name, passwords[name])))
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("connect as %s: %w", name, err)
		}
		people[name] = c
	}
	return stop, people, nil
}

// payOnce runs one payout for date ("" = the workflow's default) and prints its summary.
func payOnce(ctx context.Context, o options, cl *client.Client, approvers []*client.Client, c *chaosCluster, w *wallet.Wallet, walletURL, date string) (*round, error) {
	inputs := map[string]string{"wallet": walletURL, "drivers": strconv.Itoa(o.drivers)}
	if c != nil {
		// The chaos nodes run without --auth: nobody could approve. The chaos mode tries
		// failovers, not people, so its totals need no approval.
		inputs["approval_above"] = strconv.FormatInt(math.MaxInt64/2, 10)
	}
	if date != "" {
		inputs["date"] = date
	}
	if o.traceparent != "" {
		// The run records its trace context from cluster version 2 on: a node that just
		// started raises it within moments.
		for deadline := time.Now().Add(30 * time.Second); ; {
			st, err := cl.ClusterStatus(ctx)
			if err == nil && st.ClusterVersion >= 2 {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the cluster version did not reach 2: the run would not be traced (%v)", err)
			}
			time.Sleep(50 * time.Millisecond) // polling the cluster's version, with a deadline
		}
	}
	started, err := cl.StartRun(ctx, "nightly-payout", client.StartOptions{Inputs: inputs, Traceparent: o.traceparent})
	if err != nil {
		return nil, fmt.Errorf("start the payout: %w", err)
	}
	r := &round{}
	got, err := getRun(ctx, cl, started)
	if err != nil {
		return nil, err
	}
	r.Date = inputOf(got, "date")
	fmt.Fprintf(o.out, "\npayout for %s: run %s\n", r.Date, started)
	// The disruption runs beside the progress loop and is always waited for: it must not
	// touch the nodes once this returns (the nodes are stopped after).
	chaosDone := make(chan error, 1)
	dctx, stopChaos := context.WithCancel(ctx)
	if c != nil {
		go func() { chaosDone <- c.disrupt(dctx, started, r) }()
	} else {
		chaosDone <- nil
	}
	waited := false
	defer func() {
		if !waited {
			stopChaos()
			<-chaosDone
		}
	}()
	defer stopChaos()
	last := time.Time{}
	for {
		v, err := getRun(ctx, cl, started)
		if err != nil {
			return nil, err
		}
		if terminal(v.Status) {
			r.Run = v
			break
		}
		if v.Status == "waiting" && v.Waiting != nil && v.Waiting.Kind == "approval" && !r.approved {
			if err := approve(ctx, o.out, approvers, v); err != nil {
				return nil, err
			}
			r.approved = true
		}
		if time.Since(last) >= 500*time.Millisecond {
			fmt.Fprintln(o.out, "  "+progress(v))
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling the run's state through the API
		}
	}
	waited = true
	if err := <-chaosDone; err != nil {
		return r, err
	}
	if c != nil {
		r.LockStolen = c.lockStolen()
	}
	if r.Ledger, err = w.Totals(r.Date); err != nil {
		return r, err
	}
	r.Expected = expectedLedger(r.Date, o.drivers)
	printRound(o.out, r)
	if !r.ok() {
		msg := r.Run.Error
		if msg == "" {
			msg = fmt.Sprintf("the ledger holds %s for %d drivers, the data set owes %s to %d", money(r.Ledger.TotalCents), r.Ledger.Drivers, money(r.Expected.TotalCents), r.Expected.Drivers)
		}
		return r, fmt.Errorf("the payout run %s %s: %s", r.Run.ID, r.Run.Status, msg)
	}
	return r, nil
}

// getRun reads a run, retrying while no node knows it yet (a node restarted by the chaos
// may answer before it has caught up).
func getRun(ctx context.Context, cl *client.Client, id string) (client.Run, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := cl.Run(ctx, id)
		if err == nil {
			return v, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return v, fmt.Errorf("read run %s: %w", id, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond): // retry pacing
		}
	}
}

func terminal(status string) bool {
	switch status {
	case "succeeded", "failed", "cancelled", "dead_lettered":
		return true
	}
	return false
}

func inputOf(r client.Run, name string) string {
	var m map[string]any
	_ = json.Unmarshal(r.Inputs, &m)
	s, _ := m[name].(string)
	return s
}

// expectedLedger is what the data set owes for date, computed here without the engine.
func expectedLedger(date string, drivers int) wallet.Ledger {
	l := wallet.Ledger{Date: date}
	seen := map[string]bool{}
	for _, t := range tripsOf(date, drivers) {
		l.TotalCents += t.Cents
		if !seen[t.Driver] {
			seen[t.Driver] = true
			l.Drivers++
		}
	}
	return l
}

func money(cents int64) string { return fmt.Sprintf("%d.%02d", cents/100, cents%100) }

func printRound(out io.Writer, r *round) {
	v := r.Run
	fmt.Fprintf(out, "\nrun %s: %s\n", v.ID, v.Status)
	if r.Disruption != "" {
		fmt.Fprintf(out, "chaos:             %s\n", r.Disruption)
	}
	fmt.Fprintf(out, "drivers paid:      %d (owed: %d)\n", r.Ledger.Drivers, r.Expected.Drivers)
	fmt.Fprintf(out, "total paid:        %s (owed: %s)\n", money(r.Ledger.TotalCents), money(r.Expected.TotalCents))
	fmt.Fprintf(out, "epoch changes:     %d\n", v.EpochChanges)
	for i, e := range v.Epochs {
		var prev *client.Epoch
		if i > 0 {
			prev = &v.Epochs[i-1]
		}
		fmt.Fprintf(out, "  epoch %d: %s (%s)\n", e.Epoch, e.Owner, epochCause(prev, e))
	}
	fmt.Fprintf(out, "fenced commits:    %d\n", len(v.Fenced))
	for i, f := range v.Fenced {
		if i == 5 {
			fmt.Fprintf(out, "  ... and %d more\n", len(v.Fenced)-5)
			break
		}
		fmt.Fprintf(out, "  %s item %d from %s at epoch %d, current %d\n", f.Step, f.Item, f.Owner, f.Epoch, f.CurrentEpoch)
	}
	if r.Disruption != "" {
		fmt.Fprintf(out, "lock-stolen-mid-run logged: %d\n", r.LockStolen)
	}
	fmt.Fprintf(out, "wallet: stale credits refused %d, repeated credits applied once %d\n", r.Ledger.Rejected, r.Ledger.Duplicates)
}

// epochCause says why epoch e began, after prev (nil: the first). The log records
// "reconciled" for an epoch whose predecessor's lease lapsed when the leader's reconcile
// pass, not its lease watcher, found the lapse (a leader elected after it, as when the
// chaos kills the leader during the pause: docs/checkpoint.md): what happened is still
// that the owner's lease expired, which is what the summary says, naming how it was
// found. A reconciled epoch after one nobody claimed (a lost task) is what it says.
func epochCause(prev *client.Epoch, e client.Epoch) string {
	if e.Reason == "reconciled" && prev != nil && prev.Owner != "" {
		return fmt.Sprintf("lease-expired: %s's lease of epoch %d lapsed, found by the leader's reconcile pass", prev.Owner, prev.Epoch)
	}
	return e.Reason
}

func progress(v client.Run) string {
	s := fmt.Sprintf("%s epoch %d", v.Status, v.Epoch)
	if v.Owner != "" {
		s += " on " + v.Owner
	}
	var parts []string
	for _, st := range v.Steps {
		p := st.Name + ":" + st.Status
		if st.Items > 0 {
			p += fmt.Sprintf("(%d/%d)", st.ItemsDone, st.Items)
		}
		parts = append(parts, p)
	}
	return s + " " + strings.Join(parts, " ")
}

// alertBox keeps what the workflow's on_failure handler posted to /alerts.
type alertBox struct {
	mu   sync.Mutex
	msgs []string
}

func (b *alertBox) post(rw http.ResponseWriter, r *http.Request) {
	var body struct {
		Text string `json:"text"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	b.msgs = append(b.msgs, body.Text)
	b.mu.Unlock()
	rw.WriteHeader(http.StatusNoContent)
}

func (b *alertBox) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.msgs...)
}
